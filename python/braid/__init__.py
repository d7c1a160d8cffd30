"""braid for PyTorch: collectives, point to point and symmetric memory between the GPUs of one host, on braid's
C++ library (libbraid.so). `import braid` needs no torch; the calls on tensors import it when first used.

    import braid, torch
    comm = braid.init()                      # torchrun or braid-run variables
    torch.cuda.set_device(comm.device)
    x = torch.ones(1 << 20, device="cuda")
    braid.all_reduce(x)                      # on torch.cuda.current_stream()

braid.ops fuses tensor-parallel GEMMs with their all-gather or reduce-scatter. docs/python.md is the guide."""
from ._error import Error, ErrorCode  # first: the extension raises these
from ._braid import (Communicator, DataType, FusedMatmul, Layout, MoeHandle, MoeLayout, MoeShape, PointToPoint,
                     ReduceOp, Rendezvous, StoreHost, SymmetricMemory, datatype_name, datatype_size, error_code_name)
from ._dtypes import datatype, reduce_op
from ._state import barrier, check, default_communicator, get_rank, get_world_size, is_initialized
from ._lifecycle import destroy, init
from ._collectives import (all_gather, all_gather_into_tensor, all_reduce, all_to_all_single, all_to_all_v_device,
                           broadcast, reduce, reduce_scatter, reduce_scatter_tensor)
from ._p2p import P2POp, batch_isend_irecv, recv, send
from ._symmetric import empty, peer, view_all
from ._moe import MoeBuffer, MoeDispatch
from ._signal import SignalPad
from ._handles import op_handle
from ._ops import register_ops
from . import functional, ops

import sys as _sys
if _sys.modules.get("torch") is not None:  # the custom ops now: a first call may be under torch.compile
    register_ops()

__version__ = "0.1.0"

__all__ = [
    "Communicator", "DataType", "Error", "ErrorCode", "FusedMatmul", "Layout", "MoeBuffer", "MoeDispatch", "MoeHandle",
    "MoeLayout", "MoeShape", "P2POp", "PointToPoint", "ReduceOp", "Rendezvous", "SignalPad", "StoreHost",
    "SymmetricMemory", "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all_single", "all_to_all_v_device",
    "barrier", "batch_isend_irecv", "broadcast", "check", "datatype", "datatype_name", "datatype_size",
    "default_communicator", "destroy", "empty", "error_code_name", "functional", "get_rank", "get_world_size", "init",
    "is_initialized", "op_handle", "ops", "peer", "recv", "reduce", "reduce_op", "reduce_scatter",
    "reduce_scatter_tensor", "register_ops", "send", "view_all"
]
