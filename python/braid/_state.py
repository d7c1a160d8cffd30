"""The default communicator, as torch.distributed keeps a default process group: braid.init() makes it
(_lifecycle.py), calls that take comm=None use it, braid.destroy() frees it."""
from __future__ import annotations

from typing import Optional

from ._braid import Communicator
from ._error import Error, ErrorCode

_default: Optional[Communicator] = None


def set_default(comm: Optional[Communicator]) -> None:
    """Makes `comm` the default communicator (None: there is none); braid.init and braid.destroy alone call it."""
    global _default
    _default = comm


def is_initialized() -> bool:
    return _default is not None


def communicator(comm: Optional[Communicator], function: str) -> Communicator:
    """`comm`, or the default communicator; braid.Error when there is none."""
    if comm is not None:
        return comm
    if _default is None:
        raise Error(f"{function}: no communicator: call braid.init() first, or pass comm=", ErrorCode.INVALID_ARGUMENT)
    return _default


def default_communicator() -> Communicator:
    return communicator(None, "braid.default_communicator")


def get_rank(comm: Optional[Communicator] = None) -> int:
    return communicator(comm, "braid.get_rank").rank


def get_world_size(comm: Optional[Communicator] = None) -> int:
    return communicator(comm, "braid.get_world_size").size


def barrier(comm: Optional[Communicator] = None) -> None:
    """Host-side barrier of every rank. Unlike torch.distributed.barrier it does not wait for the GPU:
    synchronise the stream first when the peers must see this rank's work."""
    communicator(comm, "braid.barrier").barrier()


def check(comm: Optional[Communicator] = None) -> None:
    """Raises (braid.Error) what a braid kernel recorded: a timeout, a plan mismatch, refused data. Does not
    synchronise: call torch.cuda.synchronize() first to see a given call's outcome."""
    communicator(comm, "braid.check").check()
