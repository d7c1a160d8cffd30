"""braid.MoeBuffer and braid's custom ops without a GPU: shape and argument errors naming the argument, the fake
implementations' output shapes (on meta tensors, through a MoeBuffer.meta), and tracing under torch.compile's
front end without graph breaks. Tests that need torch skip without it."""
import types

import pytest

import braid
from braid import Error, ErrorCode

from helpers import OpLog, run_python

T, H, K, E, W = 6, 256, 4, 8, 2


def test_shape_errors_name_the_field():
    with pytest.raises(Error, match="argument 'shape.experts'") as caught:
        braid.MoeBuffer.meta(H, T, K, 3, world_size=W)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    with pytest.raises(Error, match="braid.MoeBuffer.meta: argument 'layout'"):
        braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout="diagonal")
    with pytest.raises(Error, match="argument 'hidden'"):
        braid.MoeBuffer.meta(-1, T, K, E, world_size=W)
    with pytest.raises(Error, match="argument 'max_tokens' is 1180591620717411303424; it must be an int in"):
        braid.MoeBuffer.meta(H, 2**70, K, E, world_size=W)  # past size_t
    with pytest.raises(Error, match="argument 'top_k' is 2147483648; it must be an int in"):
        braid.MoeBuffer.meta(H, T, 2**31, E, world_size=W)  # past int
    with pytest.raises(Error, match="argument 'dispatch_dtype'"):
        braid.MoeBuffer.meta(H, T, K, E, world_size=W, dispatch_dtype="complex64")
    with pytest.raises(Error, match="argument 'colour'"):
        braid.MoeBuffer.meta(H, T, K, E, world_size=W, colour=1)
    with pytest.raises(Error, match="argument 'shape.low_latency'"):  # fixed rows are rank-major's
        braid.MoeBuffer.meta(H, T, K, E, world_size=W, low_latency=True)
    with pytest.raises(Error, match="argument 'low_latency'"):
        braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout="rank_major", low_latency=1)


def test_meta_buffer_sizes():
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W, expert_alignment=4)
    assert moe.local_experts == E // W and not moe.rank_major
    assert moe.capacity_rows == W * T * min(K, E // W) + (E // W) * 3  # worst_case_rows
    rank_major = braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout="rank_major")
    assert rank_major.capacity_rows == W * T and rank_major.output_fields()[-1] == "combine_input"
    fixed = braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout="rank_major", low_latency=True)
    assert fixed.rank_major and fixed.shape.low_latency and fixed.capacity_rows == W * T


def test_moe_buffer_needs_a_communicator(monkeypatch):
    with pytest.raises(Error, match="braid.MoeBuffer: no communicator") as caught:
        braid.MoeBuffer(H, T, K, E)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_meta_buffer_without_torch():
    code = """
import braid
moe = braid.MoeBuffer.meta(256, 4, 2, 4, world_size=2)
try:
    moe.dispatch(None, None, None)
except ImportError as error:
    print(error)
"""
    result = run_python(code, block_torch=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("braid.MoeBuffer.dispatch needs PyTorch")


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed: the ops' fake implementations are not tested")


def inputs(torch, rows=T, dtype=None, index_dtype=None):
    x = torch.empty(rows, H, dtype=dtype or torch.bfloat16, device="meta")
    idx = torch.empty(rows, K, dtype=index_dtype or torch.int64, device="meta")
    return x, idx, torch.empty(rows, K, dtype=torch.float32, device="meta")


def test_fake_dispatch_expert_major(torch):
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W)
    got = moe.dispatch(*inputs(torch))
    R, L = moe.capacity_rows, E // W
    assert got.x.shape == (R, H) and got.x.dtype == torch.bfloat16 and got.x.device.type == "meta"
    assert got.expert_counts.shape == (L,) and got.expert_counts.dtype == torch.int64
    assert got.expert_offsets.shape == (L + 1,)
    assert got.weights.shape == (R,) and got.weights.dtype == torch.float32
    assert got.local_expert.dtype == got.source_rank.dtype == got.source_token.dtype == torch.int32
    assert got.scales is None and got.combine_input is None and got.received_tokens is None
    out = moe.combine(got.x)
    assert out.shape == (T, H) and out.dtype == torch.bfloat16


def test_fake_dispatch_rank_major_fp8(torch):
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout="rank_major", dispatch_dtype=torch.float8_e4m3fn,
                               index_dtype=torch.int32)
    x, idx, w = inputs(torch, dtype=torch.float8_e4m3fn, index_dtype=torch.int32)
    scales = torch.empty(T, H // 128, device="meta")
    got = moe.dispatch(x, idx, w, x_scales=scales)
    R = W * T
    assert got.x.shape == (R, H) and got.x.dtype == torch.float8_e4m3fn
    assert got.scales.shape == (R, H // 128) and got.scales.dtype == torch.float32
    assert got.received_tokens.shape == (W,) and got.received_tokens.dtype == torch.int64
    assert got.topk_expert.shape == (R, K) and got.topk_expert.dtype == torch.int32
    assert got.topk_weights.shape == (R, K)
    assert got.combine_input.shape == (R, H) and got.combine_input.dtype == torch.bfloat16
    assert got.expert_offsets is None and got.weights is None
    again = moe.redispatch(None, x, x_scales=scales)
    assert again.x.shape == (R, H)
    assert moe.combine(got.combine_input).shape == (T, H)


def test_dispatch_argument_errors(torch):
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W)
    x, idx, w = inputs(torch)
    cases = [
        ((x.float(), idx, w), {}, "argument 'x' has dtype torch.float32"),
        ((x[:, :8], idx, w), {}, "argument 'x' has shape"),
        ((x, idx.int(), w), {}, "argument 'topk_idx' has dtype torch.int32"),
        ((x, idx[:2], w), {}, "argument 'topk_idx' has shape"),
        ((x, idx, w.half()), {}, "argument 'topk_weights' has dtype"),
        ((x, idx, w), {"num_tokens": T + 1}, "argument 'num_tokens' is 7"),
        ((x, idx, w), {"num_tokens": torch.empty(1, dtype=torch.int32, device="meta")}, "argument 'num_tokens'"),
        ((x, idx, w), {"x_scales": torch.empty(T, 2, device="meta")}, "argument 'x_scales' is given"),
        ((torch.empty(T, H, dtype=torch.bfloat16), idx, w), {}, "argument 'x' is on cpu"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(Error, match=message) as caught:
            moe.dispatch(*args, **kwargs)
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT
        assert str(caught.value).startswith("braid.MoeBuffer.dispatch: ")
    small = braid.MoeBuffer.meta(H, 16, K, E, world_size=W)
    with pytest.raises(Error, match="argument 'x' has 6 rows; with T on the device"):
        small.dispatch(x, idx, w, torch.empty(1, dtype=torch.int64, device="meta"))
    fp8 = braid.MoeBuffer.meta(H, T, K, E, world_size=W, dispatch_dtype="float8_e5m2")
    with pytest.raises(Error, match="argument 'x_scales' is None"):
        fp8.dispatch(torch.empty(T, H, dtype=torch.float8_e5m2, device="meta"), idx, w)
    with pytest.raises(Error, match="braid.MoeBuffer.combine: argument 'y' has shape"):
        moe.combine(x)


def test_tokens_at_most_max_tokens(torch):
    """braid refuses a host T above max_tokens: so does the traced call, naming num_tokens, or x when T is x's
    rows."""
    moe = braid.MoeBuffer.meta(H, 4, K, E, world_size=W)
    x, idx, w = inputs(torch)
    with pytest.raises(Error, match="dispatch: argument 'x' has 6 rows; T \\(x's rows, num_tokens None\\) is at "
                                    "most max_tokens \\(4\\)"):
        moe.dispatch(x, idx, w)
    with pytest.raises(Error, match="dispatch: argument 'num_tokens' is 5; it must be None, an int in \\[0, 4\\]"):
        moe.dispatch(x, idx, w, 5)
    assert moe.dispatch(x, idx, w, 4).num_tokens == 4


@pytest.mark.parametrize("layout", ["expert_major", "rank_major"])
def test_combine_and_redispatch_take_the_dispatch_rows(torch, layout):
    """Combine writes the last dispatch's T rows into out, and redispatch reads T rows of x: out and x of other
    rows are refused (fewer would be overrun or over-read); num_tokens sizes a new out from those rows to
    max_tokens."""
    moe = braid.MoeBuffer.meta(H, 16, K, E, world_size=W, layout=layout)
    got = moe.dispatch(*inputs(torch))  # T = 6
    y = got.combine_input if moe.rank_major else got.x
    out = torch.empty(T, H, dtype=torch.bfloat16, device="meta")
    cases = [
        ({"out": out[:T - 1]}, "argument 'out' has shape \\(5, 256\\); it needs \\[6, 256\\]"),
        ({"out": torch.empty(T + 1, H, dtype=torch.bfloat16, device="meta")}, "argument 'out' has shape \\(7, 256\\)"),
        ({"num_tokens": T - 1}, "argument 'num_tokens' is 5; it must be in \\[6, 16\\]"),
        ({"num_tokens": 17}, "argument 'num_tokens' is 17; it must be in \\[6, 16\\]"),
        ({"num_tokens": -1}, "argument 'num_tokens' is -1"),
        ({"num_tokens": True}, "argument 'num_tokens' is True; it must be an int"),
        ({"num_tokens": 8.0}, "argument 'num_tokens' is 8.0; it must be an int"),
    ]
    for kwargs, message in cases:
        with pytest.raises(Error, match=message) as caught:
            moe.combine(y, **kwargs)
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT
        assert str(caught.value).startswith("braid.MoeBuffer.combine: ")
    assert moe.combine(y, num_tokens=10).shape == (10, H)
    assert moe.combine(y, num_tokens=16).shape == (16, H)
    if moe.rank_major:
        x = inputs(torch)[0]
        for rows in (T - 1, T + 1):
            with pytest.raises(Error, match=f"redispatch: argument 'x' has shape \\({rows}, 256\\); it needs "
                                            "\\[6, 256\\]"):
                moe.redispatch(None, torch.empty(rows, H, dtype=torch.bfloat16, device="meta"))
        assert moe.redispatch(None, x).x.shape == (moe.capacity_rows, H)
    # With T on the device combine writes up to max_tokens rows: out has x's rows, num_tokens max_tokens.
    rows = 20
    x, idx, w = inputs(torch, rows)
    moe.dispatch(x, idx, w, torch.empty(1, dtype=torch.int64, device="meta"))
    assert moe.combine(y).shape == (rows, H) and moe.combine(y, num_tokens=16).shape == (16, H)
    with pytest.raises(Error, match="argument 'num_tokens' is 15; it must be in \\[16, 16\\]"):
        moe.combine(y, num_tokens=15)
    with pytest.raises(Error, match="argument 'out' has shape \\(16, 256\\); it needs \\[20, 256\\]"):
        moe.combine(y, torch.empty(16, H, dtype=torch.bfloat16, device="meta"))


def test_device_tokens_trace(torch):
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W)
    got = moe.dispatch(*inputs(torch), torch.empty(1, dtype=torch.int64, device="meta"))
    assert got.num_tokens == T and moe.combine(got.x).shape == (T, H)


def test_functional_fakes(torch):
    stand_in = types.SimpleNamespace(size=4, rank=1, device=0)  # the fake implementations read only .size
    handle = braid.op_handle(stand_in)
    try:
        x = torch.empty(8, 3, device="meta", dtype=torch.bfloat16)
        ops = braid.register_ops()
        assert ops.all_reduce(x, "sum", handle).shape == (8, 3)
        assert ops.all_gather_into_tensor(x, handle).shape == (32, 3)
        assert ops.reduce_scatter_tensor(x, "sum", handle).shape == (2, 3)
        assert ops.broadcast(x, 0, handle).shape == (8, 3)
        assert ops.all_to_all_single(x, [1, 2, 3, 4], None, handle).shape == (10, 3)
        assert braid.functional.all_gather_into_tensor(x, comm=handle).dtype == torch.bfloat16
        with pytest.raises(Error, match="argument 'tensor' has shape \\(6, 3\\); dim 0 must divide"):
            ops.reduce_scatter_tensor(x[:6], "sum", handle)
        assert braid.functional.reduce(x, 1, comm=handle).shape == (8, 3)
        got = braid.functional.send_recv([x], [1], [x[:2], x.float()], [3, 2], comm=handle)
        assert [t.shape for t in got] == [(2, 3), (8, 3)] and got[1].dtype == torch.float32
        assert braid.functional.recv(x, 2, comm=handle).shape == (8, 3)
        braid.functional.send(x, 2, comm=handle)
        with pytest.raises(Error, match="braid.functional.send_recv: argument 'recv_peers' must have one peer per"):
            ops.send_recv([], [], [x], [], handle)
        splits = torch.empty(4, dtype=torch.int64, device="meta")
        out, counts, offsets = braid.functional.all_to_all_v_device(x, splits, 20, comm=handle)
        assert out.shape == (20, 3) and out.dtype == torch.bfloat16
        assert counts.shape == offsets.shape == (4,) and counts.dtype == offsets.dtype == torch.int64
        with pytest.raises(Error, match="argument 'output_rows' is -1"):
            ops.all_to_all_v_device(x, splits, None, -1, handle)
    finally:
        braid._handles.release_handle(stand_in)


def test_point_to_point_and_reduce_trace_without_graph_breaks(torch):
    """A ring exchange and a reduce, as functions, in one graph under dynamo."""
    stand_in = types.SimpleNamespace(size=W)
    handle = braid.op_handle(stand_in)

    def ring(x):
        (left,) = braid.functional.send_recv([x * 2], [1], [x], [1], comm=handle)
        return braid.functional.reduce(left + 1, 0, comm=handle)

    try:
        explained = torch._dynamo.explain(ring)(torch.empty(T, H, device="meta"))
        assert explained.graph_break_count == 0, explained.break_reasons
        code = explained.graphs[0].code
        assert "braid.send_recv" in code and "braid.reduce" in code
    finally:
        braid._handles.release_handle(stand_in)


def test_device_counts_all_to_all_traces_without_graph_breaks(torch):
    """A router's counts go straight into the functional all-to-all-v, all in one graph under dynamo."""
    stand_in = types.SimpleNamespace(size=W)
    handle = braid.op_handle(stand_in)

    def route(x, destination):
        counts = (destination[:, None] == torch.arange(W, device=x.device)).sum(0)
        order = destination.argsort()
        out, received, _ = braid.functional.all_to_all_v_device(x[order], counts, 2 * x.shape[0], comm=handle)
        return out * 2, received

    try:
        x = torch.empty(T, H, device="meta")
        destination = torch.empty(T, dtype=torch.int64, device="meta")
        explained = torch._dynamo.explain(route)(x, destination)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert "braid.all_to_all_v_device" in explained.graphs[0].code
    finally:
        braid._handles.release_handle(stand_in)


def test_ops_registered_lazily():
    result = run_python("import braid, sys\nprint('torch' in sys.modules)\n"
                        "import torch\nprint(hasattr(torch.ops.braid, 'moe_dispatch'))\n"
                        "braid.register_ops()\nprint(hasattr(torch.ops.braid, 'moe_dispatch'))")
    if "ModuleNotFoundError" in result.stderr:
        pytest.skip("torch is not installed")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "True"]


def test_layer_traces_without_graph_breaks(torch):
    """torch.compile's front end (dynamo) captures a MoE layer on a meta buffer in one graph."""
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout="rank_major")
    stand_in = types.SimpleNamespace(size=W)
    handle = braid.op_handle(stand_in)

    def layer(x, router):
        scores = (x.float() @ router).softmax(-1)
        weights, idx = scores.topk(K, dim=-1)
        got = moe.dispatch(x, idx, weights)
        rows = got.x.float().sum(-1, keepdim=True) * got.topk_weights.sum(-1, keepdim=True)
        y = (got.x.float() * rows).to(torch.bfloat16)
        out = moe.combine(y)
        return braid.functional.all_reduce(out, comm=handle)

    try:
        x = torch.empty(T, H, dtype=torch.bfloat16, device="meta")
        router = torch.empty(H, E, device="meta")
        explained = torch._dynamo.explain(layer)(x, router)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert explained.graph_count == 1
        code = explained.graphs[0].code
        assert "braid.moe_dispatch" in code and "braid.moe_combine" in code and "braid.all_reduce" in code
    finally:
        braid._handles.release_handle(stand_in)


# Autograd (the ops' registered formulas, run on meta tensors through the fake implementations) -----------------
def grad_inputs(torch, rows=T, dtype=None):
    dtype = dtype or torch.float32
    x = torch.empty(rows, H, dtype=dtype, device="meta", requires_grad=True)
    idx = torch.empty(rows, K, dtype=torch.int64, device="meta")
    return x, idx, torch.empty(rows, K, dtype=torch.float32, device="meta", requires_grad=True)


@pytest.mark.parametrize("layout", ["expert_major", "rank_major"])
def test_autograd_through_dispatch_and_combine(torch, layout):
    """A layer's gradient reaches x through combine's backward (rank-major: a redispatch; expert-major: a dispatch
    with the forward's routing) and dispatch's (a plain combine). The routing weights get theirs where they act:
    expert-major's weighted combine (one moe_to_sources after its backward dispatch); a rank-major layer that
    never reads the dispatched weights gives them none."""
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout=layout, dtype=torch.bfloat16)
    x, idx, w = grad_inputs(torch, dtype=torch.bfloat16)
    got = moe.dispatch(x, idx, w)
    assert got.x.requires_grad and got.x.shape == (moe.capacity_rows, H)
    differentiable = {"x", "topk_weights" if layout == "rank_major" else "weights"}
    for name in moe.output_fields():
        assert getattr(got, name).requires_grad == (name in differentiable), name
    expert = torch.empty(H, H, dtype=torch.bfloat16, device="meta", requires_grad=True)
    y = got.x @ expert
    out = moe.combine(y)
    assert out.requires_grad and out.shape == (T, H)
    log = OpLog(torch)
    with log.mode:
        out.backward(torch.empty_like(out))
    if layout == "rank_major":
        assert log.names() == ["moe_redispatch", "moe_combine"]
        assert w.grad is None
    else:
        assert log.names() == ["moe_dispatch", "moe_to_sources", "moe_combine"]  # combine's backward, dispatch's
        assert log.calls[0][1][2] is idx  # the gradient goes by the forward's routing
        assert w.grad.shape == (T, K) and w.grad.dtype == torch.float32
    name, args = log.calls[-1]
    assert args[1] is False  # dispatch's backward combines unweighted
    assert x.grad.shape == (T, H) and x.grad.dtype == torch.bfloat16
    assert expert.grad.shape == (H, H)


@pytest.mark.parametrize("layout", ["expert_major", "rank_major"])
def test_autograd_routing_weights_through_the_dispatched_weights(torch, layout):
    """A layer that applies the dispatched weights itself (rank-major topk_weights; expert-major weights with an
    unweighted combine) gives the routing weights a gradient through dispatch's backward: one moe_to_sources,
    and none of it when only the weights need one."""
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout=layout, dtype=torch.float32)
    x, idx, w = grad_inputs(torch)
    for rows_grad in (True, False):
        w.grad = None
        got = moe.dispatch(x if rows_grad else x.detach(), idx, w)
        if layout == "rank_major":
            y = got.x * got.topk_weights.sum(-1, keepdim=True)
        else:
            y = got.x * got.weights[:, None]
        out = moe.combine(y, weighted=False)
        log = OpLog(torch)
        with log.mode:
            out.sum().backward()
        assert "moe_to_sources" in log.names() and ("moe_combine" in log.names()) == rows_grad
        assert w.grad.shape == (T, K) and w.grad.dtype == torch.float32


def test_autograd_host_tokens_pad_the_gradient(torch):
    """x's rows past a host T were not dispatched: their gradient rows are zeros (padded), not missing."""
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W, dtype=torch.float32)
    x, idx, w = grad_inputs(torch)
    out = moe.combine(moe.dispatch(x, idx, w, 3).x * 2)
    assert out.shape == (3, H)
    out.sum().backward()
    assert x.grad.shape == (T, H)


def test_autograd_combine_of_more_rows(torch):
    """An out of num_tokens rows past T: combine's backward dispatches the gradient of the T rows only, which the
    routing covers."""
    moe = braid.MoeBuffer.meta(H, 16, K, E, world_size=W, dtype=torch.float32)
    x, idx, w = grad_inputs(torch)
    out = moe.combine(moe.dispatch(x, idx, w).x * 2, num_tokens=10)
    assert out.shape == (10, H)
    log = OpLog(torch)
    with log.mode:
        out.sum().backward()
    assert log.calls[0][0] == "moe_dispatch" and log.calls[0][1][0].shape == (T, H)
    assert x.grad.shape == (T, H)


def test_autograd_device_tokens(torch):
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout="rank_major", dtype=torch.float32)
    x, idx, w = grad_inputs(torch)
    tokens = torch.empty(1, dtype=torch.int64, device="meta")
    out = moe.combine(moe.dispatch(x, idx, w, tokens).x)
    out.sum().backward()
    assert out.shape == x.grad.shape == (T, H)


def test_autograd_only_combine(torch):
    """x without grad (the layer's input) but the experts' parameters with: combine's backward still runs, and
    the dispatched rows are a copy the backward pass does not overwrite."""
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W, dtype=torch.float32)
    x, idx, w = grad_inputs(torch)
    got = moe.dispatch(x.detach(), idx, w)
    assert not got.x.requires_grad and got.x.grad_fn is None
    scale = torch.empty(H, device="meta", requires_grad=True)
    log = OpLog(torch)
    out = moe.combine(got.x * scale, weighted=False)
    with log.mode:
        out.sum().backward()
    assert log.names() == ["moe_dispatch"] and scale.grad.shape == (H,)
    with torch.no_grad():  # inference: the rows are the buffer's own (no copy)
        assert not moe.dispatch(x, idx, w).x.requires_grad


def test_autograd_refusals(torch):
    rank_major = braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout="rank_major", dtype=torch.float32)
    x, idx, w = grad_inputs(torch)
    with pytest.raises(Error, match="hooks record no autograd") as caught:
        rank_major.dispatch(x, idx, w, hook=True)
    assert caught.value.code is ErrorCode.UNSUPPORTED
    fp8 = braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout="rank_major", dispatch_dtype="float8_e4m3fn",
                               dtype=torch.float32)
    fp8.dispatch(torch.empty(T, H, dtype=torch.float8_e4m3fn, device="meta"), idx, w,
                 x_scales=torch.empty(T, H // 128, device="meta"))
    out = fp8.combine(torch.empty(fp8.capacity_rows, H, device="meta", requires_grad=True))
    with pytest.raises(Error, match="does not quantise") as caught:
        out.sum().backward()
    assert caught.value.code is ErrorCode.UNSUPPORTED


def test_backward_handle_check():
    """Eagerly a backward pass names its forward dispatch; a buffer dispatched again since is refused."""
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W)
    moe._last_handle = types.SimpleNamespace(dispatch=5)
    assert moe._backward_handle(5, "f") == 5 and moe._backward_handle(-1, "f") == -1
    with pytest.raises(Error, match="dispatched again after the forward pass") as caught:
        moe._backward_handle(4, "f")
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    moe._replayed(4)  # dispatch 5 repeated the routing of dispatch 4 (expert-major combine's backward)
    assert moe._backward_handle(4, "f") == 5


@pytest.mark.parametrize("layout", ["expert_major", "rank_major"])
def test_autograd_compiles(torch, layout):
    """torch.compile (AOTAutograd, eager backend) traces the forward and the registered backward in full graphs."""
    moe = braid.MoeBuffer.meta(H, T, K, E, world_size=W, layout=layout, dtype=torch.float32)

    def layer(x, idx, w, expert):
        return moe.combine(moe.dispatch(x, idx, w).x @ expert)

    x, idx, w = grad_inputs(torch)
    expert = torch.empty(H, H, device="meta", requires_grad=True)
    torch._dynamo.reset()  # a second buffer's op handle would otherwise trace as a dynamic (symbolic) int
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    compiled(x, idx, w.detach(), expert).sum().backward()
    assert x.grad.shape == (T, H) and expert.grad.shape == (H, H)
    # With the routing weights' gradient too (expert-major: the weighted combine's; rank-major: through the
    # dispatched weights the layer applies).
    def weighted_layer(x, idx, w, expert):
        got = moe.dispatch(x, idx, w)
        y = got.x @ expert
        if layout == "rank_major":
            y = y * got.topk_weights.sum(-1, keepdim=True)
        return moe.combine(y)

    torch._dynamo.reset()
    compiled = torch.compile(weighted_layer, backend="aot_eager", fullgraph=True)
    compiled(x, idx, w, expert).sum().backward()
    assert w.grad.shape == (T, K)
