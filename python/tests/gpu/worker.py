"""One rank of the GPU tests (python/tests/test_gpu.py starts 2 under torchrun): braid's calls on tensors against
torch.distributed's NCCL on the same random data. argv[1] names the section; prints '<section> OK' on success
and raises (non-zero exit) on the first difference."""
import sys

import torch
import torch.distributed as dist

import braid

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.float64]
SIZES = [1, 7, 1000, (1 << 20) + 3]  # odd and unaligned sizes, and one past the LL sizes
OPS = [braid.ReduceOp.SUM, braid.ReduceOp.MAX, braid.ReduceOp.MIN, braid.ReduceOp.PRODUCT, braid.ReduceOp.AVG]
TORCH_OPS = {braid.ReduceOp.SUM: dist.ReduceOp.SUM, braid.ReduceOp.MAX: dist.ReduceOp.MAX,
             braid.ReduceOp.MIN: dist.ReduceOp.MIN, braid.ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
             braid.ReduceOp.AVG: dist.ReduceOp.AVG}


def random(count, dtype, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    if dtype.is_floating_point:  # values near 1: products stay finite, sums exact enough to compare
        return (torch.rand(count, generator=generator, device="cuda") + 0.5).to(dtype)
    return torch.randint(-50, 50, (count,), generator=generator, device="cuda", dtype=dtype)


def same(got, expected, what):
    torch.cuda.synchronize()
    if got.dtype.is_floating_point:
        torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=1e-3, msg=what)
    elif not torch.equal(got, expected):
        raise AssertionError(f"{what}: braid and NCCL differ")


def collectives(rank, world):
    for dtype in DTYPES:
        for count in SIZES:
            seed = hash((str(dtype), count, rank)) % (1 << 31)
            for op in OPS:
                if op is braid.ReduceOp.AVG and not dtype.is_floating_point:
                    continue  # NCCL's avg on integers truncates as braid's does; torch refuses AVG on ints
                x, reference = random(count, dtype, seed), random(count, dtype, seed)
                braid.all_reduce(x, op)
                dist.all_reduce(reference, TORCH_OPS[op])
                same(x, reference, f"all_reduce {dtype} {count} {op}")
                for root in range(world):
                    x, reference = random(count, dtype, seed), random(count, dtype, seed)
                    braid.reduce(x, root, op)
                    dist.reduce(reference, root, TORCH_OPS[op])
                    if rank == root:
                        same(x, reference, f"reduce {dtype} {count} {op} root {root}")
                out = torch.empty(count, dtype=dtype, device="cuda")
                reference = torch.empty_like(out)
                source = random(count * world, dtype, seed)
                braid.reduce_scatter_tensor(out, source, op)
                dist.reduce_scatter_tensor(reference, source, TORCH_OPS[op])
                same(out, reference, f"reduce_scatter_tensor {dtype} {count} {op}")
            for root in range(world):
                x, reference = random(count, dtype, seed), random(count, dtype, seed)
                braid.broadcast(x, root)
                dist.broadcast(reference, root)
                same(x, reference, f"broadcast {dtype} {count} root {root}")
            mine = random(count, dtype, seed)
            out, reference = (torch.empty(count * world, dtype=dtype, device="cuda") for _ in range(2))
            braid.all_gather_into_tensor(out, mine)
            dist.all_gather_into_tensor(reference, mine)
            same(out, reference, f"all_gather_into_tensor {dtype} {count}")
            in_place = torch.zeros(count * world, dtype=dtype, device="cuda")
            in_place[rank * count:(rank + 1) * count] = mine
            braid.all_gather_into_tensor(in_place, in_place[rank * count:(rank + 1) * count])
            same(in_place, reference, f"all_gather_into_tensor in place {dtype} {count}")
    parts = [torch.empty(5, device="cuda") for _ in range(world)]
    braid.all_gather(parts, torch.full((5,), float(rank), device="cuda"))
    same(torch.stack(parts), torch.arange(world, device="cuda").float()[:, None].expand(world, 5), "all_gather list")
    out = torch.empty(3, device="cuda")
    braid.reduce_scatter(out, [torch.full((3,), float(r + rank), device="cuda") for r in range(world)])
    same(out, torch.full((3,), float(world * rank + world * (world - 1) / 2), device="cuda"), "reduce_scatter list")


def all_to_all(rank, world):
    for dtype in DTYPES:
        for count in SIZES:
            source = random(count * world, dtype, rank * 1000 + count)
            out, reference = torch.empty_like(source), torch.empty_like(source)
            braid.all_to_all_single(out, source)
            dist.all_to_all_single(reference, source)
            same(out, reference, f"all_to_all_single {dtype} {count}")
    # Uneven splits (rows of 3 elements): rank r sends r + q + 1 rows to rank q.
    send_splits = [rank + q + 1 for q in range(world)]
    recv_splits = [q + rank + 1 for q in range(world)]
    source = random(sum(send_splits) * 3, torch.float32, rank).view(-1, 3)
    out = torch.empty(sum(recv_splits), 3, device="cuda")
    reference = torch.empty_like(out)
    braid.all_to_all_single(out, source, recv_splits, send_splits)
    dist.all_to_all_single(reference, source, recv_splits, send_splits)
    same(out, reference, "all_to_all_single with split sizes")


def p2p(rank, world):
    right, left = (rank + 1) % world, (rank - 1) % world
    for count in SIZES:
        mine = random(count, torch.float32, rank + count)
        got, reference = torch.empty_like(mine), torch.empty_like(mine)
        braid.batch_isend_irecv([braid.P2POp(braid.send, mine, right), braid.P2POp(braid.recv, got, left)])
        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, right),
                                               dist.P2POp(dist.irecv, reference, left)]):
            request.wait()
        same(got, reference, f"batch_isend_irecv ring {count}")
    if world >= 2 and rank < 2:
        x = torch.full((10,), float(rank), device="cuda")
        if rank == 0:
            braid.send(x, 1)
        else:
            braid.recv(x, 0)
        same(x, torch.zeros(10, device="cuda"), "send/recv")


def symmetric(rank, world):
    for dtype, shape in [(torch.float32, (3, 5)), (torch.bfloat16, (1 << 20,)), (torch.int64, (7,))]:
        x = braid.empty(shape, dtype=dtype)
        assert x.shape == shape and x.dtype == dtype and x.device == torch.device("cuda", torch.cuda.current_device())
        assert torch.count_nonzero(x).item() == 0, "braid.empty's memory starts zeroed"
        x.fill_(rank + 1)
        torch.cuda.synchronize()
        braid.barrier()
        for r in range(world):
            same(x.peer(r), torch.full(shape, r + 1, dtype=dtype, device="cuda"), f"peer({r}) {dtype}")
        everything = x.view_all()
        assert everything.shape == (world, *shape)
        for r in range(world):
            same(everything[r], torch.full(shape, r + 1, dtype=dtype, device="cuda"), f"view_all()[{r}] {dtype}")
        torch.cuda.synchronize()
        braid.barrier()
        x.peer((rank + 1) % world).fill_(100 + rank)  # store into the right neighbour's copy over NVLink
        torch.cuda.synchronize()
        braid.barrier()
        same(x, torch.full(shape, 100 + (rank - 1) % world, dtype=dtype, device="cuda"), f"written by the peer {dtype}")
        reference = x.clone()
        braid.all_reduce(x)  # a symmetric buffer: the zero-copy path
        dist.all_reduce(reference)
        same(x, reference, f"all_reduce on a symmetric tensor {dtype}")
        torch.cuda.synchronize()
        braid.barrier()
    peer_view = braid.empty(4).peer((rank + 1) % world)
    del peer_view  # the allocation lives as long as any tensor made from it; this one goes last
    torch.cuda.synchronize()


def graph(rank, world):
    x = torch.ones(4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        braid.all_reduce(x)  # a warm-up call outside the graph
    torch.cuda.current_stream().wait_stream(side)
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        braid.all_reduce(x)
    x.fill_(1.0)
    for _ in range(3):
        captured.replay()
    same(x, torch.full_like(x, float(world ** 3)), "all_reduce captured in torch.cuda.graph, replayed 3 times")


def main() -> int:
    section = sys.argv[1]
    comm = braid.init()
    torch.cuda.set_device(comm.device)
    dist.init_process_group("nccl", device_id=torch.device("cuda", comm.device))
    rank, world = comm.rank, comm.size
    assert (rank, world) == (dist.get_rank(), dist.get_world_size())
    {"collectives": collectives, "all_to_all": all_to_all, "p2p": p2p, "symmetric": symmetric, "graph": graph}[section](
        rank, world)
    torch.cuda.synchronize()
    braid.check()
    print(f"{section} OK", flush=True)
    dist.destroy_process_group()
    braid.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
