"""Symmetric tensors: braid.empty makes a torch tensor backed by a symmetric allocation (Communicator.alloc), so
every rank's copy is mapped on every rank. The tensor carries .peer(r) (rank r's copy, as a tensor on this
GPU), .view_all() (every rank's copy as one [world, *shape] tensor over the contiguous view) and
.symmetric_memory (the allocation). Tensors come through DLPack from byte arrays that hold the allocation,
so it stays mapped while any of them lives."""
from __future__ import annotations

import math
from typing import Optional

from ._braid import Communicator, SymmetricMemory, datatype_size
from ._dtypes import datatype, torch_name
from ._error import Error, argument_error, int_argument, rank_argument
from ._state import communicator
from ._torch import torch as import_torch


def _shape(size, function: str) -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list)) or len(size) == 1 and type(size[0]).__name__ == "Size":
        size = tuple(size[0])
    try:
        shape = tuple(int_argument(d, function, "size") for d in size)
    except Error:
        raise argument_error(function, "size", f"is {size!r}; it must be ints or one sequence of ints") from None
    if any(d < 0 for d in shape):
        raise argument_error(function, "size", f"is {shape}; no dimension may be negative")
    return shape


def _typed(torch, array, nbytes: int, dtype):
    """The first nbytes of a DLPack byte array as a flat tensor of dtype."""
    return torch.from_dlpack(array)[:nbytes].view(dtype)


def empty(*size, dtype=None, comm: Optional[Communicator] = None):
    """Collective (every rank, same size and dtype, same order): an uninitialised-looking (in fact zeroed)
    tensor of `size` on the communicator's GPU, in symmetric memory, with .peer(r), .view_all() and
    .symmetric_memory. size is ints or one sequence, as torch.empty takes it; dtype None: torch's default."""
    function = "braid.empty"
    torch = import_torch(function)
    c = communicator(comm, function)
    shape = _shape(size, function)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    element = datatype_size(datatype(dtype, function))
    if not isinstance(dtype, torch.dtype):  # a name or a braid.DataType: the torch.dtype the tensor views it as
        dtype = getattr(torch, torch_name(datatype(dtype, function)))
    nbytes = math.prod(shape) * element
    memory = c.alloc(max(nbytes, element), contiguous_view=True)  # braid allocates at least one element
    tensor = _typed(torch, memory.local_buffer(), nbytes, dtype).view(shape)
    tensor.symmetric_memory = memory
    tensor.peer = lambda rank: peer(memory, rank, shape, dtype)
    tensor.view_all = lambda: view_all(memory, shape, dtype)
    return tensor


def peer(memory: SymmetricMemory, rank: int, shape: tuple, dtype):
    """Rank's copy of `memory` as a tensor of shape and dtype on this rank's GPU (loads and stores go over
    NVLink). Order accesses against the peer yourself: a collective, braid.barrier after synchronising, or
    device-side signals."""
    torch = import_torch("braid.peer")
    rank = rank_argument(rank, memory.world_size, "braid.peer", "rank")
    nbytes = math.prod(shape) * datatype_size(datatype(dtype, "braid.peer"))
    return _typed(torch, memory.peer_buffer(rank), nbytes, dtype).view(shape)


def view_all(memory: SymmetricMemory, shape: tuple, dtype):
    """Every rank's copy as one [world, *shape] tensor over the contiguous view: [r] is rank r's copy. Ranks lie
    view_stride bytes apart (the size rounded up to the mapping granularity), so the tensor is contiguous only
    when the size is a multiple of it."""
    torch = import_torch("braid.view_all")
    element = datatype_size(datatype(dtype, "braid.view_all"))
    flat = torch.from_dlpack(memory.view_buffer()).view(dtype)
    inner = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        inner[i] = inner[i + 1] * shape[i + 1]
    return flat.as_strided((memory.world_size, *shape), (memory.view_stride // element, *inner))
