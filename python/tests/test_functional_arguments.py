"""braid.functional's argument checks without a GPU: each refused as braid.Error naming the functional's own
argument, the same in the custom ops' fake implementations (what torch.compile runs) as in the functions, on meta
tensors and a stand-in communicator (the checks read only its size). Tests that need torch skip without it."""

import pytest

import braid
from braid import Error, ErrorCode

from helpers import stand_in_op_handle

W = 2


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed: the checks need tensors")


@pytest.fixture
def comm():
    with stand_in_op_handle(W) as handle:
        yield handle


def refused(message, call):
    with pytest.raises(Error, match=message) as caught:
        call()
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    return caught.value


def meta(torch, *shape, dtype=None):
    return torch.empty(shape, dtype=dtype or torch.float32, device="meta")


def test_host_tensors_are_refused_before_the_ops(torch, comm):
    """The ops have no CPU kernel: the functions name a host tensor instead of torch's NotImplementedError."""
    F, x, splits = braid.functional, torch.ones(4, 2), torch.zeros(W, dtype=torch.int64)
    for call, message in [
        (lambda: F.all_reduce(x, comm=comm), "all_reduce: argument 'tensor' is on cpu; braid needs a CUDA tensor"),
        (lambda: F.all_reduce_(x, comm=comm), "all_reduce_: argument 'tensor' is on cpu"),
        (lambda: F.all_gather_into_tensor(x, comm=comm), "all_gather_into_tensor: argument 'tensor' is on cpu"),
        (lambda: F.reduce_scatter_tensor(x, comm=comm), "reduce_scatter_tensor: argument 'tensor' is on cpu"),
        (lambda: F.reduce(x, 0, comm=comm), "reduce: argument 'tensor' is on cpu"),
        (lambda: F.broadcast(x, 0, comm=comm), "broadcast: argument 'tensor' is on cpu"),
        (lambda: F.all_to_all_single(x, comm=comm), "all_to_all_single: argument 'tensor' is on cpu"),
        (lambda: F.all_to_all_v_device(x, splits, 4, comm=comm), "all_to_all_v_device: argument 'tensor' is on cpu"),
        (lambda: F.all_to_all_v_device(meta(torch, 4, 2), splits, 4, comm=comm), "argument 'input_split_sizes' is "
                                                                                  "on cpu"),
        (lambda: F.send_recv([meta(torch, 2), x], [1, 1], comm=comm), "send_recv: argument 'sends\\[1\\]' is on cpu"),
        (lambda: F.send_recv(recv_like=[x], recv_peers=[1], comm=comm), "argument 'recv_like\\[0\\]' is on cpu"),
        (lambda: F.send(x, 1, comm=comm), "braid.functional.send: argument 'tensor' is on cpu"),
        (lambda: F.recv(x, 1, comm=comm), "braid.functional.recv: argument 'like' is on cpu"),
        (lambda: F.all_reduce([1.0], comm=comm), "argument 'tensor' must be a torch.Tensor, got list"),
    ]:
        error = refused(message, call)
        assert str(error).startswith("braid.functional.")


def test_tensors_must_be_contiguous(torch, comm):
    F, x = braid.functional, meta(torch, 4, 6).t()
    message = "argument '{}' must be contiguous"
    refused("all_reduce: " + message.format("tensor"), lambda: F.all_reduce(x, comm=comm))
    refused("reduce: " + message.format("tensor"), lambda: F.reduce(x, 0, comm=comm))
    refused("all_to_all_single: " + message.format("tensor"), lambda: F.all_to_all_single(x, comm=comm))
    refused("all_to_all_v_device: " + message.format("tensor"),
            lambda: F.all_to_all_v_device(x, meta(torch, W, dtype=torch.int64), 4, comm=comm))
    refused("send_recv: " + message.format("sends\\[0\\]"), lambda: F.send_recv([x], [1], comm=comm))
    refused("braid.functional.send: " + message.format("tensor"), lambda: F.send(x, 1, comm=comm))
    ops = braid.register_ops()  # the fake implementations check too
    refused("all_reduce: " + message.format("tensor"), lambda: ops.all_reduce(x, "sum", comm))
    refused("send_recv: " + message.format("sends\\[0\\]"), lambda: ops.send_recv([x], [1], [], [], comm))


def test_empty_batch_is_a_no_op(torch, comm):
    assert braid.functional.send_recv(comm=comm) == []
    assert braid.functional.send_recv([], [], [], [], comm=comm) == []
    refused("send_recv: argument 'send_peers' must have one peer per tensor",
            lambda: braid.functional.send_recv([], [1], comm=comm))


def test_arguments_named_as_the_functions_name_them(torch, comm):
    F, x = braid.functional, meta(torch, 4, 2)
    refused("send_recv: argument 'send_peers\\[1\\]' is 2; it must be a rank in \\[0, 2\\)",
            lambda: F.send_recv([x, x], [1, 2], comm=comm))
    refused("send_recv: argument 'recv_peers\\[0\\]' is -1", lambda: F.send_recv(recv_like=[x], recv_peers=[-1],
                                                                                comm=comm))
    refused("send_recv: argument 'send_peers\\[0\\]' is True; it must be an int",
            lambda: F.send_recv([x], [True], comm=comm))
    refused("braid.functional.send: argument 'dst' is 1.0; it must be an int", lambda: F.send(x, 1.0, comm=comm))
    refused("braid.functional.recv: argument 'src' is True", lambda: F.recv(x, True, comm=comm))
    refused("send_recv: argument 'send_peers\\[0\\]' is 2; it must be a rank", lambda: F.send(x, 2, comm=comm))
    refused("broadcast: argument 'src' is 2; it must be a rank in \\[0, 2\\)", lambda: F.broadcast(x, 2, comm=comm))
    refused("reduce: argument 'dst' is -1; it must be a rank", lambda: F.reduce(x, -1, comm=comm))
    refused("all_reduce: argument 'tensor.dtype' is torch.complex64",
            lambda: F.all_reduce(meta(torch, 4, dtype=torch.complex64), comm=comm))
    refused("reduce_scatter_tensor: argument 'tensor' has shape \\(3, 2\\); dim 0 must divide",
            lambda: F.reduce_scatter_tensor(x[:3], comm=comm))
    refused("all_to_all_v_device: argument 'output_rows' is 2.7; it must be an int",
            lambda: F.all_to_all_v_device(x, meta(torch, W, dtype=torch.int64), 2.7, comm=comm))
    refused("all_to_all_v_device: argument 'output_rows' is True",
            lambda: F.all_to_all_v_device(x, meta(torch, W, dtype=torch.int64), True, comm=comm))


def test_all_to_all_single_splits(torch, comm):
    F, x = braid.functional, meta(torch, 4, 2)
    assert F.all_to_all_single(x, [3, 0], [1, 3], comm=comm).shape == (3, 2)
    assert F.all_to_all_single(x, None, [1, 3], comm=comm).shape == (4, 2)
    refused("argument 'output_split_sizes' is \\[-1, 2\\]; it needs 2 sizes \\(one per rank\\), none negative",
            lambda: F.all_to_all_single(x, [-1, 2], comm=comm))
    refused("argument 'input_split_sizes' is \\[5, -1\\]; it needs 2 sizes \\(one per rank\\), none negative, "
            "summing to tensor's 4 rows", lambda: F.all_to_all_single(x, None, [5, -1], comm=comm))
    refused("argument 'input_split_sizes' is \\[1, 1\\]", lambda: F.all_to_all_single(x, None, [1, 1], comm=comm))
    refused("argument 'tensor' is a scalar; it needs rows", lambda: F.all_to_all_single(meta(torch), comm=comm))
    refused("argument 'tensor' has 3 rows \\(dim 0\\); without input_split_sizes they must split evenly",
            lambda: F.all_to_all_single(x[:3], comm=comm))
    refused("argument 'tensor' has 3 rows \\(dim 0\\); without output_split_sizes they must split evenly",
            lambda: F.all_to_all_single(x[:3], None, [1, 2], comm=comm))


def test_fake_implementations_check_as_the_real_ones(torch, comm):
    """Called directly, as torch.compile records them, the ops refuse what their real implementations do."""
    ops, x = braid.register_ops(), meta(torch, 4, 2)
    refused("all_reduce: argument 'op' is 'band', which braid does not reduce with",
            lambda: ops.all_reduce(x, "band", comm))
    refused("all_reduce_: argument 'op' is 'bor'", lambda: ops.all_reduce_(x, "bor", comm))
    refused("reduce: argument 'op' is 'premul_sum'", lambda: ops.reduce(x, 0, "premul_sum", comm))
    refused("reduce_scatter_tensor: argument 'op' is 'bxor'", lambda: ops.reduce_scatter_tensor(x, "bxor", comm))
    refused("broadcast: argument 'src' is 5; it must be a rank in \\[0, 2\\)", lambda: ops.broadcast(x, 5, comm))
    refused("reduce: argument 'dst' is 2", lambda: ops.reduce(x, 2, "sum", comm))
    refused("all_to_all_single: argument 'tensor' has 3 rows", lambda: ops.all_to_all_single(x[:3], None, None, comm))
    refused("all_to_all_single: argument 'tensor' is a scalar", lambda: ops.all_to_all_single(meta(torch), None,
                                                                                               None, comm))
    refused("send_recv: argument 'recv_peers\\[0\\]' is 3", lambda: ops.send_recv([], [], [x], [3], comm))
    splits = meta(torch, W, dtype=torch.int64)
    refused("all_to_all_v_device: argument 'input_split_sizes' is a torch.int32 tensor",
            lambda: ops.all_to_all_v_device(x, splits.int(), None, 4, comm))
    refused("all_to_all_v_device: argument 'input_offsets' is a torch.int64 tensor of shape \\(3,\\)",
            lambda: ops.all_to_all_v_device(x, splits, meta(torch, 3, dtype=torch.int64), 4, comm))
    refused("all_to_all_v_device: argument 'tensor' has rows of shape \\(0,\\), no elements each",
            lambda: ops.all_to_all_v_device(meta(torch, 4, 0), splits, None, 4, comm))
    refused("all_to_all_v_device: argument 'tensor' is a scalar",
            lambda: ops.all_to_all_v_device(meta(torch), splits, None, 4, comm))


def test_functions_trace_without_graph_breaks(torch, comm):
    """The checks in front of the ops trace under torch.compile's front end."""
    def step(x, splits):
        y = braid.functional.all_reduce(x, comm=comm)
        z = braid.functional.broadcast(y, 1, comm=comm)
        out, _, _ = braid.functional.all_to_all_v_device(z, splits, 8, comm=comm)
        (back,) = braid.functional.send_recv([out], [1], [out], [1], comm=comm)
        return braid.functional.all_to_all_single(back, [4, 4], [4, 4], comm=comm)

    explained = torch._dynamo.explain(step)(meta(torch, 8, 2), meta(torch, W, dtype=torch.int64))
    assert explained.graph_break_count == 0, explained.break_reasons
