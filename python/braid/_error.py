"""braid.Error and braid.ErrorCode: braid's one exception type, raised by the extension (for braid::Error, with
its message and code) and by the package's own argument checks."""
from __future__ import annotations

import enum
import operator


class ErrorCode(enum.IntEnum):
    """braid::ErrorCode (braid/error.hpp), value for value."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1  # a caller's argument is wrong; the message names it
    NO_DEVICE = 2  # no usable CUDA driver (none, or one older than the runtime) or no device
    CUDA_ERROR = 3  # a CUDA runtime call failed
    DRIVER_ERROR = 4  # a CUDA driver call failed
    SYSTEM_ERROR = 5  # an OS call failed (sockets, fds, processes)
    TIMEOUT = 6  # a bounded wait expired
    PEER_UNREACHABLE = 7  # ranks cannot reach each other's memory
    MISMATCH = 8  # ranks disagree on a collective call
    UNSUPPORTED = 9  # a valid request this build or device cannot serve
    REMOTE_ERROR = 10  # a peer failed or went away
    INTERNAL = 11  # a bug in braid
    ABORTED = 12  # this rank aborted the communicator
    REVOKED = 13  # a rank revoked the communicator


class Error(RuntimeError):
    """A failed braid call: str(error) is braid's message (naming the argument, CUDA call or peer at fault) and
    error.code its braid.ErrorCode."""

    def __init__(self, message: str, code: int = ErrorCode.INTERNAL) -> None:
        super().__init__(message)
        try:
            self.code = ErrorCode(code)
        except ValueError:  # a code newer than this file: keep the number
            self.code = code

    def __reduce__(self):  # pickles with its code (multiprocessing hands exceptions between processes)
        return (type(self), (str(self), int(self.code)))


def argument_error(function: str, argument: str, problem: str) -> Error:
    """An INVALID_ARGUMENT error worded as braid's own: "<function>: argument '<name>' <problem>"."""
    return Error(f"{function}: argument '{argument}' {problem}", ErrorCode.INVALID_ARGUMENT)


def int_argument(value, function: str, argument: str) -> int:
    """`value` as an int: an int or an integer index (operator.index: a numpy integer, a 0-d integer tensor), never
    a bool, float or str; else an INVALID_ARGUMENT error naming `argument`."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise argument_error(function, argument, f"is {value!r}; it must be an int")


def rank_argument(value, world: int, function: str, argument: str) -> int:
    """int_argument, within the ranks [0, world)."""
    rank = int_argument(value, function, argument)
    if not 0 <= rank < world:
        raise argument_error(function, argument, f"is {rank}; it must be a rank in [0, {world})")
    return rank
