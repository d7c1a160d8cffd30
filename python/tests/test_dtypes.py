"""torch dtypes and reduction ops map onto braid's DataType and ReduceOp; what braid lacks is refused by name."""
import pytest

import braid
from braid import DataType, Error, ErrorCode, ReduceOp

SUPPORTED = {
    "int8": DataType.INT8, "uint8": DataType.UINT8, "int32": DataType.INT32, "uint32": DataType.UINT32,
    "int64": DataType.INT64, "uint64": DataType.UINT64, "float16": DataType.FLOAT16, "float32": DataType.FLOAT32,
    "float64": DataType.FLOAT64, "bfloat16": DataType.BFLOAT16, "float8_e4m3fn": DataType.FLOAT8_E4M3,
    "float8_e5m2": DataType.FLOAT8_E5M2,
}
SIZES = {DataType.INT8: 1, DataType.UINT8: 1, DataType.INT32: 4, DataType.UINT32: 4, DataType.INT64: 8,
         DataType.UINT64: 8, DataType.FLOAT16: 2, DataType.FLOAT32: 4, DataType.FLOAT64: 8, DataType.BFLOAT16: 2,
         DataType.FLOAT8_E4M3: 1, DataType.FLOAT8_E5M2: 1}


def test_every_datatype_maps_by_name():
    assert set(SUPPORTED.values()) == set(DataType)
    for name, expected in SUPPORTED.items():
        assert braid.datatype(name) is expected
        assert braid.datatype("torch." + name) is expected
        assert braid.datatype_size(expected) == SIZES[expected]
    assert braid.datatype(DataType.BFLOAT16) is DataType.BFLOAT16


@pytest.mark.parametrize("name", ["bool", "int16", "uint16", "complex64", "float8_e4m3fnuz", "nonsense"])
def test_unsupported_datatype_named(name):
    with pytest.raises(Error) as caught:
        braid.datatype("torch." + name, "braid.all_reduce", "tensor.dtype")
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert str(caught.value).startswith(f"braid.all_reduce: argument 'tensor.dtype' is torch.{name}")


def test_reduce_ops():
    for name, expected in [("sum", ReduceOp.SUM), ("PRODUCT", ReduceOp.PRODUCT), ("max", ReduceOp.MAX),
                           ("min", ReduceOp.MIN), ("avg", ReduceOp.AVG)]:
        assert braid.reduce_op(name) is expected
    for bad in ("band", "premul_sum", 3):
        with pytest.raises(Error, match="braid.reduce_op: argument 'op'") as caught:
            braid.reduce_op(bad)
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_torch_dtypes_and_ops():
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch.dtype mapping is not tested")
    assert braid.datatype(torch.bfloat16) is DataType.BFLOAT16
    assert braid.datatype(torch.float) is DataType.FLOAT32
    assert braid.datatype(torch.float8_e4m3fn) is DataType.FLOAT8_E4M3
    with pytest.raises(Error, match="torch.complex64"):
        braid.datatype(torch.complex64)
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    assert braid.reduce_op(dist.ReduceOp.SUM) is ReduceOp.SUM
    assert braid.reduce_op(dist.ReduceOp.PRODUCT) is ReduceOp.PRODUCT
    assert braid.reduce_op(dist.ReduceOp.AVG) is ReduceOp.AVG
    with pytest.raises(Error, match="BAND|band"):
        braid.reduce_op(dist.ReduceOp.BAND)
