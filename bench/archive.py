#!/usr/bin/env python3
"""The results archive: bench/results/archive.jsonl, one JSON object per measured point.

    bench/archive.py add --gpu KIND [--date YYYY-MM-DD] [--commit SHA] RUN.json...
    bench/archive.py add-floor --gpu KIND [--date YYYY-MM-DD] --commit SHA GRAPH_FLOOR_OUTPUT
    bench/archive.py add-torch --gpu KIND [--date YYYY-MM-DD] --commit SHA --torch VERSION --world N RUN_TORCH_CHECK_OUTPUT
    bench/archive.py list [--gpu KIND]

`add` reads braid-bench --json files and appends one row per measured point that is not in the archive yet.
A file whose run changed BRAID_* settings (a forced algorithm, say; where a library is found, BRAID_NCCL_LIBRARY and
BRAID_CUBLASLT_LIBRARY, does not count) is refused: the archive holds measurements of braid as it ships. So is one
timed otherwise than the archive's rows are (braid-bench's -a other than 3, the max over ranks, or -z 1). Switches a user turns on to get a path (OPT_IN: BRAID_EAGER_ZERO_COPY=1) are the exception:
their rows say so (eager_zero_copy) and are points of their own. A file without a commit needs --commit, which
also overrides the file's.

A collective row:
    date, commit, gpu (the machine kind, e.g. nvidia-h100-x2), gpu_name, world, nccl_version, kind="collective",
    collective, dtype, op, root, bytes, count, buffers (cudaMalloc | registered | symmetric | vmm |
    registered-vmm), mode (graph | eager), graph_calls, placement (out-of-place | in-place),
    braid_us, braid_busbw_gbs, nccl_us, nccl_busbw_gbs (null when NCCL did not run), wrong;
    with BRAID_EAGER_ZERO_COPY=1: eager_zero_copy=true, memory (vmm | cudaMalloc), and buffers "registered" where
    the run registered them, else as run (vmm: exposed at their first use)
A floor row (bench/probes/graph_floor's output): the identity fields (world 2), kind="floor", collective (the
probe's case: "empty node" or "signal+wait node"), mode="graph", braid_us (per graph node), nccl_us=null.
A torch row (nccl_shim/tests/run_torch_check.sh's step-time table): the identity fields, kind="torch", collective
(the training: ddp | fsdp2 | fsdp2pg (FSDP2, collectives' buffers from the process group's allocator) | compile), mode="eager", torch (torch's version), braid_ms (ms per step through the
shim), nccl_ms (the same with torch's own NCCL), braid_us and nccl_us (the same in µs); width, layers, batch and
steps (the training model's line; absent from outputs without it: width 1024, 4 layers, batch 64, 20 steps); what
both runs had set, each true where it was: eager_zero_copy (--eager-zero-copy: BRAID_EAGER_ZERO_COPY=1),
allocator_hook (--allocator-hook: TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1), expandable_segments
(--expandable-segments: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).
A fused-matmul row (bench/tp_overlap.py --archive FILE writes them): the identity fields, torch (its version),
    kind="fused_matmul", collective (all_gather_matmul | matmul_reduce_scatter), m, k, n, dtype, mode (eager |
    graph),
    braid_us (the fused call), gemm_us (the GEMM alone), comm_us (braid's collective alone), nccl_serial_us (NCCL's
    collective and cuBLAS one after the other; nccl_us repeats it), torch_us (torch's symm_mem fused op; null with
    torch_error where it failed), wrong (elements outside the tolerance of the serial result), algorithm (what the
    timed calls ran: pieces, or in one launch epilogue or engines for matmul_reduce_scatter, BRAID_MATMUL_REDUCE_SCATTER, and
    loads for all_gather_matmul, BRAID_ALL_GATHER_MATMUL; rows without it ran the pieces)
An MoE row:
    the same identity fields, kind="moe", collective (moe-dispatch | moe-combine | moe-layer), layout, tokens,
    hidden, top_k, experts, dtype (the dispatched type), bytes (the logical bytes: tokens * top_k rows, scales
    included; dispatch and combine together for moe-layer), nvlink_bytes, mode (graph | eager), graph_calls,
    max_sms, braid_us, braid_nvlink_gbs, nccl_us, nccl_nvlink_gbs, wrong
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ARCHIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "archive.jsonl")
# Settings a user sets to take a path that is off by default, with the value that turns it on and the default.
OPT_IN = {"BRAID_EAGER_ZERO_COPY": "1"}
OPT_IN_DEFAULTS = {"BRAID_EAGER_ZERO_COPY": "0"}
GPU_KIND = re.compile(r"^nvidia-[a-z0-9]+(-x[0-9]+)?$")


def gpu_name(config):
    gpus = config.get("gpus") or []
    names = {re.sub(r"^GPU [0-9]+ (.*) \([^)]*\)$", r"\1", g) for g in gpus}
    return " / ".join(sorted(names)) if names else None


def full_commit(name):
    """The full hash of a commit of this repository; a name git does not know is refused."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = subprocess.run(["git", "-C", here, "rev-parse", "--verify", "--quiet", name + "^{commit}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"archive: commit {name!r} is not in this repository")
    return found.stdout.strip()


def identity(config, args):
    commit = args.commit or config.get("commit")
    if not commit:
        raise SystemExit("archive: the run has no commit (BRAID_COMMIT was unset): pass --commit")
    commit = full_commit(commit)
    return {
        "date": args.date,
        "commit": commit,
        "gpu": args.gpu,
        "gpu_name": gpu_name(config),
        "world": config["ranks"],
        "nccl_version": config.get("nccl_version"),
    }


def timing(side, key):
    if side is None:
        return None, None
    return side.get("time_us"), side.get(key)


def collective_rows(run, args, opt_in):
    config = run["config"]
    base = identity(config, args)
    buffers = config["buffers"]
    if config.get("launch"):  # "threads" or "processes" (braid-bench records it; older runs did not)
        base["launch"] = config["launch"]
    if opt_in.get("BRAID_EAGER_ZERO_COPY") == "1":
        memory = "vmm" if buffers.endswith("vmm") else "cudaMalloc"
        base.update(eager_zero_copy=True, memory=memory)
        buffers = "registered" if buffers.startswith("registered") else buffers
    graph = int(config.get("graph") or 0)
    for row in run["rows"]:
        for placement_key, placement in (("out_of_place", "out-of-place"), ("in_place", "in-place")):
            measured = row.get(placement_key)
            if not measured:
                continue
            braid_us, braid_busbw = timing(measured.get("braid"), "busbw_gbs")
            nccl_us, nccl_busbw = timing(measured.get("nccl"), "busbw_gbs")
            if braid_us is None:
                continue
            wrong = [side.get("wrong") for side in (measured.get("braid"), measured.get("nccl")) if side]
            yield dict(base, kind="collective", collective=row["coll"], dtype=row["type"], op=row["redop"],
                       root=row["root"], bytes=row["size"], count=row["count"], buffers=buffers,
                       mode="graph" if graph else "eager", graph_calls=graph, placement=placement,
                       braid_us=braid_us, braid_busbw_gbs=braid_busbw, nccl_us=nccl_us, nccl_busbw_gbs=nccl_busbw,
                       wrong=None if any(w is None for w in wrong) else sum(wrong))


def moe_rows(run, args):
    config = run["config"]
    base = identity(config, args)
    for row in run["rows"]:
        braid_us, braid_gbs = timing(row.get("braid"), "nvlink_gbs")
        nccl_us, nccl_gbs = timing(row.get("nccl"), "nvlink_gbs")
        if braid_us is None:
            continue
        wrong = [side.get("wrong") for side in (row.get("braid"), row.get("nccl")) if side]
        yield dict(base, kind="moe", collective="moe-" + row["phase"], layout=row.get("layout", "expert-major"),
                   tokens=row["tokens"], hidden=config["hidden"], top_k=config["top_k"], experts=config["experts"],
                   dtype=config.get("dispatch_type") or config["type"], bytes=row["logical_bytes"],
                   nvlink_bytes=row["nvlink_bytes_max_per_rank"], mode="graph" if config.get("graph") else "eager",
                   graph_calls=int(config.get("graph") or 0), max_sms=config.get("max_sms", 0),
                   braid_us=braid_us, braid_nvlink_gbs=braid_gbs, nccl_us=nccl_us, nccl_nvlink_gbs=nccl_gbs,
                   wrong=None if any(w is None for w in wrong) else sum(wrong))


def rows_of(path, args):
    with open(path) as f:
        run = json.load(f)
    if not isinstance(run, dict) or "config" not in run or "rows" not in run:
        raise SystemExit(f"archive: {path} is not a braid-bench --json file")
    # braid-run sets these for every rank (older braid-bench builds wrote them): where the ranks are, not how braid runs.
    launch = {"BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE", "BRAID_STORE_ADDR", "BRAID_JOB_ID",
              "BRAID_JOB_SECRET"}
    # Where a library is found, not how braid runs (the rows record the NCCL version that ran).
    locations = {"BRAID_NCCL_LIBRARY", "BRAID_CUBLASLT_LIBRARY"}
    settings = {k: v for k, v in (run["config"].get("settings") or {}).items()
                if k not in launch and k not in locations and OPT_IN_DEFAULTS.get(k) != v}
    opt_in = {k: v for k, v in settings.items() if OPT_IN.get(k) == v}
    changed = {k: v for k, v in settings.items() if k not in opt_in}
    if changed:
        raise SystemExit(f"archive: {path} ran with changed settings {changed}; the archive holds defaults")
    timing_method = {k: run["config"][k] for k in ("average", "blocking") if k in run["config"]}
    if timing_method.get("average", 3) != 3 or timing_method.get("blocking", False):
        raise SystemExit(f"archive: {path} was timed with {timing_method}; the archive holds the max over ranks of "
                         "calls the host does not wait for")
    if run["config"].get("mode") == "moe":
        if opt_in:
            raise SystemExit(f"archive: {path} is an MoE run with {opt_in}, which MoE calls do not use")
        return list(moe_rows(run, args))
    return list(collective_rows(run, args, opt_in))


def load(path=ARCHIVE):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_identity(args):
    """The machine kind and date every added row carries, refused when malformed."""
    if not GPU_KIND.match(args.gpu):
        raise SystemExit(f"archive: --gpu {args.gpu!r} is not a machine kind such as nvidia-h100-x2")
    datetime.date.fromisoformat(args.date)


def append(archive, rows):
    """Appends the rows the archive does not hold yet; returns how many were added."""
    existing = {json.dumps(row, sort_keys=True) for row in load(archive)}
    added = 0
    with open(archive, "a") as out:
        for row in rows:
            line = json.dumps(row, sort_keys=True)
            if line not in existing:
                existing.add(line)
                out.write(line + "\n")
                added += 1
    return added


def add(args):
    check_identity(args)
    rows = [row for path in args.files for row in rows_of(path, args)]
    print(f"archive: {append(args.archive, rows)} rows added to {args.archive}")


FLOOR_LINE = re.compile(r"^(empty node|signal\+wait node)\s+([0-9.]+) us per node")


def add_floor(args):
    """Files the two figures of a graph_floor run: the cost of an empty graph node, and of one with a round trip."""
    check_identity(args)
    with open(args.file) as f:
        found = [m for m in (FLOOR_LINE.match(line) for line in f) if m]
    if len(found) != 2:
        raise SystemExit(f"archive: {args.file} is not the output of bench/probes/graph_floor")
    base = {"date": args.date, "commit": full_commit(args.commit), "gpu": args.gpu, "gpu_name": None, "world": 2,
            "nccl_version": None}
    rows = [dict(base, kind="floor", collective=m.group(1), mode="graph", braid_us=float(m.group(2)), nccl_us=None)
            for m in found]
    print(f"archive: {append(args.archive, rows)} graph-floor rows of {args.gpu} added to {args.archive}")


# What a torch row records of the settings both runs had (add-torch's flags of the same names).
TORCH_SETTINGS = ("eager_zero_copy", "allocator_hook", "expandable_segments")
TORCH_STEP_LINE = re.compile(r"^\s+(ddp|fsdp2|fsdp2pg|compile)\s+([0-9.]+)\s+([0-9.]+)\s+[0-9.]+\s*$")
TORCH_MODEL_LINE = re.compile(r"training model: width ([0-9]+), layers ([0-9]+), batch ([0-9]+), timed steps ([0-9]+)")


def add_torch(args):
    """Files the training step times of a run_torch_check.sh run: per section, through the shim and with NCCL."""
    check_identity(args)
    with open(args.file) as f:
        text = f.read()
    if "run_torch_check: PASS" not in text:
        raise SystemExit(f"archive: {args.file} is not the output of a run_torch_check.sh run that passed")
    found = [m for m in (TORCH_STEP_LINE.match(line) for line in text.splitlines()) if m]
    if not found:
        raise SystemExit(f"archive: {args.file} has no step-time table")
    base = {"date": args.date, "commit": full_commit(args.commit), "gpu": args.gpu, "gpu_name": None,
            "world": args.world, "nccl_version": None, "torch": args.torch}
    model = TORCH_MODEL_LINE.search(text)
    if model:
        base.update(zip(("width", "layers", "batch", "steps"), (int(v) for v in model.groups())))
    for setting in TORCH_SETTINGS:
        if getattr(args, setting):
            base[setting] = True
    rows = [dict(base, kind="torch", collective=m.group(1), mode="eager", nccl_ms=float(m.group(2)),
                 braid_ms=float(m.group(3)), nccl_us=float(m.group(2)) * 1e3, braid_us=float(m.group(3)) * 1e3)
            for m in found]
    print(f"archive: {append(args.archive, rows)} torch rows of {args.gpu} added to {args.archive}")


def list_rows(args):
    for row in load(args.archive):
        if args.gpu and row["gpu"] != args.gpu:
            continue
        print(row["date"], row["commit"][:8], row["gpu"], row["world"], row["collective"], row.get("dtype"),
              row.get("bytes"), row.get("buffers", row.get("layout")), row["mode"], row["braid_us"], row["nccl_us"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archive", default=ARCHIVE, help="the JSONL file (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("add", help="append the points of braid-bench --json files")
    p.add_argument("--gpu", required=True, help="the machine kind, e.g. nvidia-h100-x2")
    p.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).date().isoformat())
    p.add_argument("--commit", help="the commit measured (default: the file's)")
    p.add_argument("files", nargs="+")
    p.set_defaults(run=add)
    p = sub.add_parser("add-torch", help="append the step times of a nccl_shim/tests/run_torch_check.sh run")
    p.add_argument("--gpu", required=True)
    p.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).date().isoformat())
    p.add_argument("--commit", required=True, help="the commit whose shim ran")
    p.add_argument("--torch", required=True, help="torch's version, e.g. 2.11.0+cu130")
    p.add_argument("--world", type=int, required=True, help="the ranks (GPUs) of the run")
    p.add_argument("--eager-zero-copy", action="store_true", help="both runs had BRAID_EAGER_ZERO_COPY=1")
    p.add_argument("--allocator-hook", action="store_true",
                   help="both runs had TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1")
    p.add_argument("--expandable-segments", action="store_true",
                   help="both runs had PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    p.add_argument("file")
    p.set_defaults(run=add_torch)
    p = sub.add_parser("add-floor", help="append the figures of a bench/probes/graph_floor run")
    p.add_argument("--gpu", required=True)
    p.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).date().isoformat())
    p.add_argument("--commit", required=True, help="the commit whose probe ran")
    p.add_argument("file")
    p.set_defaults(run=add_floor)
    p = sub.add_parser("list", help="print the archive's rows, one line each")
    p.add_argument("--gpu")
    p.set_defaults(run=list_rows)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())
