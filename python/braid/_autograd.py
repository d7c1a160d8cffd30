"""Autograd formulas of braid's MoE ops (torch.library.register_autograd), so that torch.autograd flows through
MoeBuffer.dispatch and combine without an autograd.Function of the caller's (docs/moe.md, "Handles and the
backward pass"):
- combine's backward sends the output gradient where the token's rows went: rank-major, a redispatch on the
  forward's handle; expert-major, a dispatch of the gradient with the forward's routing (the same routing gives
  the same layout, row for row), each row scaled by its routing weight after a weighted combine.
- dispatch's backward is a combine, unweighted, of the received rows' gradient: each token's rows summed back.
Only the token rows get gradients (dispatch's x, combine's y). The routing weights get none: braid applies them
on the rank that holds the expert (expert-major weighted combine) or the caller does with the dispatched
`topk_weights` (rank-major), and carrying a gradient back to the token's rank would take an exchange of its own.

Both formulas call braid's ops, so they run eagerly and trace under torch.compile alike. Eagerly, the forward's
MoeHandle is kept, and a backward pass whose buffer has been dispatched again since (the buffer then holds
another routing) raises braid.Error instead of moving rows by the wrong routing."""
from __future__ import annotations

from ._error import Error, ErrorCode
from ._ops import resolve


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


def register_moe_autograd(torch, moe_dispatch, moe_combine) -> None:
    ops = torch.ops.braid

    # Dispatch: only the received rows are differentiable (and not fp8 ones); the metadata, weights, scales and
    # the rank-major combine_input are not functions of x.
    def dispatch_setup(ctx, inputs, output):
        x, _, _, _, device_t, host_t, buffer = inputs
        moe = resolve(buffer, "braid.MoeBuffer.dispatch")
        fields = moe.output_fields()
        ctx.x_index = None if moe.fp8 or not x.requires_grad else fields.index("x")
        ctx.mark_non_differentiable(*[t for i, t in enumerate(output) if i != ctx.x_index])
        ctx.buffer, ctx.x_rows, ctx.host_t = buffer, x.shape[0], host_t
        ctx.save_for_backward(device_t)
        ctx.forward = _forward_handle(torch, moe, output[0])

    def dispatch_backward(ctx, grads):
        nothing = (None,) * 6
        if ctx.x_index is None or grads[ctx.x_index] is None:
            return (None, *nothing)
        function = "braid.MoeBuffer.dispatch (backward)"
        moe = resolve(ctx.buffer, function)
        (device_t,) = ctx.saved_tensors
        handle = moe._backward_handle(ctx.forward, function)
        rows = ctx.x_rows if ctx.host_t < 0 or device_t is not None else ctx.host_t
        grad_rows = grads[ctx.x_index].to(moe.torch_dtype(torch)).contiguous()
        grad_x = ops.moe_combine(grad_rows, False, rows, ctx.buffer, handle, None, None, None, -1)
        if device_t is not None:  # combine leaves rows from T on unwritten: they got no rows, so no gradient
            index = torch.arange(rows, device=grad_x.device)[:, None]
            grad_x = grad_x.masked_fill(index >= device_t, 0)
        elif rows < ctx.x_rows:  # x's rows past a host T were not dispatched
            grad_x = torch.nn.functional.pad(grad_x, (0, 0, 0, ctx.x_rows - rows))
        return (grad_x, *nothing)

    moe_dispatch.register_autograd(dispatch_backward, setup_context=dispatch_setup)

    def combine_setup(ctx, inputs, output):
        _, weighted, _, buffer, handle, topk_idx, topk_weights, device_t, host_t = inputs
        moe = resolve(buffer, "braid.MoeBuffer.combine")
        ctx.buffer, ctx.weighted, ctx.host_t = buffer, weighted, host_t
        ctx.save_for_backward(topk_idx, topk_weights, device_t)
        ctx.forward = _forward_handle(torch, moe, output, handle)

    def combine_backward(ctx, grad_out):
        nothing = (None,) * 8
        function = "braid.MoeBuffer.combine (backward)"
        moe = resolve(ctx.buffer, function)
        if moe.fp8:
            raise _unsupported_fp8(moe, function)
        grad_out = grad_out.to(moe.torch_dtype(torch)).contiguous()
        handle = moe._backward_handle(ctx.forward, function)
        if moe.rank_major:
            outputs = dict(zip(moe.output_fields(), ops.moe_redispatch(grad_out, None, ctx.buffer, handle)))
            rows = outputs["x"]
        else:
            topk_idx, topk_weights, device_t = ctx.saved_tensors
            if topk_idx is None:
                raise Error(f"{function}: the combine was made without the routing of its dispatch (a dispatch "
                            "through this braid.MoeBuffer object must precede it)", ErrorCode.INVALID_ARGUMENT)
            outputs = dict(zip(moe.output_fields(), ops.moe_dispatch(grad_out, None, topk_idx, topk_weights,
                                                                     device_t, ctx.host_t, ctx.buffer)))
            moe._replayed(ctx.forward)
            rows = outputs["x"]
            if ctx.weighted:  # out[t] = sum_k w[t, k] y[row of (t, k)]: each row's gradient is w times out's
                rows = rows.float() * outputs["weights"][:, None]
        # Rows outside the dispatch (padding, rows never received) took no part in the forward: zero, not
        # whatever the buffer holds there.
        grad_y = rows.masked_fill(~moe._valid_rows(torch, outputs), 0).to(grad_out.dtype)
        return (grad_y, *nothing)

    moe_combine.register_autograd(combine_backward, setup_context=combine_setup)
