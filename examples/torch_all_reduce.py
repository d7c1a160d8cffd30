"""PyTorch unchanged, on braid: torch.distributed's NCCL backend runs on braid's NCCL shim when the shim is
loaded first. Eager all_reduce and all_gather, then the same all_reduce captured in a CUDA graph and replayed.

    LD_PRELOAD=build/nccl_shim/libnccl.so.2 torchrun --nproc-per-node 2 examples/torch_all_reduce.py
"""
import os

import torch
import torch.distributed as dist


def main() -> int:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()

    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32) + rank
    dist.all_reduce(x)
    expected = world * torch.arange(1 << 20, device="cuda", dtype=torch.float32) + world * (world - 1) / 2
    ok = torch.equal(x, expected)

    parts = [torch.empty(4, device="cuda") for _ in range(world)]
    dist.all_gather(parts, torch.full((4,), float(rank), device="cuda"))
    ok = ok and all(torch.equal(p, torch.full((4,), float(r), device="cuda")) for r, p in enumerate(parts))

    y = torch.ones(4096, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dist.all_reduce(y)  # a warm-up call outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(y)
    y.fill_(1.0)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    ok = ok and torch.equal(y, torch.full_like(y, float(world**3)))

    print(f"rank {rank}: torch all_reduce, all_gather and a captured all_reduce on {world} ranks: {'OK' if ok else 'WRONG'}")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
