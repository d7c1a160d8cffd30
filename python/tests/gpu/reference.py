"""The reference the GPU tests hold braid's results against: torch.distributed's collectives. With a GPU per rank
they are NCCL's own; with ranks sharing a GPU (BRAID_ALLOW_SHARED_GPU=1, which NCCL refuses) the process group is
gloo's and every reference result is computed on the host from all ranks' inputs, gathered as objects: reductions
in float64 (int64 for integers) and rounded once to the tensor's dtype, so the host result is at least as exact as
NCCL's."""
import torch
import torch.distributed as dist


def shares_gpus(world: int) -> bool:
    """True where the ranks cannot each have a GPU of their own."""
    return torch.cuda.device_count() < world


def init_process_group(device: int, world: int) -> None:
    if shares_gpus(world):
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("nccl", device_id=torch.device("cuda", device))


def _everyone(value):
    """Every rank's `value` (tensors moved to the host), in rank order."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, value.detach().cpu() if isinstance(value, torch.Tensor) else value)
    return parts


def _reduce(parts, op):
    dtype = parts[0].dtype
    wide = torch.stack([p.to(torch.float64 if dtype.is_floating_point else torch.int64) for p in parts])
    if op == dist.ReduceOp.SUM:
        result = wide.sum(0)
    elif op == dist.ReduceOp.AVG:
        result = wide.sum(0) / len(parts)
    elif op == dist.ReduceOp.MAX:
        result = wide.amax(0)
    elif op == dist.ReduceOp.MIN:
        result = wide.amin(0)
    elif op == dist.ReduceOp.PRODUCT:
        result = wide.prod(0)
    else:
        raise ValueError(f"the host reference has no reduction {op}")
    return result.to(dtype)


class HostReference:
    """torch.distributed's calls the tests use, computed on the host from every rank's inputs."""

    @staticmethod
    def all_reduce(tensor, op=dist.ReduceOp.SUM):
        tensor.copy_(_reduce(_everyone(tensor), op))

    @staticmethod
    def reduce(tensor, dst, op=dist.ReduceOp.SUM):
        result = _reduce(_everyone(tensor), op)
        if dist.get_rank() == dst:
            tensor.copy_(result)

    @staticmethod
    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM):
        reduced = _reduce(_everyone(input), op)
        output.copy_(reduced.chunk(dist.get_world_size())[dist.get_rank()].view_as(output))

    @staticmethod
    def broadcast(tensor, src):
        tensor.copy_(_everyone(tensor)[src])

    @staticmethod
    def all_gather_into_tensor(output, input):
        output.copy_(torch.cat([p.reshape(-1) for p in _everyone(input)]).view_as(output))

    @staticmethod
    def all_gather(outputs, input):
        for out, part in zip(outputs, _everyone(input)):
            out.copy_(part)

    @staticmethod
    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None):
        world, rank = dist.get_world_size(), dist.get_rank()
        mine = (input.detach().cpu(), None if input_split_sizes is None else list(input_split_sizes))
        blocks = []
        for inp, sizes in _everyone(mine):
            blocks.append(inp.split(sizes or [inp.shape[0] // world] * world)[rank])
        output.copy_(torch.cat(blocks).view_as(output))

    @staticmethod
    def batch_isend_irecv(ops):
        """Each receive from q takes q's sends to this rank in the order q listed them."""
        rank = dist.get_rank()
        everyone = _everyone([(op.peer, op.tensor.detach().cpu()) for op in ops if op.op.__name__ == "isend"])
        incoming = {}  # source -> its sends to this rank, not yet received
        for op in ops:
            if op.op.__name__ == "irecv":
                if op.peer not in incoming:
                    incoming[op.peer] = iter([t for dst, t in everyone[op.peer] if dst == rank])
                op.tensor.copy_(next(incoming[op.peer]))
        return []  # done already: nothing to wait for


def reference_calls(world: int):
    """The calls to hold braid against: torch.distributed itself (NCCL), or their host forms on shared GPUs."""
    return HostReference if shares_gpus(world) else dist
