"""The GEMMs of tensor-parallel layers fused with their collective (braid::FusedMatmul) on torch tensors: argument
checks, output shapes and the eager calls behind braid.ops and the custom ops braid::all_gather_matmul and
braid::matmul_reduce_scatter (registered in _ops.py). Checks raise braid.Error (INVALID_ARGUMENT) naming the
argument, in the real calls and in the fake implementations alike.

NOTE [fused matmul layout]: braid's calls take 2-D row-major matrices and gather or scatter whole rows. A tensor of
more dims is moved so that the gathered (scattered) dim leads, made contiguous and flattened to [rows, K]: rank q's
rows are then block q of that dim, so a result unflattens to [W * s, rest..., N] (or [s / W, ...]) and moves the dim
back, as torch.ops.symm_mem does: all_gather_matmul's outputs are such views, matmul_reduce_scatter's is made
contiguous (as torch's reduction returns it), with the same strides in the real and the fake calls.
A gather or scatter over the last dim (A's K in all_gather_matmul, the product's N in matmul_reduce_scatter) moves
no rows: it runs unfused, braid's collective and torch.matmul one after the other."""
from __future__ import annotations

from ._braid import FusedMatmul, Layout, ReduceOp
from ._dtypes import reduce_op as to_reduce_op
from ._error import argument_error
from ._tensors import buffer
from ._torch import current_stream

_DTYPES = ("torch.bfloat16", "torch.float16")
_ALIGNMENT = 16  # bytes: braid::FusedMatmul's matrices start 16-byte aligned

# One FusedMatmul per communicator, made on first use: id(communicator) -> (communicator, FusedMatmul). The entry
# holds the communicator, so an id is never reused while its entry lives.
_fused: dict = {}


def fused_matmul(comm) -> FusedMatmul:
    """The FusedMatmul of `comm`, made on its first call (local: no peer takes part)."""
    for key, (owner, fused) in list(_fused.items()):  # entries of destroyed communicators go
        if owner.destroyed or fused.closed:
            del _fused[key]
    entry = _fused.get(id(comm))
    if entry is None:
        entry = _fused[id(comm)] = (comm, FusedMatmul(comm))
    return entry[1]


def release(comm) -> None:
    """Frees comm's FusedMatmul (its cuBLASLt handle, side stream and symmetric workspace) if it has one; the next
    fused call makes a new one."""
    entry = _fused.pop(id(comm), None)
    if entry is not None:
        entry[1].close()


# Checks and shapes --------------------------------------------------------------------------------------------
def _check_tensor(torch, tensor, function: str, name: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise argument_error(function, name, f"must be a torch.Tensor, got {type(tensor).__name__}")
    if str(tensor.dtype) not in _DTYPES:
        raise argument_error(function, name, f"has dtype {tensor.dtype}; braid's fused GEMMs take torch.bfloat16 "
                             "or torch.float16")
    if tensor.device.type not in ("cuda", "meta"):  # meta: tracing without a GPU
        raise argument_error(function, name, f"is on {tensor.device}; braid needs a CUDA tensor")


def check_operands(torch, function: str, a, a_name: str, bs, b_names) -> None:
    """A [..., K] and each B [K', N] (K' checked with the shapes): tensors of one dtype (bfloat16 or float16) on
    one CUDA device."""
    _check_tensor(torch, a, function, a_name)
    if a.dim() < 2:
        raise argument_error(function, a_name, f"has shape {tuple(a.shape)}; it needs at least 2 dims ([..., K])")
    for b, name in zip(bs, b_names):
        _check_tensor(torch, b, function, name)
        if b.dim() != 2:
            raise argument_error(function, name, f"has shape {tuple(b.shape)}; it must be a matrix [K, N]")
        if b.dtype != a.dtype:
            raise argument_error(function, name, f"has dtype {b.dtype}; it must match {a_name}'s {a.dtype}")
        if b.device != a.device:
            raise argument_error(function, name, f"is on {b.device}; {a_name} is on {a.device}")


def _dim(dim: int, ndim: int, function: str, name: str, owner: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise argument_error(function, name, f"is {dim!r}; {owner} has {ndim} dims")
    return dim % ndim


def b_names(count: int) -> list:
    return [f"Bs[{i}]" for i in range(count)]


def check_all_gather(torch, function: str, A_shard, Bs, gather_dim: int, world: int) -> int:
    """The gather dim (from 0), after the checks of all_gather_matmul's arguments."""
    if not isinstance(Bs, (list, tuple)) or not Bs:
        raise argument_error(function, "Bs", f"is {type(Bs).__name__}; it must be a non-empty list of matrices [K, N]")
    names = b_names(len(Bs))
    check_operands(torch, function, A_shard, "A_shard", Bs, names)
    dim = _dim(gather_dim, A_shard.dim(), function, "gather_dim", "A_shard")
    gathered = list(A_shard.shape)
    gathered[dim] *= world
    for B, name in zip(Bs, names):
        if B.shape[0] != gathered[-1]:
            raise argument_error(function, name, f"has shape {tuple(B.shape)}; its K (dim 0) must be the gathered "
                                 f"A's last dim, {gathered[-1]}")
    return dim


def reduce_scatter_shape(torch, function: str, A, B, reduce_op: str, scatter_dim: int, world: int):
    """(scatter dim, braid's ReduceOp, the output's shape) after the checks."""
    check_operands(torch, function, A, "A", [B], ["B"])
    op = to_reduce_op(reduce_op, function, "reduce_op")
    if op not in (ReduceOp.SUM, ReduceOp.AVG):
        raise argument_error(function, "reduce_op", f"is {reduce_op!r}; fused GEMMs reduce with 'sum' or 'avg'")
    dim = _dim(scatter_dim, A.dim(), function, "scatter_dim", "A")
    if B.shape[0] != A.shape[-1]:
        raise argument_error(function, "B", f"has shape {tuple(B.shape)}; its K (dim 0) must be A's last dim, "
                             f"{A.shape[-1]}")
    shape = [*A.shape[:-1], B.shape[1]]
    if shape[dim] % world:
        owner, name = ("B's N (dim 1)", "B") if dim == A.dim() - 1 else (f"A's dim {dim}", "A")
        raise argument_error(function, name, f"has shape {tuple((B if name == 'B' else A).shape)}; {owner}, "
                             f"{shape[dim]}, must divide by the world size ({world})")
    shape[dim] //= world
    return dim, op, tuple(shape)


# Outputs ------------------------------------------------------------------------------------------------------
def unflatten(flat, lead, dim: int):
    """braid's [rows, N] result as the caller's layout: [lead..., N] with lead[0] moved back to `dim`."""
    return flat.view(*lead, flat.shape[-1]).movedim(0, dim)


def _product(extents) -> int:
    total = 1
    for extent in extents:
        total *= extent
    return total


def new_results(A, dim: int, lead, columns):
    """Empty outputs in the layout the calls return: for each width in `columns`, [prod(lead), width] unflattened
    (NOTE [fused matmul layout]). The fake implementations return these too."""
    return [unflatten(A.new_empty((_product(lead), n)), lead, dim) for n in columns]


def flat_rows(torch, t, dim: int):
    """(`t` with `dim` moved to the front as braid's [rows, K] matrix, contiguous and aligned, the moved shape
    but K): a copy where the moved view is not contiguous (NOTE [fused matmul layout])."""
    moved = t.movedim(dim, 0)
    lead = tuple(moved.shape[:-1])
    return _aligned(torch, moved.contiguous()).view(_product(lead), t.shape[-1]), lead


def paired_rows(t, dim: int):
    """`t` [..., C] as a matrix of rows of C (a copy where the view is not contiguous), flattened so that row r of
    the gathered A (or of A) and row r of an output's gradient belong to the same output row."""
    if dim == t.dim() - 1:  # a gather over the last dim keeps the leading dims in place
        return t.reshape(-1, t.shape[-1])
    return t.movedim(dim, 0).reshape(-1, t.shape[-1])


def _aligned(torch, t):
    """`t` contiguous and 16-byte aligned: a copy where it is not (a slice, a view at an odd offset)."""
    if t.is_contiguous() and t.data_ptr() % _ALIGNMENT == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def matrix(torch, B):
    """B [K, N] as braid takes it: (a tensor whose data_ptr is B's storage, its Layout). B itself where it is
    contiguous (ROW_MAJOR), B.t() where that is contiguous (TRANSPOSED: a Linear weight's .t()), else a copy."""
    if B.is_contiguous():
        return _aligned(torch, B), Layout.ROW_MAJOR
    if B.t().is_contiguous():
        return _aligned(torch, B.t()), Layout.TRANSPOSED
    return _aligned(torch, B.contiguous()), Layout.ROW_MAJOR


# Collectives along a dim (the unfused paths and the backward passes) --------------------------------------------
def gather_dim(torch, c, t, dim: int):
    """braid's all-gather of `t` along `dim` (rank order), as a new tensor."""
    moved = _aligned(torch, t.movedim(dim, 0).contiguous())
    out = moved.new_empty((c.size * moved.shape[0], *moved.shape[1:]))
    if moved.numel():
        function = "braid.ops (all-gather)"
        src, dst = buffer(torch, moved, c, function, "input"), buffer(torch, out, c, function, "output")
        c.all_gather(src.pointer, dst.pointer, src.count, src.dtype, current_stream(torch, c.device))
    return out.movedim(0, dim)


def scatter_dim(torch, c, t, dim: int, op: ReduceOp):
    """braid's reduce-scatter of `t` along `dim` (block `rank` of it, reduced over every rank), as a new tensor."""
    moved = _aligned(torch, t.movedim(dim, 0).contiguous())
    out = moved.new_empty((moved.shape[0] // c.size, *moved.shape[1:]))
    if out.numel():
        function = "braid.ops (reduce-scatter)"
        src, dst = buffer(torch, moved, c, function, "input"), buffer(torch, out, c, function, "output")
        c.reduce_scatter(src.pointer, dst.pointer, dst.count, dst.dtype, op, current_stream(torch, c.device))
    return out.movedim(0, dim)


# The calls ----------------------------------------------------------------------------------------------------
def all_gather_matmul(torch, c, A_shard, Bs, gather_dim_: int, return_A: bool, function: str):
    """(all_gather(A_shard, gather_dim) or None, [that @ B for B in Bs]): the first product fused with the
    all-gather, the others torch.matmul of the gathered A (NOTE [fused matmul layout])."""
    dim = check_all_gather(torch, function, A_shard, Bs, gather_dim_, c.size)
    _check_communicator(c, function, A_shard, "A_shard")
    if dim == A_shard.dim() - 1:
        A = gather_dim(torch, c, A_shard, dim)
        return (A if return_A else None), [torch.matmul(A, B) for B in Bs]
    a, lead = flat_rows(torch, A_shard, dim)
    lead = (c.size * lead[0], *lead[1:])
    rows, k = c.size * a.shape[0], a.shape[1]
    A_flat = a.new_empty((rows, k)) if return_A or len(Bs) > 1 else None
    out = a.new_empty((rows, Bs[0].shape[1]))
    _first_product(torch, c, a, Bs[0], out, A_flat, function)
    outs = [out] + [torch.matmul(A_flat, B) for B in Bs[1:]]  # the gathered A is here: no more communication
    A = unflatten(A_flat, lead, dim) if return_A else None
    return A, [unflatten(o, lead, dim) for o in outs]


def _check_communicator(c, function: str, A, name: str) -> None:
    """Before anything is enqueued: the communicator runs fused GEMMs (its FusedMatmul, which the NCCL backend
    refuses with UNSUPPORTED, whichever path the call takes), and A is on its GPU."""
    fused_matmul(c)
    if A.device.type != "cuda" or A.device.index != c.device:
        raise argument_error(function, name, f"is on {A.device}; the communicator's GPU is cuda:{c.device}")


def _first_product(torch, c, a, B, out, A_flat, function: str) -> None:
    """out = all_gather(a) @ B through braid::FusedMatmul, A_flat (or None) receiving the gathered a. Empty
    operands (no rows, K or N of 0) take torch's path: braid would enqueue nothing, and some have no address."""
    rows, k = a.shape
    n = B.shape[1]
    if rows == 0 or k == 0 or n == 0:
        if A_flat is not None and A_flat.numel():
            A_flat.copy_(gather_dim(torch, c, a, 0))
        out.zero_()
        return
    b, layout = matrix(torch, B)
    src, dst = buffer(torch, a, c, function, "A_shard"), buffer(torch, out, c, function, "out")
    weights = buffer(torch, b, c, function, "Bs[0]")
    gathered = 0 if A_flat is None else buffer(torch, A_flat, c, function, "A").pointer
    fused_matmul(c).all_gather_matmul(src.pointer, rows, k, weights.pointer, layout, n, dst.pointer, gathered,
                                      src.dtype, current_stream(torch, c.device))


def matmul_reduce_scatter(torch, c, A, B, reduce_op: str, scatter_dim_: int, function: str):
    """reduce_scatter(A @ B, reduce_op, scatter_dim): fused where the scatter moves rows (NOTE [fused matmul
    layout])."""
    dim, op, _ = reduce_scatter_shape(torch, function, A, B, reduce_op, scatter_dim_, c.size)
    _check_communicator(c, function, A, "A")
    if dim == A.dim() - 1:
        return scatter_dim(torch, c, torch.matmul(A, B), dim, op).contiguous()
    a, lead = flat_rows(torch, A, dim)
    lead = (lead[0] // c.size, *lead[1:])
    m, k = a.shape
    n = B.shape[1]
    out = a.new_empty((m // c.size, n))
    if k == 0:
        out.zero_()
    elif out.numel():  # braid enqueues nothing for m or n of 0
        b, layout = matrix(torch, B)
        src, dst = buffer(torch, a, c, function, "A"), buffer(torch, out, c, function, "out")
        weights = buffer(torch, b, c, function, "B")
        fused_matmul(c).matmul_reduce_scatter(src.pointer, m, k, weights.pointer, layout, n, dst.pointer, src.dtype,
                                              op, current_stream(torch, c.device))
    return unflatten(out, lead, dim).contiguous()  # a copy where dim is not 0, as torch's result is contiguous


def fake_all_gather_matmul(torch, A_shard, Bs, gather_dim_: int, return_A: bool, world: int, function: str):
    """What all_gather_matmul returns (shapes, dtypes and strides) without running it."""
    dim = check_all_gather(torch, function, A_shard, Bs, gather_dim_, world)
    moved = A_shard.movedim(dim, 0)
    if dim == A_shard.dim() - 1:  # as gather_dim returns it
        A = A_shard.new_empty((world * moved.shape[0], *moved.shape[1:])).movedim(0, dim)
        return (A if return_A else None), [torch.matmul(A, B) for B in Bs]
    lead = (world * moved.shape[0], *moved.shape[1:-1])
    A = new_results(A_shard, dim, lead, [A_shard.shape[-1]])[0] if return_A else None
    return A, new_results(A_shard, dim, lead, [B.shape[1] for B in Bs])


def fake_matmul_reduce_scatter(torch, A, B, reduce_op: str, scatter_dim_: int, world: int, function: str):
    """What matmul_reduce_scatter returns (shape, dtype and strides) without running it."""
    dim, _, shape = reduce_scatter_shape(torch, function, A, B, reduce_op, scatter_dim_, world)
    return A.new_empty(shape)  # contiguous, as matmul_reduce_scatter returns it
