"""braid.init and braid.destroy: the default communicator's life (_state.py holds it), with what hangs on it: the
store this process serves for init(group=), the custom ops registered at init where torch is imported, and the
FusedMatmul of braid.ops released before the communicator."""
from __future__ import annotations

import os
import socket
import sys
from typing import Optional

from . import _state
from ._braid import Communicator, Rendezvous, StoreHost
from ._error import Error, ErrorCode, argument_error
from ._fused import release
from ._ops import register_ops

_store_host: Optional[StoreHost] = None  # serves the default communicator's store when init(group=) made it here
# Stores this process served for communicators since destroyed: kept until the process exits, since another rank
# may still be finishing a request to one when this rank destroys its communicator.
_retired_store_hosts: list = []
_generations: dict = {}  # process group name -> inits through it so far (fresh keys in its store each time)


def exchange_store_address(store, key: str, rank: int, size: int, multi_host: bool = False):
    """Where the ranks of a process group meet, through the group's torch.distributed store: rank 0 serves a braid
    store in this process (StoreHost) and publishes its address under `key`; the others read it (store.get waits,
    bounded by the store's timeout). Returns (Rendezvous, the StoreHost on rank 0 or None), the StoreHost to be
    kept alive as long as the communicator."""
    host = None
    if rank == 0:
        if multi_host:  # peers on other hosts connect: every interface of both families, under a name they reach
            host = StoreHost("", 0)
            port = host.address.rsplit(":", 1)[1]
            address = f"{os.environ.get('MASTER_ADDR') or socket.gethostname()}:{port}"
        else:
            host = StoreHost("127.0.0.1", 0)
            address = host.address
        store.set(key, address)
    else:
        address = store.get(key)
        address = address.decode() if isinstance(address, (bytes, bytearray)) else str(address)
    return Rendezvous.at_store(address, rank, size, False), host


def _group_rendezvous(group, function: str):
    """A Rendezvous for the ranks of torch.distributed process group `group`, through its store."""
    from ._torch import torch as import_torch
    dist = import_torch(function).distributed
    if not dist.is_available() or not dist.is_initialized():
        raise argument_error(function, "group", "names a process group, but torch.distributed is not initialised "
                             "(call dist.init_process_group first)")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise argument_error(function, "group", "is a process group this process is not a member of")
    store = dist.distributed_c10d._get_default_store()
    name = getattr(group, "group_name", None) or "WORLD"
    generation = _generations.get(name, 0)
    _generations[name] = generation + 1
    world = group is None or group is dist.group.WORLD or size == dist.get_world_size()
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size)) if world else size
    rendezvous, host = exchange_store_address(store, f"braid/init/{name}/{generation}", rank, size,
                                              multi_host=local_size != size)
    rendezvous.source = "torch.distributed"
    if "LOCAL_RANK" in os.environ:  # this process's GPU, whatever the group (a subgroup numbers its ranks anew)
        local_rank = int(os.environ["LOCAL_RANK"])
        rendezvous.local_rank = local_rank
        rendezvous.local_size = max(int(os.environ.get("LOCAL_WORLD_SIZE", local_size)), local_rank + 1)
    return rendezvous, host


def init(group=None, *, device: Optional[int] = None, timeout_s: Optional[float] = None, backend: Optional[str] = None,
         algorithms: Optional[str] = None, max_blocks: Optional[int] = None) -> Communicator:
    """Collective: every rank the launcher started (braid-run, torchrun, Open MPI, MPICH, Slurm: read from the
    environment) meets the others and gets the default communicator, which it returns. With `group` (a
    torch.distributed process group, e.g. dist.group.WORLD) the ranks are the group's and meet through its store
    (rank 0 of the group serves braid's store on a free port it picks and publishes the address there), so no
    launcher variables and no port to configure are needed. Make its GPU current
    (torch.cuda.set_device(comm.device)) before making tensors for it. None leaves an option to braid's
    environment variables (BRAID_DEVICE or the local rank, BRAID_TIMEOUT_S, BRAID_BACKEND, BRAID_ALGO,
    BRAID_MAX_BLOCKS); with `group`, the local rank is the launcher's LOCAL_RANK where it is set (a subgroup's
    rank otherwise)."""
    global _store_host
    if _state.is_initialized():
        raise Error("braid.init: the default communicator exists already; call braid.destroy() first",
                    ErrorCode.INVALID_ARGUMENT)
    host = None
    rendezvous = Rendezvous.from_env() if group is None else None
    if group is not None:
        rendezvous, host = _group_rendezvous(group, "braid.init")
    comm = Communicator.init(rendezvous, device=-1 if device is None else device,
                             timeout_s=0.0 if timeout_s is None else timeout_s, backend=backend or "",
                             algorithms=algorithms or "", max_blocks=0 if max_blocks is None else max_blocks)
    _state.set_default(comm)
    _store_host = host
    if sys.modules.get("torch") is not None:  # the custom ops: a first call may be traced (torch.compile)
        register_ops()
    return comm


def destroy() -> None:
    """Frees the default communicator (tensors from braid.empty stay valid); braid.init() may then run again.
    After init(group=...), rank 0 keeps serving the store it made until the process exits, so the other ranks
    may destroy theirs in any order."""
    global _store_host
    if _state.is_initialized():
        comm = _state.default_communicator()
        release(comm)  # its FusedMatmul (braid.ops) first: it holds a workspace of the communicator's
        comm.destroy()
        _state.set_default(None)
    if _store_host is not None:
        _retired_store_hosts.append(_store_host)
    _store_host = None
