"""The default communicator, as torch.distributed keeps a default process group: braid.init() makes it, calls
that take comm=None use it, braid.destroy() frees it."""
from __future__ import annotations

from typing import Optional

from ._braid import Communicator, Rendezvous
from ._error import Error, ErrorCode

_default: Optional[Communicator] = None


def init(*, device: Optional[int] = None, timeout_s: Optional[float] = None, backend: Optional[str] = None,
         algorithms: Optional[str] = None, max_blocks: Optional[int] = None) -> Communicator:
    """Collective: every rank the launcher started (braid-run, torchrun, Open MPI, MPICH, Slurm: read from the
    environment) meets the others and gets the default communicator, which it returns. Make its GPU current
    (torch.cuda.set_device(comm.device)) before making tensors for it. None leaves an option to braid's
    environment variables (BRAID_DEVICE or the local rank, BRAID_TIMEOUT_S, BRAID_BACKEND, BRAID_ALGO,
    BRAID_MAX_BLOCKS)."""
    global _default
    if _default is not None:
        raise Error("braid.init: the default communicator exists already; call braid.destroy() first",
                    ErrorCode.INVALID_ARGUMENT)
    _default = Communicator.init(Rendezvous.from_env(), device=-1 if device is None else device,
                                 timeout_s=0.0 if timeout_s is None else timeout_s, backend=backend or "",
                                 algorithms=algorithms or "", max_blocks=0 if max_blocks is None else max_blocks)
    return _default


def is_initialized() -> bool:
    return _default is not None


def destroy() -> None:
    """Frees the default communicator (tensors from braid.empty stay valid); braid.init() may then run again."""
    global _default
    if _default is not None:
        _default.destroy()
        _default = None


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
