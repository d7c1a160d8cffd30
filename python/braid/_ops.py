"""braid's calls as torch.library custom ops (namespace `braid`), with fake implementations, so that they capture in
torch.cuda.graph and trace under torch.compile without graph breaks. Registered by `import braid` and braid.init()
where torch is imported already, else on first use (register_ops(), a braid.MoeBuffer, a call of braid.functional);
braid never imports torch by itself, so torch stays optional. Registered before the first traced call, a function
that calls braid.functional compiles with fullgraph=True even as the process's first braid call.

Custom ops take no Python objects, so a communicator or a MoeBuffer crosses as an int handle (_handles.py; 0 is
the default communicator as it is when the op runs). The collectives are functional, as torch's _c10d_functional
ops are: they return a new tensor (all_reduce_ is the in-place form, a mutating op). Every op runs on
torch.cuda.current_stream() and is marked side-effectful, so a collective whose result goes unused is never
removed from a graph (the peers would wait for it)."""
# No `from __future__ import annotations`: custom_op reads the ops' annotations as types.

import math
from typing import Optional

from ._dtypes import reduce_op
from ._error import argument_error, rank_argument
from ._handles import comm_of, native_handle, resolve
from ._torch import current_stream, torch as import_torch

_registered = False


def register_ops():
    """Registers braid's custom ops (once) and returns torch.ops.braid."""
    global _registered
    torch = import_torch("braid.register_ops")
    if _registered:
        return torch.ops.braid
    _register(torch)
    _registered = True
    return torch.ops.braid


def check_pairs(function: str, sends, send_peers, recv_like, recv_peers) -> None:
    """send_recv's lists: one peer per tensor."""
    if len(sends) != len(send_peers) or len(recv_like) != len(recv_peers):
        raise argument_error(function, "send_peers" if len(sends) != len(send_peers) else "recv_peers",
                             "must have one peer per tensor")


def _side_effect(torch, op) -> None:
    try:
        from torch.fx.node import has_side_effect
        has_side_effect(op._opoverload)
    except (ImportError, AttributeError):  # older torch: ops that return a tensor may be removed when unused
        pass


def _register(torch) -> None:
    from torch import Tensor
    from torch.library import custom_op

    from ._tensors import buffer, tensor_argument

    def stream(c):
        return current_stream(torch, c.device)

    # Collectives --------------------------------------------------------------------------------------------
    # Each op's argument checks run in its real and its fake implementation alike, so that under torch.compile an
    # op refuses what it refuses eagerly; the real one then checks what only the communicator knows (its GPU).
    def world(comm: int, function: str) -> int:
        return comm_of(comm, function).size

    def checked(function: str, tensor, op=None):  # a collective's tensor, and its op as braid's ReduceOp
        tensor_argument(torch, tensor, function, "tensor", meta=True)
        return None if op is None else reduce_op(op, function)

    def placed(c, function: str, *named) -> None:  # (name, tensor or None): each on the communicator's GPU
        for name, tensor in named:
            if tensor is not None:
                buffer(torch, tensor, c, function, name)

    @custom_op("braid::all_reduce", mutates_args=(), device_types="cuda")
    def all_reduce(tensor: Tensor, op: str, comm: int) -> Tensor:
        function = "braid.functional.all_reduce"
        redop = checked(function, tensor, op)
        c = comm_of(comm, function)
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        t, o = buffer(torch, tensor, c, function, "tensor"), buffer(torch, out, c, function, "out")
        c.all_reduce(t.pointer, o.pointer, t.count, t.dtype, redop, stream(c))
        return out

    @all_reduce.register_fake
    def _(tensor, op, comm):
        checked("braid.functional.all_reduce", tensor, op)
        return torch.empty_like(tensor, memory_format=torch.contiguous_format)

    @custom_op("braid::all_reduce_", mutates_args=("tensor",), device_types="cuda")
    def all_reduce_(tensor: Tensor, op: str, comm: int) -> None:
        function = "braid.functional.all_reduce_"
        redop = checked(function, tensor, op)
        c = comm_of(comm, function)
        t = buffer(torch, tensor, c, function, "tensor")
        c.all_reduce(t.pointer, t.pointer, t.count, t.dtype, redop, stream(c))

    @all_reduce_.register_fake
    def _(tensor, op, comm):
        checked("braid.functional.all_reduce_", tensor, op)

    def gathered(tensor, comm: int):  # the output, after the checks
        function = "braid.functional.all_gather_into_tensor"
        checked(function, tensor)
        w = world(comm, function)
        return tensor.new_empty((w * tensor.shape[0], *tensor.shape[1:]) if tensor.dim() else (w,))

    @custom_op("braid::all_gather_into_tensor", mutates_args=(), device_types="cuda")
    def all_gather_into_tensor(tensor: Tensor, comm: int) -> Tensor:
        function = "braid.functional.all_gather_into_tensor"
        out = gathered(tensor, comm)
        c = comm_of(comm, function)
        t, o = buffer(torch, tensor, c, function, "tensor"), buffer(torch, out, c, function, "out")
        c.all_gather(t.pointer, o.pointer, t.count, t.dtype, stream(c))
        return out

    @all_gather_into_tensor.register_fake
    def _(tensor, comm):
        return gathered(tensor, comm)

    def scattered(tensor, op: str, comm: int):  # (the output, braid's ReduceOp), after the checks
        function = "braid.functional.reduce_scatter_tensor"
        redop = checked(function, tensor, op)
        w = world(comm, function)
        if tensor.dim() == 0 or tensor.shape[0] % w:
            raise argument_error(function, "tensor", f"has shape {tuple(tensor.shape)}; dim 0 must divide by the "
                                 f"world size ({w})")
        return tensor.new_empty((tensor.shape[0] // w, *tensor.shape[1:])), redop

    @custom_op("braid::reduce_scatter_tensor", mutates_args=(), device_types="cuda")
    def reduce_scatter_tensor(tensor: Tensor, op: str, comm: int) -> Tensor:
        function = "braid.functional.reduce_scatter_tensor"
        out, redop = scattered(tensor, op, comm)
        c = comm_of(comm, function)
        t, o = buffer(torch, tensor, c, function, "tensor"), buffer(torch, out, c, function, "out")
        c.reduce_scatter(t.pointer, o.pointer, o.count, t.dtype, redop, stream(c))
        return out

    @reduce_scatter_tensor.register_fake
    def _(tensor, op, comm):
        return scattered(tensor, op, comm)[0]

    def rooted(function: str, tensor, root: int, root_name: str, comm: int, op=None):  # reduce's, broadcast's
        redop = checked(function, tensor, op)
        rank_argument(root, world(comm, function), function, root_name)
        return redop

    # On rank dst the reduction over every rank; on the others a copy of tensor (nothing arrives there).
    @custom_op("braid::reduce", mutates_args=(), device_types="cuda")
    def reduce(tensor: Tensor, dst: int, op: str, comm: int) -> Tensor:
        from ._collectives import reduce as eager
        function = "braid.functional.reduce"
        rooted(function, tensor, dst, "dst", comm, op)
        c = comm_of(comm, function)
        placed(c, function, ("tensor", tensor))
        out = tensor.clone(memory_format=torch.contiguous_format)
        eager(out, dst, op, comm=c)
        return out

    @reduce.register_fake
    def _(tensor, dst, op, comm):
        rooted("braid.functional.reduce", tensor, dst, "dst", comm, op)
        return torch.empty_like(tensor, memory_format=torch.contiguous_format)

    # A batch of point-to-point transfers in flight together: `sends` go to `send_peers`, and a new tensor shaped
    # like each of `recv_like` receives from the matching entry of `recv_peers`; returns those.
    def received(sends, send_peers, recv_like, recv_peers, comm: int):  # the outputs, after the checks
        function = "braid.functional.send_recv"
        check_pairs(function, sends, send_peers, recv_like, recv_peers)
        w = world(comm, function)
        for name, peer_name, tensors, peers in (("sends", "send_peers", sends, send_peers),
                                                ("recv_like", "recv_peers", recv_like, recv_peers)):
            for index, (tensor, peer) in enumerate(zip(tensors, peers)):
                tensor_argument(torch, tensor, function, f"{name}[{index}]", meta=True)
                rank_argument(peer, w, function, f"{peer_name}[{index}]")
        return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in recv_like]

    @custom_op("braid::send_recv", mutates_args=(), device_types="cuda")
    def send_recv(sends: list[Tensor], send_peers: list[int], recv_like: list[Tensor], recv_peers: list[int],
                  comm: int) -> list[Tensor]:
        from ._p2p import P2POp, batch_isend_irecv, recv as recv_kind, send as send_kind
        function = "braid.functional.send_recv"
        outs = received(sends, send_peers, recv_like, recv_peers, comm)
        c = comm_of(comm, function)
        placed(c, function, *((f"sends[{i}]", t) for i, t in enumerate(sends)),
               *((f"recv_like[{i}]", t) for i, t in enumerate(outs)))  # each output is on its recv_like's GPU
        ops = [P2POp(send_kind, t, p) for t, p in zip(sends, send_peers)]
        ops += [P2POp(recv_kind, t, p) for t, p in zip(outs, recv_peers)]
        if ops:
            batch_isend_irecv(ops, c, function=function)
        return outs

    @send_recv.register_fake
    def _(sends, send_peers, recv_like, recv_peers, comm):
        return received(sends, send_peers, recv_like, recv_peers, comm)

    @custom_op("braid::broadcast", mutates_args=(), device_types="cuda")
    def broadcast(tensor: Tensor, src: int, comm: int) -> Tensor:
        function = "braid.functional.broadcast"
        rooted(function, tensor, src, "src", comm)
        c = comm_of(comm, function)
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        t, o = buffer(torch, tensor, c, function, "tensor"), buffer(torch, out, c, function, "out")
        c.broadcast(t.pointer if c.rank == src else 0, o.pointer, t.count, t.dtype, src, stream(c))
        return out

    @broadcast.register_fake
    def _(tensor, src, comm):
        rooted("braid.functional.broadcast", tensor, src, "src", comm)
        return torch.empty_like(tensor, memory_format=torch.contiguous_format)

    def with_rows(function: str, tensor) -> None:  # a tensor of rows (dim 0), each of some elements
        if tensor.dim() == 0:
            raise argument_error(function, "tensor", "is a scalar; it needs rows (dim 0)")

    # The output: the received rows (output_split_sizes), or as many as sent, in equal blocks.
    def exchanged(tensor, output_split_sizes, input_split_sizes, comm: int):  # the output, after the checks
        from ._collectives import split_counts
        function = "braid.functional.all_to_all_single"
        checked(function, tensor)
        with_rows(function, tensor)
        w = world(comm, function)
        split_counts(input_split_sizes, tensor, w, function, "input_split_sizes", "tensor")
        if output_split_sizes is None:  # the output has tensor's rows, which must then split evenly too
            split_counts(None, tensor, w, function, "output_split_sizes", "tensor")
            rows = tensor.shape[0]
        else:
            if len(output_split_sizes) != w or any(s < 0 for s in output_split_sizes):
                raise argument_error(function, "output_split_sizes", f"is {list(output_split_sizes)}; it needs {w} "
                                     "sizes (one per rank), none negative")
            rows = sum(output_split_sizes)
        return tensor.new_empty((rows, *tensor.shape[1:]))

    @custom_op("braid::all_to_all_single", mutates_args=(), device_types="cuda")
    def all_to_all_single(tensor: Tensor, output_split_sizes: Optional[list[int]],
                          input_split_sizes: Optional[list[int]], comm: int) -> Tensor:
        from ._collectives import all_to_all_single as eager
        function = "braid.functional.all_to_all_single"
        out = exchanged(tensor, output_split_sizes, input_split_sizes, comm)
        c = comm_of(comm, function)
        placed(c, function, ("tensor", tensor))
        eager(out, tensor, output_split_sizes, input_split_sizes, comm=c)
        return out

    @all_to_all_single.register_fake
    def _(tensor, output_split_sizes, input_split_sizes, comm):
        return exchanged(tensor, output_split_sizes, input_split_sizes, comm)

    # The split sizes on the GPU: the output has `output_rows` rows (what arrives, packed from row 0; the rows past
    # it are unspecified), and the received counts and their offsets come back as [world] int64 tensors.
    def device_exchanged(tensor, input_split_sizes, input_offsets, output_rows: int, comm: int):
        from ._collectives import device_counts
        function = "braid.functional.all_to_all_v_device"
        checked(function, tensor)
        with_rows(function, tensor)
        if math.prod(tensor.shape[1:]) == 0:
            raise argument_error(function, "tensor", f"has rows of shape {tuple(tensor.shape[1:])}, no elements each; "
                                 "the split sizes count rows")
        c = comm_of(comm, function)
        for name, counts, required in (("input_split_sizes", input_split_sizes, True),
                                       ("input_offsets", input_offsets, False)):
            if device_counts(torch, counts, c, function, name, required) is not None:
                tensor_argument(torch, counts, function, name, meta=True)
        if output_rows < 0:
            raise argument_error(function, "output_rows", f"is {output_rows}; it must be >= 0")
        counts = tensor.new_empty((c.size,), dtype=torch.int64)
        return tensor.new_empty((output_rows, *tensor.shape[1:])), counts, torch.empty_like(counts)

    @custom_op("braid::all_to_all_v_device", mutates_args=(), device_types="cuda")
    def all_to_all_v_device(tensor: Tensor, input_split_sizes: Tensor, input_offsets: Optional[Tensor],
                            output_rows: int, comm: int) -> tuple[Tensor, Tensor, Tensor]:
        from ._collectives import all_to_all_v_device as eager
        function = "braid.functional.all_to_all_v_device"
        out, counts, offsets = device_exchanged(tensor, input_split_sizes, input_offsets, output_rows, comm)
        c = comm_of(comm, function)
        placed(c, function, ("tensor", tensor), ("input_split_sizes", input_split_sizes),
               ("input_offsets", input_offsets))
        eager(out, tensor, input_split_sizes, counts, input_offsets=input_offsets, output_offsets=offsets, comm=c)
        return out, counts, offsets

    @all_to_all_v_device.register_fake
    def _(tensor, input_split_sizes, input_offsets, output_rows, comm):
        return device_exchanged(tensor, input_split_sizes, input_offsets, output_rows, comm)

    # MoE ----------------------------------------------------------------------------------------------------
    # A dispatch returns the views of the buffer's memory (the same tensors every call, as braid's dispatch
    # returns the same addresses), in the order MoeBuffer.output_fields() gives. `handle` is a MoeHandle's
    # dispatch number for braid to check (-1: none, the buffer's last routed dispatch).
    @custom_op("braid::moe_dispatch", mutates_args=(), device_types="cuda")
    def moe_dispatch(x: Tensor, x_scales: Optional[Tensor], topk_idx: Tensor, topk_weights: Tensor,
                     num_tokens_device: Optional[Tensor], num_tokens: int, buffer: int) -> list[Tensor]:
        moe = resolve(buffer, "braid.MoeBuffer.dispatch")
        got = moe._dispatch_eager(x, topk_idx, topk_weights, num_tokens_device if num_tokens_device is not None
                                  else (None if num_tokens < 0 else num_tokens), x_scales, False)
        return [getattr(got, name).detach() for name in moe.output_fields()]

    @moe_dispatch.register_fake
    def _(x, x_scales, topk_idx, topk_weights, num_tokens_device, num_tokens, buffer):
        return resolve(buffer, "braid.MoeBuffer.dispatch")._fake_outputs(x.device)

    @custom_op("braid::moe_redispatch", mutates_args=(), device_types="cuda")
    def moe_redispatch(x: Tensor, x_scales: Optional[Tensor], buffer: int, handle: int) -> list[Tensor]:
        moe = resolve(buffer, "braid.MoeBuffer.redispatch")
        got = moe._redispatch_eager(native_handle(handle), x, x_scales, False)
        return [getattr(got, name).detach() for name in moe.output_fields()]

    @moe_redispatch.register_fake
    def _(x, x_scales, buffer, handle):
        return resolve(buffer, "braid.MoeBuffer.redispatch")._fake_outputs(x.device)

    # Combine takes the routing of the dispatch it follows (expert-major: topk_idx, topk_weights and T) only for
    # its backward pass, which dispatches the output gradient again with that routing; None on rank-major buffers.
    @custom_op("braid::moe_combine", mutates_args=(), device_types="cuda")
    def moe_combine(y: Tensor, weighted: bool, rows: int, buffer: int, handle: int, topk_idx: Optional[Tensor],
                    topk_weights: Optional[Tensor], num_tokens_device: Optional[Tensor], num_tokens: int) -> Tensor:
        moe = resolve(buffer, "braid.MoeBuffer.combine")
        out = y.new_empty((rows, moe.hidden))
        moe._combine_eager(y, out, weighted, native_handle(handle), False)
        return out

    @moe_combine.register_fake
    def _(y, weighted, rows, buffer, handle, topk_idx, topk_weights, num_tokens_device, num_tokens):
        return y.new_empty((rows, resolve(buffer, "braid.MoeBuffer.combine").hidden))

    # A value per (source token, local expert) on every rank back to the tokens' ranks: values [world *
    # max_tokens, local_experts] float32 (row s * max_tokens + t: token t of rank s) in; out [max_tokens, experts]
    # float32: each of this rank's tokens' value from every expert (expert e on rank e // local_experts). One
    # equal-block all-to-all on the buffer's communicator; the routing weights' gradient goes back through it.
    @custom_op("braid::moe_to_sources", mutates_args=(), device_types="cuda")
    def moe_to_sources(values: Tensor, buffer: int) -> Tensor:
        from ._collectives import all_to_all_single as eager
        moe = resolve(buffer, "braid.MoeBuffer (routing weights' gradient)")
        W, M, L = moe.world_size, moe.max_tokens, moe.local_experts
        received = torch.empty((W * M, L), dtype=torch.float32, device=values.device)
        eager(received, values.float().contiguous(), comm=moe._comm)
        return received.view(W, M, L).permute(1, 0, 2).reshape(M, W * L)

    @moe_to_sources.register_fake
    def _(values, buffer):
        moe = resolve(buffer, "braid.MoeBuffer (routing weights' gradient)")
        return values.new_empty((moe.max_tokens, moe.experts), dtype=torch.float32)

    from ._autograd import register_moe_autograd
    register_moe_autograd(torch, moe_dispatch, moe_combine)

    # GEMMs fused with their collective (braid::FusedMatmul, braid.ops) ------------------------------------------
    # torch.ops.symm_mem's fused_all_gather_matmul and fused_matmul_reduce_scatter with a communicator handle for
    # the group name; the gathered A comes back as None unless return_A (a schema: custom_op infers no Tensor?).
    from . import _fused

    @custom_op("braid::all_gather_matmul", mutates_args=(), device_types="cuda",
               schema="(Tensor A_shard, Tensor[] Bs, int gather_dim, bool return_A, int comm) -> (Tensor?, Tensor[])")
    def all_gather_matmul(A_shard, Bs, gather_dim, return_A, comm):
        function = "braid.ops.all_gather_matmul"
        return _fused.all_gather_matmul(torch, comm_of(comm, function), A_shard, Bs, gather_dim, return_A, function)

    @all_gather_matmul.register_fake
    def _(A_shard, Bs, gather_dim, return_A, comm):
        function = "braid.ops.all_gather_matmul"
        return _fused.fake_all_gather_matmul(torch, A_shard, Bs, gather_dim, return_A, world(comm, function),
                                             function)

    @custom_op("braid::matmul_reduce_scatter", mutates_args=(), device_types="cuda")
    def matmul_reduce_scatter(A: Tensor, B: Tensor, reduce_op: str, scatter_dim: int, comm: int) -> Tensor:
        function = "braid.ops.matmul_reduce_scatter"
        return _fused.matmul_reduce_scatter(torch, comm_of(comm, function), A, B, reduce_op, scatter_dim, function)

    @matmul_reduce_scatter.register_fake
    def _(A, B, reduce_op, scatter_dim, comm):
        function = "braid.ops.matmul_reduce_scatter"
        return _fused.fake_matmul_reduce_scatter(torch, A, B, reduce_op, scatter_dim, world(comm, function), function)

    from ._autograd import register_fused_matmul_autograd
    register_fused_matmul_autograd(torch, all_gather_matmul, matmul_reduce_scatter)

    for op in (all_reduce, all_reduce_, all_gather_into_tensor, reduce_scatter_tensor, reduce, send_recv, broadcast,
               all_to_all_single, all_to_all_v_device, moe_dispatch, moe_redispatch, moe_combine, moe_to_sources,
               all_gather_matmul, matmul_reduce_scatter):
        _side_effect(torch, op)
