"""The tensor collectives' and point-to-point calls' own argument checks without a GPU: the list forms' tensors,
all_to_all_single's whole rows, ranks as ints within the world, torch.distributed's ReduceOp objects, and
braid.empty's size and dtype, each refused naming the argument before anything is enqueued. A stand-in
communicator (no calls: reaching one fails the test) and a buffer() that accepts host tensors serve."""
import types

import pytest

import braid
from braid import Error, ErrorCode

W = 2


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed: the checks need tensors")


@pytest.fixture
def comm(monkeypatch, torch):
    """A communicator of W ranks on GPU 0 that takes no call; buffer() accepts any tensor."""
    from braid import _collectives, _p2p, _tensors

    def buffer(torch, tensor, comm, function, argument):
        if not isinstance(tensor, torch.Tensor):
            raise braid._error.argument_error(function, argument, "must be a torch.Tensor")
        return _tensors.Buffer(1, tensor.numel(), braid.datatype(tensor.dtype))

    for module in (_collectives, _p2p):
        monkeypatch.setattr(module, "buffer", buffer)
        monkeypatch.setattr(module, "current_stream", lambda torch, device: 0)
    return types.SimpleNamespace(size=W, rank=0, device=0)


def refused(message, call):
    with pytest.raises(Error, match=message) as caught:
        call()
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    return caught.value


def test_list_forms_check_every_tensor_first(torch, comm):
    x = torch.empty(4)
    refused("braid.all_gather: argument 'tensor_list\\[1\\]' is a torch.float16 tensor of shape \\(4,\\); it must "
            "match torch.float32", lambda: braid.all_gather([torch.empty(4), torch.empty(4).half()], x, comm=comm))
    refused("argument 'tensor_list\\[0\\]' is a torch.float32 tensor of shape \\(2, 2\\)",
            lambda: braid.all_gather([torch.empty(2, 2), torch.empty(4)], x, comm=comm))
    refused("argument 'tensor_list\\[1\\]' must be a torch.Tensor", lambda: braid.all_gather([x, 3], x, comm=comm))
    refused("argument 'tensor_list\\[0\\]' is on cpu; the communicator's GPU is cuda:0",
            lambda: braid.all_gather([torch.empty(4), torch.empty(4)], x, comm=comm))
    refused("argument 'tensor_list' has 1 tensors; it needs 2", lambda: braid.all_gather([x], x, comm=comm))
    refused("argument 'tensor' must be a torch.Tensor", lambda: braid.all_gather([x, x], [1, 2], comm=comm))
    refused("braid.reduce_scatter: argument 'input_list\\[1\\]' is a torch.float32 tensor of shape \\(5,\\)",
            lambda: braid.reduce_scatter(x, [torch.empty(4), torch.empty(5)], comm=comm))
    refused("argument 'input_list\\[0\\]' is a torch.bfloat16 tensor",
            lambda: braid.reduce_scatter(x, [torch.empty(4).bfloat16(), torch.empty(4)], comm=comm))
    refused("argument 'input_list' is a Tensor", lambda: braid.reduce_scatter(x, torch.empty(2, 4), comm=comm))


def test_all_to_all_single_takes_whole_rows(torch, comm):
    refused("braid.all_to_all_single: argument 'input' has shape \\(3, 2\\); without split sizes its dim 0 must "
            "split evenly over the 2 ranks", lambda: braid.all_to_all_single(torch.empty(6), torch.empty(3, 2),
                                                                              comm=comm))
    refused("argument 'output' has shape \\(3, 2\\)",
            lambda: braid.all_to_all_single(torch.empty(3, 2), torch.empty(6), comm=comm))
    refused("argument 'input' has shape \\(\\)", lambda: braid.all_to_all_single(torch.empty(()), torch.empty(()),
                                                                               comm=comm))
    refused("argument 'output' has 8 elements and input 6",
            lambda: braid.all_to_all_single(torch.empty(8), torch.empty(6), comm=comm))
    refused("argument 'input_split_sizes' is True; it must be an int",
            lambda: braid.all_to_all_single(torch.empty(2), torch.empty(2), [1, 1], [True, True], comm=comm))


def test_ranks_are_ints_in_the_world(torch, comm):
    x = torch.empty(4)
    refused("braid.reduce: argument 'dst' is True; it must be an int", lambda: braid.reduce(x, True, comm=comm))
    refused("braid.reduce: argument 'dst' is 0.0; it must be an int", lambda: braid.reduce(x, 0.0, comm=comm))
    refused("braid.broadcast: argument 'src' is 2; it must be a rank in \\[0, 2\\)",
            lambda: braid.broadcast(x, 2, comm=comm))
    refused("braid.send: argument 'dst' is 1.9; it must be an int", lambda: braid.send(x, 1.9, comm=comm))
    refused("braid.recv: argument 'src' is -1; it must be a rank", lambda: braid.recv(x, -1, comm=comm))
    refused("braid.batch_isend_irecv: argument 'p2p_op_list\\[0\\].peer' is True",
            lambda: braid.batch_isend_irecv([braid.P2POp(braid.send, x, True)], comm=comm))


def test_reduce_op_objects_of_torch_distributed(torch):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    assert braid.reduce_op(dist.ReduceOp(dist.ReduceOp.MAX)) == braid.ReduceOp.MAX
    assert braid.reduce_op(dist.ReduceOp.AVG) == braid.ReduceOp.AVG
    assert braid._dtypes.reduce_op_name(dist.ReduceOp(dist.ReduceOp.MIN)) == "min"
    refused("argument 'op' is .*which braid does not reduce with", lambda: braid.reduce_op(dist.ReduceOp.BAND))


def test_empty_checks_size_and_dtype_before_allocating(torch, monkeypatch):
    def no_alloc(*args, **kwargs):
        raise AssertionError("allocated")

    stand_in = types.SimpleNamespace(size=W, rank=0, device=0, alloc=no_alloc)
    refused("braid.empty: argument 'size' is \\(2.7,\\)", lambda: braid.empty(2.7, comm=stand_in))
    refused("braid.empty: argument 'size' is \\(True,\\)", lambda: braid.empty(True, comm=stand_in))
    refused("braid.empty: argument 'dtype' is complex64", lambda: braid.empty(4, dtype="complex64", comm=stand_in))
    with pytest.raises(AssertionError, match="allocated"):  # a name or a DataType gets as far as the allocation
        braid.empty(4, dtype="float32", comm=stand_in)
    with pytest.raises(AssertionError, match="allocated"):
        braid.empty(4, dtype=braid.DataType.BFLOAT16, comm=stand_in)


def test_peer_rank_is_an_int_in_the_world(torch):
    memory = types.SimpleNamespace(world_size=W)  # the rank is checked before the memory is read
    refused("braid.peer: argument 'rank' is True; it must be an int", lambda: braid.peer(memory, True, (4,),
                                                                                         torch.float32))
    refused("braid.peer: argument 'rank' is 2; it must be a rank in \\[0, 2\\)",
            lambda: braid.peer(memory, 2, (4,), torch.float32))
    refused("braid.peer: argument 'rank' is 1.0", lambda: braid.peer(memory, 1.0, (4,), torch.float32))
