"""python -m braid.bench: braid's calls timed from Python, so the cost of the Python layer per call can be set beside
braid-bench's numbers for the same cases. Run one process per GPU (torchrun --nproc-per-node N -m braid.bench, or
braid-run). Each case is timed two ways, with torch.cuda.Event around `--calls` calls: captured in one CUDA graph
and replayed (the GPU time per call, no host cost) and eagerly (what a Python caller pays: the host's time per
call whenever it exceeds the GPU's). Prints one line per case and mode on rank 0: per call, in microseconds, the
slowest rank's median over `--repeats` timings (as braid-bench reports).

Cases: all_reduce in place (bfloat16, sizes from --sizes), and MoE dispatch, combine and both, expert-major,
rank-major and low-latency, at T=128, H=7168, K=8, E=64 bfloat16 (DeepSeek's decode shape), routed as
braid-bench --moe routes: `--seed S` here and `braid-bench --moe --seed S` time the same routing."""
from __future__ import annotations

import argparse
import statistics

import braid


_SLEEP_CYCLES = 200_000  # about 100 us at the GPU's clock: longer than the host takes to launch a replay


def _time(torch, body, calls: int, repeats: int, graph: bool) -> float:
    """Median microseconds per call of `body` (one call), run `calls` times per timing."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up, outside any capture
            body()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    if graph:
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            for _ in range(calls):
                body()
        captured.replay()
        run = captured.replay
    else:
        def run():
            for _ in range(calls):
                body()
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        braid.barrier()  # no GPU work is pending (synchronised above)
        body()  # untimed: it waits for the last rank out of the barrier, so the timed calls start together
        if graph:
            # The GPU busy while the host records the start and launches the replay, so that the time between the
            # two (Python's, tens of microseconds) is not counted as the calls'. Both ranks sleep alike.
            torch.cuda._sleep(_SLEEP_CYCLES)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    """splitmix64's finaliser, as braid-bench's mix()."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def bench_routing(seed: int, rank: int, tokens: int, top_k: int, experts: int):
    """braid-bench --moe --seed `seed`'s routing of `rank` at T = tokens (tools/braid-bench/moe_data.cpp,
    make_routing): K distinct experts per token, uniform over E, weights (1 + u % 1024) / 1024. Lists of
    [tokens * top_k] ids and weights."""
    state = _mix(_mix((seed + tokens) & _MASK) ^ _mix(0xE0E0 + rank))
    ids, weights = [], []

    def draw() -> int:
        nonlocal state
        state = (state + _GOLDEN) & _MASK
        return _mix(state)

    for _ in range(tokens):
        mine = []
        for _ in range(top_k):
            e = draw() % experts
            while e in mine:
                e = draw() % experts
            mine.append(e)
            weights.append((1 + draw() % 1024) / 1024.0)
        ids.extend(mine)
    return ids, weights


def _routing(torch, tokens: int, experts: int, top_k: int, seed: int, rank: int):
    ids, weights = bench_routing(seed, rank, tokens, top_k, experts)
    return (torch.tensor(ids, dtype=torch.int64, device="cuda").view(tokens, top_k),
            torch.tensor(weights, dtype=torch.float32, device="cuda").view(tokens, top_k))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m braid.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8K,64K,1M,16M,64M", help="all_reduce sizes in bytes (K, M suffixes)")
    parser.add_argument("--calls", type=int, default=20, help="calls per timing (and per captured graph)")
    parser.add_argument("--repeats", type=int, default=20, help="timings per case; the median is printed")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1, help="the routing's seed (braid-bench --moe --seed)")
    parser.add_argument("--skip-moe", action="store_true")
    parser.add_argument("--group", action="store_true", help="braid.init(group=WORLD) after init_process_group")
    args = parser.parse_args(argv)

    import torch
    if args.group:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        comm = braid.init(group=dist.group.WORLD)
    else:
        comm = braid.init()
    torch.cuda.set_device(comm.device)
    rank, world = comm.rank, comm.size

    def report(case: str, mode: str, micros: float) -> None:
        micros = max(float(v) for v in comm.host_allgather(repr(micros).encode()))  # the slowest rank's
        if rank == 0:
            print(f"{case:<44} {mode:<6} {micros:10.2f} us/call  (world {world}, {torch.cuda.get_device_name()})",
                  flush=True)

    if rank == 0:
        print(f"# braid {braid.__version__} from Python: the slowest rank's median of {args.repeats} timings of "
              f"{args.calls} calls, routing seed {args.seed}",
              flush=True)
    for text in args.sizes.split(","):
        text = text.strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        size = int(text.rstrip("KMG")) * scale
        x = torch.ones(max(size // 2, 1), dtype=torch.bfloat16, device="cuda")
        for graph in (True, False):
            report(f"all_reduce bf16 {size} B", "graph" if graph else "eager",
                   _time(torch, lambda: braid.all_reduce(x), args.calls, args.repeats, graph))

    if not args.skip_moe:
        torch.set_grad_enabled(False)  # braid's calls alone: under grad mode dispatch would also copy its rows out
        T, H, K, E = args.tokens, args.hidden, args.top_k, args.experts
        x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
        index, weights = _routing(torch, T, E, K, args.seed, rank)
        for layout, fixed in (("expert_major", False), ("rank_major", False), ("rank_major", True)):
            moe = braid.MoeBuffer(H, T, K, E, layout=layout, low_latency=fixed)
            if fixed:
                layout = "low_latency"
            got = moe.dispatch(x, index, weights)
            y = got.combine_input if moe.rank_major else got.x
            out = torch.empty_like(x)
            cases = {"dispatch": lambda: moe.dispatch(x, index, weights),
                     "combine": lambda: moe.combine(y, out),
                     "dispatch+combine": lambda: (moe.dispatch(x, index, weights), moe.combine(y, out))}
            for name, body in cases.items():
                for graph in (True, False):
                    report(f"moe {layout} {name} T={T} H={H} K={K} E={E}", "graph" if graph else "eager",
                           _time(torch, body, args.calls, args.repeats, graph))
            torch.cuda.synchronize()
            braid.barrier()
            moe.close()
    torch.cuda.synchronize()
    braid.check()
    braid.barrier()
    braid.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
