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
from ._ops import register_ops

__all__ = ["all_reduce", "all_reduce_", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce", "broadcast",
           "all_to_all_single", "all_to_all_v_device", "send_recv", "send", "recv"]


def _op_name(op) -> str:
    return reduce_op_name(op)


def all_reduce(tensor, op=ReduceOp.SUM, comm=None):
    """`tensor` reduced over every rank, as a new tensor."""
    return register_ops().all_reduce(tensor, _op_name(op), op_handle(comm))


def all_reduce_(tensor, op=ReduceOp.SUM, comm=None):
    """Reduces `tensor` over every rank in place (a mutating op); returns it."""
    register_ops().all_reduce_(tensor, _op_name(op), op_handle(comm))
    return tensor


def all_gather_into_tensor(tensor, comm=None):
    """Every rank's `tensor` concatenated along dim 0 in rank order: [world * rows, ...]."""
    return register_ops().all_gather_into_tensor(tensor, op_handle(comm))


def reduce_scatter_tensor(tensor, op=ReduceOp.SUM, comm=None):
    """Block `rank` (dim 0 split into world blocks) of `tensor` reduced over every rank."""
    return register_ops().reduce_scatter_tensor(tensor, _op_name(op), op_handle(comm))


def reduce(tensor, dst: int, op=ReduceOp.SUM, comm=None):
    """On rank dst, `tensor` reduced over every rank, as a new tensor; on the other ranks a copy of `tensor`."""
    return register_ops().reduce(tensor, int_argument(dst, "braid.functional.reduce", "dst"), _op_name(op),
                                 op_handle(comm))


def send_recv(sends: Sequence = (), send_peers: Sequence[int] = (), recv_like: Sequence = (),
              recv_peers: Sequence[int] = (), comm=None):
    """A batch of point-to-point transfers in flight together (batch_isend_irecv as a function): sends[i] goes to
    rank send_peers[i], and a new tensor shaped like recv_like[i] receives from rank recv_peers[i]; returns the
    received tensors in that order. The k-th send to q matches the k-th receive q makes from this rank."""
    function = "braid.functional.send_recv"
    return register_ops().send_recv(list(sends), [int_argument(p, function, "send_peers") for p in send_peers],
                                    list(recv_like), [int_argument(p, function, "recv_peers") for p in recv_peers],
                                    op_handle(comm))


def send(tensor, dst: int, comm=None) -> None:
    """Sends `tensor` to rank dst (a send_recv of one send)."""
    send_recv([tensor], [dst], comm=comm)


def recv(like, src: int, comm=None):
    """A new tensor shaped like `like`, received from rank src (a send_recv of one receive)."""
    return send_recv(recv_like=[like], recv_peers=[src], comm=comm)[0]


def broadcast(tensor, src: int, comm=None):
    """Rank src's `tensor` on every rank, as a new tensor."""
    return register_ops().broadcast(tensor, int_argument(src, "braid.functional.broadcast", "src"), op_handle(comm))


def all_to_all_single(tensor, output_split_sizes: Optional[Sequence[int]] = None,
                      input_split_sizes: Optional[Sequence[int]] = None, comm=None):
    """torch's all_to_all_single as a function: rows of dim 0 (equal blocks, or host lists of split sizes)."""
    function = "braid.functional.all_to_all_single"
    outs = None if output_split_sizes is None else [int_argument(s, function, "output_split_sizes")
                                                    for s in output_split_sizes]
    ins = None if input_split_sizes is None else [int_argument(s, function, "input_split_sizes")
                                                  for s in input_split_sizes]
    return register_ops().all_to_all_single(tensor, outs, ins, op_handle(comm))


def all_to_all_v_device(tensor, input_split_sizes, output_rows: int, input_offsets=None, comm=None):
    """braid.all_to_all_v_device as a function: the split sizes are an int64 CUDA tensor of one entry per rank
    (rows of dim 0 to each rank; input_offsets: where each block starts, None: packed in rank order), so a kernel
    can decide them and the call captures in a graph. Returns (output, output_split_sizes, output_offsets):
    output has output_rows rows, the received ones packed in rank order from row 0 (rows past them unspecified);
    the counts and offsets are new [world] int64 tensors. A total above output_rows writes no rows (the counts
    and offsets still are) and braid.check() reports it."""
    return register_ops().all_to_all_v_device(tensor, input_split_sizes, input_offsets, int(output_rows),
                                              op_handle(comm))
