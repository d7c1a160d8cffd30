# Typing stub of the extension braid._braid: made by `python -m nanobind.stubgen -m braid._braid`, then the
# *_buffer(), *_array() and MoeBuffer.arrays() results typed Any (DLPack arrays: pass them to torch.from_dlpack).
# python/tests/test_stub.py checks that it names what the module holds.
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
        The contiguous view: world_size * view_stride uint8 on this rank's GPU (DLPack). Raises braid.Error (INVALID_ARGUMENT) where the memory was allocated without contiguous_view.
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
        Frees the communicator (later calls raise braid.Error): now, or, where another thread is inside one of its
        calls, when that call returns. Symmetric memory made from it stays valid.
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
        """A line for this rank, then a line per other rank."""

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
        Raises what a kernel recorded (a timeout, a plan mismatch, a peer process that exited, an abort, refused data); does not synchronise.
        """

    def abort(self) -> None:
        """
        Aborts this rank's use of the communicator from any thread: its waits end; check() and every later call that takes a stream raise ABORTED (unless another fatal failure came first). Local (the peers are not told). Raises only on a destroyed communicator.
        """

    def shrink(self, excluded: Sequence[int]) -> Communicator:
        """
        Collective over the ranks not in `excluded` (they alone call it): a new communicator of theirs, ranks in their old order, through this one's store. Works after a failure; revoke first.
        """

    def revoke(self) -> None:
        """
        Revokes the communicator for every rank: within about 10 ms every rank's waits end; check() and every later call that takes a stream raise REVOKED (unless another fatal failure came first). CUDA backend only.
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
        MPI_Alltoallv's shape: host lists of one count (and displacement) per rank, in elements; None displacements: packed in rank order. send_counts and recv_counts are required: None, or a length other than the world size, raises braid.Error (INVALID_ARGUMENT) naming them.
        """

    def all_to_allv_device(self, send: int, send_counts: int, send_displs: int, recv: int, recv_capacity: int, recv_counts: int, recv_displs: int, dtype: DataType, stream: int) -> None:
        """
        All-to-all-v with the send counts in device memory (int64, one per rank, in elements; decided on the GPU, capturable): send_displs a device array or 0 (packed). What arrives is packed in rank order into recv (recv_capacity elements); the counts received are written to the device array recv_counts and their offsets to recv_displs (or 0). A total above the capacity writes nothing into recv; check() reports it.
        """

    def send(self, buffer: int, count: int, dtype: DataType, peer: int, stream: int) -> None: ...

    def recv(self, buffer: int, count: int, dtype: DataType, peer: int, stream: int) -> None: ...

    def send_recv(self, ops: Sequence[PointToPoint], stream: int) -> None:
        """
        A batch of sends and receives in flight together (NCCL's group of ncclSend/ncclRecv).
        """

    def __repr__(self) -> str: ...

MAX_TOP_K: int = 16

MOE_MAX_EXPERTS: int = 1024

MOE_SCALE_COLUMNS: int = 128

class MoeLayout(enum.Enum):
    """How dispatch lays out the rows a rank receives (braid::MoeLayout)."""

    EXPERT_MAJOR = 0

    RANK_MAJOR = 1

class MoeShape:
    """
    What a MoeBuffer is made for (braid::MoeShape); every rank passes the same.
    """

    def __init__(self) -> None: ...

    @property
    def hidden(self) -> int: ...

    @hidden.setter
    def hidden(self, arg: int, /) -> None: ...

    @property
    def type(self) -> DataType: ...

    @type.setter
    def type(self, arg: DataType, /) -> None: ...

    @property
    def dispatch_type(self) -> DataType | None: ...

    @dispatch_type.setter
    def dispatch_type(self, arg: DataType | None, /) -> None: ...

    @property
    def index_type(self) -> DataType: ...

    @index_type.setter
    def index_type(self, arg: DataType, /) -> None: ...

    @property
    def max_tokens(self) -> int: ...

    @max_tokens.setter
    def max_tokens(self, arg: int, /) -> None: ...

    @property
    def top_k(self) -> int: ...

    @top_k.setter
    def top_k(self, arg: int, /) -> None: ...

    @property
    def experts(self) -> int: ...

    @experts.setter
    def experts(self, arg: int, /) -> None: ...

    @property
    def expert_alignment(self) -> int: ...

    @expert_alignment.setter
    def expert_alignment(self, arg: int, /) -> None: ...

    @property
    def capacity_rows(self) -> int: ...

    @capacity_rows.setter
    def capacity_rows(self, arg: int, /) -> None: ...

    @property
    def layout(self) -> MoeLayout: ...

    @layout.setter
    def layout(self, arg: MoeLayout, /) -> None: ...

    @property
    def max_sms(self) -> int: ...

    @max_sms.setter
    def max_sms(self, arg: int, /) -> None: ...

    @property
    def low_latency(self) -> bool: ...

    @low_latency.setter
    def low_latency(self, arg: bool, /) -> None: ...

    def __repr__(self) -> str: ...

class MoeHandle:
    """Names one routed dispatch of a MoeBuffer (braid::MoeHandle)."""

    def __init__(self) -> None: ...

    @property
    def dispatch(self) -> int:
        """The buffer's routed dispatches up to and including this one."""

    @dispatch.setter
    def dispatch(self, arg: int, /) -> None: ...

    def __repr__(self) -> str: ...

class MoeHook:
    """
    The receiving half of a rank-major dispatch, redispatch or combine called with it (braid::MoeHook). Valid while its MoeBuffer lives.
    """

    def __init__(self) -> None: ...

    @property
    def pending(self) -> bool:
        """Whether a receiving half is still to be enqueued."""

    def receive(self, stream: int) -> None:
        """Enqueues the receiving half on `stream`; once per hook."""

class MoeDispatchOutput:
    """
    What dispatch returns (braid::MoeDispatchOutput): addresses of views of the buffer's memory, 0 for fields of the other layout.
    """

    @property
    def x(self) -> int: ...

    @property
    def scales(self) -> int: ...

    @property
    def expert_counts(self) -> int: ...

    @property
    def expert_offsets(self) -> int: ...

    @property
    def weights(self) -> int: ...

    @property
    def local_expert(self) -> int: ...

    @property
    def source_rank(self) -> int: ...

    @property
    def source_token(self) -> int: ...

    @property
    def received_tokens(self) -> int: ...

    @property
    def topk_expert(self) -> int: ...

    @property
    def topk_weights(self) -> int: ...

    @property
    def combine_input(self) -> int: ...

    @property
    def capacity_rows(self) -> int: ...

    @property
    def local_experts(self) -> int: ...

    @property
    def handle(self) -> MoeHandle: ...

class MoeBuffer:
    """
    Symmetric buffers for one MoE shape class on one communicator (braid::MoeBuffer). Buffers are device addresses, streams cudaStream_t ints.
    """

    @staticmethod
    def create(comm: Communicator, shape: MoeShape) -> MoeBuffer:
        """
        Collective over comm's ranks, every rank with the same shape. The buffer keeps comm alive.
        """

    @staticmethod
    def worst_case_rows(shape: MoeShape, world: int) -> int:
        """Receive rows that no routing can exceed."""

    @staticmethod
    def symmetric_bytes(shape: MoeShape, world: int) -> int:
        """
        Symmetric memory one MoeBuffer of this shape holds on each rank; validates the shape.
        """

    @property
    def shape(self) -> MoeShape: ...

    @property
    def capacity_rows(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def device(self) -> int: ...

    def dispatch(self, x: int, x_scales: int, topk_idx: int, topk_weights: int, num_tokens: int, num_tokens_device: int, stream: int, hook: MoeHook | None = None) -> MoeDispatchOutput:
        """
        x_scales 0 unless the shape dispatches fp8; num_tokens_device 0: T is num_tokens.
        """

    def redispatch(self, handle: MoeHandle, x: int, x_scales: int, stream: int, hook: MoeHook | None = None) -> MoeDispatchOutput:
        """Rank-major: new rows with the routing of the dispatch `handle` names."""

    def combine(self, y: int, out: int, weighted: bool, stream: int, hook: MoeHook | None = None, handle: MoeHandle | None = None) -> None:
        """
        For the tokens of the last dispatch (or the one `handle` names, which must be the last).
        """

    def copy_expert_counts(self, host_counts: int, stream: int) -> None:
        """
        One cudaMemcpyAsync of the last dispatch's expert_counts into host memory (pinned: capturable).
        """

    def arrays(self, output: MoeDispatchOutput) -> dict[str, Any]:
        """
        Each non-null field of a dispatch's output as uint8 DLPack arrays (of the byte sizes moe.hpp gives them) on this rank's GPU, each holding this buffer.
        """

    def __repr__(self) -> str: ...

class SignalPad:
    """
    A signal pad for your kernels (braid/device/sync_device.hpp), made collectively on a communicator with `channels` channels: addresses as integers, arrays as DLPack int64.
    """

    def __init__(self, comm: Communicator, channels: int) -> None:
        """Collective: every rank, the same channels."""

    @property
    def local(self) -> int:
        """This rank's counters: uint64 [channels][world], then the plan words."""

    @property
    def peers(self) -> int:
        """
        A device array of world pointers: every rank's counters as mapped here.
        """

    @property
    def expected(self) -> int:
        """
        uint64 [channels][world] of this rank's device memory: the counts its waits waited for.
        """

    @property
    def error(self) -> int:
        """The fatal ErrorWord (host-mapped), as kernels address it."""

    @property
    def data_error(self) -> int:
        """The data-error ErrorWord (host-mapped), as kernels address it."""

    @property
    def rank(self) -> int: ...

    @property
    def world(self) -> int: ...

    @property
    def channels(self) -> int: ...

    @property
    def timeout_ns(self) -> int: ...

    @property
    def device(self) -> int: ...

    @property
    def struct(self) -> bytes:
        """The braid::device::SignalPad itself, to pass a kernel by value."""

    @property
    def device_struct(self) -> int:
        """
        A copy of the struct in device memory, for a kernel that takes `const SignalPad*`.
        """

    def counters_array(self) -> Any:
        """
        This rank's counters, [channels * world] int64 (slot c * world + q: signals received from q on c).
        """

    def expected_array(self) -> Any:
        """This rank's expected counts, [channels * world] int64."""

    def peers_array(self) -> Any:
        """
        Every rank's counters' address as mapped here, [world] int64 on the GPU.
        """

    def check(self) -> None:
        """
        Raises braid.Error for a failure a kernel recorded in this pad: a timeout (TIMEOUT) or a barrier's plan mismatch (MISMATCH), both recorded for good, or a data error (cleared once raised).
        """

    def __repr__(self) -> str: ...

SIGNAL_PAD_STRUCT_BYTES: int = 72

class Layout(enum.Enum):
    """
    How a K x N matrix B is stored (braid::Layout): ROW_MAJOR [K, N], or TRANSPOSED [N, K] (a torch Linear layer's weight).
    """

    ROW_MAJOR = 0

    TRANSPOSED = 1

class FusedMatmul:
    """
    GEMMs fused with their collective on one communicator (braid::FusedMatmul): a cuBLASLt handle, a side stream and a symmetric workspace that grows to the largest call. Matrices are dense row-major device addresses, streams cudaStream_t ints.
    """

    def __init__(self, comm: Communicator) -> None:
        """
        Local (no peer takes part). comm must use the CUDA backend; cuBLASLt is loaded at run time. The object keeps comm alive.
        """

    def all_gather_matmul(self, a_shard: int, rows: int, k: int, b: int, b_layout: Layout, n: int, out: int, a_gathered: int, dtype: DataType, stream: int) -> None:
        """
        Collective: out [rows * size, n] = all_gather(a_shard [rows, k]) x B (k x n, stored as b_layout says); a_gathered 0, or [rows * size, k] that receives the gathered A.
        """

    def matmul_reduce_scatter(self, a: int, m: int, k: int, b: int, b_layout: Layout, n: int, out: int, dtype: DataType, op: ReduceOp, stream: int) -> None:
        """
        Collective: out [m / size, n] = block rank() of op (SUM or AVG) over the ranks of a [m, k] x B; m must divide by the world size.
        """

    def reserve(self, bytes: int) -> None:
        """
        Collective: grows the symmetric workspace to at least `bytes` now (workspace_bytes after an eager call of the largest shape is what that shape needs). Not inside a graph capture.
        """

    @property
    def workspace_bytes(self) -> int:
        """The symmetric workspace's bytes on this rank now."""

    @property
    def epilogue_reduce_scatters(self) -> int:
        """
        The matmul_reduce_scatter calls run as one launch of braid's Hopper GEMM with the reduce-scatter in its epilogue (BRAID_MATMUL_REDUCE_SCATTER=epilogue or engines), captured ones counted once at capture.
        """

    @property
    def all_gathers_under_loads(self) -> int:
        """
        The all_gather_matmul calls run as one launch of braid's Hopper GEMM with the all-gather under its loads (BRAID_ALL_GATHER_MATMUL=loads), captured ones counted once at capture.
        """

    @property
    def device(self) -> int:
        """CUDA ordinal of the communicator's GPU."""

    def close(self) -> None:
        """
        Frees the cuBLASLt handle, the side stream and the workspace now (later calls raise braid.Error).
        """

    @property
    def closed(self) -> bool: ...

    def __repr__(self) -> str: ...
