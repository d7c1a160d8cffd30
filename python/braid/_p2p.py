"""Point to point on tensors: send, recv, and batches of them in flight together (torch's P2POp and
batch_isend_irecv; NCCL's group semantics). Stream-ordered on the current stream, like the collectives: send
returns once enqueued, not when the peer has the data."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ._braid import Communicator, PointToPoint
from ._error import argument_error, rank_argument
from ._state import communicator
from ._tensors import buffer
from ._torch import current_stream, torch as import_torch


def send(tensor, dst: int, comm: Optional[Communicator] = None) -> None:
    """Sends `tensor` to rank dst, whose matching recv names this rank."""
    batch_isend_irecv([P2POp(send, tensor, dst)], comm, function="braid.send")


def recv(tensor, src: int, comm: Optional[Communicator] = None) -> int:
    """Receives rank src's matching send into `tensor`; returns src (torch returns the sender's rank)."""
    batch_isend_irecv([P2POp(recv, tensor, src)], comm, function="braid.recv")
    return src


@dataclass
class P2POp:
    """One op of batch_isend_irecv: op is braid.send or braid.recv (torch's P2POp takes dist.isend/irecv)."""

    op: Callable
    tensor: object
    peer: int


def batch_isend_irecv(p2p_op_list: Sequence[P2POp], comm: Optional[Communicator] = None, *,
                      function: str = "braid.batch_isend_irecv") -> None:
    """Every op of the list in flight together (a send to q and a receive from q never deadlock). The k-th send
    this rank makes to q matches the k-th receive q makes from this rank; their byte sizes must be equal."""
    torch, c = import_torch(function), communicator(comm, function)
    ops = []
    for index, item in enumerate(p2p_op_list):
        name = f"p2p_op_list[{index}]" if function == "braid.batch_isend_irecv" else "tensor"
        if not isinstance(item, P2POp) or item.op not in (send, recv):
            raise argument_error(function, name, "must be a braid.P2POp whose op is braid.send or braid.recv")
        t = buffer(torch, item.tensor, c, function, name if name == "tensor" else f"{name}.tensor")
        kind = PointToPoint.Kind.SEND if item.op is send else PointToPoint.Kind.RECV
        peer_name = {"braid.send": "dst", "braid.recv": "src"}.get(function, f"{name}.peer")
        ops.append(PointToPoint(kind, rank_argument(item.peer, c.size, function, peer_name), t.pointer, t.count,
                                t.dtype))
    c.send_recv(ops, current_stream(torch, c.device))
