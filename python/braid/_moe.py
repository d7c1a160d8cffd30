"""braid.MoeBuffer: expert-parallel MoE dispatch and combine on torch tensors (braid/moe.hpp, docs/moe.md).

Dispatch returns a MoeDispatch whose tensors are views of the buffer's memory on this GPU: the same tensors for
every dispatch of the buffer (braid writes its results at the same addresses each time), holding the last
dispatch's results until the next one. With grad mode on (torch.is_grad_enabled()), a dispatch without hook=True
on a buffer without dispatch_dtype returns x (and, where topk_weights requires grad, the dispatched weights) as
new copies instead, with the rows outside the dispatch zeroed (docs/python.md, "Autograd through MoE"). Calls enqueue on torch.cuda.current_stream() and are graph-capturable;
T comes from the host (an int, default x's rows) or from a device int64 tensor read on the GPU, so one captured
graph serves every batch size. Under torch.compile the calls go through braid's custom ops (braid/_ops.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ._braid import DataType, MoeBuffer as _MoeBuffer, MoeHandle, MoeHook, MoeLayout, MoeShape, MOE_SCALE_COLUMNS
from ._dtypes import datatype, torch_name
from ._error import Error, ErrorCode, argument_error, int_argument
from ._handles import op_handle, release_handle
from ._ops import register_ops
from ._state import communicator
from ._torch import current_stream, torch as import_torch

_EXPERT_MAJOR_FIELDS = ("x", "scales", "expert_counts", "expert_offsets", "weights", "local_expert", "source_rank",
                        "source_token")
_RANK_MAJOR_FIELDS = ("x", "scales", "expert_counts", "source_rank", "source_token", "received_tokens", "topk_expert",
                      "topk_weights", "combine_input")


@dataclass
class MoeDispatch:
    """What MoeBuffer.dispatch returns: views of the buffer's memory (None for another layout's fields, scales
    without fp8 dispatch), as braid::MoeDispatchOutput describes them, except the grad-mode copies the module's
    docstring names. Read them on the device, or after synchronising; the views hold this dispatch's results until
    the buffer's next dispatch."""

    x: Any  # [capacity_rows, hidden] of the dispatch dtype
    scales: Any = None  # fp8: [capacity_rows, hidden / 128] float32
    expert_counts: Any = None  # [local_experts] int64
    expert_offsets: Any = None  # expert-major: [local_experts + 1] int64
    weights: Any = None  # expert-major: [capacity_rows] float32
    local_expert: Any = None  # expert-major: [capacity_rows] int32
    source_rank: Any = None  # [capacity_rows] int32
    source_token: Any = None  # [capacity_rows] int32
    received_tokens: Any = None  # rank-major: [world] int64
    topk_expert: Any = None  # rank-major: [capacity_rows, top_k] int32
    topk_weights: Any = None  # rank-major: [capacity_rows, top_k] float32
    combine_input: Any = None  # rank-major: [capacity_rows, hidden] of the buffer's dtype (symmetric memory)
    handle: Optional[MoeHandle] = None  # this dispatch's routing (None under torch.compile)
    num_tokens: Any = None  # rows combine's out gets: host T, or x's rows when T is on the device
    hook: Optional["Hook"] = None  # with hook=True: call hook.receive() before reading the outputs


class Hook:
    """The receiving half of a rank-major call made with hook=True: the call enqueued its sends and returned;
    receive() enqueues the rest on the current stream. Once per hook; until it is called, the buffer refuses
    every other call."""

    def __init__(self, moe: "MoeBuffer", hook: MoeHook) -> None:
        self._moe, self._hook = moe, hook  # the buffer must outlive its hook

    @property
    def pending(self) -> bool:
        return self._hook.pending

    def receive(self) -> None:
        torch = import_torch("braid.MoeBuffer hook.receive")
        self._hook.receive(current_stream(torch, self._moe.device))


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _dtype_of(torch, dtype: DataType):
    return getattr(torch, torch_name(dtype))


class MoeBuffer:
    """Symmetric buffers for one MoE shape class on a communicator (collective: every rank, the same shape), reused
    by every dispatch/combine pair. Arguments are braid::MoeShape's fields; dtypes are torch dtypes (or names):
    dtype the rows' (bfloat16, float16, float32: what combine takes and returns), dispatch_dtype fp8
    (float8_e4m3fn, float8_e5m2) to dispatch fp8 rows with scales, index_dtype topk_idx's (int64 or int32).
    layout: 'expert_major' (default) or 'rank_major'; low_latency=True (rank-major only) gives each token a fixed
    row, s * max_tokens + t, for decode batches (braid::MoeShape::low_latency)."""

    def __init__(self, hidden: int, max_tokens: int, top_k: int, experts: int, *, dtype="bfloat16",
                 dispatch_dtype=None, index_dtype="int64", expert_alignment: int = 1, capacity_rows: int = 0,
                 layout="expert_major", max_sms: int = 0, low_latency: bool = False, comm=None) -> None:
        function = "braid.MoeBuffer"
        comm = communicator(comm, function)
        try:
            shape = self._make_shape(function, hidden, max_tokens, top_k, experts, dtype, dispatch_dtype,
                                     index_dtype, expert_alignment, capacity_rows, layout, max_sms, low_latency)
        except Error:
            # Still join the ranks' exchange of shapes, with one that create refuses (hidden 0), so that every
            # rank fails at once (the others with kMismatch naming this rank), then raise this rank's reason.
            try:
                _MoeBuffer.create(comm, MoeShape())
            except Error:
                pass
            raise
        buffer = _MoeBuffer.create(comm, shape)  # validates the shape, naming the field, within the exchange
        self._setup(shape, comm, buffer, comm.size, comm.rank, comm.device, buffer.capacity_rows)

    @classmethod
    def meta(cls, hidden: int, max_tokens: int, top_k: int, experts: int, *, world_size: int, rank: int = 0,
             **options) -> "MoeBuffer":
        """A MoeBuffer without memory or communicator, for tracing: its calls run braid's ops' fake
        implementations (on meta or fake tensors), which give the output shapes and dtypes a real buffer of this
        shape on world_size ranks would. options: the constructor's keyword arguments but comm."""
        function = "braid.MoeBuffer.meta"
        self = cls.__new__(cls)
        defaults = dict(dtype="bfloat16", dispatch_dtype=None, index_dtype="int64", expert_alignment=1, capacity_rows=0,
                        layout="expert_major", max_sms=0, low_latency=False)
        unknown = set(options) - set(defaults)
        if unknown:
            raise argument_error(function, sorted(unknown)[0], "is not an option of braid.MoeBuffer")
        defaults.update(options)
        shape = self._make_shape(function, hidden, max_tokens, top_k, experts, *defaults.values())
        _MoeBuffer.symmetric_bytes(shape, world_size)
        rows = shape.capacity_rows or _MoeBuffer.worst_case_rows(shape, world_size)
        self._setup(shape, None, None, world_size, rank, -1, rows)
        return self

    @staticmethod
    def _make_shape(function, hidden, max_tokens, top_k, experts, dtype, dispatch_dtype, index_dtype,
                    expert_alignment, capacity_rows, layout, max_sms, low_latency) -> MoeShape:
        shape = MoeShape()
        # The most each field holds: size_t (hidden, max_tokens, capacity_rows) or int (the rest) in braid::MoeShape.
        for name, value, most in (("hidden", hidden, 2**64 - 1), ("max_tokens", max_tokens, 2**64 - 1),
                                  ("top_k", top_k, 2**31 - 1), ("experts", experts, 2**31 - 1),
                                  ("expert_alignment", expert_alignment, 2**31 - 1),
                                  ("capacity_rows", capacity_rows, 2**64 - 1), ("max_sms", max_sms, 2**31 - 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
                raise argument_error(function, name, f"is {value!r}; it must be an int in [0, {most}]")
            setattr(shape, name, value)
        shape.type = datatype(dtype, function, "dtype")
        if dispatch_dtype is not None:
            shape.dispatch_type = datatype(dispatch_dtype, function, "dispatch_dtype")
        shape.index_type = datatype(index_dtype, function, "index_dtype")
        layouts = {"expert_major": MoeLayout.EXPERT_MAJOR, "rank_major": MoeLayout.RANK_MAJOR}
        if isinstance(layout, MoeLayout):
            shape.layout = layout
        elif str(layout).lower() in layouts:
            shape.layout = layouts[str(layout).lower()]
        else:
            raise argument_error(function, "layout", f"is {layout!r}; it must be 'expert_major' or 'rank_major'")
        if not isinstance(low_latency, bool):
            raise argument_error(function, "low_latency", f"is {low_latency!r}; it must be a bool")
        shape.low_latency = low_latency
        return shape

    def _setup(self, shape, comm, buffer, world, rank, device, capacity_rows) -> None:
        # Plain Python values, so that torch.compile traces the calls without touching the extension.
        self._comm, self._buffer, self.shape = comm, buffer, shape
        self.hidden, self.max_tokens, self.top_k, self.experts = shape.hidden, shape.max_tokens, shape.top_k, \
            shape.experts
        self.world_size, self.rank, self.device = world, rank, device
        self.local_experts = shape.experts // world
        self.capacity_rows = capacity_rows
        self.rank_major = shape.layout == MoeLayout.RANK_MAJOR
        self.fp8 = shape.dispatch_type is not None
        self._type, self._moved, self._index = shape.type, shape.dispatch_type or shape.type, shape.index_type
        self._fields = tuple(f for f in (_RANK_MAJOR_FIELDS if self.rank_major else _EXPERT_MAJOR_FIELDS)
                             if f != "scales" or self.fp8)
        self._views: Optional[dict] = None  # name -> tensor over the buffer's memory, made by the first dispatch
        self._addresses: Optional[tuple] = None
        self._last_handle: Optional[MoeHandle] = None
        # The last dispatch's routing (topk_idx, topk_weights, device T, host T): expert-major combine's backward
        # dispatches the output gradient with it.
        self._routing: Optional[tuple] = None
        # (the dispatch number a combine's backward made, the forward dispatch whose routing it repeated)
        self._replay: Optional[tuple] = None
        self._out_rows = 0  # combine's rows: the last dispatch's T (host) or x's rows (device T)
        if buffer is not None or _torch_available():
            register_ops()
        self._handle = op_handle(self)

    def __repr__(self) -> str:
        if self._buffer is None:
            return f"braid.MoeBuffer.meta({self.shape!r}, world_size={self.world_size})"
        return f"braid.{self._buffer!r}"

    def output_fields(self) -> tuple:
        """The names of the tensors a dispatch of this buffer returns, in the order braid's ops return them."""
        return self._fields

    def close(self) -> None:
        """Drops the ops' reference to this buffer (its memory goes with this object and the last tensor over
        it)."""
        release_handle(self)

    # Views of the buffer's memory -------------------------------------------------------------------------
    def _output(self, torch, output, num_tokens) -> MoeDispatch:
        addresses = tuple(getattr(output, f) for f in self._fields)
        if addresses != self._addresses:  # the first dispatch (braid keeps the addresses afterwards)
            arrays = self._buffer.arrays(output)
            self._views = {name: self._typed(torch, name, torch.from_dlpack(arrays[name])) for name in self._fields}
            self._addresses = addresses
        return MoeDispatch(handle=output.handle, num_tokens=num_tokens, **self._views)

    def _shapes(self, torch) -> dict:
        rows, hidden, k = self.capacity_rows, self.hidden, self.top_k
        moved, typ = _dtype_of(torch, self._moved), _dtype_of(torch, self._type)
        i32, i64, f32 = torch.int32, torch.int64, torch.float32
        return {"x": ((rows, hidden), moved), "scales": ((rows, hidden // MOE_SCALE_COLUMNS), f32),
                "expert_counts": ((self.local_experts,), i64), "expert_offsets": ((self.local_experts + 1,), i64),
                "weights": ((rows,), f32), "local_expert": ((rows,), i32), "source_rank": ((rows,), i32),
                "source_token": ((rows,), i32), "received_tokens": ((self.world_size,), i64),
                "topk_expert": ((rows, k), i32), "topk_weights": ((rows, k), f32),
                "combine_input": ((rows, hidden), typ)}

    def torch_dtype(self, torch):
        """The torch dtype of the token rows combine takes and returns (the shape's dtype)."""
        return _dtype_of(torch, self._type)

    def _valid_rows(self, torch, outputs: dict):
        """[capacity_rows, 1] bool on the device: the rows that belong to the dispatch whose outputs these are
        (rank-major: the received tokens of each source, not a low-latency buffer's holes; expert-major: the rows
        of a local expert below the rows in use, none where they overflowed the capacity)."""
        rows = self.capacity_rows
        index = torch.arange(rows, device=outputs["source_rank"].device)
        if self.rank_major:
            valid = index % self.max_tokens < outputs["received_tokens"].repeat_interleave(self.max_tokens)
            valid = valid & (outputs["source_rank"] >= 0)  # a hole's source rank is -1
        else:
            used = outputs["expert_offsets"][-1]
            valid = (index < used) & (used <= rows) & (outputs["local_expert"] >= 0)
        return valid[:, None]

    def _backward_handle(self, forward: int, function: str) -> int:
        """The dispatch number a backward call passes to braid for the forward dispatch `forward` (-1, traced:
        the last one). Raises when the buffer has been dispatched with another routing since."""
        if forward < 0:
            return -1
        last = self._last_handle.dispatch if self._last_handle is not None else -1
        if last == forward or self._replay == (last, forward):
            return last
        raise Error(f"{function}: this buffer's last routed dispatch is number {last}, not the forward's {forward}: "
                    "it was dispatched again after the forward pass, and a backward pass needs its forward's routing "
                    "(use one braid.MoeBuffer per MoE layer)", ErrorCode.INVALID_ARGUMENT)

    def _replayed(self, forward: int) -> None:
        """Records that the last dispatch (a combine's backward, expert-major) repeated the routing of `forward`,
        so the matching dispatch's backward may combine on it."""
        if forward >= 0 and self._last_handle is not None:
            self._replay = (self._last_handle.dispatch, forward)

    def _grad_mode(self, torch) -> bool:
        return torch.is_grad_enabled()  # False under torch.no_grad() and torch.inference_mode()

    def _typed(self, torch, name: str, flat):
        shape, dtype = self._shapes(torch)[name]
        return flat.view(dtype).view(shape)

    def _fake_outputs(self, device) -> list:
        torch = import_torch("braid.MoeBuffer")
        shapes = self._shapes(torch)
        return [torch.empty(shapes[name][0], dtype=shapes[name][1], device=device) for name in self._fields]

    # Argument checks (metadata only, so that they trace) --------------------------------------------------
    def _check_rows(self, torch, tensor, name: str, function: str, dtype: DataType, columns: int, rows=None):
        if not isinstance(tensor, torch.Tensor):
            raise argument_error(function, name, f"must be a torch.Tensor, got {type(tensor).__name__}")
        want = _dtype_of(torch, dtype)
        if tensor.dtype != want:
            raise argument_error(function, name, f"has dtype {tensor.dtype}; this buffer needs {want}")
        if tensor.dim() != 2 or tensor.shape[1] != columns or (rows is not None and tensor.shape[0] != rows):
            need = f"[{'T' if rows is None else rows}, {columns}]"
            raise argument_error(function, name, f"has shape {tuple(tensor.shape)}; it needs {need}")
        if tensor.device.type != "cuda" and tensor.device.type != "meta":
            raise argument_error(function, name, f"is on {tensor.device}; braid needs a CUDA tensor")

    def _check_dispatch(self, torch, function, x, topk_idx, topk_weights, num_tokens, x_scales):
        self._check_rows(torch, x, "x", function, self._moved, self.hidden)
        rows = x.shape[0]
        self._check_rows(torch, topk_idx, "topk_idx", function, self._index, self.top_k, rows)
        self._check_rows(torch, topk_weights, "topk_weights", function, DataType.FLOAT32, self.top_k, rows)
        self._check_scales(torch, function, x_scales, rows)
        if isinstance(num_tokens, torch.Tensor):
            if num_tokens.dtype != torch.int64 or num_tokens.numel() != 1 or num_tokens.device.type == "cpu":
                raise argument_error(function, "num_tokens", f"is a {num_tokens.dtype} tensor of "
                                     f"{num_tokens.numel()} elements on {num_tokens.device}; a device T is one int64 "
                                     "on the GPU")
            if rows < self.max_tokens:
                raise argument_error(function, "x", f"has {rows} rows; with T on the device (num_tokens a tensor) "
                                     f"the inputs need max_tokens ({self.max_tokens}) rows")
        elif num_tokens is not None and (isinstance(num_tokens, bool) or not isinstance(num_tokens, int)
                                         or not 0 <= num_tokens <= min(rows, self.max_tokens)):
            raise argument_error(function, "num_tokens", f"is {num_tokens!r}; it must be None, an int in [0, "
                                 f"{min(rows, self.max_tokens)}] (x's {rows} rows, at most max_tokens "
                                 f"{self.max_tokens}) or a device int64 tensor")
        elif num_tokens is None and rows > self.max_tokens:
            raise argument_error(function, "x", f"has {rows} rows; T (x's rows, num_tokens None) is at most "
                                 f"max_tokens ({self.max_tokens})")

    def _check_scales(self, torch, function, x_scales, rows):
        if self.fp8:
            if x_scales is None:
                raise argument_error(function, "x_scales", "is None; this buffer dispatches fp8 rows, each with "
                                     f"hidden / {MOE_SCALE_COLUMNS} float32 scales")
            self._check_rows(torch, x_scales, "x_scales", function, DataType.FLOAT32,
                             self.hidden // MOE_SCALE_COLUMNS, rows)
        elif x_scales is not None:
            raise argument_error(function, "x_scales", "is given; this buffer dispatches without scales (no "
                                 "dispatch_dtype)")

    def _traced(self, torch, *tensors) -> bool:
        """Whether to go through braid's ops: under torch.compile, on a meta buffer, or on meta tensors."""
        return self._buffer is None or torch.compiler.is_compiling() or any(
            t is not None and t.device.type == "meta" for t in tensors)

    # Dispatch ------------------------------------------------------------------------------------------------
    def dispatch(self, x, topk_idx, topk_weights, num_tokens=None, *, x_scales=None, hook: bool = False) -> MoeDispatch:
        """Sends each token x[t] ([T, hidden] of the dispatch dtype) to the ranks holding its experts topk_idx[t]
        ([T, top_k]; -1: none) with weights topk_weights ([T, top_k] float32). num_tokens: None (x's rows), an
        int, or a device int64 tensor (then x and the routing need at least max_tokens rows). Every rank must call it.
        hook=True (rank-major): only the sending half; call .hook.receive() before reading the outputs."""
        function = "braid.MoeBuffer.dispatch"
        torch = import_torch(function)
        self._check_dispatch(torch, function, x, topk_idx, topk_weights, num_tokens, x_scales)
        device_t = num_tokens if isinstance(num_tokens, torch.Tensor) else None
        host_t = -1 if num_tokens is None or device_t is not None else num_tokens
        grad = self._grad_mode(torch) and not hook and not self.fp8  # fp8 rows are not differentiable
        if hook and self._grad_mode(torch) and (x.requires_grad or topk_weights.requires_grad):
            raise Error(f"{function}: argument 'hook' is True and x or topk_weights requires grad; hooks record no "
                        "autograd: "
                        "dispatch without a hook, or under torch.no_grad()", ErrorCode.UNSUPPORTED)
        if self._traced(torch, x) or (grad and (x.requires_grad or topk_weights.requires_grad)):
            if hook:
                raise Error(f"{function}: argument 'hook' is True under torch.compile; hooks run eagerly only",
                            ErrorCode.UNSUPPORTED)
            outputs = torch.ops.braid.moe_dispatch(x, x_scales, topk_idx, topk_weights, device_t, host_t,
                                                   self._handle)
            self._out_rows = x.shape[0] if host_t < 0 else host_t
            got = MoeDispatch(num_tokens=self._out_rows, **dict(zip(self._fields, outputs)))
            if self._buffer is not None and not torch.compiler.is_compiling():
                got.handle = self._last_handle
        else:
            got = self._dispatch_eager(x, topk_idx, topk_weights, num_tokens, x_scales, hook)
        self._routing = (topk_idx, topk_weights, device_t, host_t)
        if grad:
            # Under autograd the rows are a copy (rows outside the dispatch zeroed): a backward pass moves the
            # gradient through the buffer's rows, which would otherwise change what autograd saved of them.
            valid = self._valid_rows(torch, vars(got))
            got.x = got.x.masked_fill(~valid, 0)
            if topk_weights.requires_grad:  # the dispatched weights are differentiable too: a copy as well
                name = "topk_weights" if self.rank_major else "weights"
                weights = getattr(got, name)
                setattr(got, name, weights.masked_fill(~(valid if self.rank_major else valid[:, 0]), 0))
        return got

    def _pointers(self, torch, function, *named):
        from ._tensors import buffer
        return [0 if t is None else buffer(torch, t, self._comm, function, name).pointer for name, t in named]

    def _dispatch_eager(self, x, topk_idx, topk_weights, num_tokens, x_scales, hook) -> MoeDispatch:
        function = "braid.MoeBuffer.dispatch"
        torch = import_torch(function)
        device_t = num_tokens if isinstance(num_tokens, torch.Tensor) else None
        host_t = x.shape[0] if num_tokens is None else (0 if device_t is not None else num_tokens)
        px, ps, pi, pw, pt = self._pointers(torch, function, ("x", x), ("x_scales", x_scales), ("topk_idx", topk_idx),
                                            ("topk_weights", topk_weights), ("num_tokens", device_t))
        native = MoeHook() if hook else None
        output = self._buffer.dispatch(px, ps, pi, pw, host_t, pt, current_stream(torch, self.device), native)
        self._out_rows = x.shape[0] if device_t is not None else host_t
        got = self._output(torch, output, self._out_rows)
        self._last_handle = output.handle
        if native is not None:
            got.hook = Hook(self, native)
        return got

    def redispatch(self, handle, x, *, x_scales=None, hook: bool = False) -> MoeDispatch:
        """Rank-major: dispatches new rows x ([T, hidden], T the rows of the dispatch `handle` names, which must be
        the buffer's last routed one: its num_tokens) with that dispatch's routing; only the data moves (the
        metadata stays). The backward pass of a combine. handle None: the last dispatch."""
        function = "braid.MoeBuffer.redispatch"
        torch = import_torch(function)
        self._check_rows(torch, x, "x", function, self._moved, self.hidden, self._out_rows)
        self._check_scales(torch, function, x_scales, x.shape[0])
        if self._traced(torch, x):
            if hook:
                raise Error(f"{function}: argument 'hook' is True under torch.compile; hooks run eagerly only",
                            ErrorCode.UNSUPPORTED)
            outputs = torch.ops.braid.moe_redispatch(x, x_scales, self._handle, -1)
            return MoeDispatch(num_tokens=self._out_rows, **dict(zip(self._fields, outputs)))
        return self._redispatch_eager(handle, x, x_scales, hook)

    def _redispatch_eager(self, handle, x, x_scales, hook) -> MoeDispatch:
        function = "braid.MoeBuffer.redispatch"
        torch = import_torch(function)
        if handle is None:
            handle = self.last_handle()
        elif not isinstance(handle, MoeHandle):
            raise argument_error(function, "handle", f"is a {type(handle).__name__}; pass a dispatch's .handle")
        px, ps = self._pointers(torch, function, ("x", x), ("x_scales", x_scales))
        native = MoeHook() if hook else None
        output = self._buffer.redispatch(handle, px, ps, current_stream(torch, self.device), native)
        got = self._output(torch, output, self._out_rows)
        if native is not None:
            got.hook = Hook(self, native)
        return got

    def last_handle(self) -> MoeHandle:
        """The handle of the buffer's last routed dispatch made through this object (braid checks it at the call)."""
        return self._last_handle if self._last_handle is not None else MoeHandle()

    # Combine -------------------------------------------------------------------------------------------------
    def combine(self, y, out=None, *, weighted: Optional[bool] = None, handle=None, hook: bool = False,
                num_tokens: Optional[int] = None):
        """For the tokens of the last dispatch (or the one `handle` names, which must be the last): out [T, hidden]
        of the buffer's dtype gets each token's rows from y ([capacity_rows, hidden]) summed, in float32.
        Expert-major: weighted (default True) applies the routing weights. Rank-major: y is a row per received
        token (weights applied; pass the dispatch's combine_input to save a copy) and weighted must be False.
        T is the last dispatch's num_tokens (host T, or x's rows with T on the device). out None: a new [T, hidden]
        tensor, or one of num_tokens rows, from the rows combine writes (host T, or max_tokens with T on the
        device) to max_tokens, the rows past them unwritten. Returns out, or (out, hook) with hook=True
        (rank-major)."""
        function = "braid.MoeBuffer.combine"
        torch = import_torch(function)
        if weighted is None:
            weighted = not self.rank_major
        self._check_rows(torch, y, "y", function, self._type, self.hidden, self.capacity_rows)
        rows = self._out_rows
        if num_tokens is not None:  # combine writes the dispatch's T rows: a shorter out would be overrun
            least = min(self._out_rows, self.max_tokens)  # host T, or max_tokens when T is on the device
            rows = int_argument(num_tokens, function, "num_tokens")
            if not least <= rows <= self.max_tokens:
                raise argument_error(function, "num_tokens", f"is {rows}; it must be in [{least}, {self.max_tokens}]"
                                     f": at least the {least} rows combine writes (the last dispatch's T, or "
                                     "max_tokens with T on the device), at most max_tokens")
        if out is not None:
            self._check_rows(torch, out, "out", function, self._type, self.hidden, self._out_rows)
            rows = self._out_rows
        traced = self._traced(torch, y)
        if traced and (hook or out is not None):
            raise Error(f"{function}: argument '{'hook' if hook else 'out'}' is given under torch.compile; "
                        "there combine returns a new tensor and runs without hooks", ErrorCode.UNSUPPORTED)
        routing_weights = None if self.rank_major or self._routing is None else self._routing[1]
        grad = self._grad_mode(torch) and (y.requires_grad or (bool(weighted) and routing_weights is not None and
                                                               routing_weights.requires_grad))
        if grad and hook:
            raise Error(f"{function}: argument 'hook' is True and y (or the routing weights of a weighted combine) "
                        "requires grad; hooks record no autograd: "
                        "combine without a hook, or under torch.no_grad()", ErrorCode.UNSUPPORTED)
        if traced or grad:
            if handle is not None and not isinstance(handle, MoeHandle):
                raise argument_error(function, "handle", f"is a {type(handle).__name__}; pass a dispatch's .handle")
            number = -1 if handle is None or torch.compiler.is_compiling() else handle.dispatch
            idx, weights, device_t, host_t = (None, None, None, -1) if self.rank_major or self._routing is None \
                else self._routing
            result = torch.ops.braid.moe_combine(y, bool(weighted), rows, self._handle, number, idx, weights,
                                                 device_t, host_t)
            if out is None:
                return result
            out.copy_(result)
            return out
        if out is None:
            out = y.new_empty((rows, self.hidden))
        native = self._combine_eager(y, out, weighted, handle, hook)
        return (out, Hook(self, native)) if native is not None else out

    def _combine_eager(self, y, out, weighted, handle, hook):
        function = "braid.MoeBuffer.combine"
        torch = import_torch(function)
        if handle is not None and not isinstance(handle, MoeHandle):
            raise argument_error(function, "handle", f"is a {type(handle).__name__}; pass a dispatch's .handle")
        py, po = self._pointers(torch, function, ("y", y), ("out", out))
        native = MoeHook() if hook else None
        self._buffer.combine(py, po, bool(weighted), current_stream(torch, self.device), native, handle)
        return native

    def copy_expert_counts(self, host_counts=None):
        """One cudaMemcpyAsync of the last dispatch's expert_counts into host_counts ([local_experts] int64 in
        pinned host memory; None: a new one), on the current stream: read it once the stream has synchronised.
        Capturable in a graph. Returns host_counts."""
        function = "braid.MoeBuffer.copy_expert_counts"
        torch = import_torch(function)
        if self._buffer is None:
            raise Error(f"{function}: a meta MoeBuffer has no counts to copy", ErrorCode.INVALID_ARGUMENT)
        if host_counts is None:
            host_counts = torch.empty(self.local_experts, dtype=torch.int64, pin_memory=True)
        if not isinstance(host_counts, torch.Tensor) or host_counts.device.type != "cpu":
            raise argument_error(function, "host_counts", "must be a CPU tensor in pinned memory")
        if host_counts.dtype != torch.int64 or host_counts.numel() != self.local_experts \
                or not host_counts.is_contiguous():
            raise argument_error(function, "host_counts", f"is {host_counts.dtype} of {host_counts.numel()} "
                                 f"elements; it needs {self.local_experts} contiguous int64 (one per local expert)")
        if not host_counts.is_pinned():
            raise argument_error(function, "host_counts", "is not in pinned memory (torch.empty(..., "
                                 "pin_memory=True)); the copy must be asynchronous")
        self._buffer.copy_expert_counts(host_counts.data_ptr(), current_stream(torch, self.device))
        return host_counts
