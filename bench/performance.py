#!/usr/bin/env python3
"""Writes docs/performance.md and its plots (docs/img/performance-*.png) from the results archive.

    bench/performance.py            the page and the plots (needs matplotlib: pip install matplotlib)
    bench/performance.py --no-plots the page alone
    bench/performance.py --check    exit 1 when docs/performance.md is not what the archive gives

For each machine kind, the page shows the newest measurement of every point (collective, datatype, size,
buffer kind, graph or eager): tables per collective and buffer kind against NCCL, the goals of
bench/performance_goals.json met or missed, and MoE dispatch and combine.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import archive  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "performance.md")
GOAL_NOTES = os.path.join(ROOT, "docs", "dev", "performance-goals.md")
IMAGES = os.path.join(ROOT, "docs", "img")
GOALS = os.path.join(HERE, "performance_goals.json")

COLLECTIVES = ["allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv"]
TITLES = {"allreduce": "All-reduce", "allgather": "All-gather", "reducescatter": "Reduce-scatter",
          "alltoall": "All-to-all", "broadcast": "Broadcast", "reduce": "Reduce", "sendrecv": "Send/recv"}
EXPOSED_AT_FIRST_USE = "vmm, exposed at first use (eager zero copy)"
BUFFERS = ["cudaMalloc", "registered", "symmetric", "vmm", "registered, eager zero copy", EXPOSED_AT_FIRST_USE]


def buffers_of(row):
    """The buffer kind a row's table is for: rows with BRAID_EAGER_ZERO_COPY=1 have their own, registered buffers
    apart from the unregistered VMM buffers the switch exposes at their first use."""
    if not row.get("eager_zero_copy"):
        return row["buffers"]
    return "registered, eager zero copy" if row["buffers"] == "registered" else EXPOSED_AT_FIRST_USE
# The machine kinds the goals are stated for come first; the rest follow by name.
PREFERRED = ["nvidia-h100-x2", "nvidia-h200-x2"]
# Small calls are measured in CUDA graphs up to this size, large ones eagerly (dev/performance_run.sh).
GRAPH_MAX_BYTES = 16 << 20


def size_name(n):
    n = int(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def torch_settings(row):
    """What both runs of a torch row had set, as the page names it."""
    names = (("eager_zero_copy", "switch"), ("allocator_hook", "hook"), ("expandable_segments", "expandable"))
    return ", ".join(name for field, name in names if row.get(field)) or "none"


def point_key(row):
    if row["kind"] == "floor":
        return (row["gpu"], row["world"], "floor", row["collective"])
    if row["kind"] == "torch":
        return (row["gpu"], row["world"], "torch", row["collective"], row.get("width"), row.get("layers"),
                row.get("batch"), row.get("steps"), torch_settings(row))
    if row["kind"] == "fused_matmul":
        return (row["gpu"], row["world"], "fused_matmul", row["collective"], row["dtype"], row["m"], row["k"], row["n"],
                row["mode"], row.get("algorithm", "pieces"))
    if row["kind"] == "moe":
        return (row["gpu"], row["world"], "moe", row["collective"], row["layout"], row["dtype"], row["tokens"],
                row["hidden"], row["top_k"], row["experts"], row["mode"], row.get("max_sms", 0))
    return (row["gpu"], row["world"], "collective", row["collective"], row["dtype"], row["op"], row["bytes"],
            row["buffers"], row["mode"], row["placement"], row.get("eager_zero_copy", False), row.get("memory"))


def newest(rows):
    """The newest row of every point: later dates win, and on one date the later line of the archive (the archive
    files the runs of one date in the order of their builds)."""
    best = {}
    for row in rows:
        key = point_key(row)
        if key not in best or row["date"] >= best[key]["date"]:
            best[key] = row
    return list(best.values())


def matches(row, select):
    for field, want in select.items():
        if field == "bytes_min":
            if row["bytes"] < want:
                return False
        elif field == "bytes_max":
            if row["bytes"] > want:
                return False
        elif row.get(field) != want:
            return False
    return True


def fmt(value, digits=1):
    return "–" if value is None else f"{value:.{digits}f}"


def short(commit):
    return commit[:7]


def provenance(rows):
    pairs = sorted({(r["date"], short(r["commit"])) for r in rows})
    return ", ".join(f"{commit} ({date})" for date, commit in pairs)


def goal_results(goal, rows):
    """(label, measured text, met) for each group the goal's rows fall in; nothing when none was measured."""
    selected = [r for r in rows if matches(r, goal["select"])]
    groups = {}
    for row in selected:
        per = goal.get("per")
        label = (buffers_of(row) if per == "buffers" else row.get(per)) if per else ""
        groups.setdefault(label, []).append(row)
    results = []
    for label, group in sorted(groups.items()):
        kind = goal["kind"]
        if kind == "max":
            worst = max(group, key=lambda r: r["braid_us"])
            results.append((label, f"{worst['braid_us']:.2f} µs", worst["braid_us"] <= goal["value"], group))
        elif kind == "min":
            worst = min(group, key=lambda r: r["braid_busbw_gbs"])
            best = max(group, key=lambda r: r["braid_busbw_gbs"])
            low, high = f"{worst['braid_busbw_gbs']:.0f}", f"{best['braid_busbw_gbs']:.0f}"
            text = (low if low == high else f"{low}–{high}") + " GB/s"
            results.append((label, text, worst["braid_busbw_gbs"] >= goal["value"], group))
        elif kind == "nccl":
            compared = [r for r in group if r["nccl_us"] is not None]
            if not compared:
                continue
            slower = [r for r in compared if r["braid_us"] > r["nccl_us"]]
            worst = max(compared, key=lambda r: r["braid_us"] / r["nccl_us"])
            text = f"{len(compared) - len(slower)} of {len(compared)} points faster; worst braid/NCCL time " \
                   f"{worst['braid_us'] / worst['nccl_us']:.2f}"
            results.append((label, text, not slower, compared))
        elif kind == "slower_than_none":
            others = [r for r in rows if matches(r, goal["other"])]
            if not others:
                continue
            mine, other = group[0], others[0]
            text = f"{mine['braid_us']:.1f} µs against {other['braid_us']:.1f} µs"
            results.append((label, text, mine["braid_us"] <= other["braid_us"], [mine, other]))
        else:
            raise SystemExit(f"performance: goal {goal['name']!r} has an unknown kind {kind!r}")
    return results


def goal_target(goal):
    return {"max": lambda g: f"≤ {g['value']:g} µs", "min": lambda g: f"≥ {g['value']:g} GB/s busbw",
            "nccl": lambda g: "no slower than NCCL", "slower_than_none": lambda g: "no slower"}[goal["kind"]](goal)


def collective_table(rows):
    lines = ["| size | mode | braid µs | NCCL µs | braid/NCCL time | braid busbw GB/s | NCCL busbw GB/s |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["bytes"], r["mode"])):
        ratio = r["braid_us"] / r["nccl_us"] if r["nccl_us"] else None
        lines.append(f"| {size_name(r['bytes'])} | {r['mode']} | {fmt(r['braid_us'], 2)} | {fmt(r['nccl_us'], 2)} | "
                     f"{fmt(ratio, 2)} | {fmt(r['braid_busbw_gbs'])} | {fmt(r['nccl_busbw_gbs'])} |")
    return lines


def moe_table(rows):
    lines = ["| T | layout | dispatch type | E | phase | braid µs | NCCL path µs | braid/NCCL | braid NVLink GB/s |",
             "|---:|---|---|---:|---|---:|---:|---:|---:|"]
    order = {"moe-dispatch": 0, "moe-combine": 1, "moe-layer": 2}
    for r in sorted(rows, key=lambda r: (r["experts"], r["dtype"], r["layout"], r["tokens"], order[r["collective"]])):
        ratio = r["braid_us"] / r["nccl_us"] if r["nccl_us"] else None
        lines.append(f"| {r['tokens']} | {r['layout']} | {r['dtype']} | {r['experts']} | {r['collective'][4:]} | "
                     f"{fmt(r['braid_us'])} | {fmt(r['nccl_us'])} | {fmt(ratio, 2)} | {fmt(r['braid_nvlink_gbs'])} |")
    return lines


def at_a_glance(current, kinds):
    """Per machine kind, world and mode: how many points braid is faster or slower than NCCL at, and the worst."""
    lines = ["## At a glance", "",
             "Every collective point measured with NCCL beside braid (all collectives, sizes, buffer kinds, "
             "datatypes, out of place): how many braid is faster at, how many slower, and the slowest braid/NCCL "
             "time ratio, named. A ratio below 1 is braid faster.", "",
             "| GPUs | ranks | mode | points | braid faster | braid slower | median braid/NCCL | worst point |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for gpu in kinds:
        for world in sorted({r["world"] for r in current if r["gpu"] == gpu}):
            for mode in ("graph", "eager"):
                points = [r for r in current if r["gpu"] == gpu and r["world"] == world and r["kind"] == "collective"
                          and r["mode"] == mode and r["placement"] == "out-of-place" and r.get("nccl_us")
                          and r.get("braid_us")]
                if not points:
                    continue
                ratios = sorted(r["braid_us"] / r["nccl_us"] for r in points)
                worst = max(points, key=lambda r: r["braid_us"] / r["nccl_us"])
                slower = sum(ratio > 1 for ratio in ratios)
                what = (f"{worst['braid_us'] / worst['nccl_us']:.2f}: {TITLES[worst['collective']].lower()} "
                        f"{size_name(worst['bytes'])} {worst['dtype']}, {worst['buffers']}")
                lines.append(f"| {gpu} | {world} | {mode} | {len(points)} | {len(points) - slower} | {slower} | "
                             f"{ratios[len(ratios) // 2]:.2f} | {what} |")
    return lines + [""]


def bench_flag_size(n):
    for scale, unit in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def launch_of(row):
    """How a row's ranks ran: "processes" (braid-run) or "threads" (braid-bench -t). Rows without the field ran as
    threads, but for buffers exposed at their first use, timed as processes, where the large calls exchange on the
    host."""
    return row.get("launch") or ("processes" if buffers_of(row) == EXPOSED_AT_FIRST_USE else "threads")


def bench_lines(rows, world):
    """The braid-bench command behind each run of one table's rows (one collective, buffer kind and datatype):
    one per mode, graph length and launch kind (threads or processes)."""
    lines = []
    for mode in ("graph", "eager"):
        runs = sorted({(r["graph_calls"], launch_of(r)) for r in rows if r["mode"] == mode})
        for calls, launch_kind in runs:
            mine = [r for r in rows if r["mode"] == mode and r["graph_calls"] == calls and launch_of(r) == launch_kind]
            r = mine[0]
            graph = f"-G {calls}" if mode == "graph" else "-G 0"
            op = f" -o {r['op']}" if r["op"] not in ("none", "sum") else ""
            root = f" -r {r['root']}" if r.get("root", -1) > 0 else ""
            sizes = sorted({x["bytes"] for x in mine})
            what = f"{'Graph' if mode == 'graph' else 'Eager'} rows {size_name(sizes[0])} to {size_name(sizes[-1])}"
            memory = "--vmm 1 " if r["buffers"] == "vmm" or r.get("memory") == "vmm" else ""
            register = "--register 1 " if r["buffers"] == "registered" else ""
            switch = "BRAID_EAGER_ZERO_COPY=1 " if r.get("eager_zero_copy") else ""
            launch = f"braid-run -n {world} braid-bench" if launch_kind == "processes" else f"braid-bench -t {world}"
            lines += [f"{what}: `{switch}{launch} --coll {r['collective']} -d {r['dtype']}{op}{root} "
                      f"-b {bench_flag_size(sizes[0])} -e {bench_flag_size(sizes[-1])} -f 2 {graph} "
                      f"--inplace {1 if r['placement'] == 'in-place' else 0} "
                      f"--symmetric {1 if r['buffers'] == 'symmetric' else 0} {memory}{register}--compare nccl`", ""]
    return lines[:-1]


def fused_table(rows):
    """One line per fused GEMM + collective shape: braid's fused call against its parts and the alternatives."""
    lines = ["| call | M | K | N | mode | braid µs | GEMM alone µs | collective alone µs | NCCL then cuBLAS µs "
             "| torch µs | NCCL serial / braid |", "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["collective"], r["m"], r["k"], r["n"], r["mode"], r.get("algorithm", ""))):
        algorithm = r.get("algorithm", "pieces")
        call = r["collective"] + ("" if algorithm == "pieces" else f" ({algorithm})")
        lines.append(f"| {call} | {r['m']} | {r['k']} | {r['n']} | {r['mode']} | {fmt(r['braid_us'])} | "
                     f"{fmt(r['gemm_us'])} | {fmt(r['comm_us'])} | {fmt(r['nccl_serial_us'])} | {fmt(r['torch_us'])} "
                     f"| {r['nccl_serial_us'] / r['braid_us']:.2f} |")
    return lines


def torch_steps(current, kinds):
    """PyTorch training steps through the NCCL shim beside torch's own NCCL, per machine kind and world."""
    rows = [r for r in current if r["kind"] == "torch"]
    if not rows:
        return []
    lines = ["## PyTorch training through the NCCL shim", "",
             "torch.distributed (backend \"nccl\") with braid's NCCL shim preloaded against torch's own NCCL, on the "
             "same GPUs: an MLP of Linear + GELU layers (float32; the model column: width x layers, batch, timed "
             "steps; 1024 x 4, batch 64, 20 steps where the run did not print it), plain SGD, trained with DDP, with "
             "FSDP2 (`fully_shard` per layer), with FSDP2 whose collectives' buffers come from the process group's "
             "allocator (`set_allocate_memory_from_process_group_for_comm(True)`: `ncclMemAlloc` memory, registered) "
             "and with DDP around a `torch.compile`'d forward and loss (10 steps). "
             "Rank 0's mean time per step, after 3 warm-up steps. Settings, what both runs had set: switch "
             "`BRAID_EAGER_ZERO_COPY=1`, hook `TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1`, expandable "
             "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` ([nccl-shim.md](nccl-shim.md)). Measured with "
             "`nccl_shim/tests/run_torch_check.sh NGPUS OUT_DIR build/nccl_shim/libnccl.so.2` (`TORCH_CHECK_ARGS` "
             "sets the model), which also checks that both runs' losses and parameters agree.", "",
             "| GPUs | ranks | torch | model | settings | training | shim ms/step | NCCL ms/step | shim/NCCL "
             "| commit |",
             "|---|---:|---|---|---|---|---:|---:|---:|---|"]
    order = {"ddp": 0, "fsdp2": 1, "fsdp2pg": 2, "compile": 3}
    names = {"ddp": "DDP", "fsdp2": "FSDP2", "fsdp2pg": "FSDP2, buffers from the process group",
             "compile": "DDP, compiled"}
    for gpu in kinds:
        def model(r):
            return (r.get("width") or 1024, r.get("layers") or 4, r.get("batch") or 64, r.get("steps") or 20)

        for r in sorted((r for r in rows if r["gpu"] == gpu),
                        key=lambda r: (r["world"], model(r), torch_settings(r),
                                       order.get(r["collective"], 9))):
            width, layers, batch, steps = model(r)
            lines.append(f"| {gpu} | {r['world']} | {r['torch']} | {width} x {layers}, batch {batch}, {steps} steps | "
                         f"{torch_settings(r)} | {names.get(r['collective'], r['collective'])} | "
                         f"{r['braid_ms']:.2f} | {r['nccl_ms']:.2f} | {r['braid_ms'] / r['nccl_ms']:.2f} | "
                         f"{short(r['commit'])} ({r['date']}) |")
    return lines + [""]


def image_name(gpu, what):
    return f"performance-{gpu}-{what}.png"


def page(rows, goals):
    current = newest(rows)
    kinds = sorted({r["gpu"] for r in current}, key=lambda k: (PREFERRED.index(k) if k in PREFERRED else 99, k))
    out = ["# Performance", "",
           "<!-- Written by bench/performance.py from bench/results/archive.jsonl: edit those, not this page. -->", "",
           "braid against NCCL on the same GPUs, data and buffers, measured by `braid-bench` with NCCL's library "
           "loaded beside braid (`--compare nccl`). Times are per call: CUDA events around a run of calls after a "
           "warm-up, the median of five runs on each rank, the slowest rank's median. Small messages run as CUDA "
           "graphs of 20 calls (`-G 20`), large ones eagerly (and, in the graph tables, as CUDA graphs of 2 calls). Bus bandwidth (busbw) is nccl-tests': the data a rank "
           "must move over its links per second, comparable across collectives and world sizes.", "",
           "Each table shows the newest measurement of every point (the newest build where two were measured on "
           "one date) with the commit and date it was taken at, and gives the command of each of its runs. "
           "To measure on your own GPUs: [bench/README.md](../bench/README.md) (`braid-bench --compare nccl`, "
           "with `-G 20` for the graph rows through 16 MiB, `-G 2` for the larger graph rows, and `--symmetric 1` "
           "for the symmetric ones). The archive's runs are "
           "filed with `bench/archive.py add --gpu <kind> <files>`, and `bench/performance.py` writes this page.", ""]
    out += at_a_glance(current, kinds)
    out += torch_steps(current, kinds)
    out += ["## Goals", "",
            "| goal | target | GPUs | measured | met |", "|---|---|---|---|---|"]
    missed = []
    for goal in goals:
        for gpu in kinds:
            mine = [r for r in current if r["gpu"] == gpu and r["kind"] != "torch"]
            for label, text, met, group in goal_results(goal, mine):
                name = goal["name"] + (f" ({label})" if label else "")
                out.append(f"| {name} | {goal_target(goal)} | {gpu} | {text} | {'yes' if met else '**no**'} |")
                reason = goal.get("reason")
                if isinstance(reason, dict):  # one per value of `per`
                    reason = reason.get(label)
                if isinstance(reason, dict):  # one per machine kind, "other" for the rest
                    reason = reason.get(gpu, reason.get("other"))
                if not met and reason:
                    missed.append((name, gpu, reason))
    out.append("")
    notes = ["# Performance goals that are missed, and why", "",
             "<!-- Written by bench/performance.py from bench/performance_goals.json and the archive. -->", "",
             "The goals of [the performance page](../performance.md) marked **no**, each with what keeps it from "
             "being met.", ""]
    if missed:
        out += ["Why the goals marked **no** are missed: [dev/performance-goals.md](dev/performance-goals.md).", ""]
        for name, gpu, reason in missed:
            notes.append(f"- {name}, {gpu}: {reason}")
    else:
        notes.append("Every goal is met.")
    notes_text = "\n".join(notes).rstrip() + "\n"
    floors = [r for r in current if r["kind"] == "floor"]
    if floors:
        out += ["## The floor under a small call", "",
                "What a CUDA graph node costs before any data moves (`bench/probes/graph_floor.cu`, outside braid): "
                "an empty kernel node, and a node whose kernel stores a flag into the peer's memory and waits for the "
                "peer's flag (one NVLink round trip), as every 2-rank collective does at least once. Per node, in "
                "graphs of 20 nodes.", "",
                "| GPUs | case | µs per node | commit |", "|---|---|---:|---|"]
        for r in sorted(floors, key=lambda r: (r["gpu"], r["collective"])):
            out.append(f"| {r['gpu']} | {r['collective']} | {r['braid_us']:.2f} | {short(r['commit'])} ({r['date']}) |")
        out.append("")
    for gpu in kinds:
        mine = [r for r in current if r["gpu"] == gpu and r["kind"] not in ("floor", "torch")]
        names = sorted({r["gpu_name"] for r in mine if r.get("gpu_name")})
        out += [f"## {gpu}: {', '.join(names)}", ""]
        for world in sorted({r["world"] for r in mine}):
            here = [r for r in mine if r["world"] == world]
            colls = [c for c in COLLECTIVES if any(r["kind"] == "collective" and r["collective"] == c for r in here)]
            for coll in colls:
                out += [f"### {TITLES[coll]}, {world} ranks", ""]
                out += [f"![{TITLES[coll]} on {gpu}](img/{image_name(gpu, f'{coll}-{world}')})", ""]
                for buffers in BUFFERS:
                    table = [r for r in here if r["kind"] == "collective" and r["collective"] == coll
                             and buffers_of(r) == buffers]
                    if not table:
                        continue
                    for dtype, placement in sorted({(r["dtype"], r["placement"]) for r in table},
                                                   key=lambda k: (k[0], k[1] != "out-of-place")):
                        typed = [r for r in table if r["dtype"] == dtype and r["placement"] == placement]
                        out += [f"{buffers} buffers, {dtype}, {typed[0]['op'] if coll not in ('allgather', 'alltoall', 'broadcast', 'sendrecv') else 'no op'}"
                                f", {placement}; commit {provenance(typed)}:", ""]
                        out += collective_table(typed) + [""] + bench_lines(typed, world) + [""]
            moe = [r for r in here if r["kind"] == "moe"]
            if moe:
                out += [f"### MoE dispatch and combine, {world} ranks", "",
                        f"H = {moe[0]['hidden']}, K = {moe[0]['top_k']}, CUDA graphs of {moe[0]['graph_calls']} "
                        f"calls. The NCCL path is `ncclAlltoAll` of the counts, a host synchronisation and grouped "
                        f"send/recv; NVLink GB/s is the bytes a rank sends or receives over its links per second. "
                        f"Commit {provenance(moe)}.", ""]
                if any(r["layout"] == "rank-major" and r["experts"] == 64 for r in moe):
                    out += [f"![MoE on {gpu}](img/{image_name(gpu, f'moe-{world}')})", ""]
                out += moe_table(moe) + [""]
            fused = [r for r in here if r["kind"] == "fused_matmul"]
            if fused:
                out += [f"### Tensor-parallel GEMM with its collective, {world} ranks", "",
                        "`braid.ops.all_gather_matmul` (the all-gather of A's shard hidden under A x B) and "
                        "`braid.ops.matmul_reduce_scatter` (the reduce-scatter of A x B hidden under the GEMM), "
                        "bfloat16, M the rows of the whole A and B a Linear weight's transpose, beside the GEMM "
                        "alone on one GPU, braid's collective alone, NCCL's collective and cuBLAS one after the "
                        f"other, and torch's `symm_mem` fused ops (torch {fused[0].get('torch', '?')}). Eager calls "
                        "(mode graph: replays of a CUDA graph that captured one call), each launched while the GPU "
                        "sleeps about 1 ms so that the host's launch time is not counted (the GPU's time), the "
                        "slowest rank's median; the plot shows the eager calls. Measured with `torchrun "
                        "--nproc-per-node 2 bench/tp_overlap.py [--mode graph]`; "
                        f"commit {provenance(fused)}.", ""]
                out += [f"![Fused GEMM and collective on {gpu}](img/{image_name(gpu, f'fused-{world}')})", ""]
                out += fused_table(fused) + [""]
    return "\n".join(out).rstrip() + "\n", notes_text


def style(axis, xlabel, ylabel):
    """Log-2 sizes on x, a grid, the labels."""
    axis.set_xscale("log", base=2)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(True, which="both", alpha=0.3)


def save(plt, fig, title, gpu, what):
    """Writes the figure as docs/img/performance-<gpu>-<what>.png; returns its path."""
    fig.suptitle(title)
    fig.tight_layout()
    path = os.path.join(IMAGES, image_name(gpu, what))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plots(rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(IMAGES, exist_ok=True)
    current = newest(rows)
    written = []
    for gpu in sorted({r["gpu"] for r in current}):
        mine = [r for r in current if r["gpu"] == gpu and r["kind"] not in ("floor", "torch")]
        for world in sorted({r["world"] for r in mine}):
            here = [r for r in mine if r["world"] == world]
            for coll in COLLECTIVES:
                rows_c = [r for r in here if r["kind"] == "collective" and r["collective"] == coll]
                if not rows_c:
                    continue
                fig, (bw, lat) = plt.subplots(1, 2, figsize=(11, 4))
                for buffers in BUFFERS:
                    for dtype in sorted({r["dtype"] for r in rows_c}):
                        mine_b = [r for r in rows_c if buffers_of(r) == buffers and r["dtype"] == dtype]
                        # The title's modes (graphs through 16 MiB, eager above) make the line; larger calls
                        # captured into graphs are a series of their own.
                        line = sorted((r for r in mine_b if (r["mode"] == "graph") == (r["bytes"] <= GRAPH_MAX_BYTES)),
                                      key=lambda r: r["bytes"])
                        captured = sorted((r for r in mine_b if r["mode"] == "graph" and r["bytes"] > GRAPH_MAX_BYTES),
                                          key=lambda r: r["bytes"])
                        for series, suffix, marker, linestyle in ((line, "", "o", "-"),
                                                                  (captured, ", CUDA graphs", "s", ":")):
                            if not series:
                                continue
                            sizes = [r["bytes"] for r in series]
                            label = f"braid, {buffers}, {dtype}{suffix}"
                            bw.plot(sizes, [r["braid_busbw_gbs"] for r in series], marker=marker, linestyle=linestyle,
                                    label=label)
                            lat.plot(sizes, [r["braid_us"] for r in series], marker=marker, linestyle=linestyle,
                                     label=label)
                        nccl = [r for r in line if r["nccl_us"] is not None]
                        if nccl and buffers == "cudaMalloc":
                            bw.plot([r["bytes"] for r in nccl], [r["nccl_busbw_gbs"] for r in nccl], marker="x",
                                    linestyle="--", label=f"NCCL, {dtype}")
                            lat.plot([r["bytes"] for r in nccl], [r["nccl_us"] for r in nccl], marker="x",
                                     linestyle="--", label=f"NCCL, {dtype}")
                style(bw, "message size (bytes)", "bus bandwidth (GB/s)")
                style(lat, "message size (bytes)", "time per call (µs)")
                lat.set_yscale("log")
                bw.legend(fontsize=8)
                written.append(save(plt, fig, f"{TITLES[coll]}, {world} ranks, {gpu} (graphs up to 16 MiB, eager above)",
                                    gpu, f"{coll}-{world}"))
            moe = [r for r in here if r["kind"] == "moe" and r["layout"] == "rank-major" and r["experts"] == 64
                   and r["dtype"] == "bfloat16"]
            if moe:
                fig, axes = plt.subplots(1, 2, figsize=(11, 4))
                for axis, phase in zip(axes, ("moe-dispatch", "moe-combine")):
                    line = sorted((r for r in moe if r["collective"] == phase), key=lambda r: r["tokens"])
                    axis.plot([r["tokens"] for r in line], [r["braid_us"] for r in line], marker="o",
                              label="braid, rank-major")
                    nccl = [r for r in line if r["nccl_us"] is not None]
                    axis.plot([r["tokens"] for r in nccl], [r["nccl_us"] for r in nccl], marker="x", linestyle="--",
                              label="NCCL path")
                    style(axis, "tokens per rank (T)", "time per call (µs)")
                    axis.set_yscale("log")
                    axis.set_title(phase[4:])
                    axis.legend(fontsize=8)
                written.append(save(plt, fig, f"MoE, H=7168, K=8, E=64, bf16, {world} ranks, {gpu}", gpu,
                                    f"moe-{world}"))
            fused = sorted((r for r in here if r["kind"] == "fused_matmul" and r["mode"] == "eager"
                            and r.get("algorithm", "pieces") == "pieces"),  # the default's; the table has the rest
                           key=lambda r: (r["collective"], r["m"], r["k"], r["n"]))
            if fused:
                written.append(fused_plot(plt, fused, gpu, world))
    return written


def fused_plot(plt, rows, gpu, world):
    """Bars per shape: the GEMM alone (the floor overlap aims at), braid's fused call, NCCL then cuBLAS, torch's op."""
    series = (("GEMM alone", "gemm_us"), ("braid fused", "braid_us"), ("NCCL then cuBLAS", "nccl_serial_us"),
              ("torch symm_mem fused", "torch_us"))
    fig, axis = plt.subplots(figsize=(11, 4))
    width = 0.2
    for i, (label, field) in enumerate(series):
        xs = [j + (i - 1.5) * width for j in range(len(rows))]
        axis.bar(xs, [r[field] if r[field] is not None else 0 for r in rows], width, label=label)
    axis.set_xticks(range(len(rows)))
    axis.set_xticklabels([f"{r['collective']}\n{r['m']}x{r['k']}x{r['n']}" for r in rows], fontsize=7)
    axis.set_ylabel("time per call (µs)")
    axis.grid(axis="y", alpha=0.3)
    axis.legend(fontsize=8)
    return save(plt, fig, f"GEMM with its collective, bf16, {world} ranks, {gpu} (eager, M x K x N)", gpu,
                f"fused-{world}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archive", default=archive.ARCHIVE)
    parser.add_argument("--page", default=PAGE)
    parser.add_argument("--no-plots", action="store_true", help="write the page only")
    parser.add_argument("--check", action="store_true", help="compare the page with what the archive gives")
    args = parser.parse_args(argv)
    rows = archive.load(args.archive)
    with open(GOALS) as f:
        goals = json.load(f)["goals"]
    text, notes = page(rows, goals)
    notes_path = GOAL_NOTES if args.page == PAGE else os.path.splitext(args.page)[0] + "-goals.md"
    if args.check:
        for path, want in ((args.page, text), (notes_path, notes)):
            if not os.path.exists(path) or open(path).read() != want:
                print(f"performance: {path} is not what {args.archive} gives: run bench/performance.py")
                return 1
        print(f"performance: {args.page} matches {args.archive}")
        return 0
    for path, content in ((args.page, text), (notes_path, notes)):
        with open(path, "w") as f:
            f.write(content)
        print(f"performance: wrote {path}")
    if not args.no_plots:
        try:
            written = plots(rows)
        except ImportError:
            raise SystemExit("performance: the plots need matplotlib (pip install matplotlib), or pass --no-plots")
        for path in written:
            print(f"performance: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
