"""braid.SignalPad: a signal pad for your own kernels (Triton or CUDA), braid/device/sync_device.hpp's pad made on
a communicator. Rank `me` signals `peer` on channel c by a system-scope release add of 1 on the peer's counter
for (c, me); a wait on (c, peer) adds 1 to this rank's expected count for that slot and spins, with acquire loads
at system scope, until the counter reaches it. Counters only grow, so back-to-back use and graph replays stay in
step. docs/python.md, "Signals in your kernels", has the protocol and a Triton example."""
from __future__ import annotations

from typing import Optional

from ._braid import Communicator
from ._braid import SignalPad as _NativePad
from ._error import argument_error
from ._state import communicator
from ._torch import torch as import_torch


class SignalPad:
    """Collective (every rank, the same channels): a pad of `channels` channels on the communicator (default: the
    default one). For Triton kernels: counters() and expected() ([channels, world] int64 on this GPU, slot
    [c, q] about peer q) and peers() ([world] int64: every rank's counters' address as mapped here). For CUDA
    kernels: struct (the braid::device::SignalPad, by value) or device_struct (its address), used with
    braid/device/sync_device.hpp's signal, wait and barrier, which record timeouts check() raises."""

    def __init__(self, channels: int = 1, comm: Optional[Communicator] = None) -> None:
        function = "braid.SignalPad"
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise argument_error(function, "channels", f"is {channels!r}; it must be an int >= 1")
        self.native = _NativePad(communicator(comm, function), channels)
        self.rank, self.world, self.channels = self.native.rank, self.native.world, self.native.channels
        self.timeout_ns, self.device = self.native.timeout_ns, self.native.device
        self.struct, self.device_struct = self.native.struct, self.native.device_struct

    def _tensor(self, array, rows: Optional[int]):
        tensor = import_torch("braid.SignalPad").from_dlpack(array)
        return tensor.view(rows, self.world) if rows is not None else tensor

    def counters(self):
        """This rank's counters, [channels, world] int64: [c, q] counts the signals q sent here on channel c."""
        return self._tensor(self.native.counters_array(), self.channels)

    def expected(self):
        """This rank's expected counts, [channels, world] int64: [c, q] is the count its last wait on (c, q)
        waited for; a wait adds 1 and spins until counters()[c, q] reaches it (after a wait that gave up, above
        the counter)."""
        return self._tensor(self.native.expected_array(), self.channels)

    def peers(self):
        """[world] int64 on this GPU: rank q's counters as mapped here; signal q on channel c by a release add of 1
        at peers()[q] + 8 * (c * world + rank)."""
        return self._tensor(self.native.peers_array(), None)

    def check(self) -> None:
        """Raises braid.Error for a failure sync_device.hpp's waits recorded in this pad: a timeout (TIMEOUT) or a
        barrier's plan mismatch (MISMATCH), both recorded for good, or a data error a kernel recorded (raised
        once)."""
        self.native.check()

    def __repr__(self) -> str:
        return f"braid.SignalPad(rank={self.rank}, world={self.world}, channels={self.channels})"
