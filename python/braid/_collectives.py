"""Collectives on tensors, in torch.distributed's shape: they enqueue on the current CUDA stream of the
communicator's GPU and return (no Work objects: order later work by stream, as with async_op=False under NCCL).
In place where NCCL allows: all_reduce, reduce and broadcast always; all_gather_into_tensor when the input is the
output's block of this rank; reduce_scatter_tensor when the output is the input's block of this rank."""
from __future__ import annotations

from typing import Optional, Sequence

from ._braid import Communicator, ReduceOp
from ._dtypes import reduce_op
from ._error import Error, ErrorCode, argument_error, int_argument, rank_argument
from ._state import communicator
from ._tensors import buffer, same_dtype
from ._torch import current_stream, torch as import_torch


def _setup(function: str, comm: Optional[Communicator]):
    return import_torch(function), communicator(comm, function)


def all_reduce(tensor, op=ReduceOp.SUM, comm: Optional[Communicator] = None) -> None:
    """Reduces `tensor` over every rank, in place."""
    function = "braid.all_reduce"
    torch, c = _setup(function, comm)
    t = buffer(torch, tensor, c, function, "tensor")
    c.all_reduce(t.pointer, t.pointer, t.count, t.dtype, reduce_op(op, function), current_stream(torch, c.device))


def reduce(tensor, dst: int, op=ReduceOp.SUM, comm: Optional[Communicator] = None) -> None:
    """Reduces `tensor` over every rank into rank dst's `tensor` (in place); other ranks' tensors are unchanged."""
    function = "braid.reduce"
    torch, c = _setup(function, comm)
    t = buffer(torch, tensor, c, function, "tensor")
    dst = rank_argument(dst, c.size, function, "dst")
    recv = t.pointer if c.rank == dst else 0  # braid writes recv on the root only
    c.reduce(t.pointer, recv, t.count, t.dtype, reduce_op(op, function), dst, current_stream(torch, c.device))


def broadcast(tensor, src: int, comm: Optional[Communicator] = None) -> None:
    """Copies rank src's `tensor` into every rank's `tensor`."""
    function = "braid.broadcast"
    torch, c = _setup(function, comm)
    t = buffer(torch, tensor, c, function, "tensor")
    src = rank_argument(src, c.size, function, "src")
    send = t.pointer if c.rank == src else 0  # braid reads send on the root only
    c.broadcast(send, t.pointer, t.count, t.dtype, src, current_stream(torch, c.device))


def all_gather_into_tensor(output_tensor, input_tensor, comm: Optional[Communicator] = None) -> None:
    """output_tensor (world * input's elements) gets every rank's input_tensor, in rank order."""
    function = "braid.all_gather_into_tensor"
    torch, c = _setup(function, comm)
    out = buffer(torch, output_tensor, c, function, "output_tensor")
    inp = buffer(torch, input_tensor, c, function, "input_tensor")
    same_dtype(input_tensor, output_tensor, function, "output_tensor")
    if out.count != c.size * inp.count:
        raise argument_error(function, "output_tensor", f"has {out.count} elements; it needs world size ({c.size}) "
                             f"x input_tensor's {inp.count}")
    c.all_gather(inp.pointer, out.pointer, inp.count, inp.dtype, current_stream(torch, c.device))


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, comm: Optional[Communicator] = None) -> None:
    """output gets block rank of input (world blocks of output's elements) reduced over every rank."""
    function = "braid.reduce_scatter_tensor"
    torch, c = _setup(function, comm)
    out = buffer(torch, output, c, function, "output")
    inp = buffer(torch, input, c, function, "input")
    same_dtype(input, output, function, "output")
    if inp.count != c.size * out.count:
        raise argument_error(function, "input", f"has {inp.count} elements; it needs world size ({c.size}) x "
                             f"output's {out.count}")
    c.reduce_scatter(inp.pointer, out.pointer, out.count, out.dtype, reduce_op(op, function),
                     current_stream(torch, c.device))


def all_gather(tensor_list: Sequence, tensor, comm: Optional[Communicator] = None) -> None:
    """tensor_list[r] gets rank r's `tensor` (torch's list form: gathers into one buffer, then copies out)."""
    function = "braid.all_gather"
    torch, c = _setup(function, comm)
    buffer(torch, tensor, c, function, "tensor")
    _check_list(torch, c, tensor_list, tensor, function, "tensor_list")
    gathered = torch.empty((c.size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
    all_gather_into_tensor(gathered, tensor, c)
    for rank, out in enumerate(tensor_list):
        out.copy_(gathered[rank])


def _check_list(torch, c, tensors: Sequence, like, function: str, argument: str) -> None:
    """The list form's tensors, before anything is enqueued: world of them, each of `like`'s shape and dtype on the
    communicator's GPU (as torch.distributed asks)."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise argument_error(function, argument, f"is a {type(tensors).__name__}; it must be a list of {c.size} "
                             "tensors")
    if len(tensors) != c.size:
        raise argument_error(function, argument, f"has {len(tensors)} tensors; it needs {c.size} (world size)")
    for rank, t in enumerate(tensors):
        name = f"{argument}[{rank}]"
        if not isinstance(t, torch.Tensor):
            raise argument_error(function, name, f"must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != like.dtype or tuple(t.shape) != tuple(like.shape):
            raise argument_error(function, name, f"is a {t.dtype} tensor of shape {tuple(t.shape)}; it must match "
                                 f"{like.dtype} and {tuple(like.shape)}")
    for rank, t in enumerate(tensors):
        if t.device.type != "cuda" or t.device.index != c.device:
            raise argument_error(function, f"{argument}[{rank}]", f"is on {t.device}; the communicator's GPU is "
                                 f"cuda:{c.device}")


def reduce_scatter(output, input_list: Sequence, op=ReduceOp.SUM, comm: Optional[Communicator] = None) -> None:
    """output gets input_list[rank] reduced over every rank (torch's list form: concatenates, then reduces)."""
    function = "braid.reduce_scatter"
    torch, c = _setup(function, comm)
    buffer(torch, output, c, function, "output")
    _check_list(torch, c, input_list, output, function, "input_list")
    joined = torch.cat([t.reshape(-1) for t in input_list])
    reduce_scatter_tensor(output, joined, op, c)


def split_counts(splits, tensor, world: int, function: str, argument: str, tensor_name: str) -> Optional[list]:
    """Element counts per rank from split sizes along dim 0 (None: equal blocks)."""
    rows = tensor.shape[0] if tensor.dim() > 0 else 0
    row = tensor.numel() // rows if rows else 0
    if splits is None:
        if rows % world:
            raise argument_error(function, tensor_name, f"has {rows} rows (dim 0); without {argument} they must "
                                 f"split evenly over {world} ranks")
        return [rows // world * row] * world
    if hasattr(splits, "device") and hasattr(splits, "tolist"):
        raise Error(f"{function}: argument '{argument}' is a tensor; here split sizes are host lists of ints (split "
                    "sizes on the GPU: braid.all_to_all_v_device)", ErrorCode.UNSUPPORTED)
    splits = [int_argument(s, function, argument) for s in splits]
    if len(splits) != world or any(s < 0 for s in splits) or sum(splits) != rows:
        raise argument_error(function, argument, f"is {splits}; it needs {world} sizes (one per rank), none negative, "
                             f"summing to {tensor_name}'s {rows} rows")
    return [s * row for s in splits]


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      comm: Optional[Communicator] = None) -> None:
    """torch.distributed.all_to_all_single: block r of input goes to rank r, which receives it as its block of
    this rank. Without split sizes, equal blocks; with them (host lists, rows of dim 0), MPI's all-to-all-v."""
    function = "braid.all_to_all_single"
    torch, c = _setup(function, comm)
    out = buffer(torch, output, c, function, "output")
    inp = buffer(torch, input, c, function, "input")
    same_dtype(input, output, function, "output")
    stream = current_stream(torch, c.device)
    if output_split_sizes is None and input_split_sizes is None:
        for name, tensor in (("input", input), ("output", output)):  # blocks of whole rows, as torch asks
            if tensor.dim() == 0 or tensor.shape[0] % c.size:
                raise argument_error(function, name, f"has shape {tuple(tensor.shape)}; without split sizes its dim 0 "
                                     f"must split evenly over the {c.size} ranks")
        if inp.count != out.count:
            raise argument_error(function, "output", f"has {out.count} elements and input {inp.count}; without split "
                                 "sizes they must be equal")
        c.all_to_all(inp.pointer, out.pointer, inp.count // c.size, inp.dtype, stream)
        return
    send_counts = split_counts(input_split_sizes, input, c.size, function, "input_split_sizes", "input")
    recv_counts = split_counts(output_split_sizes, output, c.size, function, "output_split_sizes", "output")
    c.all_to_allv(inp.pointer, send_counts, None, out.pointer, recv_counts, None, inp.dtype, stream)


def device_counts(torch, tensor, c, function: str, argument: str, required: bool):
    """A per-rank int64 array (split sizes or offsets, in rows): its type, dtype and length (where it lives is
    checked with the other tensors)."""
    if tensor is None:
        if required:
            raise argument_error(function, argument, f"is None; it needs {c.size} int64 entries (one per rank) on the "
                                 "GPU")
        return None
    if not isinstance(tensor, torch.Tensor):
        raise argument_error(function, argument, f"is a {type(tensor).__name__}; it must be an int64 CUDA tensor of "
                             f"{c.size} entries (host lists of split sizes: braid.all_to_all_single)")
    if tensor.dtype != torch.int64 or tensor.dim() != 1 or tensor.numel() != c.size:
        raise argument_error(function, argument, f"is a {tensor.dtype} tensor of shape {tuple(tensor.shape)}; it "
                             f"must be int64 of shape ({c.size},) (one entry per rank)")
    return tensor


def all_to_all_v_device(output, input, input_split_sizes, output_split_sizes=None, *, input_offsets=None,
                        output_offsets=None, comm: Optional[Communicator] = None):
    """All-to-all-v with the split sizes on the GPU (Communicator.all_to_allv_device): no host round trip, so
    the routing can be decided by a kernel and the call captured in a CUDA graph with any counts.

    input: [N, ...]; this rank sends input_split_sizes[q] rows (an int64 CUDA tensor of world entries) to rank q,
    starting at row input_offsets[q] (an int64 CUDA tensor; None: packed in rank order). output: [capacity, ...]
    of input's dtype and row shape; what arrives is packed in rank order from row 0, and the rows received from
    each rank and their first rows are written to output_split_sizes and output_offsets (int64 CUDA tensors of
    world entries; None: new ones). Returns (output_split_sizes, output_offsets). Rows past the received ones
    are not written. A total above capacity writes no rows (the counts and offsets still are), and a negative
    count or offset sends nothing to that rank: braid.check() reports either once the stream has reached the
    call."""
    function = "braid.all_to_all_v_device"
    torch, c = _setup(function, comm)
    send_counts = device_counts(torch, input_split_sizes, c, function, "input_split_sizes", True)
    send_displs = device_counts(torch, input_offsets, c, function, "input_offsets", False)
    recv_counts = device_counts(torch, output_split_sizes, c, function, "output_split_sizes", False)
    recv_displs = device_counts(torch, output_offsets, c, function, "output_offsets", False)
    for name, tensor in (("output", output), ("input", input)):
        if not isinstance(tensor, torch.Tensor):
            raise argument_error(function, name, f"must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() == 0:
            raise argument_error(function, name, "is a scalar; it needs rows (dim 0)")
    same_dtype(input, output, function, "output")
    if tuple(output.shape[1:]) != tuple(input.shape[1:]):
        raise argument_error(function, "output", f"has rows of shape {tuple(output.shape[1:])}; input's are "
                             f"{tuple(input.shape[1:])}")
    for name, tensor in (("input_split_sizes", send_counts), ("input_offsets", send_displs),
                         ("output_split_sizes", recv_counts), ("output_offsets", recv_displs)):
        if tensor is not None:
            buffer(torch, tensor, c, function, name)  # a contiguous CUDA tensor on the communicator's GPU
    out = buffer(torch, output, c, function, "output")
    inp = buffer(torch, input, c, function, "input")
    # The written arrays overlap none of the four (views of one tensor included): their bytes are compared.
    def span(tensor):
        return tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    arrays = (("input_split_sizes", send_counts), ("input_offsets", send_displs), ("output_split_sizes", recv_counts),
              ("output_offsets", recv_displs))
    for index, (name, tensor) in enumerate(arrays[2:], start=2):
        for other_name, other in arrays[:index]:
            if tensor is not None and other is not None and span(tensor)[0] < span(other)[1] \
                    and span(other)[0] < span(tensor)[1]:
                raise argument_error(function, name, f"overlaps {other_name}; it is written")
    new = dict(dtype=torch.int64, device=input.device)
    if recv_counts is None:
        recv_counts = torch.empty(c.size, **new)
    if recv_displs is None:
        recv_displs = torch.empty(c.size, **new)
    # braid counts elements; the splits here are rows: scale them on the device when a row is several elements.
    row = 1
    for extent in input.shape[1:]:
        row *= extent
    if row == 0:
        raise argument_error(function, "input", f"has rows of shape {tuple(input.shape[1:])}, no elements each; the "
                             "split sizes count rows")
    if row == 1:
        counts_in, displs_in, counts_out, displs_out = send_counts, send_displs, recv_counts, recv_displs
    else:
        counts_in = send_counts * row
        displs_in = None if send_displs is None else send_displs * row
        counts_out, displs_out = torch.empty(c.size, **new), torch.empty(c.size, **new)
    # braid needs device addresses even for empty tensors (it cannot see the counts): one element stands in.
    send = input if input.numel() else torch.empty(1, dtype=input.dtype, device=input.device)
    recv = output if output.numel() else torch.empty(1, dtype=output.dtype, device=output.device)
    c.all_to_allv_device(send.data_ptr(), counts_in.data_ptr(), 0 if displs_in is None else displs_in.data_ptr(),
                         recv.data_ptr(), out.count, counts_out.data_ptr(), displs_out.data_ptr(), inp.dtype,
                         current_stream(torch, c.device))
    if row != 1:
        torch.floor_divide(counts_out, row, out=recv_counts)
        torch.floor_divide(displs_out, row, out=recv_displs)
    return recv_counts, recv_displs
