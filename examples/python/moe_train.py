"""A small expert-parallel MoE layer trained with SGD on braid's dispatch and combine.

    torchrun --nproc-per-node 2 examples/python/moe_train.py       (or braid-run -n 2 python3 ...)

Each rank holds E / W experts (here a [H, H] matrix each) and a batch of T tokens. A router picks each token's top
K experts; braid.MoeBuffer.dispatch sends the token to the ranks holding them, each rank runs its experts on the
rows it received, and combine sums the expert outputs back on the token's rank, weighted by the router. The loss
is the mean squared error against a fixed target map, so it has a minimum the experts can reach. Autograd flows
through dispatch and combine by braid's registered formulas (docs/python.md, "Autograd through MoE"), so the
training loop is plain PyTorch: loss.backward(), then SGD on the experts and the router. Prints the loss per step
on rank 0 and exits non-zero unless the last loss is below half the first."""
import sys

import torch

import braid

T, H, K, E = 64, 128, 2, 8  # tokens per rank, hidden size, experts per token, experts in all
STEPS, LR, ROUTER_LR = 20, 2.0, 0.1


def main() -> int:
    comm = braid.init()  # torchrun's or braid-run's variables
    torch.cuda.set_device(comm.device)
    rank, world = comm.rank, comm.size
    local = E // world  # experts on this rank: [rank * local, (rank + 1) * local)

    # The router and the target map are the same on every rank (one seed); each rank's experts and tokens are its
    # own (seeded by rank).
    shared = torch.Generator(device="cuda").manual_seed(0)
    router = torch.randn(H, E, device="cuda", generator=shared).requires_grad_()
    target = torch.randn(H, H, device="cuda", generator=shared) / H ** 0.5
    mine = torch.Generator(device="cuda").manual_seed(1 + rank)
    experts = (torch.randn(local, H, H, device="cuda", generator=mine) / H ** 0.5).requires_grad_()
    x = torch.randn(T, H, device="cuda", generator=mine)

    # Rank-major: a row per (token, destination rank); this rank reduces its experts' outputs for each received
    # token to one row, weights applied, and combine sums those rows over the ranks. float32 keeps the example's
    # numbers simple (bfloat16 works the same way). One buffer per layer: a backward pass needs its forward's
    # routing, which the buffer holds until its next dispatch.
    moe = braid.MoeBuffer(H, T, K, E, layout="rank_major", dtype=torch.float32)
    optimizer = torch.optim.SGD([{"params": [experts]}, {"params": [router], "lr": ROUTER_LR}], lr=LR)

    def layer(tokens):
        # The routing weights are differentiable: their gradient comes back from the experts' ranks through
        # dispatch's backward (docs/python.md), and trains the router.
        weights, index = (tokens @ router).softmax(-1).topk(K, dim=-1)
        got = moe.dispatch(tokens, index, weights)
        # Under autograd got.x is a copy of the received rows, zero outside them, so the expert's matmul can
        # save it for the backward pass (which moves the gradient through the buffer's rows).
        outs = torch.einsum("rh,lhd->rld", got.x, experts)  # every received row through every local expert
        chosen = got.topk_expert.long()  # the token's k-th expert as a local index here, or -1 (elsewhere)
        picked = outs.gather(1, chosen.clamp(min=0)[:, :, None].expand(-1, K, H))
        gate = torch.where(chosen >= 0, got.topk_weights, 0.0)[:, :, None]  # weight 0 for experts elsewhere
        return moe.combine((picked * gate).sum(1))  # [T, H]: each token's experts summed over the ranks

    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        out = layer(x)
        loss = ((out - x @ target) ** 2).mean()
        loss.backward()  # combine's backward redispatches the gradient; no autograd.Function of our own
        braid.all_reduce(router.grad, braid.ReduceOp.AVG)  # one router on every rank, as data parallelism keeps it
        optimizer.step()
        # The mean over every rank's tokens (each rank's experts learn from every rank's tokens).
        total = loss.detach().reshape(1)
        braid.all_reduce(total, braid.ReduceOp.AVG)
        losses.append(total.item())
        if rank == 0:
            print(f"step {step:2d}  loss {losses[-1]:.5f}", flush=True)

    torch.cuda.synchronize()
    braid.check()  # anything braid's kernels refused (none expected)
    decreased = losses[-1] < 0.5 * losses[0]
    if rank == 0:
        print("OK" if decreased else f"FAILED: the loss went from {losses[0]:.5f} to {losses[-1]:.5f}", flush=True)
    braid.barrier()  # no rank frees its buffer while a peer may still read it
    moe.close()
    braid.destroy()
    return 0 if decreased else 1


if __name__ == "__main__":
    sys.exit(main())
