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


class _Done:
    def wait(self):
        return True


def _everyone(tensor):
    """Every rank's copy of `tensor` (on the host), in rank order."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, tensor.detach().cpu())
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
        inputs = _everyone(input)
        splits = [None] * world
        dist.all_gather_object(splits, None if input_split_sizes is None else list(input_split_sizes))
        blocks = []
        for q in range(world):
            sizes = splits[q] or [inputs[q].shape[0] // world] * world
            blocks.append(inputs[q].split(sizes)[rank])
        output.copy_(torch.cat(blocks).view_as(output))

    @staticmethod
    def batch_isend_irecv(ops):
        """Each receive from q takes q's sends to this rank in the order q listed them."""
        rank = dist.get_rank()
        sends = [(op.peer, op.tensor.detach().cpu()) for op in ops if op.op.__name__ == "isend"]
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, sends)
        taken = {}
        for op in ops:
            if op.op.__name__ == "irecv":
                from_peer = [t for dst, t in everyone[op.peer] if dst == rank]
                index = taken.get(op.peer, 0)
                taken[op.peer] = index + 1
                op.tensor.copy_(from_peer[index])
        return [_Done()]


def reference_calls(world: int):
    """The calls to hold braid against: torch.distributed itself (NCCL), or their host forms on shared GPUs."""
    return HostReference if shares_gpus(world) else dist
