"""Autograd formulas of braid's ops (torch.library.register_autograd), so that torch.autograd flows through
MoeBuffer.dispatch and combine, and braid.ops' fused GEMMs (NOTE [fused matmul gradients], below), without an
autograd.Function of the caller's. MoE (docs/moe.md, "Handles and the backward pass"):
- combine's backward sends the output gradient where the token's rows went: rank-major, a redispatch on the
  forward's handle; expert-major, a dispatch of the gradient with the forward's routing (the same routing gives
  the same layout, row for row), each row scaled by its routing weight after a weighted combine.
- dispatch's backward is a combine, unweighted, of the received rows' gradient: each token's rows summed back.
- the routing weights (topk_weights) get a gradient wherever they act: through the dispatched weights the caller
  uses (rank-major `topk_weights`, expert-major `weights`: dispatch's backward), and through an expert-major
  weighted combine (combine's backward: out[t] = sum_k w[t, k] y[row of (t, k)], so the gradient of w[t, k] is
  the dot product of out's gradient at t with that row, taken on the expert's rank). Either way each pair's value
  is computed on the rank holding its expert and goes back to the token's rank through braid::moe_to_sources, one
  equal-block all-to-all of [world * max_tokens, local_experts] float32.

The formulas call braid's ops, so they run eagerly and trace under torch.compile alike. Eagerly, a MoE forward's
MoeHandle is kept, and a backward pass whose buffer has been dispatched again since (the buffer then holds
another routing) raises braid.Error instead of moving rows by the wrong routing."""
from __future__ import annotations

from ._error import Error, ErrorCode
from ._handles import comm_of, resolve


def _fake(torch, tensor) -> bool:
    """Whether `tensor` is a stand-in of tracing (meta, fake or functional), not memory braid wrote."""
    if tensor.device.type == "meta":
        return True
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # pragma: no cover - older torch
        return False
    return is_fake(tensor)


def _forward_handle(torch, moe, output, handle: int = -1) -> int:
    """The dispatch number the backward pass checks (-1 while tracing: the buffer's state then is not the
    run's)."""
    if moe._buffer is None or _fake(torch, output):
        return -1
    if handle >= 0:
        return handle
    return moe._last_handle.dispatch if moe._last_handle is not None else -1


def _unsupported_fp8(moe, function: str):
    return Error(f"{function}: the backward pass of an fp8-dispatching buffer would dispatch a quantised "
                 "gradient; braid does not quantise: dispatch the gradient yourself", ErrorCode.UNSUPPORTED)


def _repeated(torch, idx):
    """[T, K] bool: the pairs naming an expert their token named at a smaller k (braid refuses them)."""
    K = idx.shape[1]
    earlier = torch.ones(K, K, dtype=torch.bool, device=idx.device).tril(-1)  # [k, j]: j < k
    return ((idx[:, :, None] == idx[:, None, :]) & earlier).any(-1)


def routing_weights_grad(torch, moe, buffer, meta, per_pair, topk_idx, host_t, device_t):
    """The gradient of the routing weights topk_idx was dispatched with ([x rows, K] float32), from a value per
    received pair on this rank: per_pair [capacity_rows, K] (rank-major, by the dispatched topk_expert) or
    [capacity_rows] (expert-major, a row's pair). meta: the dispatch's source_rank, source_token, and
    topk_expert (rank-major) or local_expert and expert_offsets (expert-major). Pairs that were not dispatched
    (ids -1, out of range or repeated; tokens from T on) get 0."""
    M, E = moe.max_tokens, moe.experts
    valid = moe._valid_rows(torch, meta)[:, 0]
    token_row = meta["source_rank"].long() * M + meta["source_token"].long()
    if moe.rank_major:
        expert = meta["topk_expert"].long()
        values_in = per_pair.float()
    else:
        expert = meta["local_expert"].long()[:, None]
        values_in = per_pair.float()[:, None]
    keep = valid[:, None] & (expert >= 0)
    values = torch.zeros(moe.world_size * M, moe.local_experts, dtype=torch.float32, device=per_pair.device)
    values.index_put_((torch.where(keep, token_row[:, None], 0).flatten(), torch.where(keep, expert, 0).flatten()),
                      torch.where(keep, values_in, 0.0).flatten(), accumulate=True)
    back = torch.ops.braid.moe_to_sources(values, buffer)  # [M, E]
    rows = topk_idx.shape[0]
    back = back[:rows] if rows <= M else torch.nn.functional.pad(back, (0, 0, 0, rows - M))
    idx = topk_idx.long()
    ok = (idx >= 0) & (idx < E) & ~_repeated(torch, idx)
    token = torch.arange(rows, device=idx.device)[:, None]
    if device_t is not None:
        ok = ok & (token < device_t)
    elif host_t >= 0:
        ok = ok & (token < host_t)
    return torch.where(ok, back.gather(1, torch.where(ok, idx, 0)), 0.0)


_META_FIELDS = {True: ("source_rank", "source_token", "received_tokens", "topk_expert"),
                False: ("source_rank", "source_token", "local_expert", "expert_offsets")}


def register_moe_autograd(torch, moe_dispatch, moe_combine) -> None:
    ops = torch.ops.braid

    # Dispatch: the received rows (not fp8 ones) are functions of x, and the dispatched weights (rank-major
    # topk_weights, expert-major weights) of topk_weights; the metadata, scales and the rank-major combine_input
    # are functions of neither.
    def dispatch_setup(ctx, inputs, output):
        x, _, topk_idx, topk_weights, device_t, host_t, buffer = inputs
        moe = resolve(buffer, "braid.MoeBuffer.dispatch")
        fields = moe.output_fields()
        ctx.x_index = None if moe.fp8 or not x.requires_grad else fields.index("x")
        ctx.w_index = None if moe.fp8 or not topk_weights.requires_grad else \
            fields.index("topk_weights" if moe.rank_major else "weights")
        ctx.mark_non_differentiable(*[t for i, t in enumerate(output) if i not in (ctx.x_index, ctx.w_index)])
        ctx.set_materialize_grads(False)  # an output the layer never used brings None, not zeros to move
        ctx.buffer, ctx.x_rows, ctx.host_t = buffer, x.shape[0], host_t
        meta = [output[fields.index(name)] for name in _META_FIELDS[moe.rank_major]] if ctx.w_index is not None else []
        ctx.save_for_backward(device_t, topk_idx, *meta)
        ctx.forward = _forward_handle(torch, moe, output[0])

    def dispatch_backward(ctx, grads):
        function = "braid.MoeBuffer.dispatch (backward)"
        moe = resolve(ctx.buffer, function)
        device_t, topk_idx, *meta = ctx.saved_tensors
        grad_x = grad_w = None
        if ctx.x_index is not None and grads[ctx.x_index] is not None:
            handle = moe._backward_handle(ctx.forward, function)
            rows = ctx.x_rows if ctx.host_t < 0 or device_t is not None else ctx.host_t
            grad_rows = grads[ctx.x_index].to(moe.torch_dtype(torch)).contiguous()
            grad_x = ops.moe_combine(grad_rows, False, rows, ctx.buffer, handle, None, None, None, -1)
            if device_t is not None:  # combine leaves rows from T on unwritten: they got no rows, so no gradient
                index = torch.arange(rows, device=grad_x.device)[:, None]
                grad_x = grad_x.masked_fill(index >= device_t, 0)
            elif rows < ctx.x_rows:  # x's rows past a host T were not dispatched
                grad_x = torch.nn.functional.pad(grad_x, (0, 0, 0, ctx.x_rows - rows))
        if ctx.w_index is not None and grads[ctx.w_index] is not None:
            moe._backward_handle(ctx.forward, function)  # the metadata must still be the forward's
            grad_w = routing_weights_grad(torch, moe, ctx.buffer, dict(zip(_META_FIELDS[moe.rank_major], meta)),
                                          grads[ctx.w_index], topk_idx, ctx.host_t, device_t)
        return (grad_x, None, None, grad_w, None, None, None)

    moe_dispatch.register_autograd(dispatch_backward, setup_context=dispatch_setup)

    def combine_setup(ctx, inputs, output):
        y, weighted, _, buffer, handle, topk_idx, topk_weights, device_t, host_t = inputs
        moe = resolve(buffer, "braid.MoeBuffer.combine")
        ctx.buffer, ctx.weighted, ctx.host_t = buffer, weighted, host_t
        # The routing weights' gradient of a weighted combine needs y (each row's dot product with out's gradient).
        ctx.weights_grad = bool(weighted) and topk_weights is not None and topk_weights.requires_grad
        ctx.save_for_backward(topk_idx, topk_weights, device_t, y if ctx.weights_grad else None)
        ctx.forward = _forward_handle(torch, moe, output, handle)

    def combine_backward(ctx, grad_out):
        function = "braid.MoeBuffer.combine (backward)"
        moe = resolve(ctx.buffer, function)
        if moe.fp8:
            raise _unsupported_fp8(moe, function)
        grad_out = grad_out.to(moe.torch_dtype(torch)).contiguous()
        handle = moe._backward_handle(ctx.forward, function)
        grad_w = None
        if moe.rank_major:
            outputs = dict(zip(moe.output_fields(), ops.moe_redispatch(grad_out, None, ctx.buffer, handle)))
            rows = outputs["x"]
        else:
            topk_idx, topk_weights, device_t, y = ctx.saved_tensors
            if topk_idx is None:
                raise Error(f"{function}: the combine was made without the routing of its dispatch (a dispatch "
                            "through this braid.MoeBuffer object must precede it)", ErrorCode.INVALID_ARGUMENT)
            if ctx.host_t < 0 and device_t is None:  # T was x's rows, topk_idx's; out may have more (num_tokens)
                grad_out = grad_out[:topk_idx.shape[0]]
            outputs = dict(zip(moe.output_fields(), ops.moe_dispatch(grad_out, None, topk_idx, topk_weights,
                                                                     device_t, ctx.host_t, ctx.buffer)))
            moe._replayed(ctx.forward)
            rows = outputs["x"]
            if ctx.weights_grad:  # d out[t] / d w[t, k] = y[row of (t, k)], dotted with out's gradient there
                dots = (rows.float() * y.float()).sum(-1)
                grad_w = routing_weights_grad(torch, moe, ctx.buffer, outputs, dots, topk_idx, ctx.host_t, device_t)
            if ctx.weighted:  # out[t] = sum_k w[t, k] y[row of (t, k)]: each row's gradient is w times out's
                rows = rows.float() * outputs["weights"][:, None]
        # Rows outside the dispatch (padding, rows never received) took no part in the forward: zero, not
        # whatever the buffer holds there.
        grad_y = rows.masked_fill(~moe._valid_rows(torch, outputs), 0).to(grad_out.dtype)
        return (grad_y, None, None, None, None, None, grad_w, None, None)

    moe_combine.register_autograd(combine_backward, setup_context=combine_setup)


# GEMMs fused with their collective (braid.ops) ----------------------------------------------------------------
# NOTE [fused matmul gradients]: each op's backward is the other op, along the same dim d and communicator.
# - out_i = AG_d(A_shard) @ B_i: dA_shard = RS_d(sum_i dout_i @ B_i^T), one matmul_reduce_scatter of the dout_i
#   concatenated along N with the B_i concatenated alike (plus RS_d of the gathered A's own gradient, where the
#   caller used it); dB_i = A^T @ dout_i over every row of the gathered A, with no communication (each rank's B_i
#   is its own, as in a column-parallel layer).
# - out = RS_d(A @ B): dA = AG_d(dout) @ B^T, one all_gather_matmul that returns AG_d(dout) too, and
#   dB = A^T @ AG_d(dout); both times 1 / world for 'avg'.
# A's rows and a gradient's rows pair up through _fused.paired_rows, which flattens both alike.


def register_fused_matmul_autograd(torch, all_gather_matmul, matmul_reduce_scatter) -> None:
    from . import _fused
    from ._dtypes import reduce_op as to_reduce_op
    from ._braid import ReduceOp

    ops = torch.ops.braid

    def gather_setup(ctx, inputs, output):
        A_shard, Bs, gather_dim, _, comm = inputs
        ctx.dim, ctx.comm = gather_dim % A_shard.dim(), comm
        ctx.a_grad, ctx.b_grads = A_shard.requires_grad, [B.requires_grad for B in Bs]
        ctx.set_materialize_grads(False)  # an output the caller never used (often A) brings None, not zeros to move
        gathered = output[0]
        if any(ctx.b_grads) and gathered is None:
            raise Error("braid.ops.all_gather_matmul: argument 'return_A' is False while Bs need gradients, which "
                        "need the gathered A: call braid.ops.all_gather_matmul, which keeps it for them",
                        ErrorCode.INVALID_ARGUMENT)
        ctx.save_for_backward(gathered if any(ctx.b_grads) else None, *(Bs if ctx.a_grad else [None] * len(Bs)))

    def gather_backward(ctx, grad_A, grad_outs):
        A, *Bs = ctx.saved_tensors
        d, comm = ctx.dim, ctx.comm
        grad_shard = None
        if ctx.a_grad:
            pairs = [(g, B) for g, B in zip(grad_outs, Bs) if g is not None]
            if pairs:
                g = pairs[0][0] if len(pairs) == 1 else torch.cat([g for g, _ in pairs], dim=-1)
                B = pairs[0][1] if len(pairs) == 1 else torch.cat([B for _, B in pairs], dim=1)
                grad_shard = ops.matmul_reduce_scatter(g, B.t(), "sum", d, comm)
            if grad_A is not None:
                part = ops.reduce_scatter_tensor(grad_A.movedim(d, 0).contiguous(), "sum", comm).movedim(0, d)
                grad_shard = part if grad_shard is None else grad_shard + part
        grad_Bs = [_fused.paired_rows(A, d).t() @ _fused.paired_rows(g, d) if wanted and g is not None else None
                   for wanted, g in zip(ctx.b_grads, grad_outs)]
        return grad_shard, grad_Bs, None, None, None

    all_gather_matmul.register_autograd(gather_backward, setup_context=gather_setup)

    def scatter_setup(ctx, inputs, output):
        A, B, reduce_op, scatter_dim, comm = inputs
        ctx.dim, ctx.comm = scatter_dim % A.dim(), comm
        ctx.a_grad, ctx.b_grad = A.requires_grad, B.requires_grad
        average = to_reduce_op(reduce_op, "braid.ops.matmul_reduce_scatter", "reduce_op") == ReduceOp.AVG
        ctx.scale = 1.0 / comm_of(comm, "braid.ops.matmul_reduce_scatter").size if average else None
        ctx.save_for_backward(A if ctx.b_grad else None, B if ctx.a_grad else None)

    def scatter_backward(ctx, grad):
        A, B = ctx.saved_tensors
        d, comm = ctx.dim, ctx.comm
        if ctx.scale is not None:
            grad = grad * ctx.scale
        grad_A = grad_B = full = None
        if ctx.a_grad:
            full, (grad_A,) = ops.all_gather_matmul(grad, [B.t()], d, ctx.b_grad, comm)
        elif ctx.b_grad:
            full = ops.all_gather_into_tensor(grad.movedim(d, 0).contiguous(), comm).movedim(0, d)
        if ctx.b_grad:
            grad_B = _fused.paired_rows(A, d).t() @ _fused.paired_rows(full, d)
        return grad_A, grad_B, None, None, None

    matmul_reduce_scatter.register_autograd(scatter_backward, setup_context=scatter_setup)
