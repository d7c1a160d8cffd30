"""braid.all_to_all_v_device without a GPU: its argument errors, named, before anything is enqueued (split sizes
and offsets as int64 CUDA tensors of one entry per rank, rows of the same shape and dtype). A stand-in
communicator serves: the checks read only its size and device. Tests that need torch skip without it."""
import types

import pytest

import braid
from braid import Error, ErrorCode

W = 2


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed: all_to_all_v_device's checks need tensors")


@pytest.fixture
def comm():
    return types.SimpleNamespace(size=W, rank=0, device=0)


def refused(torch, comm, message, *args, **kwargs):
    with pytest.raises(Error, match=message) as caught:
        braid.all_to_all_v_device(*args, comm=comm, **kwargs)
    assert str(caught.value).startswith("braid.all_to_all_v_device: ")
    return caught.value


def test_split_sizes_must_be_int64_tensors_of_one_per_rank(torch, comm):
    x = torch.empty(4, 3, device="meta")
    counts = torch.empty(W, dtype=torch.int64, device="meta")
    error = refused(torch, comm, "argument 'input_split_sizes' is a list; .*braid.all_to_all_single", x, x, [2, 2])
    assert error.code is ErrorCode.INVALID_ARGUMENT
    refused(torch, comm, "argument 'input_split_sizes' is None", x, x, None)
    refused(torch, comm, "argument 'input_split_sizes' is a torch.int32 tensor of shape \\(2,\\); it must be int64",
            x, x, counts.int())
    refused(torch, comm, "argument 'input_split_sizes' is a torch.int64 tensor of shape \\(3,\\)", x, x,
            torch.empty(3, dtype=torch.int64, device="meta"))
    refused(torch, comm, "argument 'input_offsets' is a torch.float32", x, x, counts, input_offsets=counts.float())
    refused(torch, comm, "argument 'output_split_sizes' is a torch.int64 tensor of shape \\(2, 1\\)", x, x, counts,
            counts[:, None])
    refused(torch, comm, "argument 'output_offsets' is a tuple", x, x, counts, output_offsets=(0, 2))
    refused(torch, comm, "argument 'input_split_sizes' is on cpu; braid needs a CUDA tensor", x, x,
            torch.zeros(W, dtype=torch.int64))


def test_rows_must_match(torch, comm, monkeypatch):
    # Split sizes that pass their own checks (on "the GPU"): the tensors' checks come next.
    monkeypatch.setattr(braid._collectives, "buffer", lambda torch, t, c, f, a: None)
    counts = torch.empty(W, dtype=torch.int64, device="meta")
    x = torch.empty(4, 3, device="meta")
    refused(torch, comm, "argument 'output' has dtype torch.float16; it must match torch.float32", x.half(), x, counts)
    refused(torch, comm, "argument 'output' has rows of shape \\(4,\\); input's are \\(3,\\)",
            torch.empty(4, 4, device="meta"), x, counts)
    refused(torch, comm, "argument 'input' is a scalar", x, torch.empty((), device="meta"), counts)
    refused(torch, comm, "argument 'output' must be a torch.Tensor, got list", [], x, counts)
    # The written arrays overlap none of the others, by their bytes (host tensors here: meta ones have no address).
    host, more, rows = (torch.zeros(W, dtype=torch.int64) for _ in range(3))
    y = torch.empty(4, 3)
    refused(torch, comm, "argument 'output_split_sizes' overlaps input_split_sizes", y, y, host, host)
    refused(torch, comm, "argument 'output_split_sizes' overlaps input_split_sizes", y, y, host, host[:])
    refused(torch, comm, "argument 'output_offsets' overlaps output_split_sizes", y, y, host, more,
            output_offsets=more.view(W))
    refused(torch, comm, "argument 'output_offsets' overlaps input_offsets", y, y, host, more, input_offsets=rows,
            output_offsets=rows)
    # Rows of no elements: the split sizes count rows, which carry nothing.
    refused(torch, comm, "argument 'input' has rows of shape \\(0,\\), no elements each", torch.empty(4, 0),
            torch.empty(4, 0), host, more)


def test_host_tensor_rows_named(torch, comm):
    counts = torch.zeros(W, dtype=torch.int64)
    with pytest.raises(Error, match="argument 'input_split_sizes' is on cpu"):
        braid.all_to_all_v_device(torch.empty(4), torch.empty(4), counts, comm=comm)


def test_all_to_all_single_points_at_the_device_form(torch, comm):
    with pytest.raises(Error, match="braid.all_to_all_v_device") as caught:
        braid._collectives.split_counts(torch.zeros(W, dtype=torch.int64), torch.empty(4), W,
                                        "braid.all_to_all_single", "input_split_sizes", "input")
    assert caught.value.code is ErrorCode.UNSUPPORTED


def test_without_communicator(torch):
    with pytest.raises(Error, match="braid.all_to_all_v_device: no communicator"):
        braid.all_to_all_v_device(torch.empty(1), torch.empty(1), torch.zeros(W, dtype=torch.int64))
