"""Tensor-parallel GEMMs fused with their collective (braid::FusedMatmul): the all-gather of a column-parallel
layer's input, or the reduce-scatter of a row-parallel layer's output, hidden under the GEMM. The functions take
the arguments of torch.ops.symm_mem.fused_all_gather_matmul and fused_matmul_reduce_scatter, with a braid
communicator in place of the group name, so a model switches by name:

    A, (y,) = braid.ops.all_gather_matmul(x_shard, [w1.t()])            # y = all_gather(x_shard) @ w1.t()
    z_shard = braid.ops.matmul_reduce_scatter(h, w2.t(), "sum")         # z_shard = reduce_scatter(h @ w2.t())

Calls are collective (every rank, the same shapes), run on torch.cuda.current_stream() and go through braid's
custom ops (torch.ops.braid.all_gather_matmul, .matmul_reduce_scatter): they trace under torch.compile without
graph breaks, capture in torch.cuda.graph (after one eager call of the largest shape, or reserve(): the symmetric
workspace grows outside captures only; reserve() does not cover the calls in one launch of
BRAID_MATMUL_REDUCE_SCATTER=epilogue or engines and BRAID_ALL_GATHER_MATMUL=loads, whose exchange area only an eager
call of the largest shape grows), and carry autograd, each op the other's backward. Operands are bfloat16 or
float16, A and every B of one dtype; B [K, N] is passed as it is stored (a Linear weight's .t() needs no copy). The
calls in one launch, and braid's Hopper GEMM as a tuning candidate, need B as such a .t() (the transpose of a
contiguous [N, K] tensor); a contiguous [K, N] B, or one that has to be copied, always runs as the pieces.
Each communicator gets one braid.FusedMatmul, made on its first call; release() frees it."""
from __future__ import annotations

from typing import Sequence

from ._dtypes import reduce_op_name
from ._error import argument_error, int_argument
from ._fused import b_names, check_operands, fused_matmul, release as _release
from ._handles import op_handle
from ._ops import register_ops
from ._state import communicator
from ._torch import torch as import_torch

__all__ = ["all_gather_matmul", "matmul_reduce_scatter", "reserve", "workspace_bytes", "epilogue_reduce_scatters",
           "all_gathers_under_loads", "release"]


def all_gather_matmul(A_shard, Bs: Sequence, gather_dim: int = 0, *, return_A: bool = True, comm=None):
    """(A or None, [A @ B for B in Bs]) with A = all_gather(A_shard, gather_dim): rank q's A_shard [..., K] (at
    least 2 dims) is block q of A along gather_dim. The first product runs fused with the all-gather; the others multiply the
    gathered A once it is there. gather_dim may be any dim of A_shard; the last one (K) runs unfused. return_A=False
    returns None for A (it is kept anyway where a B needs a gradient). Each GEMM shape settles on its GEMM (a cuBLASLt
    algorithm, or braid's Hopper kernel) once its eager trials have run and completed, 3 timed GEMM runs of each
    candidate, at most 15 (BRAID_GEMM_TUNING): results may differ in the last bit until then."""
    function = "braid.ops.all_gather_matmul"
    torch = import_torch(function)
    if isinstance(Bs, torch.Tensor) or not isinstance(Bs, (list, tuple)) or not Bs:
        raise argument_error(function, "Bs", f"is {type(Bs).__name__}; it must be a non-empty list of matrices [K, N]")
    Bs = list(Bs)
    check_operands(torch, function, A_shard, "A_shard", Bs, b_names(len(Bs)))
    keep_A = bool(return_A) or (torch.is_grad_enabled() and any(B.requires_grad for B in Bs))
    dim = int_argument(gather_dim, function, "gather_dim")
    A, outs = register_ops().all_gather_matmul(A_shard, Bs, dim, keep_A, op_handle(comm))
    return (A if return_A else None), list(outs)


def matmul_reduce_scatter(A, B, reduce_op: str = "sum", scatter_dim: int = 0, *, comm=None):
    """reduce_scatter(A @ B, reduce_op, scatter_dim): block `rank` along scatter_dim of every rank's product,
    summed ('sum') or averaged ('avg'). A [..., K] (at least 2 dims), B [K, N]; the product's extent along
    scatter_dim (A's, or B's N for the last dim) must divide by the world size. The result is contiguous, as torch's
    is. Any dim but the last (N) runs fused; the last runs unfused. Each GEMM shape settles on its GEMM (a cuBLASLt algorithm,
    or braid's Hopper kernel) once its eager trials have run and completed, 3 timed GEMM runs of each candidate, at
    most 15 (BRAID_GEMM_TUNING): results may differ in the last bit until then."""
    function = "braid.ops.matmul_reduce_scatter"
    torch = import_torch(function)
    check_operands(torch, function, A, "A", [B], ["B"])
    dim = int_argument(scatter_dim, function, "scatter_dim")
    return register_ops().matmul_reduce_scatter(A, B, reduce_op_name(reduce_op), dim, op_handle(comm))


def reserve(nbytes: int, comm=None) -> None:
    """Collective: grows the communicator's fused-GEMM workspace to at least nbytes now, so that calls up to that
    size capture in a CUDA graph without an eager call first (workspace_bytes() after an eager call of the largest
    shape is what that shape needs). Not inside a capture."""
    function = "braid.ops.reserve"
    size = int_argument(nbytes, function, "nbytes")
    if size < 0:
        raise argument_error(function, "nbytes", f"is {size}; it must be >= 0")
    fused_matmul(communicator(comm, function)).reserve(size)


def workspace_bytes(comm=None) -> int:
    """The communicator's fused-GEMM workspace on this rank now, in bytes (0 before its first call; asking makes
    the communicator's braid.FusedMatmul, loading cuBLASLt, and raises UNSUPPORTED on the NCCL backend)."""
    return fused_matmul(communicator(comm, "braid.ops.workspace_bytes")).workspace_bytes


def epilogue_reduce_scatters(comm=None) -> int:
    """The matmul_reduce_scatter calls of the communicator's braid.FusedMatmul that ran as one launch of braid's
    Hopper GEMM with the reduce-scatter in its epilogue (BRAID_MATMUL_REDUCE_SCATTER=epilogue or engines),
    captured ones counted once at capture."""
    return fused_matmul(communicator(comm, "braid.ops.epilogue_reduce_scatters")).epilogue_reduce_scatters


def all_gathers_under_loads(comm=None) -> int:
    """The all_gather_matmul calls of the communicator's braid.FusedMatmul that ran as one launch of braid's Hopper
    GEMM with the all-gather under its loads (BRAID_ALL_GATHER_MATMUL=loads), captured ones counted once at
    capture."""
    return fused_matmul(communicator(comm, "braid.ops.all_gathers_under_loads")).all_gathers_under_loads


def release(comm=None) -> None:
    """Frees the communicator's braid.FusedMatmul (its cuBLASLt handle, side stream and workspace); the next call
    makes a new one. Graphs captured with the old one must not be replayed afterwards."""
    _release(communicator(comm, "braid.ops.release"))
