# Typing stub of the extension braid._braid: made by `python -m nanobind.stubgen -m braid._braid`, then the
# *_buffer() results typed Any (DLPack arrays: pass them to torch.from_dlpack). python/tests/test_stub.py checks
# that it names what the module holds.
"""
braid's C++ API for Python: pointers and CUDA streams as integers (the braid package wraps tensors)
"""

from collections.abc import Sequence
import enum

from typing import Any

from braid._error import Error as Error, ErrorCode as ErrorCode


def error_code_name(code: int) -> str:
    """
    braid's name of an error code (error_code_name in braid/error.hpp), e.g. 'invalid argument'.
    """

class DataType(enum.Enum):
    """Element types of braid's calls (NCCL's set and numbering)."""

    INT8 = 0

    UINT8 = 1

    INT32 = 2

    UINT32 = 3

    INT64 = 4

    UINT64 = 5

    FLOAT16 = 6

    FLOAT32 = 7

    FLOAT64 = 8

    BFLOAT16 = 9

    FLOAT8_E4M3 = 10

    FLOAT8_E5M2 = 11

class ReduceOp(enum.Enum):
    """Reduction operators (torch.distributed.ReduceOp's names)."""

    SUM = 0

    PRODUCT = 1

    MAX = 2

    MIN = 3

    AVG = 4

def datatype_size(dtype: DataType) -> int:
    """Bytes of one element of dtype."""

def datatype_name(dtype: DataType) -> str:
    """braid's name of dtype ('float32', 'bfloat16', ...)."""

class PointToPoint:
    """
    One send or receive of a Communicator.send_recv batch (pointer: a device address).
    """

    def __init__(self, kind: PointToPoint.Kind, peer: int, pointer: int, count: int, dtype: DataType) -> None: ...

    class Kind(enum.Enum):
        SEND = 0

        RECV = 1

    @property
    def kind(self) -> PointToPoint.Kind: ...

    @kind.setter
    def kind(self, arg: PointToPoint.Kind, /) -> None: ...

    @property
    def peer(self) -> int: ...

    @peer.setter
    def peer(self, arg: int, /) -> None: ...

    @property
    def pointer(self) -> int: ...

    @pointer.setter
    def pointer(self, arg: int, /) -> None: ...

    @property
    def count(self) -> int: ...

    @count.setter
    def count(self, arg: int, /) -> None: ...

    @property
    def dtype(self) -> DataType: ...

    @dtype.setter
    def dtype(self, arg: DataType, /) -> None: ...

    def __repr__(self) -> str: ...

class Rendezvous:
    """Where and how the ranks of a job meet (braid/rendezvous.hpp)."""

    def __init__(self) -> None: ...

    @staticmethod
    def from_env() -> Rendezvous:
        """
        From the launcher's variables: braid-run, torchrun, Open MPI, MPICH, Slurm (the first that matches). Raises braid.Error (INVALID_ARGUMENT) naming a missing or malformed variable.
        """

    @staticmethod
    def at_store(store_address: str, rank: int, size: int, rank0_serves_store: bool) -> Rendezvous:
        """
        Explicit: every rank names the same store 'host:port'; rank 0 serves it when rank0_serves_store.
        """

    @property
    def rank(self) -> int: ...

    @rank.setter
    def rank(self, arg: int, /) -> None: ...

    @property
    def size(self) -> int: ...

    @size.setter
    def size(self, arg: int, /) -> None: ...

    @property
    def local_rank(self) -> int: ...

    @local_rank.setter
    def local_rank(self, arg: int, /) -> None: ...

    @property
    def local_size(self) -> int: ...

    @local_size.setter
    def local_size(self, arg: int, /) -> None: ...

    @property
    def store_host(self) -> str: ...

    @store_host.setter
    def store_host(self, arg: str, /) -> None: ...

    @property
    def store_port(self) -> int: ...

    @store_port.setter
    def store_port(self, arg: int, /) -> None: ...

    @property
    def serve_store(self) -> bool: ...

    @serve_store.setter
    def serve_store(self, arg: bool, /) -> None: ...

    @property
    def job_id(self) -> str: ...

    @job_id.setter
    def job_id(self, arg: str, /) -> None: ...

    @property
    def source(self) -> str: ...

    @source.setter
    def source(self, arg: str, /) -> None: ...

    def __repr__(self) -> str: ...

class StoreHost:
    """
    A store served by this process until it is garbage-collected; pass .address to Rendezvous.at_store(..., rank0_serves_store=False).
    """

    def __init__(self, bind_host: str = '127.0.0.1', port: int = 0) -> None: ...

    @property
    def address(self) -> str: ...

class SymmetricMemory:
    """
    One symmetric allocation (Communicator.alloc): the same size on every rank, every rank's copy mapped here. Addresses are integers; *_buffer() give DLPack arrays of bytes.
    """

    @property
    def bytes(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def device(self) -> int:
        """CUDA ordinal of this rank's GPU."""

    @property
    def local(self) -> int:
        """This rank's copy."""

    def peer(self, rank: int) -> int:
        """Rank's copy as mapped here (an address on this rank's GPU)."""

    @property
    def peers(self) -> list[int]:
        """Every rank's copy as mapped here, in rank order."""

    @property
    def device_peers(self) -> int:
        """
        A device array of `world_size` pointers (the peers), to pass to kernels.
        """

    @property
    def view(self) -> int:
        """
        The contiguous view (rank r's copy at view + r * view_stride), or 0 without contiguous_view.
        """

    @property
    def view_stride(self) -> int:
        """
        Bytes between consecutive ranks in the view (bytes rounded up to the mapping granularity).
        """

    def local_buffer(self) -> Any:
        """This rank's copy: `bytes` uint8 on this rank's GPU (DLPack)."""

    def peer_buffer(self, rank: int) -> Any:
        """Rank's copy as mapped here: `bytes` uint8 on this rank's GPU (DLPack)."""

    def view_buffer(self) -> Any:
        """
        The contiguous view: world_size * view_stride uint8 on this rank's GPU (DLPack).
        """

    def __repr__(self) -> str: ...

class Communicator:
    """
    A group of ranks, one GPU each (braid::Communicator). Make one with Communicator.init; buffers are device addresses, streams cudaStream_t ints.
    """

    @staticmethod
    def init(rendezvous: Rendezvous | None = None, *, device: int = -1, timeout_s: float = 0.0, algorithms: str = '', max_blocks: int = 0, backend: str = '', nccl_library: str = '') -> Communicator:
        """
        Collective over the rendezvous' ranks (None: Rendezvous.from_env()). device -1: BRAID_DEVICE, else the local rank; 0 and '' take braid's defaults (BRAID_TIMEOUT_S, BRAID_ALGO, ...).
        """

    def destroy(self) -> None:
        """
        Frees the communicator now (later calls raise braid.Error); symmetric memory made from it stays valid.
        """

    @property
    def destroyed(self) -> bool: ...

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def device(self) -> int:
        """CUDA ordinal of this rank's GPU."""

    @property
    def timeout_s(self) -> float: ...

    @property
    def backend(self) -> str:
        """'cuda' (symmetric memory, one host) or 'nccl'."""

    @property
    def uses_multicast(self) -> bool: ...

    def describe(self) -> str:
        """A line per peer."""

    def alloc(self, bytes: int, contiguous_view: bool = False) -> SymmetricMemory:
        """
        Collective: every rank asks for the same bytes (> 0) in the same order. The memory is zeroed.
        """

    def barrier(self) -> None:
        """
        Host-side barrier over the store (it does not wait for the GPU: synchronise first).
        """

    def host_allgather(self, mine: bytes) -> list[bytes]:
        """
        Collective: every rank's bytes, in rank order (small values, over the store).
        """

    def check(self) -> None:
        """
        Raises what a kernel recorded (a timeout, a plan mismatch, refused data); does not synchronise.
        """

    def all_reduce(self, send: int, recv: int, count: int, dtype: DataType, op: ReduceOp, stream: int) -> None: ...

    def reduce(self, send: int, recv: int, count: int, dtype: DataType, op: ReduceOp, root: int, stream: int) -> None: ...

    def reduce_scatter(self, send: int, recv: int, recv_count: int, dtype: DataType, op: ReduceOp, stream: int) -> None: ...

    def all_gather(self, send: int, recv: int, send_count: int, dtype: DataType, stream: int) -> None: ...

    def broadcast(self, send: int, recv: int, count: int, dtype: DataType, root: int, stream: int) -> None: ...

    def all_to_all(self, send: int, recv: int, count: int, dtype: DataType, stream: int) -> None:
        """count elements per rank, in both directions."""

    def all_to_allv(self, send: int, send_counts: Sequence[int] | None, send_displs: Sequence[int] | None, recv: int, recv_counts: Sequence[int] | None, recv_displs: Sequence[int] | None, dtype: DataType, stream: int) -> None:
        """
        MPI_Alltoallv's shape: host lists of one count (and displacement) per rank, in elements; None displacements: packed in rank order.
        """

    def send(self, buffer: int, count: int, dtype: DataType, peer: int, stream: int) -> None: ...

    def recv(self, buffer: int, count: int, dtype: DataType, peer: int, stream: int) -> None: ...

    def send_recv(self, ops: Sequence[PointToPoint], stream: int) -> None:
        """
        A batch of sends and receives in flight together (NCCL's group of ncclSend/ncclRecv).
        """

    def __repr__(self) -> str: ...
