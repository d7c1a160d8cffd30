"""torch, imported on first use: `import braid` works without it (the extension never links it), and only the
calls on tensors need it."""
from __future__ import annotations

import importlib
from types import ModuleType


_module = None  # torch once imported: a plain global read, which torch.compile traces (an import call it does not)


def torch(function: str) -> ModuleType:
    """The torch module, or ImportError naming the braid call that needs it."""
    global _module
    if _module is not None:
        return _module
    try:
        _module = importlib.import_module("torch")
        return _module
    except ImportError as error:
        raise ImportError(f"{function} needs PyTorch (pip install torch); braid itself imports without it") from error


def current_stream(torch_module: ModuleType, device: int) -> int:
    """The cudaStream_t of torch's current stream on `device`, as braid's calls take it (inside torch.cuda.graph,
    the capturing stream)."""
    return torch_module.cuda.current_stream(device).cuda_stream
