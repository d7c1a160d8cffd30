#!/usr/bin/env python3
"""Tensor-parallel GEMMs fused with their collective, timed against their parts and against the alternatives:

    torchrun --nproc-per-node 2 bench/tp_overlap.py [--mode graph] [--archive FILE --gpu KIND [--commit SHA]]

For each shape (M rows of the whole A, bfloat16; B [K, N] is a Linear weight's .t()), per call in microseconds:
  braid_us        braid.ops.all_gather_matmul (return_A=False) or braid.ops.matmul_reduce_scatter ('sum')
  gemm_us         torch.matmul of the whole problem, [M, K] x [K, N], on one rank: what overlap cannot go below
  comm_us         braid's collective alone (braid.functional): the all-gather of A's shard, or the reduce-scatter
                  of the [M, N] product
  nccl_serial_us  torch.distributed's NCCL collective, then cuBLAS (or cuBLAS, then NCCL), one after the other
  torch_us        torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter (null, with the
                  reason, where it fails)
Each figure is the slowest rank's median over --repeats timings of one call (CUDA events), after warm-up calls
(--mode graph: of one replay of a CUDA graph that captured one call, after the warm-up calls);
the ranks meet at a barrier before each timing. The fused result is checked against the serial one (`wrong`:
elements outside rtol 2e-2, atol 5e-2 on products of magnitude about 1). Prints a table on rank 0; --archive FILE
appends one row per shape (kind "fused_matmul", bench/archive.py's identity fields; nccl_us repeats
nccl_serial_us, the NCCL way of doing the same job) to FILE."""
import os

# NOTE [no multicast]: NVLink multicast (NVLS) stays off for every library in this process: NCCL, torch's
# symmetric memory and NVSHMEM. A multicast program on a shared GPU host can take the host's GPUs out of service.
# Set before torch (and NCCL) load; NCCL_NVLS_ENABLE is forced, not defaulted, since a launcher may export 1.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import braid  # noqa: E402

# (M, K, N): M rows of the whole A. all_gather_matmul: A_shard [M / world, K]; matmul_reduce_scatter: A [M, K] on
# every rank, the output [M / world, N].
ALL_GATHER_SHAPES = [(4096, 4096, 4096), (8192, 8192, 3584), (16384, 4096, 7168)]
REDUCE_SCATTER_SHAPES = [(4096, 4096, 4096), (8192, 3584, 8192), (16384, 7168, 4096)]
TOLERANCE = dict(rtol=2e-2, atol=5e-2)
_SLEEP_CYCLES = 2_000_000  # about 1 ms of GPU time: the host launches the timed call meanwhile


def median_us(fn, args) -> float:
    """The slowest rank's median microseconds of one call of fn (--mode graph: of one replay of a CUDA graph that
    captured one call, after the eager warm-up calls)."""
    for _ in range(args.warmup):
        fn()
    torch.cuda.synchronize()
    if args.mode == "graph":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        fn = graph.replay
        fn()
        torch.cuda.synchronize()
    times = []
    for _ in range(args.repeats):
        braid.barrier()  # host barrier: no GPU work is pending (synchronised below)
        torch.cuda._sleep(_SLEEP_CYCLES)  # every rank alike: the launch below is not timed
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device="cuda")
    dist.all_reduce(slowest, dist.ReduceOp.MAX)
    return float(slowest.item())


def wrong_elements(got, expected) -> int:
    """Elements of the fused result outside the tolerance of the serial one (NCCL then cuBLAS)."""
    got, expected = got.float(), expected.float()
    bad = (got - expected).abs() > TOLERANCE["atol"] + TOLERANCE["rtol"] * expected.abs()
    count = torch.tensor([int(bad.sum())], device="cuda")
    dist.all_reduce(count)
    return int(count.item())


def random(shape, seed: int, scale: float):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=generator, device="cuda") * scale).to(torch.bfloat16)


def enable_torch_symmetric_memory(group) -> None:
    """torch's fused ops over the CUDA backend of symmetric memory. torch 2.11 registers process groups by itself
    (enable_symm_mem_for_group is deprecated there); older versions need the call."""
    import warnings
    import torch.distributed._symmetric_memory as symm_mem
    try:
        symm_mem.set_backend("CUDA")
    except (AttributeError, RuntimeError):  # older torch: CUDA is the only backend
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem.enable_symm_mem_for_group(group.group_name)


def torch_fused_us(call, args):
    """(torch's fused op's time, None) or (None, why it could not run)."""
    try:
        return median_us(call, args), None
    except Exception as error:  # noqa: BLE001 - any failure of torch's op is recorded, not fatal
        torch.cuda.synchronize()
        return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]


def all_gather_case(m: int, k: int, n: int, args, group_name: str) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = random((m // world, k), rank, k ** -0.5)
    B = random((n, k), 1000, 1.0).t()  # a Linear weight [N, K] as B: K x N, transposed storage
    full_a = random((m, k), 7, k ** -0.5)
    gathered = torch.empty((m, k), dtype=torch.bfloat16, device="cuda")

    def fused():
        return braid.ops.all_gather_matmul(shard, [B], return_A=False)[1][0]

    def serial():
        dist.all_gather_into_tensor(gathered, shard)
        return torch.matmul(gathered, B)

    before = braid.ops.all_gathers_under_loads()
    row = dict(braid_us=median_us(fused, args))
    # What the timed calls ran (BRAID_ALL_GATHER_MATMUL): every one in one launch under the GEMM's loads, or none.
    row["algorithm"] = "loads" if braid.ops.all_gathers_under_loads() > before else "pieces"
    row.update(gemm_us=median_us(lambda: torch.matmul(full_a, B), args),
               comm_us=median_us(lambda: braid.functional.all_gather_into_tensor(shard), args),
               nccl_serial_us=median_us(serial, args))
    row["torch_us"], row["torch_error"] = torch_fused_us(
        lambda: torch.ops.symm_mem.fused_all_gather_matmul(shard, [B], 0, group_name, return_A=False), args)
    row["wrong"] = wrong_elements(fused(), serial())
    return row


def reduce_scatter_case(m: int, k: int, n: int, args, group_name: str) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    A = random((m, k), rank, k ** -0.5)
    B = random((n, k), 2000 + rank, 1.0).t()  # each rank's own rows of a row-parallel layer's weight
    partial = torch.matmul(A, B)
    scattered = torch.empty((m // world, n), dtype=torch.bfloat16, device="cuda")

    def fused():
        return braid.ops.matmul_reduce_scatter(A, B, "sum")

    def serial():
        dist.reduce_scatter_tensor(scattered, torch.matmul(A, B))
        return scattered

    before = braid.ops.epilogue_reduce_scatters()
    row = dict(braid_us=median_us(fused, args))
    # What the timed calls ran (BRAID_MATMUL_REDUCE_SCATTER): every one in one launch of braid's Hopper GEMM (its
    # epilogue's exchange, or the copy engines'), or none.
    one_launch = os.environ.get("BRAID_MATMUL_REDUCE_SCATTER", "pieces")
    row["algorithm"] = one_launch if braid.ops.epilogue_reduce_scatters() > before else "pieces"
    row.update(gemm_us=median_us(lambda: torch.matmul(A, B), args),
               comm_us=median_us(lambda: braid.functional.reduce_scatter_tensor(partial), args),
               nccl_serial_us=median_us(serial, args))
    row["torch_us"], row["torch_error"] = torch_fused_us(
        lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, group_name), args)
    row["wrong"] = wrong_elements(fused(), serial().clone())
    return row


def commit_of(args) -> str:
    """The commit measured: --commit, else BRAID_COMMIT, else the checkout's HEAD."""
    commit = args.commit or os.environ.get("BRAID_COMMIT")
    if commit:
        return commit
    here = os.path.dirname(os.path.abspath(__file__))
    found = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit("tp_overlap: no commit to file the rows under (no git checkout here): pass --commit")
    return found.stdout.strip()


def identity(args) -> dict:
    """The fields every archive row carries (bench/archive.py)."""
    nccl = torch.cuda.nccl.version()
    return {"date": args.date, "commit": commit_of(args), "gpu": args.gpu, "gpu_name": torch.cuda.get_device_name(),
            "world": dist.get_world_size(), "nccl_version": ".".join(str(v) for v in nccl)
            if isinstance(nccl, tuple) else str(nccl), "torch": torch.__version__}


def print_table(rows) -> None:
    header = (f"{'collective':<22} {'M':>6} {'K':>6} {'N':>6} {'braid_us':>10} {'gemm_us':>10} {'comm_us':>10} "
              f"{'nccl_serial_us':>15} {'torch_us':>10} {'serial/braid':>12} {'wrong':>6}")
    print(header)
    for r in rows:
        torch_us = f"{r['torch_us']:.1f}" if r["torch_us"] is not None else "-"
        print(f"{r['collective']:<22} {r['m']:>6} {r['k']:>6} {r['n']:>6} {r['braid_us']:>10.1f} {r['gemm_us']:>10.1f} "
              f"{r['comm_us']:>10.1f} {r['nccl_serial_us']:>15.1f} {torch_us:>10} "
              f"{r['nccl_serial_us'] / r['braid_us']:>12.2f} {r['wrong']:>6}")
    for r in rows:
        if r["torch_error"]:
            print(f"torch's fused {r['collective']} {r['m']}x{r['k']}x{r['n']} did not run: {r['torch_error']}")


def archive_rows(rows, args) -> None:
    """Appends the rows to the archive file (rows it holds already are not repeated)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import archive
    archive.check_identity(args)
    added = archive.append(args.archive, rows)
    print(f"tp_overlap: {added} rows added to {args.archive}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=16,
                        help="untimed calls before each timing series (braid's GEMM shapes settle their cuBLASLt "
                             "algorithm over their first 15 eager calls)")
    parser.add_argument("--repeats", type=int, default=25, help="timings per figure (median; at least 20)")
    parser.add_argument("--archive", help="append the rows to this JSONL file (bench/results/archive.jsonl)")
    parser.add_argument("--gpu", help="the machine kind the rows are filed under, e.g. nvidia-h200-x2")
    parser.add_argument("--commit", help="the commit measured (default: BRAID_COMMIT, else git HEAD)")
    parser.add_argument("--mode", choices=("eager", "graph"), default="eager",
                        help="time eager calls, or replays of CUDA graphs that captured one call each")
    parser.add_argument("--collective", choices=("all_gather_matmul", "matmul_reduce_scatter"),
                        help="time this fused call's shapes alone (default: both calls')")
    parser.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).date().isoformat())
    args = parser.parse_args()
    if args.repeats < 20:
        parser.error("--repeats must be at least 20")
    if args.archive and not args.gpu:
        parser.error("--archive needs --gpu (the machine kind)")

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    braid.init(group=dist.group.WORLD)  # braid's own communicator; NCCL's stays torch's default group
    group_name = dist.group.WORLD.group_name
    try:
        enable_torch_symmetric_memory(dist.group.WORLD)
    except Exception as error:  # noqa: BLE001 - torch's side is optional: its rows say why
        print(f"tp_overlap: torch's symmetric memory: {error}", file=sys.stderr)
    base = identity(args) if args.archive else {}

    rows = []
    for collective, shapes, case in (("all_gather_matmul", ALL_GATHER_SHAPES, all_gather_case),
                                     ("matmul_reduce_scatter", REDUCE_SCATTER_SHAPES, reduce_scatter_case)):
        if args.collective not in (None, collective):
            continue
        for m, k, n in shapes:
            measured = case(m, k, n, args, group_name)
            rows.append(dict(base, kind="fused_matmul", collective=collective, m=m, k=k, n=n, dtype="bfloat16",
                             mode=args.mode, nccl_us=measured["nccl_serial_us"], **measured))
            torch.cuda.synchronize()
    if dist.get_rank() == 0:
        print_table(rows)
        if args.archive:
            archive_rows(rows, args)
    braid.ops.release()
    braid.destroy()
    dist.destroy_process_group()
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
