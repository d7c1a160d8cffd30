"""Tensors as braid's calls take them: a device address, an element count and a DataType, after checking that the
tensor can be one (a contiguous CUDA tensor on the communicator's GPU, of a dtype braid moves). Failures are
braid.Error (INVALID_ARGUMENT) naming the call and the argument."""
from __future__ import annotations

from typing import NamedTuple

from ._braid import Communicator, DataType
from ._dtypes import datatype
from ._error import argument_error


class Buffer(NamedTuple):
    pointer: int
    count: int  # elements
    dtype: DataType


def tensor_argument(torch, tensor, function: str, argument: str, meta: bool = False) -> DataType:
    """The DataType of `tensor`, once it is what braid takes without its communicator: a contiguous CUDA tensor
    of a dtype braid moves. meta=True also takes meta tensors, which carry shapes only: the custom ops' fake
    implementations check with it, so that they refuse what the real ones do."""
    if not isinstance(tensor, torch.Tensor):
        raise argument_error(function, argument, f"must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cuda" and not (meta and tensor.device.type == "meta"):
        raise argument_error(function, argument, f"is on {tensor.device}; braid needs a CUDA tensor")
    if not tensor.is_contiguous():
        raise argument_error(function, argument, "must be contiguous (call .contiguous() first)")
    return datatype(tensor.dtype, function, f"{argument}.dtype")


def buffer(torch, tensor, comm: Communicator, function: str, argument: str) -> Buffer:
    dtype = tensor_argument(torch, tensor, function, argument)
    if tensor.device.index != comm.device:
        raise argument_error(function, argument,
                             f"is on {tensor.device}; the communicator's GPU is cuda:{comm.device}")
    return Buffer(tensor.data_ptr(), tensor.numel(), dtype)


def same_dtype(first, second, function: str, argument: str) -> None:
    if first.dtype != second.dtype:
        raise argument_error(function, argument, f"has dtype {second.dtype}; it must match {first.dtype}")
