#!/usr/bin/env python3
"""A cost model of braid's protocols and NCCL's collectives on one host, from the machine's probes and the archive.

    bench/cost_model.py [--fit nvidia-h200-x2] [--check nvidia-h200-x4] [--worlds 4,8] [--doc docs/dev/selection.md]
    bench/cost_model.py --write-table      # selection.cpp's rows for 5 to 8 ranks, from the model

NOTE [cost model]
A call of S bytes (nccl-tests' size: the whole output of an all-gather, the whole input of a reduce-scatter) on N
ranks by one of braid's protocols takes

    T = launch + steps * (hop + switched * switch_hop) + S * serial / local_copy
          + max(S * sum over its link terms of  factor / (rate(engine) * share * eta(engine)),  S * local / local_copy)

- The link terms say what crosses the busiest GPU's links, per byte of S: for each engine (SM stores, copy
  engines, LL lines, LL128 lines, a split block's pushes: NOTE [push group]) a factor from the protocol's shape
  (`movement` below: (N-1)/N of S for an all-gather, N-1 whole buffers for a root that serves or gathers every
  peer, ...). LL lines carry 8 bytes of payload in 16, LL128 lines 120 in 128: their rate is the SM rate times
  that share.
- rate(engine) comes from the machine's probes (MACHINES, from bench/probes: SM stores into one peer, a copy
  engine's copy to one peer), share(N) is what is left of a GPU's egress when it stores to N-1 peers at once
  through the switch instead of to one (1 for engines, which serve one peer a step).
- local counts the extra passes through the GPU's own memory that run beside the links (a FIFO's copy-out, an
  engine's reduction), serial those done before any byte crosses a link (a staged protocol's copy into its staging:
  NOTE [staged copy-in]), both at the machine's local copy rate. steps counts the barriers and signals in sequence;
  a FIFO adds its first piece's signal (NOTE [FIFO signal]). One function per protocol says its shape (`PROTOCOLS`).
- switched is 1 where the ranks reach each other through the host's switch (more than 2 GPUs), and switch_hop
  what a step costs more there, fitted on the 4-GPU rows below 1 MiB (NOTE [switch hop]).
- launch, hop and eta(engine) are the model's seven other parameters per machine and mode (graph or eager), fitted by
  least squares on the relative error to the archive's rows of one machine kind and world (the 2-GPU rows), each
  row matched to the protocol braid ran: the first row of the table of the row's commit (src/collectives/
  selection.cpp's kModelTable and kTable, parsed here; today's where the checkout lacks that commit) that the call's
  collective, size, world and buffers pass, as the library picks it. A graph row on cudaMalloc buffers ran on buffers
  the peers map (NOTE [registered cudaMalloc buffers]).
NCCL's time is alpha + S * bus_factor / (busbw * share), alpha and busbw fitted per (collective, buffers, mode); its
rings and chains store to one next rank, so their share is the ring probe's, all-to-all's the egress share.

The model is checked against the rows of another world (`--check`): the error stated is |predicted - measured| /
measured over those rows from 1 MiB up, each of braid's rows predicted for the protocol it ran: the choice of the
table of the row's commit at that world (git history; today's table where the checkout lacks that commit).

Its choice for a (collective, size, world, buffers) is the protocol it predicts fastest among those the
collective has whose gates the call passes. Those choices are the rows for the worlds the archive has no rows of
(5 to 8 ranks: kModelTable in selection.cpp; `--write-table` writes them, tests/bench/test_cost_model.py fails
where they differ), LL's
cut-off first and from the call alone, as kTable needs it (docs/dev/protocol.md). Send/recv keeps its measured
rows at every world (a pair moves the same whatever the world). Where ranks were measured (2 and 4) kTable's rows
stay the measured cut-offs: where the model disagrees with them at 4 ranks, the model is wrong (LL128's rate,
fitted on few rows, is the largest gap).

What it leaves out: latency that grows with the peers (one switch hop serves every world above 2; no probe has
timed a barrier or a signal through the switch of a 4-GPU host), the rates of loads from several peers at once and
of FIFO copy-outs fed by several peers (the 4-rank reduce-scatter on unmapped buffers moves 210-300 GB/s of egress at 32-512 MiB where the model's SM stores reach ~320; its blocks
push a round and then reduce it, so the two add rather than overlap, but counting them so moves kModelTable's
staged cut-off), L2-resident local passes (a copy-in of a few MiB costs less than at the HBM copy rate), the chain's fill (it
counts as one step), contention between the engines and the SMs of one GPU, and anything an 8-GPU probe would show
(none has run): 8 ranks reuse the 4-rank egress share.
"""
import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ARCHIVE = os.path.join(HERE, "results", "archive.jsonl")
TABLE = os.path.join(HERE, "..", "src", "collectives", "selection.cpp")
MiB = 1 << 20
BEGIN = "<!-- cost model: generated by bench/cost_model.py --doc; edit the script, not this section -->"
END = "<!-- end of the cost model's section -->"

# GB/s, measured on each machine kind: one rank's SM stores and copy-engine copies into one peer (probes such as
# bench/probes/link_sharing.cu), and a copy within one GPU. The shares were measured on a 4xH200 host: every rank
# storing to all three peers at once moved 344 GB/s of egress, every rank to the next rank at once (a ring) 363, one
# rank into one peer 369; no 4-GPU H100 host was measured, so H100 reuses them.
MACHINES = {
    "nvidia-h200": {"sm": 353.0, "ce": 397.0, "egress_share": 344.0 / 369.0, "ring_share": 363.0 / 369.0,
                    "local_copy": 2090.0},
    "nvidia-h100": {"sm": 353.0, "ce": 398.0, "egress_share": 344.0 / 369.0, "ring_share": 363.0 / 369.0,
                    "local_copy": 1500.0},
}
WIRE = {"sm": 1.0, "push": 1.0, "ce": 1.0, "ll": 0.5, "ll128": 120.0 / 128.0}  # payload share of what crosses the link
ENGINES = ("sm", "ce", "ll", "ll128", "push")
COLLECTIVES = ("allreduce", "reduce", "reducescatter", "allgather", "broadcast", "alltoall", "sendrecv")
# kTable's names.
CPP_COLLECTIVE = {"kAllReduce": "allreduce", "kReduce": "reduce", "kReduceScatter": "reducescatter",
                  "kAllGather": "allgather", "kBroadcast": "broadcast", "kAllToAll": "alltoall",
                  "kAllToAllv": "alltoallv", "kSendRecv": "sendrecv"}
CPP_ALGORITHM = {"kLL": "ll", "kLL128": "ll128", "kOneShot": "oneshot", "kTwoShot": "twoshot",
                 "kPipelined": "pipelined", "kStaged": "staged", "kCopyEngine": "copyengine",
                 "kMulticast": "multicast", "kSplit": "split"}
MODEL_WORLDS = (5, 8)  # worlds with no archive rows whose table the model prints
SWITCHED = ("nvidia-h200-x4", 4)  # the rows that fit the switch hop (NOTE [switch hop])
TABLE_WORLDS = range(5, 9)  # worlds whose rows are the model's, kModelTable (the archive has none of them)
# Send/recv moves between two ranks whatever the world, so its measured rows serve every world.
TABLE_COLLECTIVES = ("allreduce", "reduce", "reducescatter", "allgather", "broadcast", "alltoall")
MULTICAST_COLLECTIVES = ("allreduce", "reduce", "allgather")  # multicast serves above LL where its gate is open
CPP_BEGIN = "    // The cost model's rows for 5 to 8 ranks: generated by bench/cost_model.py --write-table; edit the script."
CPP_END = "    // End of the cost model's rows."


def machine_of(kind):
    for name, parameters in MACHINES.items():
        if kind.startswith(name):
            return parameters
    raise SystemExit(f"cost_model.py: no probe figures for machine kind {kind!r} (MACHINES)")


def bus_factor(collective, world):
    if collective == "allreduce":
        return 2.0 * (world - 1) / world
    if collective in ("allgather", "reducescatter", "alltoall"):
        return (world - 1) / world
    return 1.0  # broadcast, reduce, sendrecv


def egress_share(machine, world):
    return 1.0 if world <= 2 else machine["egress_share"]


def nccl_share(machine, collective, world):
    """What is left of a GPU's egress to NCCL on one host (NVLS off): its rings and chains store to one next rank
    while every rank does (the ring probe's share), its all-to-all to every peer at once (the egress share)."""
    if world <= 2:
        return 1.0
    return machine["egress_share"] if collective == "alltoall" else machine.get("ring_share", machine["egress_share"])


# --- braid's protocols -------------------------------------------------------------------------------------------

# NOTE [staged copy-in]
# A staged protocol (staged, split, the one shot: src/kernels/staged.cuh's run_staged) copies its input into its
# staging area, then enters the barrier, then reads the peers' staging: the copy-in is done before any byte crosses
# a link, so its time adds to the exchange's (Shape.serial). A pipeline's local passes (a FIFO's copy-out, an
# engine's reduction) run beside its pushes and overlap them (Shape.local, Shape.fifo).
#
# NOTE [FIFO signal]
# A FIFO protocol on buffers the peers do not map (src/kernels/pipeline.cuh) pushes pieces into the receiver's FIFOs;
# the receiver copies a piece out once the sender's signal for it arrives. The copy-outs run beside the pushes (a
# pipeline: Shape.fifo overlaps the links), but the first piece's signal is one more hop in sequence than a zero-copy
# kernel has (FIFO_STEP). Protocols that go through FIFOs whatever the buffers (protocols.cpp: no zero-copy row):
# broadcast's and reduce's chains, send/recv (an all-to-all-v restricted to the pair: send_recv.cpp). A chain has no
# barrier of its own: one step to start, its hops overlapping, and its FIFOs' signal.
FIFO_STEP = 1

# What a protocol moves per byte of S (nccl-tests' size):
#   links:   [(engine, factor)], what crosses the busiest GPU's links by each engine ("sm1": SM stores to one peer
#            at a time, a chain's next rank, which has the GPU's egress to itself; "push": SM stores of a split
#            block's push group, NOTE [push group])
#   local:   passes through the GPU's own memory that overlap the links (a pipeline's copy-out, an engine's reduction)
#   serial:  passes through its own memory before the exchange (NOTE [staged copy-in])
#   fifo:    bytes a rank copies out of its FIFOs, beside the pushes (NOTE [FIFO signal]); 0 where the peers map
#            the buffers (zero copy)
#   steps:   barriers and signals in sequence
Shape = collections.namedtuple("Shape", "links local serial fifo steps")


def shape(links, steps, local=0.0, serial=0.0, fifo=0.0):
    return Shape(links, local, serial, fifo, steps + (FIFO_STEP if fifo else 0))


def ll(collective, n, mapped):
    """LL lines: every rank's data to every rank that needs it, 8 bytes of payload in 16, no barrier."""
    f = (n - 1) / n
    factor = {"allreduce": n - 1, "reduce": n - 1, "broadcast": n - 1, "reducescatter": f, "allgather": f,
              "alltoall": f}.get(collective)
    return None if factor is None else shape([("ll", factor)], 1)


def ll128(collective, n, mapped):
    """LL128 lines (120 bytes of payload in 128): the all-reduce's whole input to every peer; a pair's message."""
    factor = {"allreduce": n - 1, "sendrecv": 1.0}.get(collective)
    return None if factor is None else shape([("ll128", factor)], 1)


def one_shot(collective, n, mapped):
    """All-reduce: the input into staging, one barrier, every peer's staging loaded and reduced (staged always)."""
    return shape([("sm", n - 1)], 2, serial=1.0) if collective == "allreduce" else None


def two_shot(collective, n, mapped):
    """All-reduce: a reduce-scatter then an all-gather, each moving (N-1)/N of S; FIFOs unless the peers map."""
    f = (n - 1) / n
    if collective != "allreduce":
        return None
    return shape([("sm", 2 * f)], 2, fifo=0.0 if mapped else 2 * f)


def staged(collective, n, mapped):
    """The input (all-gather: this rank's block) into staging, one barrier, the peers' staging read out."""
    f = (n - 1) / n
    table = {
        "reduce": ([("sm", n - 1)], 1.0),         # the root loads every peer's staging
        "reducescatter": ([("sm", f)], 1.0),      # the whole input staged, this rank's block loaded from each peer
        "allgather": ([("sm", f)], 1.0 / n),
        "broadcast": ([("sm", n - 1)], 1.0),      # every peer loads the root's staging
    }
    if collective not in table:
        return None
    links, copy_in = table[collective]
    return shape(links, 2, serial=copy_in)


def split(collective, n, mapped):
    """Reduce and broadcast (kTable: 3+ ranks): staged, each rank serving a 1/N part between two barriers."""
    f = (n - 1) / n
    return shape([("sm", 2 * f)], 3, serial=1.0) if collective in ("reduce", "broadcast") else None


# NOTE [push group]
# The all-to-all's FIFO kernel (all_to_all_pipelined.cu) splits each block into a push group of kPushThreads
# threads and a copy group that copies pieces out beside it; its pushers load a distinct piece for every peer, one
# load per store, so they keep fewer stores in flight than the probe's kernel and the zero-copy kernels and reach
# their own share of the SM store rate (engine "push", its eta fitted as the others'; where no fitted row pushes
# so, as in graph mode, whose cudaMalloc rows are zero copy, the SM's eta). The all-gather's push group
# (all_gather.cu) loads a piece once and stores it to every peer, the reduce-scatter's and the chains' blocks push
# with all their threads: SM stores. Send/recv runs the all-to-all-v's kernel, but its rows keep the SM engine: they
# are graph mode's only rows on the push group, and moving them refits graph mode's launch and hop, which moves
# kModelTable's cut-offs (tests/bench/test_cost_model.py).


def pipelined(collective, n, mapped):
    """Pushes through FIFOs (NOTE [FIFO signal]), or the zero-copy kernels where the peers map the buffers."""
    f = (n - 1) / n
    if collective in ("reduce", "broadcast"):  # a chain to / from the root: one step to start, its hops overlapping
        return shape([("sm1", 1.0)], 1, fifo=1.0)
    if collective in ("reducescatter", "allgather"):
        return shape([("sm", f)], 2, fifo=0.0 if mapped else f)
    if collective == "alltoall":  # FIFOs fed by a split block's push group (NOTE [push group])
        return shape([("sm" if mapped else "push", f)], 2, fifo=0.0 if mapped else f)
    if collective == "sendrecv":
        return shape([("sm", 1.0)], 2, fifo=1.0)
    return None


def copy_engine(collective, n, mapped):
    """Copy engines: a copy per peer a step, between barrier kernels; into the peers' buffers where they map them,
    else as pairs into their pipeline areas, copied (or reduced) out there by SMs beside the next chunk."""
    f = (n - 1) / n
    out = 0.0 if mapped else 1.0
    if collective == "allreduce":  # pushes, reduced in the peer's output (NOTE [all-reduce pairs unpriced])
        return shape([("ce", 1.0)], 4, local=0.5) if n == 2 and mapped else None
    table = {
        "reduce": ([("ce", 1.0)], 1.0) if n == 2 else None,
        "reducescatter": ([("ce", f)], f) if n <= 4 else None,  # pairs; the table's rows stop at 4 ranks
        "allgather": ([("ce", f)], f * out) if mapped or n == 2 else None,
        "broadcast": ([("ce", 1.0)], out) if n == 2 else None,
        "alltoall": ([("ce", f)], f * out) if mapped or n <= 4 else None,
        "sendrecv": ([("ce", 1.0)], out),
    }
    entry = table.get(collective)
    return None if entry is None else shape(entry[0], 4, local=entry[1])


# NOTE [all-reduce pairs unpriced]
# On more than 2 ranks all-reduce's copy engines run as a reduce-scatter's pairs, then an all-gather's (links: 2 (N-1)/N
# of S by the engines, as much reduced or copied out locally, two phases of barriers). The model leaves them out of
# its choices until they have run captured in graphs on more than 2 ranks: priced, they win beyond 32 MiB at 5 to 8
# ranks, and kModelTable would take them there.
PROTOCOLS = {"ll": ll, "ll128": ll128, "oneshot": one_shot, "twoshot": two_shot, "staged": staged, "split": split,
             "pipelined": pipelined, "copyengine": copy_engine}


def movement(collective, algorithm, world, mapped):
    """The protocol's Shape, or None where it does not serve the collective at that world. mapped: the peers map
    the call's buffers (symmetric memory, or cudaMalloc buffers registered at capture: `buffers_of`)."""
    cost = PROTOCOLS.get(algorithm)
    return None if cost is None else cost(collective, world, mapped)


def features(machine, collective, algorithm, world, mapped, size):
    """The row of the least-squares system: (coefficients of launch, hop, 1/eta per engine; the local passes that
    overlap the links, us; those before the exchange, us)."""
    move = movement(collective, algorithm, world, mapped)
    if move is None:
        return None
    per_engine = dict.fromkeys(ENGINES, 0.0)
    for engine, factor in move.links:
        one_peer = engine == "sm1"  # SM stores to one peer only (a chain's next rank): the egress is not shared
        engine = "sm" if one_peer else engine
        rate = machine["ce" if engine == "ce" else "sm"] * WIRE[engine]  # the push group's stores are SM stores
        share = 1.0 if engine == "ce" or one_peer else egress_share(machine, world)
        per_engine[engine] += size * factor / (rate * share) * 1e-3  # us at eta = 1
    overlapped_us = size * max(move.local, move.fifo) / machine["local_copy"] * 1e-3
    serial_us = size * move.serial / machine["local_copy"] * 1e-3
    switched_steps = float(move.steps) if world > 2 else 0.0  # NOTE [switch hop]
    return [1.0, float(move.steps)] + [per_engine[e] for e in ENGINES] + [switched_steps], overlapped_us, serial_us


SWITCH = 2 + len(ENGINES)  # the switch hop's place in a parameter list: launch, hop, 1/eta per engine, switch hop


def time_of(params, row):
    """launch + steps * hop (+ steps * switch hop through a switch) + the passes before the exchange + the longer
    of the link time and the local passes that overlap it (a pipeline's)."""
    coefficients, overlapped_us, serial_us = row
    link_us = sum(c * p for c, p in zip(coefficients[2:SWITCH], params[2:SWITCH]))
    return (params[0] + coefficients[1] * params[1] + coefficients[SWITCH] * params[SWITCH] + serial_us +
            max(link_us, overlapped_us))


def predict_braid(params, machine, collective, algorithm, world, mapped, size):
    row = features(machine, collective, algorithm, world, mapped, size)
    return None if row is None else time_of(params, row)


# --- kTable, as the library reads it ------------------------------------------------------------------------------

def parse_table(path=TABLE):
    """The rows of selection.cpp's kModelTable, then kTable's, in the order the library tries them at 5 to 8 ranks:
    (collective, max_bytes, algorithm, symmetric_only, max_world, fp8_only, min_world)."""
    with open(path) as f:
        text = f.read()
    rows = []
    for table in ("kModelTable", "kTable"):  # selection.cpp consults the model's rows first where they serve
        rows += parse_rows(text, table)
    if not rows:
        raise SystemExit(f"cost_model.py: no rows of kTable found in {path}")
    return rows


def table_body(text, table):
    """The text of selection.cpp's array `table`, between its braces."""
    body = text[text.index(f"constexpr Row {table}[] = {{"):]
    return body[:body.index("\n};")]


def parse_rows(text, table):
    rows = []
    for match in re.finditer(r"\{Collective::(\w+),\s*([^,]+),\s*Algorithm::(\w+)((?:,\s*[^,}]+)*)\}",
                             table_body(text, table)):
        collective, size_text, algorithm, rest = match.groups()
        extras = [e.strip() for e in rest.split(",") if e.strip()]
        rows.append({"collective": CPP_COLLECTIVE[collective], "max_bytes": cpp_size(size_text),
                     "algorithm": CPP_ALGORITHM[algorithm],
                     "symmetric": len(extras) > 0 and extras[0] == "Buffers::kSymmetric",
                     "max_world": int(extras[1]) if len(extras) > 1 else 1 << 30,
                     "fp8": len(extras) > 2 and extras[2] == "Types::kFp8",
                     "min_world": int(extras[3]) if len(extras) > 3 else 1})
    return rows


def cpp_size(text):
    text = text.strip()
    if text == "SIZE_MAX":
        return 1 << 62
    match = re.fullmatch(r"size_t\((\d+)\)\s*<<\s*(\d+)", text)
    if not match:
        raise SystemExit(f"cost_model.py: cannot read the size {text!r} of a kTable row")
    return int(match.group(1)) << int(match.group(2))


def gate_open(collective, algorithm, world, mapped, engines=True):
    """The library's gates for a call out of place, multicast off, ranks as threads: the protocols `movement` knows
    at that world; engines: the copy engines reach the buffers (`buffers_of`)."""
    return (algorithm != "multicast" and (engines or algorithm != "copyengine") and
            movement(collective, algorithm, world, mapped) is not None)


def shipped(table, collective, size, world, mapped, fp8=False, engines=True):
    for row in table:
        if (row["collective"] == collective and size <= row["max_bytes"] and
                row["min_world"] <= world <= row["max_world"] and
                (not row["symmetric"] or mapped) and (not row["fp8"] or fp8) and
                gate_open(collective, row["algorithm"], world, mapped, engines)):
            return row["algorithm"]
    return "staged"


# NOTE [registered cudaMalloc buffers]
# Since automatic registration (AUTO_REGISTRATION), a call captured into a CUDA graph registers its cudaMalloc
# buffers and every peer maps them (docs/dev/registration.md): the graph rows on cudaMalloc buffers ran the zero-copy
# protocols, as the symmetric rows did (their times agree), and looked up kTable's symmetric rows (planner.cpp's
# table_key), but for broadcast, whose zero copy is the engines'. Ranks run as threads there, and the copy engines do
# not reach another GPU's cudaMalloc memory of the same process (gates_of: same_process_peers), but for the pairs
# into the communicator's own areas (reduce-scatter on 2 ranks, reduce, send/recv). Eager calls stay staged.
AUTO_REGISTRATION = "c8f687160995092e9370b395eb0d734d7aee4dbb"
ENGINE_PAIRS = ("reduce", "sendrecv")  # their engines' copies go into the peers' pipeline areas whatever the buffers


def registers(commit, cache={}):
    """Whether `commit` registers a captured call's cudaMalloc buffers (its history holds AUTO_REGISTRATION); true
    where the checkout cannot tell (today's library does)."""
    if commit not in cache:
        try:
            done = subprocess.run(["git", "-C", HERE, "merge-base", "--is-ancestor", AUTO_REGISTRATION, commit],
                                  capture_output=True)
            cache[commit] = done.returncode != 1
        except OSError:
            cache[commit] = True
    return cache[commit]


def buffers_of(collective, buffers, mode, commit, world):
    """(mapped: the peers map the buffers and the table's symmetric rows serve, engines: the copy engines' gate is
    open) for an archive row (NOTE [registered cudaMalloc buffers])."""
    if buffers == "symmetric":
        return True, True
    if mode == "graph" and registers(commit):
        engines = collective in ENGINE_PAIRS or (collective == "reducescatter" and world == 2)
        return collective != "broadcast", engines
    return False, True


def candidates(table, collective):
    return sorted({row["algorithm"] for row in table if row["collective"] == collective} - {"multicast"})


# --- the archive -------------------------------------------------------------------------------------------------

def load(path):
    with open(path) as f:
        return [row for row in (json.loads(line) for line in f if line.strip()) if row.get("kind") == "collective"]


def commit_order():
    """{commit: its place in the repository's history, oldest first}: rows of one date are ordered by it (a
    checkout without the history orders them by hash, which the dates then only approximate)."""
    try:
        out = subprocess.run(["git", "-C", HERE, "rev-list", "--all", "--reverse"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {commit: i for i, commit in enumerate(out.split())}


def points(rows, gpu, world, dtype):
    """{(impl, collective, buffers, mode): {bytes: median time us}}: newest_points without the commits."""
    return {key: {size: us for size, (us, _) in series.items()}
            for key, series in newest_points(rows, gpu, world, dtype).items()}


def newest_points(rows, gpu, world, dtype):
    """{(impl, collective, buffers, mode): {bytes: (median time us, commit)}}: each size's newest measurement, from
    runs that measured its key at 3 sizes from 1 MiB or more (a sweep, not a spot check). Runs of different size
    ranges (the eager 8 KiB-16 MiB rows beside the 32 MiB-512 MiB ones) add up."""
    large = collections.defaultdict(set)
    for row in rows:
        if row["bytes"] >= MiB:
            large[(row["gpu"], row["world"], row["dtype"], row["collective"], row["buffers"], row["mode"],
                   row["date"], row["commit"])].add(row["bytes"])
    newest = {}
    measured = collections.defaultdict(list)
    order = commit_order()
    for row in rows:
        if row["gpu"] != gpu or row["world"] != world or row["placement"] != "out-of-place" or row["dtype"] != dtype:
            continue
        if len(large[(gpu, world, dtype, row["collective"], row["buffers"], row["mode"], row["date"],
                      row["commit"])]) < 3:
            continue
        for impl in ("braid", "nccl"):
            us = row.get(f"{impl}_us")
            if us is None:
                continue
            point = (impl, row["collective"], row["buffers"], row["mode"], row["bytes"])
            stamp = (row["date"], order.get(row["commit"], -1), row["commit"])
            if point not in newest or stamp > newest[point]:
                newest[point] = stamp
            measured[(point, stamp)].append(us)
    out = collections.defaultdict(dict)
    for (point, stamp), us in measured.items():
        if stamp == newest[point]:
            out[point[:4]][point[4]] = (statistics.median(us), stamp[2])
    return dict(out)


def table_at(commit, today, cache={}):
    """The selection table (kModelTable, then kTable) of `commit`, which its rows ran; `today` where the
    checkout lacks that commit or its table cannot be read."""
    if commit not in cache:
        try:
            text = subprocess.run(["git", "-C", HERE, "show", f"{commit}:src/collectives/selection.cpp"],
                                  capture_output=True, text=True, check=True).stdout
            rows = []
            for name in ("kModelTable", "kTable"):
                if f"constexpr Row {name}[]" in text:
                    rows += parse_rows(text, name)
            cache[commit] = rows or today
        except (OSError, subprocess.CalledProcessError, KeyError, SystemExit):
            cache[commit] = today
    return cache[commit]


# --- fitting -----------------------------------------------------------------------------------------------------

def minimise(cost, start, steps):
    """Nelder-Mead: the point near `start` (initial simplex sides `steps`) where cost is least."""
    n = len(start)
    simplex = [list(start)] + [[x + (steps[i] if i == j else 0.0) for j, x in enumerate(start)] for i in range(n)]
    values = [cost(p) for p in simplex]
    for _ in range(4000):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centre = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centre, worst)]
        r = cost(reflected)
        if r < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centre, worst)]
            e = cost(expanded)
            simplex[-1], values[-1] = (expanded, e) if e < r else (reflected, r)
        elif r < values[-2]:
            simplex[-1], values[-1] = reflected, r
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centre, worst)]
            k = cost(contracted)
            if k < values[-1]:
                simplex[-1], values[-1] = contracted, k
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p)] for p in simplex[1:]]
                values = [values[0]] + [cost(p) for p in simplex[1:]]
        if max(values) - min(values) < 1e-12:
            break
    return simplex[min(range(n + 1), key=values.__getitem__)]


def fit_braid(series_by_key, table, machine, world, mode):
    """launch, hop and 1/eta per engine (eta: the share of the probe's rate a protocol reaches) for one mode, by
    least squares on the relative error; an engine no fitted row used keeps eta 1."""
    samples = []
    for (impl, collective, buffers, row_mode), series in series_by_key.items():
        if impl != "braid" or row_mode != mode or collective not in COLLECTIVES:
            continue
        for size, (us, commit) in series.items():
            mapped, engines = buffers_of(collective, buffers, mode, commit, world)
            algorithm = shipped(table_at(commit, table), collective, size, world, mapped, engines=engines)
            row = features(machine, collective, algorithm, world, mapped, size)
            if row is not None:
                samples.append((row, us))
    used = [any(row[0][2 + i] for row, _ in samples) for i in range(len(ENGINES))]

    def cost(params):
        if params[0] < 0 or params[1] < 0 or any(p <= 0 for p in params[2:SWITCH]):
            return float("inf")
        return sum(((time_of(params, row) - us) / us) ** 2 for row, us in samples)

    params = minimise(lambda p: cost(p + [0.0]), [5.0, 2.0] + [1.0] * len(ENGINES), [2.0, 1.0] + [0.3] * len(ENGINES))
    for i, engine_used in enumerate(used):
        if not engine_used:  # the push group's stores are SM stores: the SM's eta where no row tells them apart
            params[2 + i] = params[2] if ENGINES[i] == "push" and used[0] else 1.0
    return params + [0.0], len(samples)


# NOTE [switch hop]
# On 2 GPUs the ranks reach each other over one direct link; on the larger hosts every byte and every signal goes
# through the host's NVLink switch, and no probe has timed a barrier or a signal there. So a step costs
# switch_hop more where the world is above 2, fitted per mode (the 2-rank parameters held) on the switched
# machine's rows below 1 MiB, where latency is most of the time. The error is stated on that machine's rows from
# 1 MiB up, which the fit never sees. 8 ranks reuse it: the switch is one hop whatever the world.
def fit_switch_hop(params, series_by_key, table, machine, world, mode):
    """params with the switch hop fitted on the rows below 1 MiB of one switched world (least squares on the
    relative error); (params, rows fitted)."""
    samples = []
    for (impl, collective, buffers, row_mode), series in series_by_key.items():
        if impl != "braid" or row_mode != mode or collective not in COLLECTIVES:
            continue
        for size, (us, commit) in series.items():
            if size >= MiB:
                continue
            mapped, engines = buffers_of(collective, buffers, mode, commit, world)
            algorithm = shipped(table_at(commit, table), collective, size, world, mapped, engines=engines)
            row = features(machine, collective, algorithm, world, mapped, size)
            if row is not None:
                samples.append((row, us))
    if not samples:
        return params, 0

    def cost(point):
        if point[0] < 0:
            return float("inf")
        return sum(((time_of(params[:SWITCH] + point, row) - us) / us) ** 2 for row, us in samples)

    return params[:SWITCH] + minimise(cost, [1.0], [0.5]), len(samples)


def fit_nccl(series, collective, world, machine):
    """(alpha us, busbw GB/s) of T = alpha + S * factor / busbw, least squares on the relative error from 1 MiB."""
    large = [(s, t) for s, t in series.items() if s >= MiB]
    small = [t for s, t in series.items() if s <= 64 * 1024]
    if len(large) < 2:
        return None
    factor = bus_factor(collective, world) / nccl_share(machine, collective, world)
    a11 = a12 = a22 = b1 = b2 = 0.0
    for s, t in large:
        u, v = 1.0 / t, s * factor / t
        a11 += u * u; a12 += u * v; a22 += v * v; b1 += u; b2 += v
    det = a11 * a22 - a12 * a12
    alpha, k = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
    if k <= 0:
        return None
    if alpha <= 0 and small:
        alpha = statistics.median(small)
    return alpha, 1e-3 / k


def predict_nccl(model, machine, collective, world, size):
    alpha, busbw = model
    return alpha + size * bus_factor(collective, world) / (busbw * nccl_share(machine, collective, world)) * 1e-3


# --- the model's choices -----------------------------------------------------------------------------------------

SIZES = [1 << e for e in range(13, 30)]  # 8 KiB .. 512 MiB


def choice(params, machine, table, collective, world, mapped, size):
    best = None
    for algorithm in candidates(table, collective):
        if not gate_open(collective, algorithm, world, mapped):
            continue
        t = predict_braid(params, machine, collective, algorithm, world, mapped, size)
        if t is not None and (best is None or t < best[1]):
            best = (algorithm, t)
    return best


def model_rows(params, machine, table, world):
    """kTable rows for `world` ranks: per collective, the LL cut-off from the call alone (LL rows never depend on
    the buffers: docs/dev/protocol.md), then the choice on symmetric buffers and on any buffer as runs of sizes
    (the symmetric rows left out where they are the any-buffer rows)."""
    rows = []
    for collective in COLLECTIVES:
        lls = [a for a in ("ll", "ll128") if a in candidates(table, collective)]
        ll_limit = 0
        for size in SIZES:  # the largest size through which an LL protocol wins on both buffer kinds
            picks = [choice(params, machine, table, collective, world, mapped, size) for mapped in (False, True)]
            if all(p is not None and p[0] in lls for p in picks) and picks[0][0] == picks[1][0]:
                ll_limit = size
                ll_algorithm = picks[0][0]
            else:
                break
        if ll_limit:
            rows.append((collective, ll_limit, ll_algorithm, False))
        runs_by_buffers = {}
        for mapped in (True, False):
            runs = []
            for size in SIZES:
                if size <= ll_limit:
                    continue
                pick = choice(params, machine, table, collective, world, mapped, size)
                algorithm = pick[0] if pick else "pipelined"
                if algorithm in lls:
                    algorithm = min((a for a in candidates(table, collective) if a not in lls and
                                     gate_open(collective, a, world, mapped)),
                                    key=lambda a: predict_braid(params, machine, collective, a, world, mapped, size))
                if runs and runs[-1][1] == algorithm:
                    runs[-1][0] = size
                else:
                    runs.append([size, algorithm])
            if runs:
                runs[-1][0] = None  # the last run serves every larger size
            runs_by_buffers[mapped] = runs
        for mapped in (True, False):
            if mapped and runs_by_buffers[True] == runs_by_buffers[False]:
                continue  # symmetric calls take the same rows for any buffer
            for limit, algorithm in runs_by_buffers[mapped]:
                rows.append((collective, limit, algorithm, mapped))
    return rows


def cpp_size_text(limit):
    if limit is None:
        return "SIZE_MAX"
    return f"size_t({limit // MiB}) << 20" if limit >= MiB and limit % MiB == 0 else f"size_t({limit >> 10}) << 10"


def table_rows(params, machine, table):
    """kModelTable's rows, in C++: per collective, the model's rows of each world of TABLE_WORLDS, with a multicast
    row after the LL rows where kTable has multicast for the collective (as in kTable's rows for every world, so
    that multicast keeps serving where BRAID_ENABLE_MULTICAST opened it). Where every world has as many rows, the
    i-th rows of neighbouring worlds that are equal become one row for that range of worlds; else each run of
    worlds with equal rows keeps its own. Either way a world's rows, filtered from these, are its own in order."""
    names = {v: k for k, v in CPP_COLLECTIVE.items()}
    algorithms = {v: k for k, v in CPP_ALGORITHM.items()}

    def rows_of(world, collective):
        rows = []
        for row in model_rows(params, machine, table, world):
            if row[0] != collective:
                continue
            if (collective in MULTICAST_COLLECTIVES and row[2] not in ("ll", "ll128") and
                    not any(r[2] == "multicast" for r in rows)):
                rows.append((collective, None, "multicast", False))
            rows.append(row)
        return rows

    def runs(worlds, same):  # neighbouring worlds for which same(first world, world) holds, as [first, last]
        out = []
        for world in worlds:
            if out and same(out[-1][0], world):
                out[-1][1] = world
            else:
                out.append([world, world])
        return out

    def line(row, first, last):
        collective, limit, algorithm, mapped = row
        buffers = "Buffers::kSymmetric" if mapped else "Buffers::kAny"
        return (f"    {{Collective::{names[collective]}, {cpp_size_text(limit)}, Algorithm::{algorithms[algorithm]}, "
                f"{buffers}, {last}, Types::kAny, {first}}},")

    lines = []
    for collective in TABLE_COLLECTIVES:
        per_world = {world: rows_of(world, collective) for world in TABLE_WORLDS}
        if len({len(rows) for rows in per_world.values()}) == 1:
            for i in range(len(per_world[TABLE_WORLDS.start])):
                for first, last in runs(TABLE_WORLDS, lambda a, b: per_world[a][i] == per_world[b][i]):
                    lines.append(line(per_world[first][i], first, last))
        else:
            for first, last in runs(TABLE_WORLDS, lambda a, b: per_world[a] == per_world[b]):
                lines += [line(row, first, last) for row in per_world[first]]
    return lines


def fitted_model(archive, table_path, fit, fit_world, dtype, switched=SWITCHED):
    """(machine, kTable, braid's parameters by mode, rows fitted by mode, NCCL's models, the archive's points).
    switched: (machine kind, world) whose rows below 1 MiB fit the switch hop (NOTE [switch hop]), or None."""
    machine = machine_of(fit)
    table = parse_table(table_path)
    rows = load(archive)
    fitted = newest_points(rows, fit, fit_world, dtype)
    params, counts = {}, {}
    for mode in ("graph", "eager"):
        params[mode], counts[mode] = fit_braid(fitted, table, machine, fit_world, mode)
        if switched is not None:
            switched_rows = newest_points(rows, switched[0], switched[1], dtype)
            params[mode], switch_count = fit_switch_hop(params[mode], switched_rows, table, machine, switched[1], mode)
            counts[mode] = (counts[mode], switch_count)
        else:
            counts[mode] = (counts[mode], 0)
    nccl = {}
    for (impl, collective, buffers, mode), series in points(rows, fit, fit_world, dtype).items():
        if impl == "nccl":
            model = fit_nccl(series, collective, fit_world, machine)
            if model is not None:
                nccl[(collective, buffers, mode)] = model
    return machine, table, params, counts, nccl, rows


def table_block(text):
    """The generated rows' lines in selection.cpp's text, between CPP_BEGIN and CPP_END."""
    if CPP_BEGIN not in text or CPP_END not in text:
        raise SystemExit("cost_model.py: selection.cpp lacks the markers of the model's rows")
    return text[text.index(CPP_BEGIN) + len(CPP_BEGIN) + 1:text.index(CPP_END)].splitlines()


# --- report ------------------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archive", default=ARCHIVE)
    parser.add_argument("--table", default=TABLE, help="selection.cpp, whose kTable gives braid's protocols")
    parser.add_argument("--fit", default="nvidia-h200-x2", help="machine kind whose rows fit the model")
    parser.add_argument("--fit-world", type=int, default=2)
    parser.add_argument("--check", default="nvidia-h200-x4", help="machine kind whose rows check it")
    parser.add_argument("--check-world", type=int, default=4)
    parser.add_argument("--worlds", default="4,8", help="worlds to print predictions for")
    parser.add_argument("--dtype", default="bfloat16", help="the rows' datatype")
    parser.add_argument("--doc", help="rewrite the cost model's section of this markdown file")
    parser.add_argument("--write-table", action="store_true",
                        help="rewrite kModelTable, the rows for 5 to 8 ranks, in --table with the model's, and stop")
    args = parser.parse_args()

    machine, table, params, counts, nccl, rows = fitted_model(args.archive, args.table, args.fit, args.fit_world,
                                                              args.dtype)
    if args.write_table:
        with open(args.table) as f:
            text = f.read()
        table_block(text)  # the markers are there
        generated = "\n".join(table_rows(params["graph"], machine, table))
        text = text[:text.index(CPP_BEGIN) + len(CPP_BEGIN) + 1] + generated + "\n" + text[text.index(CPP_END):]
        with open(args.table, "w") as f:
            f.write(text)
        print(f"cost_model.py: wrote the model's rows for {TABLE_WORLDS.start} to {TABLE_WORLDS.stop - 1} ranks "
              f"into {args.table}")
        return 0
    checked = newest_points(rows, args.check, args.check_world, args.dtype)

    lines = [BEGIN, "", "## The cost model's parameters and error (`bench/cost_model.py`)", "",
             f"Fitted on {args.fit} ({args.fit_world} ranks), its switch hop on {SWITCHED[0]}'s rows below 1 MiB "
             f"({SWITCHED[1]} ranks), checked on {args.check} ({args.check_world} ranks), "
             f"{args.dtype}, out of place, the newest commit of each row (NOTE [cost model] in the script says what "
             "the model is and leaves out). Error: |predicted - measured| / measured over the checked rows from "
             "1 MiB up (rows the switch hop's fit never sees).", "",
             "braid's parameters (eta: the share of the probe's rate a protocol's engine reaches; switch hop: what "
             "a step adds through the switch, NOTE [switch hop]):", "",
             "| mode | rows fitted | launch (us) | hop (us) | " + " | ".join(f"eta {e}" for e in ENGINES) +
             " | switch hop (us) | its rows |",
             "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in ENGINES) + " | ---: | ---: |"]
    for mode in ("graph", "eager"):
        p = params[mode]
        etas = " | ".join(f"{1.0 / x:.2f}" if x > 0 else "-" for x in p[2:SWITCH])
        lines.append(f"| {mode} | {counts[mode][0]} | {p[0]:.1f} | {p[1]:.1f} | {etas} | {p[SWITCH]:.1f} | "
                     f"{counts[mode][1]} |")
    lines += ["", "| impl | collective | buffers | mode | protocols the rows ran | rows | median error | max error |",
              "| --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    errors_by_impl = collections.defaultdict(list)
    for key in sorted(checked):
        impl, collective, buffers, mode = key
        if collective not in COLLECTIVES:
            continue
        errors, protocols = [], set()
        for size, (t, commit) in sorted(checked[key].items()):
            if size < MiB:
                continue
            if impl == "braid":  # the protocol the row ran: its commit's table's choice
                mapped, engines = buffers_of(collective, buffers, mode, commit, args.check_world)
                algorithm = shipped(table_at(commit, table), collective, size, args.check_world, mapped,
                                    engines=engines)
                protocols.add(algorithm)
                p = predict_braid(params[mode], machine, collective, algorithm, args.check_world, mapped, size)
            else:
                model = nccl.get((collective, buffers, mode))
                p = predict_nccl(model, machine, collective, args.check_world, size) if model else None
            if p is not None:
                errors.append(abs(p - t) / t)
        if not errors:
            continue
        errors_by_impl[impl] += errors
        lines.append(f"| {impl} | {collective} | {buffers} | {mode} | {', '.join(sorted(protocols)) or '-'} | "
                     f"{len(errors)} | {statistics.median(errors):.0%} | {max(errors):.0%} |")
    lines.append("")
    for impl in ("braid", "nccl"):
        e = errors_by_impl[impl]
        if e:
            within = sum(x <= 0.15 for x in e) / len(e)
            lines.append(f"- {impl}: {len(e)} checked rows, median error {statistics.median(e):.0%}, "
                         f"{within:.0%} within 15 %, largest {max(e):.0%}.")
    worlds = [int(w) for w in args.worlds.split(",") if w]
    sizes = [MiB, 16 * MiB, 256 * MiB]
    lines += ["", "Predicted times (us), graph mode, out of place: braid's fastest protocol (its name) / NCCL:", "",
              "| collective | buffers | " + " | ".join(f"{w} ranks, {s // MiB} MiB" for w in worlds for s in sizes) + " |",
              "| --- | --- | " + " | ".join("---:" for _ in worlds for _ in sizes) + " |"]
    for collective in COLLECTIVES:
        for buffers in ("cudaMalloc", "symmetric"):
            mapped = buffers == "symmetric"
            cells = []
            for w in worlds:
                for s in sizes:
                    best = choice(params["graph"], machine, table, collective, w, mapped, s)
                    model = nccl.get((collective, buffers, "graph"))
                    theirs = f"{predict_nccl(model, machine, collective, w, s):.0f}" if model else "-"
                    cells.append(f"{best[1]:.0f} {best[0]} / {theirs}" if best else f"- / {theirs}")
            lines.append(f"| {collective} | {buffers} | " + " | ".join(cells) + " |")
    lines += ["", "The model's rows for the worlds the archive has none of (graph mode; first matching row wins, as in "
              "kTable; sizes up to and including the limit):", "",
              "| ranks | collective | buffers | up to | protocol |", "| ---: | --- | --- | ---: | --- |"]
    for world in MODEL_WORLDS:
        for collective, limit, algorithm, mapped in model_rows(params["graph"], machine, table, world):
            buffers = "symmetric" if mapped else "any"
            limit_text = "any size" if limit is None else (f"{limit // MiB} MiB" if limit >= MiB else f"{limit >> 10} KiB")
            lines.append(f"| {world} | {collective} | {buffers} | {limit_text} | {algorithm} |")
    lines += ["", END]
    text = "\n".join(lines) + "\n"
    if args.doc:
        with open(args.doc) as f:
            doc = f.read()
        if BEGIN in doc and END in doc:
            doc = doc[:doc.index(BEGIN)] + text + doc[doc.index(END) + len(END) + 1:]
        else:
            doc = doc.rstrip("\n") + "\n\n" + text
        with open(args.doc, "w") as f:
            f.write(doc)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
