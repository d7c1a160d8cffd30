"""braid.ops (GEMMs fused with their collective) without a GPU: the module imports without torch, the argument
errors name the argument, the fake implementations give torch.ops.symm_mem's shapes (and the strides the real calls
return) on meta tensors, the autograd formulas run each op as the other's backward, and torch.compile's front end
traces a tensor-parallel MLP in one graph. A stand-in communicator (an object with .size) names the world size.
Tests that need torch skip without it."""

import pytest

import braid
from braid import Error, ErrorCode

from helpers import OpLog, run_python, stand_in_op_handle

W = 2


def test_import_without_torch():
    code = """
import braid, braid.ops
try:
    braid.ops.all_gather_matmul(None, [None])
except ImportError as error:
    print(error)
"""
    result = run_python(code, block_torch=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("braid.ops.all_gather_matmul needs PyTorch")


def test_public_names():
    assert braid.ops is __import__("braid.ops").ops
    for name in braid.ops.__all__:
        assert callable(getattr(braid.ops, name)), name
    assert set(braid.Layout.__members__) == {"ROW_MAJOR", "TRANSPOSED"}
    assert braid.FusedMatmul is braid._braid.FusedMatmul


def test_workspace_calls_need_a_communicator():
    for call in (lambda: braid.ops.reserve(1 << 20), braid.ops.workspace_bytes, braid.ops.epilogue_reduce_scatters,
                 braid.ops.all_gathers_under_loads, braid.ops.release):
        with pytest.raises(Error, match=r"braid.ops.\w+: no communicator") as caught:
            call()
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_reserve_takes_bytes():
    """nbytes is checked before the communicator is looked up."""
    for nbytes, message in ((-1, "is -1; it must be >= 0"), (2.5, "is 2.5; it must be an int"),
                            (True, "is True; it must be an int"), ("1", "is '1'; it must be an int")):
        with pytest.raises(Error, match=f"braid.ops.reserve: argument 'nbytes' {message}") as caught:
            braid.ops.reserve(nbytes)
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_fused_matmul_takes_a_communicator():
    with pytest.raises(TypeError):
        braid.FusedMatmul(None)


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed: the ops' fake implementations are not tested")


@pytest.fixture
def comm():
    with stand_in_op_handle(W) as handle:
        yield handle


def meta(torch, *shape, dtype=None, grad=False):
    return torch.empty(*shape, dtype=dtype or torch.bfloat16, device="meta", requires_grad=grad)


def test_all_gather_matmul_shapes(torch, comm):
    A_shard, B1, weight = meta(torch, 3, 16), meta(torch, 16, 8), meta(torch, 24, 16)
    A, outs = braid.ops.all_gather_matmul(A_shard, [B1, weight.t()], comm=comm)
    assert A.shape == (6, 16) and A.dtype == torch.bfloat16 and A.device.type == "meta"
    assert [o.shape for o in outs] == [(6, 8), (6, 24)]
    A, outs = braid.ops.all_gather_matmul(A_shard, (B1,), return_A=False, comm=comm)
    assert A is None and outs[0].shape == (6, 8)
    half = meta(torch, 3, 16, dtype=torch.float16)
    assert braid.ops.all_gather_matmul(half, [meta(torch, 16, 8, dtype=torch.float16)], comm=comm)[1][0].dtype == \
        torch.float16


def test_all_gather_matmul_other_dims(torch, comm):
    """gather_dim 1 of a 3-D A: the outputs are [2, 10, N] views of [10, 2, N] rows, as the real call returns
    them; the last dim (K) gathers columns, so B has the gathered K."""
    A, outs = braid.ops.all_gather_matmul(meta(torch, 2, 5, 16), [meta(torch, 16, 8)], gather_dim=1, comm=comm)
    assert A.shape == (2, 10, 16) and A.stride() == (16, 32, 1)
    assert outs[0].shape == (2, 10, 8) and outs[0].stride() == (8, 16, 1)
    A, outs = braid.ops.all_gather_matmul(meta(torch, 2, 5, 16), [meta(torch, 16, 8)], gather_dim=-2, comm=comm)
    assert A.shape == (2, 10, 16)
    A, outs = braid.ops.all_gather_matmul(meta(torch, 3, 16), [meta(torch, 32, 8)], gather_dim=1, comm=comm)
    assert A.shape == (3, 32) and outs[0].shape == (3, 8)


def test_matmul_reduce_scatter_shapes(torch, comm):
    A, B = meta(torch, 8, 16), meta(torch, 16, 24)
    assert braid.ops.matmul_reduce_scatter(A, B, comm=comm).shape == (4, 24)
    assert braid.ops.matmul_reduce_scatter(A, meta(torch, 24, 16).t(), "avg", comm=comm).shape == (4, 24)
    out = braid.ops.matmul_reduce_scatter(meta(torch, 3, 4, 16), B, "sum", scatter_dim=1, comm=comm)
    assert out.shape == (3, 2, 24) and out.is_contiguous()  # as torch's reduction returns it
    out = braid.ops.matmul_reduce_scatter(meta(torch, 3, 16), B, scatter_dim=-1, comm=comm)
    assert out.shape == (3, 12) and out.is_contiguous()
    assert braid.ops.matmul_reduce_scatter(A, B, braid.ReduceOp.AVG, comm=comm).shape == (4, 24)


def test_matmul_reduce_scatter_takes_torch_distributed_ops(torch, comm):
    """torch.distributed's ReduceOp: the class's members and an instance made from one."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    A, B = meta(torch, 8, 16), meta(torch, 16, 24)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp(dist.ReduceOp.AVG)):
        assert braid.ops.matmul_reduce_scatter(A, B, op, comm=comm).shape == (4, 24)
    with pytest.raises(Error, match="argument 'reduce_op' is 'max'; fused GEMMs reduce with"):
        braid.ops.matmul_reduce_scatter(A, B, dist.ReduceOp(dist.ReduceOp.MAX), comm=comm)


def test_argument_errors(torch, comm):
    A, B = meta(torch, 8, 16), meta(torch, 16, 8)
    gather, scatter = braid.ops.all_gather_matmul, braid.ops.matmul_reduce_scatter
    cases = [
        (lambda: gather(A.float(), [B], comm=comm), "all_gather_matmul: argument 'A_shard' has dtype torch.float32"),
        (lambda: gather(A, [B, B.half()], comm=comm), "argument 'Bs\\[1\\]' has dtype torch.float16; it must match"),
        (lambda: gather(A, [torch.empty(16, 8, dtype=torch.bfloat16)], comm=comm), "argument 'Bs\\[0\\]' is on cpu"),
        (lambda: gather(A, [], comm=comm), "argument 'Bs' is list; it must be a non-empty list"),
        (lambda: gather(A, B, comm=comm), "argument 'Bs' is Tensor"),
        (lambda: gather(A, [meta(torch, 8, 8)], comm=comm), "argument 'Bs\\[0\\]' has shape \\(8, 8\\); its K"),
        (lambda: gather(A, [meta(torch, 16)], comm=comm), "argument 'Bs\\[0\\]' has shape \\(16,\\); it must be a"),
        (lambda: gather(meta(torch, 16), [B], comm=comm), "argument 'A_shard' has shape \\(16,\\); it needs at least"),
        (lambda: gather(A, [B], gather_dim=2, comm=comm), "argument 'gather_dim' is 2; A_shard has 2 dims"),
        (lambda: scatter(meta(torch, 7, 16), B, comm=comm), "matmul_reduce_scatter: argument 'A' has shape \\(7, 16\\)"
                                                             "; A's dim 0, 7, must divide by the world size \\(2\\)"),
        (lambda: scatter(A, meta(torch, 16, 7), scatter_dim=1, comm=comm), "argument 'B' has shape \\(16, 7\\); B's N"),
        (lambda: scatter(A, torch.empty(16, 8, dtype=torch.bfloat16), comm=comm), "argument 'B' is on cpu"),
        (lambda: scatter(A, B.float(), comm=comm), "argument 'B' has dtype torch.float32"),
        (lambda: scatter(A, B, "max", comm=comm), "argument 'reduce_op' is 'max'; fused GEMMs reduce with"),
        (lambda: scatter(A, B, "bitwise", comm=comm), "argument 'reduce_op' is 'bitwise'"),
        (lambda: scatter(A, B, scatter_dim=-3, comm=comm), "argument 'scatter_dim' is -3"),
        (lambda: scatter(A, meta(torch, 8, 8), comm=comm), "argument 'B' has shape \\(8, 8\\); its K"),
        (lambda: gather(A, [B], gather_dim=True, comm=comm), "argument 'gather_dim' is True; it must be an int"),
        (lambda: gather(A, [B], gather_dim=0.9, comm=comm), "argument 'gather_dim' is 0.9; it must be an int"),
        (lambda: scatter(A, B, scatter_dim="1", comm=comm), "argument 'scatter_dim' is '1'; it must be an int"),
    ]
    for call, message in cases:
        with pytest.raises(Error, match=message) as caught:
            call()
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_custom_ops_check_too(torch, comm):
    """Called directly, the ops (what torch.compile records) check as the functions do."""
    ops = braid.register_ops()
    A, B = meta(torch, 8, 16), meta(torch, 16, 8)
    with pytest.raises(Error, match="braid.ops.all_gather_matmul: argument 'A_shard' has dtype torch.float32"):
        ops.all_gather_matmul(A.float(), [B], 0, True, comm)
    with pytest.raises(Error, match="braid.ops.matmul_reduce_scatter: argument 'A' has shape \\(7, 16\\)"):
        ops.matmul_reduce_scatter(A[:7], B, "sum", 0, comm)
    got, outs = ops.all_gather_matmul(A, [B], 0, False, comm)
    assert got is None and outs[0].shape == (16, 8)


def test_all_gather_matmul_backward(torch, comm):
    """dA_shard: one matmul_reduce_scatter of both outputs' gradients; dB: the gathered A times the gradient."""
    A_shard = meta(torch, 2, 3, 16, grad=True)
    B1, weight = meta(torch, 16, 8, grad=True), meta(torch, 24, 16, grad=True)
    A, outs = braid.ops.all_gather_matmul(A_shard, [B1, weight.t()], gather_dim=1, return_A=False, comm=comm)
    assert A is None and all(o.requires_grad for o in outs)
    log = OpLog(torch)
    with log.mode:
        torch.autograd.backward(outs, [torch.empty_like(o) for o in outs])
    assert log.names() == ["matmul_reduce_scatter"]
    assert A_shard.grad.shape == (2, 3, 16) and B1.grad.shape == (16, 8) and weight.grad.shape == (24, 16)


def test_all_gather_matmul_backward_through_the_gathered_A(torch, comm):
    """Where the caller uses the gathered A too, its gradient is reduce-scattered back into the shard's."""
    A_shard, B = meta(torch, 3, 16, grad=True), meta(torch, 16, 8)
    A, (out,) = braid.ops.all_gather_matmul(A_shard, [B], comm=comm)
    log = OpLog(torch)
    with log.mode:
        (A.sum() + out.sum()).backward()
    assert log.names() == ["matmul_reduce_scatter", "reduce_scatter_tensor"] and A_shard.grad.shape == (3, 16)


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_matmul_reduce_scatter_backward(torch, comm, op):
    """dA and dB from one all_gather_matmul of the output gradient with B^T (which returns the gathered gradient)."""
    A, B = meta(torch, 3, 4, 16, grad=True), meta(torch, 16, 8, grad=True)
    out = braid.ops.matmul_reduce_scatter(A, B, op, scatter_dim=1, comm=comm)
    log = OpLog(torch)
    with log.mode:
        out.backward(torch.empty_like(out))
    assert log.names() == ["all_gather_matmul"]
    assert A.grad.shape == (3, 4, 16) and B.grad.shape == (16, 8)
    frozen = meta(torch, 16, 8)  # B without a gradient: A's alone
    x = meta(torch, 4, 16, grad=True)
    braid.ops.matmul_reduce_scatter(x, frozen, op, comm=comm).sum().backward()
    assert x.grad.shape == (4, 16) and frozen.grad is None


def test_tensor_parallel_mlp_traces_and_compiles(torch, comm):
    """A column-parallel then row-parallel MLP in one graph under dynamo, and AOTAutograd traces its backward."""
    def mlp(x, w1, w2):
        _, (h,) = braid.ops.all_gather_matmul(x, [w1.t()], return_A=False, comm=comm)
        return braid.ops.matmul_reduce_scatter(torch.nn.functional.gelu(h), w2.t(), comm=comm)

    x, w1, w2 = meta(torch, 4, 32), meta(torch, 64, 32), meta(torch, 32, 64)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(mlp)(x, w1, w2)
    assert explained.graph_break_count == 0, explained.break_reasons
    code = explained.graphs[0].code
    assert "braid.all_gather_matmul" in code and "braid.matmul_reduce_scatter" in code
    x, w1, w2 = meta(torch, 4, 32, grad=True), meta(torch, 64, 32, grad=True), meta(torch, 32, 64, grad=True)
    torch._dynamo.reset()
    out = torch.compile(mlp, backend="aot_eager", fullgraph=True)(x, w1, w2)
    assert out.shape == (4, 32)
    out.sum().backward()
    assert x.grad.shape == (4, 32) and w1.grad.shape == (64, 32) and w2.grad.shape == (32, 64)


def test_ops_registered_with_the_others():
    result = run_python("import torch, braid\nprint(hasattr(torch.ops.braid, 'all_gather_matmul'), "
                        "hasattr(torch.ops.braid, 'matmul_reduce_scatter'))")
    if "ModuleNotFoundError" in result.stderr:
        pytest.skip("torch is not installed")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True True"
