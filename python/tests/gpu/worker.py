"""One rank of the GPU tests (python/tests/test_gpu.py starts 2 under torchrun): braid's calls on tensors against
torch.distributed's on the same random data (NCCL, or its host form where ranks share a GPU: reference.py).
argv[1] names the section; prints '<section> OK' on success and raises (non-zero exit) on the first difference."""
import sys

import torch
import torch.distributed as dist

import braid
from reference import init_process_group, reference_calls

REFERENCE = dist  # set by main(): NCCL, or its host form where ranks share a GPU (reference.py)

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
        raise AssertionError(f"{what}: braid and the reference differ")


def collectives(rank, world):
    for dtype in DTYPES:
        for count in SIZES:
            seed = hash((str(dtype), count, rank)) % (1 << 31)
            for op in OPS:
                if op is braid.ReduceOp.AVG and not dtype.is_floating_point:
                    continue  # NCCL's avg on integers truncates as braid's does; torch refuses AVG on ints
                x, reference = random(count, dtype, seed), random(count, dtype, seed)
                braid.all_reduce(x, op)
                REFERENCE.all_reduce(reference, TORCH_OPS[op])
                same(x, reference, f"all_reduce {dtype} {count} {op}")
                for root in range(world):
                    x, reference = random(count, dtype, seed), random(count, dtype, seed)
                    braid.reduce(x, root, op)
                    REFERENCE.reduce(reference, root, TORCH_OPS[op])
                    if rank == root:
                        same(x, reference, f"reduce {dtype} {count} {op} root {root}")
                out = torch.empty(count, dtype=dtype, device="cuda")
                reference = torch.empty_like(out)
                source = random(count * world, dtype, seed)
                braid.reduce_scatter_tensor(out, source, op)
                REFERENCE.reduce_scatter_tensor(reference, source, TORCH_OPS[op])
                same(out, reference, f"reduce_scatter_tensor {dtype} {count} {op}")
            for root in range(world):
                x, reference = random(count, dtype, seed), random(count, dtype, seed)
                braid.broadcast(x, root)
                REFERENCE.broadcast(reference, root)
                same(x, reference, f"broadcast {dtype} {count} root {root}")
            mine = random(count, dtype, seed)
            out, reference = (torch.empty(count * world, dtype=dtype, device="cuda") for _ in range(2))
            braid.all_gather_into_tensor(out, mine)
            REFERENCE.all_gather_into_tensor(reference, mine)
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
            REFERENCE.all_to_all_single(reference, source)
            same(out, reference, f"all_to_all_single {dtype} {count}")
    # Uneven splits (rows of 3 elements): rank r sends r + q + 1 rows to rank q.
    send_splits = [rank + q + 1 for q in range(world)]
    recv_splits = [q + rank + 1 for q in range(world)]
    source = random(sum(send_splits) * 3, torch.float32, rank).view(-1, 3)
    out = torch.empty(sum(recv_splits), 3, device="cuda")
    reference = torch.empty_like(out)
    braid.all_to_all_single(out, source, recv_splits, send_splits)
    REFERENCE.all_to_all_single(reference, source, recv_splits, send_splits)
    same(out, reference, "all_to_all_single with split sizes")


def all_to_all_device(rank, world):
    """braid.all_to_all_v_device (split sizes on the GPU) against torch.distributed.all_to_all_single with the same
    splits: the packed output, the received counts and offsets, rows past them untouched; input blocks at given
    offsets; nothing to send; an overflow of the capacity (no rows written, counts written, check() raises); and a
    captured CUDA graph replayed with the counts changed on the device."""
    def exchange(send_splits):
        everyone = gathered(torch.tensor(send_splits, device="cuda"), world)
        return [int(everyone[q][rank]) for q in range(world)]

    def offsets_of(splits):
        return [sum(splits[:q]) for q in range(len(splits))]

    for dtype, row_shape in [(torch.float32, (3,)), (torch.bfloat16, ()), (torch.int64, (2, 5))]:
        row = 1
        for extent in row_shape:
            row *= extent
        send_splits = [(rank + 2 * q + 1) % 5 for q in range(world)]
        recv_splits = exchange(send_splits)
        source = random(sum(send_splits) * row, dtype, rank + 7).view(-1, *row_shape)
        reference = torch.empty(sum(recv_splits), *row_shape, dtype=dtype, device="cuda")
        REFERENCE.all_to_all_single(reference, source, recv_splits, send_splits)
        out = torch.full((sum(recv_splits) + 3, *row_shape), 7, dtype=dtype, device="cuda")
        counts, offsets = braid.all_to_all_v_device(out, source, torch.tensor(send_splits, device="cuda"))
        what = f"all_to_all_v_device {dtype} rows {row_shape}"
        same(out[:sum(recv_splits)], reference, what)
        same(out[sum(recv_splits):], torch.full_like(out[sum(recv_splits):], 7), f"{what}: rows past the received")
        assert counts.tolist() == recv_splits, f"{what}: counts {counts.tolist()}, expected {recv_splits}"
        assert offsets.tolist() == offsets_of(recv_splits), f"{what}: offsets {offsets.tolist()}"
        # The same blocks laid out in reverse rank order in the input, sent from their offsets.
        blocks = list(source.split(send_splits))
        reversed_source = torch.cat(blocks[::-1])
        starts = [sum(send_splits[q + 1:]) for q in range(world)]
        out2, counts2, offsets2 = torch.empty_like(out), torch.empty_like(counts), torch.empty_like(offsets)
        got = braid.all_to_all_v_device(out2, reversed_source, torch.tensor(send_splits, device="cuda"), counts2,
                                        input_offsets=torch.tensor(starts, device="cuda"), output_offsets=offsets2)
        assert got[0] is counts2 and got[1] is offsets2
        same(out2[:sum(recv_splits)], reference, f"{what} from input_offsets")
        assert counts2.tolist() == recv_splits and offsets2.tolist() == offsets_of(recv_splits)
    # The functional op (a torch.library custom op), eager and under torch.compile (full graph), against the same
    # reference: the rows, the received counts and offsets.
    send_splits = [(rank + q + 2) % 4 for q in range(world)]
    recv_splits = exchange(send_splits)
    source = random(sum(send_splits) * 3, torch.float32, rank + 11).view(-1, 3)
    reference = torch.empty(sum(recv_splits), 3, device="cuda")
    REFERENCE.all_to_all_single(reference, source, recv_splits, send_splits)
    splits = torch.tensor(send_splits, device="cuda")
    for name, fn in (("eager", braid.functional.all_to_all_v_device),
                     ("compiled", torch.compile(braid.functional.all_to_all_v_device, backend="aot_eager",
                                                fullgraph=True))):
        out, counts, offsets = fn(source, splits, sum(recv_splits) + 2)
        same(out[:sum(recv_splits)], reference, f"functional all_to_all_v_device ({name})")
        assert counts.tolist() == recv_splits and offsets.tolist() == offsets_of(recv_splits), name
    # Nothing to send (an empty input), and nothing to receive.
    empty = torch.empty(0, 4, device="cuda")
    counts, offsets = braid.all_to_all_v_device(torch.empty(2, 4, device="cuda"), empty,
                                                torch.zeros(world, dtype=torch.int64, device="cuda"))
    assert counts.tolist() == [0] * world and offsets.tolist() == [0] * world, "all_to_all_v_device of nothing"
    # Capacity overflow: one row short. No row is written, the counts are, and check() reports it once.
    send_splits = [q + 1 for q in range(world)]
    recv_splits = exchange(send_splits)
    short = torch.full((sum(recv_splits) - 1, 3), -1.0, device="cuda")
    counts, _ = braid.all_to_all_v_device(short, torch.ones(sum(send_splits), 3, device="cuda"),
                                          torch.tensor(send_splits, device="cuda"))
    torch.cuda.synchronize()
    same(short, torch.full_like(short, -1.0), "all_to_all_v_device overflow writes no rows")
    assert counts.tolist() == recv_splits, "all_to_all_v_device overflow still writes the counts"
    try:
        braid.check()
        raise AssertionError("all_to_all_v_device overflow: check() raised nothing")
    except braid.Error:
        pass
    braid.check()  # reported once
    torch.cuda.synchronize()
    braid.barrier()
    # Captured once, replayed with other counts written on the device.
    capacity = 8 * world
    source = torch.empty(capacity, 3, device="cuda")
    splits = torch.zeros(world, dtype=torch.int64, device="cuda")
    out = torch.zeros(capacity, 3, device="cuda")
    counts = torch.empty(world, dtype=torch.int64, device="cuda")
    offsets = torch.empty_like(counts)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        braid.all_to_all_v_device(out, source, splits, counts, output_offsets=offsets)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        braid.all_to_all_v_device(out, source, splits, counts, output_offsets=offsets)
    for replay in range(5):
        send_splits = [(replay + rank + q) % 8 for q in range(world)]
        recv_splits = exchange(send_splits)
        source.copy_(random(capacity * 3, torch.float32, replay * 10 + rank).view(capacity, 3))
        splits.copy_(torch.tensor(send_splits))
        graph.replay()
        reference = torch.empty(sum(recv_splits), 3, device="cuda")
        REFERENCE.all_to_all_single(reference, source[:sum(send_splits)], recv_splits, send_splits)
        same(out[:sum(recv_splits)], reference, f"all_to_all_v_device replay {replay}")
        assert counts.tolist() == recv_splits and offsets.tolist() == offsets_of(recv_splits), f"replay {replay}"
    torch.cuda.synchronize()
    braid.barrier()


def p2p(rank, world):
    right, left = (rank + 1) % world, (rank - 1) % world
    for count in SIZES:
        mine = random(count, torch.float32, rank + count)
        got, reference = torch.empty_like(mine), torch.empty_like(mine)
        braid.batch_isend_irecv([braid.P2POp(braid.send, mine, right), braid.P2POp(braid.recv, got, left)])
        for request in REFERENCE.batch_isend_irecv([dist.P2POp(dist.isend, mine, right),
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
    # The functional forms (custom ops), eager and compiled: a ring exchange of two tensors and a reduce.
    mine, second = random(1000, torch.float32, rank + 5), random(77, torch.bfloat16, rank + 6)
    references = [torch.empty_like(mine), torch.empty_like(second)]
    for request in REFERENCE.batch_isend_irecv([dist.P2POp(dist.isend, mine, right),
                                                dist.P2POp(dist.isend, second, right),
                                                dist.P2POp(dist.irecv, references[0], left),
                                                dist.P2POp(dist.irecv, references[1], left)]):
        request.wait()

    def ring(a, b):
        return braid.functional.send_recv([a, b], [right, right], [a, b], [left, left])

    for name, fn in (("eager", ring), ("compiled", torch.compile(ring, backend="aot_eager", fullgraph=True))):
        got = fn(mine, second)
        same(got[0], references[0], f"functional send_recv ({name})")
        same(got[1], references[1], f"functional send_recv, second tensor ({name})")
    if world >= 2 and rank < 2:
        if rank == 0:
            braid.functional.send(mine, 1)
        else:
            same(braid.functional.recv(mine, 0), random(1000, torch.float32, 5), "functional send/recv")
    for dst in range(world):
        reference = mine.clone()
        REFERENCE.reduce(reference, dst)
        got = braid.functional.reduce(mine, dst)
        same(got, reference if rank == dst else mine, f"functional reduce to {dst}")


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
        REFERENCE.all_reduce(reference)
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


# MoE ---------------------------------------------------------------------------------------------------------
MOE_T, MOE_H, MOE_K = 37, 256, 4


def routing(rows, experts, k, seed, hot=0, empty=()):
    """Distinct expert ids per token (some -1), experts in `empty` never chosen, expert `hot` chosen by most."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    scores = torch.rand(rows, experts, generator=generator)
    scores[:, hot] += 0.7  # hot
    for e in empty:
        scores[:, e] = -1.0  # never in the top k
    weights, index = scores.topk(k, dim=1)
    drop = torch.rand(rows, k, generator=generator) < 0.1
    index[drop] = -1
    weights = torch.rand(rows, k, generator=generator)
    return index.cuda(), weights.float().cuda()


def gathered(tensor, world):
    parts = [torch.empty_like(tensor) for _ in range(world)]
    REFERENCE.all_gather(parts, tensor.contiguous())
    return parts


def moe_reference_out(x, index, weights, experts):
    """out[t] = sum over valid k of w[t, k] * (e + 1) * x[t], in float32."""
    scale = torch.where(index >= 0, weights * (index.float() + 1), torch.zeros_like(weights)).sum(1, keepdim=True)
    return x.float() * scale


def moe(rank, world):
    E = 4 * world
    x = random(MOE_T * MOE_H, torch.float32, rank).view(MOE_T, MOE_H).to(torch.bfloat16)
    index, weights = routing(MOE_T, E, MOE_K, seed=rank, hot=rank % E, empty=(E - 1,))
    xs, idxs, ws = gathered(x, world), gathered(index, world), gathered(weights, world)
    lo = rank * (E // world)
    for layout, fixed in (("expert_major", False), ("rank_major", False), ("rank_major", True)):
        buffer = braid.MoeBuffer(MOE_H, MOE_T, MOE_K, E, layout=layout, expert_alignment=1 if layout == "rank_major"
                                 else 8, low_latency=fixed)
        got = buffer.dispatch(x, index, weights)
        torch.cuda.synchronize()
        counts = got.expert_counts.cpu()
        for j in range(E // world):  # the pairs each local expert receives, from every rank
            expected = sum(int((idxs[s] == lo + j).sum()) for s in range(world))
            assert counts[j] == expected, f"{layout} expert {j}: {counts[j]} rows, expected {expected}"
        if layout == "expert_major":
            offsets = got.expert_offsets.cpu()
            for j in range(E // world):
                assert offsets[j] % 8 == 0
                for row in range(offsets[j], offsets[j] + counts[j]):
                    s, t = int(got.source_rank[row]), int(got.source_token[row])
                    assert int(got.local_expert[row]) == j and lo + j in idxs[s][t].tolist()
                    same(got.x[row], xs[s][t], f"{layout} row {row}")
            y = torch.zeros_like(got.x)
            used = int(offsets[-1])
            y[:used] = (got.x[:used].float() * (got.local_expert[:used, None].float() + lo + 1)).to(y.dtype)
            out = buffer.combine(y)  # weighted
        else:
            received = got.received_tokens.cpu()
            for s in range(world):
                here = ((idxs[s] >= lo) & (idxs[s] < lo + E // world)).any(1)
                mine = here.nonzero().flatten()
                want = MOE_T if fixed else len(mine)  # low latency: the source's T, holes included
                assert received[s] == want, f"rank-major: {received[s]} tokens from {s}, expected {want}"
                for i, t in enumerate(mine.tolist()):
                    row = s * MOE_T + (t if fixed else i)
                    assert (int(got.source_rank[row]), int(got.source_token[row])) == (s, t)
                    same(got.x[row], xs[s][t], f"rank-major row {row}")
                if fixed:
                    for t in (~here).nonzero().flatten().tolist():
                        row = s * MOE_T + t
                        assert int(got.source_rank[row]) == -1 and bool((got.topk_expert[row] == -1).all()), \
                            f"low-latency row {row} is not a hole"

            valid = (torch.arange(world * MOE_T, device="cuda") % MOE_T
                     < got.received_tokens.repeat_interleave(MOE_T))[:, None]
            te = got.topk_expert
            scale = torch.where(te >= 0, got.topk_weights * (te.float() + lo + 1), 0.0).sum(1, keepdim=True)
            got.combine_input.copy_(torch.where(valid, got.x.float() * scale, 0.0).to(torch.bfloat16))
            out = buffer.combine(got.combine_input)
        same(out, moe_reference_out(x, index, weights, E), f"{layout}{' low-latency' if fixed else ''} combine")
        pinned = buffer.copy_expert_counts()
        torch.cuda.synchronize()
        assert torch.equal(pinned, counts), "copy_expert_counts"
        torch.cuda.synchronize()
        braid.barrier()
    # fp8 rank-major dispatch: rows and scales arrive bit for bit.
    buffer = braid.MoeBuffer(MOE_H, MOE_T, MOE_K, E, layout="rank_major", dispatch_dtype=torch.float8_e4m3fn)
    x8 = x.float().to(torch.float8_e4m3fn)
    scales = torch.rand(MOE_T, MOE_H // 128, device="cuda")
    got = buffer.dispatch(x8, index, weights, x_scales=scales)
    torch.cuda.synchronize()
    x8s, scs = gathered(x8.view(torch.uint8), world), gathered(scales, world)
    for row in range(world * MOE_T):
        if row % MOE_T < int(got.received_tokens[row // MOE_T]):
            s, t = int(got.source_rank[row]), int(got.source_token[row])
            assert torch.equal(got.x[row].view(torch.uint8), x8s[s][t]) and torch.equal(got.scales[row], scs[s][t])
    torch.cuda.synchronize()
    braid.barrier()


def moe_graph(rank, world):
    """200 replays of a captured dispatch + combine with T (and the routing) changed on the device."""
    E, T = 4 * world, 64
    buffer = braid.MoeBuffer(MOE_H, T, MOE_K, E)
    x = torch.empty(T, MOE_H, dtype=torch.bfloat16, device="cuda")
    index = torch.full((T, MOE_K), -1, dtype=torch.int64, device="cuda")
    weights = torch.zeros(T, MOE_K, device="cuda")
    tokens = torch.zeros(1, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        got = buffer.dispatch(x, index, weights, tokens)
        out = buffer.combine(got.x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = buffer.dispatch(x, index, weights, tokens)
        out = buffer.combine(got.x)  # y = the dispatched rows: out[t] = sum_k w * x[t]
    for replay in range(200):
        generator = torch.Generator(device="cpu").manual_seed(replay * 100 + rank)
        t = int(torch.randint(0, T + 1, (1,), generator=generator))
        new_index, new_weights = routing(T, E, MOE_K, seed=replay * 100 + rank, hot=replay % E)
        x.copy_(random(T * MOE_H, torch.float32, replay + rank).view(T, MOE_H))
        index.copy_(new_index)
        weights.copy_(new_weights)
        tokens.fill_(t)
        graph.replay()
        expected = x[:t].float() * torch.where(index[:t] >= 0, weights[:t], 0.0).sum(1, keepdim=True)
        same(out[:t], expected, f"replay {replay} T={t}")
    torch.cuda.synchronize()
    braid.barrier()


def moe_layer(x, router, experts, buffer, lo):
    """Router, dispatch, per-expert matmul (rank-major: each received token through this rank's experts of its
    top k, weighted, summed), combine."""
    T = buffer.max_tokens
    weights, index = (x.float() @ router).softmax(-1).topk(buffer.top_k, dim=-1)
    got = buffer.dispatch(x, index, weights)
    rows, te, tw, received = got.x, got.topk_expert, got.topk_weights, got.received_tokens
    R = rows.shape[0]
    valid = (torch.arange(R, device=rows.device) % T < received.repeat_interleave(T))[:, None]
    outs = torch.einsum("rh,lhd->rld", torch.where(valid, rows.float(), 0.0), experts)
    pick = outs.gather(1, te.long().clamp(min=0)[:, :, None].expand(R, te.shape[1], outs.shape[2]))
    y = (pick * torch.where(te >= 0, tw, 0.0)[:, :, None]).sum(1).to(x.dtype)
    return buffer.combine(y)


def moe_layer_expert_major(x, router, experts, buffer):
    """The same layer on an expert-major buffer: each received row through its local expert, then a weighted
    combine (braid applies the routing weights)."""
    weights, index = (x.float() @ router).softmax(-1).topk(buffer.top_k, dim=-1)
    got = buffer.dispatch(x, index, weights)
    expert_of_row = experts[got.local_expert.long().clamp(min=0)]  # [R, H, H]; padding rows of x are zeros
    return buffer.combine(torch.einsum("rh,rhd->rd", got.x, expert_of_row), weighted=True)


def moe_compile(rank, world):
    E, T, H = 4 * world, 32, 128
    buffer = braid.MoeBuffer(H, T, 2, E, layout="rank_major")
    generator = torch.Generator(device="cuda").manual_seed(7)
    router = torch.randn(H, E, device="cuda", generator=generator)
    experts = torch.randn(E // world, H, H, device="cuda", generator=generator) / H ** 0.5
    x = random(T * H, torch.float32, rank).view(T, H).to(torch.bfloat16)
    lo = rank * (E // world)
    eager = moe_layer(x, router, experts, buffer, lo).clone()
    compiled = torch.compile(moe_layer, fullgraph=True)
    got = compiled(x, router, experts, buffer, lo)
    same(got, eager, "torch.compile'd MoE layer against eager")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(moe_layer)(x, router, experts, buffer, lo)
    assert explained.graph_break_count == 0, explained.break_reasons
    # functional collectives compile too
    fn = torch.compile(lambda t: braid.functional.all_reduce(t * 2), fullgraph=True)
    same(fn(torch.ones(1000, device="cuda")), torch.full((1000,), 2.0 * world, device="cuda"), "compiled all_reduce")
    torch.cuda.synchronize()
    braid.barrier()


def compile_first(rank, world):
    """The process's first braid call is traced by torch.compile(fullgraph=True): the custom ops exist already."""
    fn = torch.compile(lambda t: braid.functional.all_reduce(t * 2), fullgraph=True)
    x = random(4099, torch.float32, rank)
    expected = x * 2
    REFERENCE.all_reduce(expected)
    same(fn(x), expected, "all_reduce compiled before any eager braid call")


def moe_backward(rank, world):
    """Plain autograd through dispatch and combine (the ops' registered formulas: combine's backward a redispatch
    or a dispatch of the output gradient, dispatch's a combine, the routing weights' gradient back through
    moe_to_sources), on every layout, in float32: the output, the input gradient (through the rows and through
    the router), the gradient of this rank's experts and the router's (summed over ranks) against a reference on
    every rank's tokens and experts, all-gathered here."""
    E, T, H, K = 4 * world, 32, 128, 2
    L, lo = E // world, rank * (E // world)
    router_init = torch.randn(H, E, device="cuda", generator=torch.Generator(device="cuda").manual_seed(11))
    for layout, fixed in (("rank_major", False), ("rank_major", True), ("expert_major", False)):
        router = router_init.clone().requires_grad_()
        mine = torch.randn(L, H, H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(100 + rank))
        experts = (mine / H ** 0.5).requires_grad_()
        x = random(T * H, torch.float32, rank).view(T, H).requires_grad_()
        grad_out = random(T * H, torch.float32, rank + 99).view(T, H)
        buffer = braid.MoeBuffer(H, T, K, E, layout=layout, dtype=torch.float32, low_latency=fixed)
        if layout == "rank_major":
            out = moe_layer(x, router, experts, buffer, lo)
        else:
            out = moe_layer_expert_major(x, router, experts, buffer)
        out.backward(grad_out)
        # Reference: every rank's tokens through every expert, on this GPU alone.
        xs = torch.cat(gathered(x.detach(), world)).requires_grad_()
        experts_all = torch.cat(gathered(experts.detach(), world)).requires_grad_()
        router_ref = router_init.clone().requires_grad_()
        weights, index = (xs @ router_ref).softmax(-1).topk(K, dim=-1)
        per = torch.einsum("th,ehd->ted", xs, experts_all)
        ref = (per.gather(1, index[:, :, None].expand(-1, K, H)) * weights[:, :, None]).sum(1)
        ref.backward(torch.cat(gathered(grad_out, world)))
        block = slice(rank * T, (rank + 1) * T)
        name = layout + (" low-latency" if fixed else "")
        same(out, ref[block], f"{name} MoE layer forward against the all-gathered reference")
        same(x.grad, xs.grad[block], f"{name} input gradient against the all-gathered reference")
        same(experts.grad, experts_all.grad[lo:lo + L], f"{name} experts' gradient against the reference")
        router_grad = router.grad.clone()
        REFERENCE.all_reduce(router_grad)
        same(router_grad, router_ref.grad, f"{name} router gradient (the routing weights') against the reference")
        torch.cuda.synchronize()
        braid.barrier()
        buffer.close()


def signal_pad(rank, world):
    """braid.SignalPad from Triton kernels, as docs/python.md shows them: each round every rank writes its peer's
    copy of a symmetric tensor, signals it on channel 1 and waits for its own writer's signal, reads, and then the
    ranks pass a barrier of signals on channel 0 before the next round overwrites anything. 50 rounds; the
    counters and expected counts end in step; check() finds nothing."""
    triton = required_module("triton")
    import triton.language as tl

    @triton.jit
    def signal(peers, channel, me, peer, world):
        counters = tl.load(peers + peer).to(tl.pointer_type(tl.int64))
        tl.atomic_add(counters + channel * world + me, 1, sem="release", scope="sys")

    @triton.jit
    def wait(counters, expected, channel, peer, world):
        slot = channel * world + peer
        target = tl.load(expected + slot) + 1
        tl.store(expected + slot, target)
        seen = tl.atomic_add(counters + slot, 0, sem="acquire", scope="sys")
        while seen < target:
            seen = tl.atomic_add(counters + slot, 0, sem="acquire", scope="sys")

    pad = braid.SignalPad(2)
    assert (pad.rank, pad.world, pad.channels) == (rank, world, 2)
    assert len(pad.struct) == braid._braid.SIGNAL_PAD_STRUCT_BYTES, len(pad.struct)  # the device struct, by value
    counters, expected, peers = pad.counters(), pad.expected(), pad.peers()
    assert counters.shape == expected.shape == (2, world) and peers.shape == (world,)
    data = braid.empty(4096, dtype=torch.float32)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    rounds = 50
    for r in range(1, rounds + 1):
        data.peer(nxt).fill_(float(rank * 1000 + r))  # into the next rank's copy, then the signal (stream order)
        signal[(1,)](peers, 1, rank, nxt, world)
        wait[(1,)](counters, expected, 1, prev, world)
        same(data, torch.full_like(data, float(prev * 1000 + r)), f"signal_pad round {r}: the writer's data")
        for q in range(world):  # a barrier: nobody writes the next round before everyone has read this one
            if q != rank:
                signal[(1,)](peers, 0, rank, q, world)
        for q in range(world):
            if q != rank:
                wait[(1,)](counters, expected, 0, q, world)
    torch.cuda.synchronize()
    want = torch.zeros(2, world, dtype=torch.int64)
    want[0, :] = rounds
    want[1, prev] = rounds
    want[:, rank] = 0
    assert torch.equal(counters.cpu(), want) and torch.equal(expected.cpu(), want), (counters, expected)
    pad.check()
    braid.barrier()


def required_module(name):
    try:
        return __import__(name)
    except ImportError:
        raise AssertionError(f"{name} is not installed: the signal_pad section needs it") from None


def init_group(rank, world):
    """braid.init(group=dist.group.WORLD) after torch.distributed: a second communicator through its store."""
    braid.destroy()
    comm = braid.init(group=dist.group.WORLD)
    assert (comm.rank, comm.size) == (rank, world)
    x = torch.full((100,), float(rank + 1), device="cuda")
    braid.all_reduce(x)
    same(x, torch.full((100,), world * (world + 1) / 2, device="cuda"), "all_reduce after init(group=)")


# Fused GEMM + collective (braid.ops) --------------------------------------------------------------------------
# NOTE [fused matmul tolerance]: bfloat16 keeps 8 significant bits, so one rounding moves a value v by up to
# |v| * 2^-8. braid and the reference both accumulate in float32 but split the GEMM differently (braid by blocks of
# rows through cuBLASLt, torch through cuBLAS) and round at different points (reduce-scatter: braid adds each peer's
# rounded product to its own in float32, the reference adds rounded products), so an element may differ by a few
# roundings of the terms that made it. Inputs are scaled so that products are about N(0, 1): terms stay below 5
# in practice, and rtol 2e-2 with atol 5e-2 covers three roundings of such terms while a wrong block, a wrong rank's
# data or a missing term (an error of about 1) still fails.
FUSED_TOLERANCE = dict(rtol=2e-2, atol=5e-2)


def fused_random(shape, seed, scale=1.0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=generator, device="cuda") * scale).to(torch.bfloat16)


def fused_close(got, expected, what):
    torch.cuda.synchronize()
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    torch.testing.assert_close(got.float(), expected.float(), msg=what, **FUSED_TOLERANCE)


def reference_gather(tensor, dim):
    """The reference all-gather along `dim` (rank order)."""
    moved = tensor.movedim(dim, 0).contiguous()
    out = moved.new_empty((dist.get_world_size() * moved.shape[0], *moved.shape[1:]))
    REFERENCE.all_gather_into_tensor(out, moved)
    return out.movedim(0, dim)


def reference_scatter(tensor, dim, op=dist.ReduceOp.SUM):
    """The reference reduce-scatter along `dim`."""
    moved = tensor.movedim(dim, 0).contiguous()
    out = moved.new_empty((moved.shape[0] // dist.get_world_size(), *moved.shape[1:]))
    REFERENCE.reduce_scatter_tensor(out, moved, op)
    return out.movedim(0, dim)


def fused_matmul(rank, world):
    """braid.ops.all_gather_matmul and matmul_reduce_scatter against the unfused reference (the reference
    all-gather then torch.matmul; torch.matmul then the reference reduce-scatter) on random bfloat16 data (NOTE
    [fused matmul tolerance]): odd row counts, several Bs (a Linear weight's .t() and a row-major matrix), return_A, gather and
    scatter dims 1 of 3-D tensors and the last dim, 'avg'; a captured graph whose replays equal eager calls on the
    same inputs; autograd gradients against the reference's; torch.compile(fullgraph=True) against eager; and the
    argument errors (raised on every rank before anything is enqueued)."""
    # all_gather_matmul: (rows per rank, K, N), K and N multiples of 8 (16-byte rows).
    for rows, k, n in ((64, 256, 128), (37, 128, 72), (1, 8, 8), (129, 1024, 520)):
        x = fused_random((rows, k), rank * 100 + rows, k ** -0.5)
        weight = fused_random((n, k), 7 + n)  # a Linear layer's [N, K]: B = weight.t()
        dense = fused_random((k, 2 * n), 8 + n)
        full = reference_gather(x, 0)
        A, (y1, y2) = braid.ops.all_gather_matmul(x, [weight.t(), dense])
        torch.cuda.synchronize()
        assert torch.equal(A, full), f"all_gather_matmul {rows}x{k}x{n}: the gathered A"
        fused_close(y1, full @ weight.t(), f"all_gather_matmul {rows}x{k}x{n}, B = weight.t()")
        fused_close(y2, full @ dense, f"all_gather_matmul {rows}x{k}x{n}, second B")
        none, (y,) = braid.ops.all_gather_matmul(x, [dense], return_A=False)
        assert none is None
        fused_close(y, full @ dense, f"all_gather_matmul {rows}x{k}x{n} without A")
    x3 = fused_random((3, 5, 64), rank + 40, 0.125)  # gather_dim 1 of a 3-D A: [3, 5 * world, 64]
    B = fused_random((64, 48), 41)
    A, (y,) = braid.ops.all_gather_matmul(x3, [B], gather_dim=1)
    full = reference_gather(x3, 1)
    torch.cuda.synchronize()
    assert A.shape == (3, 5 * world, 64) and torch.equal(A, full), "all_gather_matmul gather_dim=1: the gathered A"
    fused_close(y, full @ B, "all_gather_matmul gather_dim=1")
    A, (y,) = braid.ops.all_gather_matmul(x3, [fused_random((64 * world, 16), 42)], gather_dim=2)  # unfused: K
    fused_close(y, reference_gather(x3, 2) @ fused_random((64 * world, 16), 42), "all_gather_matmul gather_dim=2")

    # matmul_reduce_scatter: (rows per rank of the output, K, N).
    for rows, k, n in ((32, 256, 128), (19, 120, 72), (1, 8, 8), (77, 1024, 264)):
        a = fused_random((rows * world, k), rank * 100 + rows + 1, k ** -0.5)
        weight = fused_random((n, k), 9 + n)
        partial = a @ weight.t()
        for op, torch_op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
            got = braid.ops.matmul_reduce_scatter(a, weight.t(), op)
            fused_close(got, reference_scatter(partial, 0, torch_op), f"matmul_reduce_scatter {rows}x{k}x{n} {op}")
        dense = weight.t().contiguous()
        fused_close(braid.ops.matmul_reduce_scatter(a, dense), reference_scatter(a @ dense, 0),
                    f"matmul_reduce_scatter {rows}x{k}x{n}, row-major B")
    a3 = fused_random((3, 4 * world, 64), rank + 50, 0.125)
    B = fused_random((64, 40), 51)
    fused_close(braid.ops.matmul_reduce_scatter(a3, B, scatter_dim=1), reference_scatter(a3 @ B, 1),
                "matmul_reduce_scatter scatter_dim=1")
    B = fused_random((64, 8 * world), 52)
    fused_close(braid.ops.matmul_reduce_scatter(a3, B, scatter_dim=2), reference_scatter(a3 @ B, 2),
                "matmul_reduce_scatter scatter_dim=2 (unfused: N)")

    fused_graph(rank, world)
    fused_backward(rank, world)
    fused_compile(rank, world)
    fused_errors(rank, world)
    torch.cuda.synchronize()
    braid.barrier()


def fused_graph(rank, world):
    """A column-parallel GEMM then a row-parallel one captured in one graph, after a warm-up (NOTE [GEMM algorithm
    choice]); each replay, on new inputs, equals eager calls on those inputs bit for bit."""
    rows, k, n = 48, 512, 256
    x = fused_random((rows, k), rank, k ** -0.5)
    w1, w2 = fused_random((n, k), 60, n ** -0.5), fused_random((k, n), 61, n ** -0.5)

    def layer():
        _, (h,) = braid.ops.all_gather_matmul(x, [w1.t()], return_A=False)
        return braid.ops.matmul_reduce_scatter(h, w2.t())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager first: the workspace grows, and each GEMM shape settles its algorithm
        for _ in range(16):
            layer()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()  # the algorithm trials read: the capture and the eager calls after it run alike
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer()
    for replay in range(5):
        x.copy_(fused_random((rows, k), rank + 10 * replay, k ** -0.5))
        graph.replay()
        expected = layer()
        torch.cuda.synchronize()
        assert torch.equal(captured, expected), f"fused graph replay {replay} differs from the eager calls"
    torch.cuda.synchronize()
    braid.barrier()


def fused_backward(rank, world):
    """Gradients through both ops (each the other's backward) against the reference's: every rank's loss on the
    gathered input (all-gathered by the reference) differentiated by plain torch, dA reduce-scattered by it."""
    rows, k, n = 24, 256, 128
    x = fused_random((2, rows, k), rank, k ** -0.5).requires_grad_()  # gather_dim 1 of a 3-D input
    w1 = fused_random((n, k), 70 + rank, k ** -0.5).requires_grad_()  # each rank's own columns
    g1 = fused_random((2, rows * world, n), 80 + rank)
    _, (y,) = braid.ops.all_gather_matmul(x, [w1.t()], gather_dim=1, return_A=False)
    y.backward(g1)
    full = reference_gather(x.detach(), 1).float().requires_grad_()
    w1_ref = w1.detach().float().requires_grad_()
    (full @ w1_ref.t()).backward(g1.float())
    fused_close(x.grad, reference_scatter(full.grad, 1), "all_gather_matmul: the input's gradient")
    fused_close(w1.grad, w1_ref.grad, "all_gather_matmul: B's gradient")

    a = fused_random((rows * world, n), rank + 90, n ** -0.5).requires_grad_()
    w2 = fused_random((k, n), 100 + rank, n ** -0.5).requires_grad_()  # each rank's own rows
    g2 = fused_random((rows, k), 110 + rank)
    for op, scale in (("sum", 1.0), ("avg", 1.0 / world)):
        a.grad = w2.grad = None
        braid.ops.matmul_reduce_scatter(a, w2.t(), op).backward(g2)
        g_full = reference_gather(g2, 0).float() * scale
        fused_close(a.grad, g_full @ w2.detach().float(), f"matmul_reduce_scatter {op}: A's gradient")
        fused_close(w2.grad, (a.detach().float().t() @ g_full).t(), f"matmul_reduce_scatter {op}: B's gradient")
    torch.cuda.synchronize()
    braid.barrier()


def fused_compile(rank, world):
    """A tensor-parallel MLP under torch.compile(fullgraph=True) against eager, forward and backward."""
    rows, k, n = 32, 256, 512
    w1 = fused_random((n, k), 120 + rank, k ** -0.5)
    w2 = fused_random((k, n), 130 + rank, n ** -0.5)

    def mlp(x, w1, w2):
        _, (h,) = braid.ops.all_gather_matmul(x, [w1.t()], return_A=False)
        return braid.ops.matmul_reduce_scatter(torch.nn.functional.relu(h), w2.t())

    x = fused_random((rows, k), rank + 140, k ** -0.5)
    eager = mlp(x, w1, w2)
    compiled = torch.compile(mlp, fullgraph=True)
    fused_close(compiled(x, w1, w2), eager, "compiled tensor-parallel MLP against eager")
    leaves = [t.clone().requires_grad_() for t in (x, w1, w2)]
    mlp(*leaves).sum().backward()
    again = [t.clone().requires_grad_() for t in (x, w1, w2)]
    torch.compile(mlp, fullgraph=True)(*again).sum().backward()
    for name, got, want in zip(("x", "w1", "w2"), again, leaves):
        fused_close(got.grad, want.grad, f"compiled tensor-parallel MLP: {name}'s gradient")
    torch.cuda.synchronize()
    braid.barrier()


def fused_errors(rank, world):
    """Argument errors name the argument, on every rank alike, before anything is enqueued."""
    x, B = fused_random((8, 64), rank), fused_random((64, 16), 1)
    cases = [
        (lambda: braid.ops.all_gather_matmul(x.float(), [B.float()]), "argument 'A_shard' has dtype torch.float32"),
        (lambda: braid.ops.all_gather_matmul(x, [B.cpu()]), "argument 'Bs[0]' is on cpu"),
        (lambda: braid.ops.matmul_reduce_scatter(fused_random((3 * world + 1, 64), 2), B), "argument 'A' has shape"),
        (lambda: braid.ops.matmul_reduce_scatter(x, B.cpu()), "argument 'B' is on cpu"),
        (lambda: braid.ops.matmul_reduce_scatter(x, B.half()), "argument 'B' has dtype torch.float16"),
    ]
    for call, message in cases:
        try:
            call()
        except braid.Error as error:
            assert error.code == braid.ErrorCode.INVALID_ARGUMENT and message in str(error), str(error)
        else:
            raise AssertionError(f"no error for {message!r}")
    braid.check()
    # The communicator still works: a call after the refusals.
    _, (y,) = braid.ops.all_gather_matmul(x, [B])
    fused_close(y, reference_gather(x, 0) @ B, "all_gather_matmul after the refused calls")


def main() -> int:
    global REFERENCE
    section = sys.argv[1]
    comm = braid.init()
    torch.cuda.set_device(comm.device)
    init_process_group(comm.device, comm.size)
    REFERENCE = reference_calls(comm.size)
    rank, world = comm.rank, comm.size
    assert (rank, world) == (dist.get_rank(), dist.get_world_size())
    sections = {"collectives": collectives, "all_to_all": all_to_all, "all_to_all_device": all_to_all_device,
                "p2p": p2p, "symmetric": symmetric, "graph": graph, "moe": moe, "moe_graph": moe_graph,
                "moe_compile": moe_compile, "moe_backward": moe_backward, "signal_pad": signal_pad,
                "init_group": init_group, "compile_first": compile_first, "fused_matmul": fused_matmul}
    sections[section](rank, world)
    torch.cuda.synchronize()
    braid.check()
    print(f"{section} OK", flush=True)
    dist.destroy_process_group()
    braid.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
