"""braid.SignalPad without a GPU: its argument checks, and the packed struct's size (braid::device::SignalPad:
five pointers, three ints, a 64-bit timeout and the optional `stopped` pointer, null in these pads). The pad
itself is made and used on GPUs (tests/gpu/worker.py, section signal_pad)."""
import pytest

import braid
from braid import Error, ErrorCode


def test_channels_are_checked_first():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(Error, match="braid.SignalPad: argument 'channels'") as caught:
            braid.SignalPad(bad)
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_needs_a_communicator():
    with pytest.raises(Error, match="braid.SignalPad: no communicator"):
        braid.SignalPad(2)


def test_struct_size():
    assert braid._braid.SIGNAL_PAD_STRUCT_BYTES == 5 * 8 + 3 * 4 + 4 + 8 + 8  # the ints padded to the timeout's 8
