"""braid.Error and braid.ErrorCode: braid's one exception type, raised by the extension (for braid::Error, with
its message and code) and by the package's own argument checks."""
from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """braid::ErrorCode (braid/error.hpp), value for value."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1  # a caller's argument is wrong; the message names it
    NO_DEVICE = 2  # no CUDA driver or device on this machine
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
