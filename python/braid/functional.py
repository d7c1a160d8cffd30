"""Functional collectives through braid's custom ops (torch.ops.braid.*): each returns a new tensor, as torch's
_c10d_functional ops do (but all_reduce_, which returns its input reduced in place, and send, which returns
None), so they trace under torch.compile without graph breaks and capture in torch.cuda.graph. They run on
torch.cuda.current_stream(). comm: None (the default communicator when the op runs), a Communicator, or its
braid.op_handle() (an int, which is what traces without a guard on the object)."""
from __future__ import annotations

from typing import Optional, Sequence

from ._braid import ReduceOp
from ._dtypes import reduce_op_name
from ._error import int_argument
from ._handles import op_handle
from ._ops import check_pairs, register_ops
from ._tensors import tensor_argument
from ._torch import torch as import_torch

__all__ = ["all_reduce", "all_reduce_", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce", "broadcast",
           "all_to_all_single", "all_to_all_v_device", "send_recv", "send", "recv"]


def _tensor(tensor, function: str, argument: str):
    """`tensor` once braid's ops can take it (a contiguous CUDA tensor of a dtype braid moves; meta ones trace),
    checked here because a tensor on another device would not reach them: torch would raise its own error."""
    tensor_argument(import_torch(function), tensor, function, argument, meta=True)
    return tensor


def all_reduce(tensor, op=ReduceOp.SUM, comm=None):
    """`tensor` reduced over every rank, as a new tensor."""
    function = "braid.functional.all_reduce"
    return register_ops().all_reduce(_tensor(tensor, function, "tensor"), reduce_op_name(op), op_handle(comm))


def all_reduce_(tensor, op=ReduceOp.SUM, comm=None):
    """Reduces `tensor` over every rank in place (a mutating op); returns it."""
    function = "braid.functional.all_reduce_"
    register_ops().all_reduce_(_tensor(tensor, function, "tensor"), reduce_op_name(op), op_handle(comm))
    return tensor


def all_gather_into_tensor(tensor, comm=None):
    """Every rank's `tensor` concatenated along dim 0 in rank order: [world * rows, ...]."""
    function = "braid.functional.all_gather_into_tensor"
    return register_ops().all_gather_into_tensor(_tensor(tensor, function, "tensor"), op_handle(comm))


def reduce_scatter_tensor(tensor, op=ReduceOp.SUM, comm=None):
    """Block `rank` (dim 0 split into world blocks) of `tensor` reduced over every rank."""
    function = "braid.functional.reduce_scatter_tensor"
    return register_ops().reduce_scatter_tensor(_tensor(tensor, function, "tensor"), reduce_op_name(op),
                                                op_handle(comm))


def reduce(tensor, dst: int, op=ReduceOp.SUM, comm=None):
    """On rank dst, `tensor` reduced over every rank, as a new tensor; on the other ranks a copy of `tensor`."""
    function = "braid.functional.reduce"
    return register_ops().reduce(_tensor(tensor, function, "tensor"), int_argument(dst, function, "dst"),
                                 reduce_op_name(op), op_handle(comm))


def send_recv(sends: Sequence = (), send_peers: Sequence[int] = (), recv_like: Sequence = (),
              recv_peers: Sequence[int] = (), comm=None):
    """A batch of point-to-point transfers in flight together (batch_isend_irecv as a function): sends[i] goes to
    rank send_peers[i], and a new tensor shaped like recv_like[i] receives from rank recv_peers[i]; returns the
    received tensors in that order. The k-th send to q matches the k-th receive q makes from this rank. An empty
    batch moves nothing and returns []."""
    function = "braid.functional.send_recv"
    sends = [_tensor(t, function, f"sends[{i}]") for i, t in enumerate(sends)]
    recv_like = [_tensor(t, function, f"recv_like[{i}]") for i, t in enumerate(recv_like)]
    send_peers = [int_argument(p, function, f"send_peers[{i}]") for i, p in enumerate(send_peers)]
    recv_peers = [int_argument(p, function, f"recv_peers[{i}]") for i, p in enumerate(recv_peers)]
    check_pairs(function, sends, send_peers, recv_like, recv_peers)
    if not sends and not recv_like:  # no op: an op without a tensor has no device to run on
        return []
    return register_ops().send_recv(sends, send_peers, recv_like, recv_peers, op_handle(comm))


def send(tensor, dst: int, comm=None) -> None:
    """Sends `tensor` to rank dst (a send_recv of one send; a dst outside the world is refused as
    send_peers[0], a tensor on another GPU than the communicator's as sends[0])."""
    function = "braid.functional.send"
    send_recv([_tensor(tensor, function, "tensor")], [int_argument(dst, function, "dst")], comm=comm)


def recv(like, src: int, comm=None):
    """A new tensor shaped like `like`, received from rank src (a send_recv of one receive; a src outside the
    world is refused as recv_peers[0], a `like` on another GPU than the communicator's as recv_like[0])."""
    function = "braid.functional.recv"
    return send_recv(recv_like=[_tensor(like, function, "like")], recv_peers=[int_argument(src, function, "src")],
                     comm=comm)[0]


def broadcast(tensor, src: int, comm=None):
    """Rank src's `tensor` on every rank, as a new tensor."""
    function = "braid.functional.broadcast"
    return register_ops().broadcast(_tensor(tensor, function, "tensor"), int_argument(src, function, "src"),
                                    op_handle(comm))


def all_to_all_single(tensor, output_split_sizes: Optional[Sequence[int]] = None,
                      input_split_sizes: Optional[Sequence[int]] = None, comm=None):
    """torch's all_to_all_single as a function: rows of dim 0 (equal blocks, or host lists of split sizes)."""
    function = "braid.functional.all_to_all_single"
    outs = None if output_split_sizes is None else [int_argument(s, function, "output_split_sizes")
                                                    for s in output_split_sizes]
    ins = None if input_split_sizes is None else [int_argument(s, function, "input_split_sizes")
                                                  for s in input_split_sizes]
    return register_ops().all_to_all_single(_tensor(tensor, function, "tensor"), outs, ins, op_handle(comm))


def all_to_all_v_device(tensor, input_split_sizes, output_rows: int, input_offsets=None, comm=None):
    """braid.all_to_all_v_device as a function: the split sizes are an int64 CUDA tensor of one entry per rank
    (rows of dim 0 to each rank; input_offsets: where each block starts, None: packed in rank order), so a kernel
    can decide them and the call captures in a graph. Returns (output, output_split_sizes, output_offsets):
    output has output_rows rows, the received ones packed in rank order from row 0 (rows past them unspecified);
    the counts and offsets are new [world] int64 tensors. A total above output_rows writes no rows (the counts
    and offsets still are) and braid.check() reports it."""
    function = "braid.functional.all_to_all_v_device"
    tensor = _tensor(tensor, function, "tensor")
    input_split_sizes = _tensor(input_split_sizes, function, "input_split_sizes")
    offsets = None if input_offsets is None else _tensor(input_offsets, function, "input_offsets")
    return register_ops().all_to_all_v_device(tensor, input_split_sizes, offsets,
                                              int_argument(output_rows, function, "output_rows"), op_handle(comm))
