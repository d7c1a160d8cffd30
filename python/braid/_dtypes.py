"""torch dtypes and reduction ops as braid's DataType and ReduceOp. Matched by name ('float32', 'torch.float32'),
so the mapping, and its errors, need no torch: a torch.dtype, its name, or a braid.DataType all work."""
from __future__ import annotations

from ._braid import DataType, ReduceOp
from ._error import argument_error

# torch.<name> -> braid DataType. torch.float8_e4m3fn is OCP e4m3 (no infinities), braid's FLOAT8_E4M3.
_DATATYPES = {
    "int8": DataType.INT8,
    "uint8": DataType.UINT8,
    "int32": DataType.INT32,
    "uint32": DataType.UINT32,
    "int64": DataType.INT64,
    "uint64": DataType.UINT64,
    "float16": DataType.FLOAT16,
    "half": DataType.FLOAT16,
    "float32": DataType.FLOAT32,
    "float": DataType.FLOAT32,
    "float64": DataType.FLOAT64,
    "double": DataType.FLOAT64,
    "bfloat16": DataType.BFLOAT16,
    "float8_e4m3fn": DataType.FLOAT8_E4M3,
    "float8_e5m2": DataType.FLOAT8_E5M2,
}

# torch.distributed.ReduceOp names (and lower-case strings) -> braid ReduceOp.
_REDUCE_OPS = {"sum": ReduceOp.SUM, "product": ReduceOp.PRODUCT, "max": ReduceOp.MAX, "min": ReduceOp.MIN,
               "avg": ReduceOp.AVG}


def _name(value) -> str:
    text = str(value)
    return text[len("torch."):] if text.startswith("torch.") else text


def datatype(dtype, function: str = "braid.datatype", argument: str = "dtype") -> DataType:
    """braid's DataType for a torch.dtype (or its name, or a DataType); braid.Error (INVALID_ARGUMENT) naming
    `argument` for a dtype braid does not move (bool, int16, complex, ...)."""
    if isinstance(dtype, DataType):
        return dtype
    found = _DATATYPES.get(_name(dtype))
    if found is None:
        supported = ", ".join(f"torch.{name}" for name in _DATATYPES if name not in ("half", "float", "double"))
        raise argument_error(function, argument, f"is {dtype}, which braid does not support (supported: {supported})")
    return found


def torch_name(dtype: DataType) -> str:
    """The name of a braid DataType's torch.dtype (torch.<name>; float8_e4m3fn for FLOAT8_E4M3)."""
    return next(name for name, value in _DATATYPES.items() if value == dtype)


def reduce_op_name(op) -> str:
    """The lower-case name of a reduction op, as given: 'sum' for torch.distributed.ReduceOp.SUM (a RedOpType with
    .name 'SUM'), for a ReduceOp instance made from one (ReduceOp(ReduceOp.SUM), whose .op is that RedOpType), for
    'SUM' or 'sum', and for braid's ReduceOp.SUM. Not checked: reduce_op() refuses what braid lacks."""
    if not isinstance(op, (str, ReduceOp)) and hasattr(op, "op") and hasattr(op.op, "name"):
        op = op.op
    name = op if isinstance(op, str) else getattr(op, "name", None) or str(op)
    return str(name).rsplit(".", 1)[-1].lower()


def reduce_op(op, function: str = "braid.reduce_op", argument: str = "op") -> ReduceOp:
    """braid's ReduceOp for a torch.distributed.ReduceOp (or 'sum', ..., or a ReduceOp); braid.Error
    (INVALID_ARGUMENT) naming `argument` for ops braid lacks (BAND, BOR, BXOR, PREMUL_SUM)."""
    if isinstance(op, ReduceOp):
        return op
    found = _REDUCE_OPS.get(reduce_op_name(op))
    if found is None:
        raise argument_error(function, argument,
                             f"is {op!r}, which braid does not reduce with (supported: SUM, PRODUCT, MAX, MIN, AVG)")
    return found
