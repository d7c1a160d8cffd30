"""braid imports without torch, never imports it by itself, and the calls on tensors say torch is missing."""
import braid

from helpers import run_python


def test_import_without_torch():
    result = run_python("import braid\nassert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
                        "print(braid.__version__, braid.ReduceOp.SUM, braid.datatype('bfloat16'))",
                        block_torch=True)
    assert result.returncode == 0, result.stderr
    assert "ReduceOp.SUM DataType.BFLOAT16" in result.stdout


def test_import_does_not_import_torch():
    result = run_python("import braid\nprint('torch' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_tensor_calls_name_missing_torch():
    code = """
import braid
for call in (lambda: braid.empty(4), lambda: braid.all_reduce(None), lambda: braid.send(None, 1)):
    try:
        call()
    except ImportError as error:
        print(error)
"""
    result = run_python(code, block_torch=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [line.split(" ")[0] for line in lines] == ["braid.empty", "braid.all_reduce", "braid.send"]
    assert all("needs PyTorch" in line for line in lines)


def test_public_names():
    for name in braid.__all__:
        assert hasattr(braid, name), name
    assert braid.Error is braid._braid.Error  # the extension raises the package's class


def test_import_after_torch_registers_the_ops():
    """A first braid call inside torch.compile(fullgraph=True) needs the custom ops registered before tracing."""
    import pytest
    pytest.importorskip("torch", reason="torch is not installed")
    result = run_python("import torch\nimport braid\nprint(hasattr(torch.ops.braid, 'all_reduce'), "
                        "hasattr(torch.ops.braid, 'all_to_all_single'))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True True"
