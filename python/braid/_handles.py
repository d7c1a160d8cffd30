"""Handles: how braid's custom ops (_ops.py) name Python objects. A custom op takes no Python object, so a
communicator or a braid.MoeBuffer crosses as an int: op_handle() gives it one and keeps the object alive until
release_handle(); 0 is the default communicator as it is when the op runs."""
from __future__ import annotations

import itertools
from typing import Any

from ._braid import MoeHandle
from ._error import argument_error
from ._state import communicator

_objects: dict[int, Any] = {}  # handle -> Communicator or braid.MoeBuffer (kept alive while registered)
_handles: dict[int, int] = {}  # id(object) -> handle
_next = itertools.count(1)


def op_handle(obj) -> int:
    """The int that names `obj` (a Communicator or a braid.MoeBuffer) to braid's ops; None: 0, the default
    communicator. The registry holds obj until release_handle()."""
    if obj is None:
        return 0
    if isinstance(obj, int):
        return obj
    handle = _handles.get(id(obj))
    if handle is None:
        handle = next(_next)
        _handles[id(obj)] = handle
        _objects[handle] = obj
    return handle


def release_handle(obj) -> None:
    handle = _handles.pop(id(obj), None)
    if handle is not None:
        _objects.pop(handle, None)


def resolve(handle: int, function: str):
    """The object a handle names (0: the default communicator)."""
    if handle == 0:
        return communicator(None, function)
    found = _objects.get(handle)
    if found is None:
        raise argument_error(function, "comm", f"is handle {handle}, which names no live communicator or MoeBuffer")
    return found


def native_handle(number: int):
    """A MoeHandle from its dispatch number as the ops take it; None for -1 (the buffer's last routed dispatch)."""
    if number < 0:
        return None
    handle = MoeHandle()
    handle.dispatch = number
    return handle


def comm_of(handle: int, function: str):
    """The communicator a handle names: the object itself, or a MoeBuffer's."""
    found = resolve(handle, function)
    return getattr(found, "_comm", found)  # a MoeBuffer names its communicator
