"""torch, imported on first use: `import braid` works without it (the extension never links it), and only the
calls on tensors need it."""
from __future__ import annotations

import importlib
from types import ModuleType


def torch(function: str) -> ModuleType:
    """The torch module, or ImportError naming the braid call that needs it."""
    try:
        return importlib.import_module("torch")
    except ImportError as error:
        raise ImportError(f"{function} needs PyTorch (pip install torch); braid itself imports without it") from error


def current_stream(torch_module: ModuleType, device: int) -> int:
    """The cudaStream_t of torch's current stream on `device`, as braid's calls take it (inside torch.cuda.graph,
    the capturing stream)."""
    return torch_module.cuda.current_stream(device).cuda_stream
