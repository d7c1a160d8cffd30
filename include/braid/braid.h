/* braid — C API. Every call returns a braidResult_t; braidGetLastError() gives the message of this
 * thread's last failure (the same text braid::Error carries in C++). A braid::Error maps to its code, a failed
 * host allocation (std::bad_alloc) to braidSystemError, any other C++ exception to braidInternalError with its
 * message. Refusals past the C layer's own NULL checks come from the C++ call it wraps and name that call and its
 * arguments (Communicator::all_reduce, 'recv', 'send_count'; MoeBuffer::create, 'shape.type'): braid.hpp has them.
 * No call changes the calling thread's current CUDA device: make the communicator's device (braidCommDevice)
 * current before allocating its buffers or creating its streams; buffers must be memory of that GPU
 * (braidInvalidArgument otherwise, unless BRAID_CHECK_POINTERS=off). */
#ifndef BRAID_BRAID_H_
#define BRAID_BRAID_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as braid::ErrorCode. */
typedef enum {
  braidSuccess = 0,
  braidInvalidArgument = 1,
  braidNoDevice = 2,
  braidCudaError = 3,
  braidDriverError = 4,
  braidSystemError = 5,
  braidTimeout = 6,
  braidPeerUnreachable = 7,
  braidMismatch = 8,
  braidUnsupported = 9,
  braidRemoteError = 10,
  braidInternalError = 11,
  braidAborted = 12,
  braidRevoked = 13
} braidResult_t;

typedef struct braidComm* braidComm_t;
typedef struct braidSymmetricMemory* braidSymmetricMemory_t;

/* Same values as braid::DataType. */
typedef enum {
  braidInt8 = 0,
  braidUint8 = 1,
  braidInt32 = 2,
  braidUint32 = 3,
  braidInt64 = 4,
  braidUint64 = 5,
  braidFloat16 = 6,
  braidFloat32 = 7,
  braidFloat64 = 8,
  braidBfloat16 = 9,
  braidFloat8e4m3 = 10,
  braidFloat8e5m2 = 11
} braidDataType_t;

/* Same values as braid::ReduceOp. braidAvg: the sum divided by the number of ranks, once, at the end (integers: the
 * sum wraps in the type's width and the division truncates toward zero, as ncclAvg; on the NCCL backend, NCCL's
 * own avg). */
typedef enum { braidSum = 0, braidProd = 1, braidMax = 2, braidMin = 3, braidAvg = 4 } braidRedOp_t;

/* A cudaStream_t (the CUDA runtime defines it as exactly this), without including CUDA headers. */
typedef struct CUstream_st* braidStream_t;

typedef struct braidRegisteredBuffer* braidRegisteredBuffer_t;
typedef struct braidExportedHandle* braidExportedHandle_t;
typedef struct braidImportedMemory* braidImportedMemory_t;
typedef struct braidGlobalMemory* braidGlobalMemory_t;

/* One op of a braidSendRecv batch (braid::PointToPoint): count elements of datatype at buffer. */
typedef enum { braidP2PSend = 0, braidP2PRecv = 1 } braidP2PKind_t;
typedef struct {
  braidP2PKind_t kind;
  int peer;
  void* buffer; /* braidP2PSend: read; braidP2PRecv: written */
  size_t count;
  braidDataType_t datatype;
} braidP2POp_t;

/* A short description of a code ("invalid argument", "timeout", ...; "unknown error" for a value that is none). */
const char* braidGetErrorString(braidResult_t result);
/* The message of this thread's last failure, or "": valid until this thread's next failing call. */
const char* braidGetLastError(void);

/* A communicator is driven by one host thread at a time (as in NCCL); braidCommAbort and braidCommRevoke may come
 * from any thread. Constructors (braidCommInit*, braidCommShrink, braidSymmetricAlloc, braidRegisterBuffer,
 * braidExportHandle, braidImportHandle, braidImportGlobal, braidMoeBufferCreate, braidFusedMatmulCreate) set their
 * out-parameter to NULL when they fail; other calls leave their out-parameters unchanged when they fail. A NULL
 * handle is braidInvalidArgument naming it, except in the calls that destroy or free one (braidCommDestroy,
 * braidSymmetricFree, braidDeregisterBuffer, braidExportedHandleFree, braidImportedMemoryFree, braidGlobalMemoryFree,
 * braidMoeBufferFree, braidFusedMatmulFree), which return braidSuccess for NULL. The C calls refuse a NULL handle,
 * out-parameter, or the host arrays the C layer reads (braidAllToAllv[Device]'s sendcounts and recvcounts,
 * braidSendRecv's ops, braidCommShrink's excluded, braidImportHandle's blob, braidMoeCopyExpertCounts' host_counts;
 * and braidMoeCombine's weighted) before anything else, ahead of a recorded fatal failure (braidImportGlobal's mine
 * aside: see there); buffers and device arrays are the C++ call's to check, after a recorded fatal failure. On the
 * NCCL backend (BRAID_BACKEND=nccl, or ranks the CUDA backend cannot serve) braidSymmetricAlloc, braidAllToAllvDevice,
 * braidImportGlobal, braidAllToAllGlobal, braidMoeBufferCreate, braidFusedMatmulCreate and braidCommRevoke return
 * braidUnsupported (braidAllToAllvDevice and braidAllToAllGlobal after a recorded fatal failure and the shared-GPU
 * stream check, which come first). */

/* Rendezvous from the environment (braid-run, torchrun, Open MPI, MPICH, Slurm). device < 0 (here and in
 * braidCommInitRank): BRAID_DEVICE where it is set, else the local rank (the rank where none is known; modulo the
 * GPUs this process sees with BRAID_ALLOW_SHARED_GPU=1). */
braidResult_t braidCommInitFromEnv(braidComm_t* comm, int device);
/* Explicit: every rank names the same store "host:port" (port not 0: braidInvalidArgument naming store_address);
 * rank 0 serves it when its rank0_serves_store is non-zero (the other ranks' flags are not read), and the port must
 * then be free there; where rank 0's is 0, another process must serve that store (the C API starts none), else
 * init fails after the timeout. size >= 1 and 0 <= rank < size (braidInvalidArgument); at most 16 ranks
 * (braidUnsupported). */
braidResult_t braidCommInitRank(braidComm_t* comm, const char* store_address, int rank, int size,
                                int rank0_serves_store, int device);
braidResult_t braidCommDestroy(braidComm_t comm);
braidResult_t braidCommRank(braidComm_t comm, int* rank);
braidResult_t braidCommSize(braidComm_t comm, int* size);
braidResult_t braidCommDevice(braidComm_t comm, int* device);
braidResult_t braidCommBarrier(braidComm_t comm);

/* Collective symmetric allocation, zeroed: every rank calls it with the same bytes >= 1, which the ranks exchange
 * first; then a rank that asked for 0 gets braidInvalidArgument and the others braidMismatch, as do ranks whose
 * sizes differ. contiguous_view != 0 also maps a [world x stride] view. The memory stays valid after
 * braidCommDestroy, and braidSymmetricFree may come after it. */
braidResult_t braidSymmetricAlloc(braidComm_t comm, size_t bytes, int contiguous_view, braidSymmetricMemory_t* memory);
braidResult_t braidSymmetricFree(braidSymmetricMemory_t memory);
braidResult_t braidSymmetricLocal(braidSymmetricMemory_t memory, void** pointer);
braidResult_t braidSymmetricPeer(braidSymmetricMemory_t memory, int rank, void** pointer);
braidResult_t braidSymmetricDevicePeers(braidSymmetricMemory_t memory, void* const** device_array);
/* *view: NULL unless allocated with contiguous_view. stride may be NULL; otherwise it receives the bytes between
 * consecutive ranks in the view (each rank's mapped size, also without a view). */
braidResult_t braidSymmetricView(braidSymmetricMemory_t memory, void** view, size_t* stride);

/* Collectives, stream-ordered and CUDA-graph capturable, with NCCL's argument order and the rules of
 * braid::Communicator's (braid.hpp): every rank calls them in the same order with the same count, datatype, op and
 * root; in place as NCCL takes it (braidAllToAllv and braidAllToAllvDevice never in place: braidAllToAllv's
 * overlapping send and receive extents are braidInvalidArgument, and braidAllToAllvDevice's where sendbuff's first
 * byte lies in recvbuff's recvcapacity elements, its send extent being known on the device only); a count of 0
 * moves nothing and checks no buffer. A fatal failure on
 * the GPU (a peer that never arrives, ranks that disagree on a call's plan) is returned by every later call that
 * takes a stream and by braidCommCheck; data a kernel refused (braidCommCheck below) only by braidCommCheck. */
braidResult_t braidAllReduce(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, braidRedOp_t op, braidStream_t stream);
braidResult_t braidReduce(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t count,
                          braidDataType_t datatype, braidRedOp_t op, int root, braidStream_t stream);
braidResult_t braidReduceScatter(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t recvcount,
                                 braidDataType_t datatype, braidRedOp_t op, braidStream_t stream);
braidResult_t braidAllGather(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t sendcount,
                             braidDataType_t datatype, braidStream_t stream);
braidResult_t braidBroadcast(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, int root, braidStream_t stream);
/* sendbuff holds one block of count elements for every rank (braid::Communicator::all_to_all). */
braidResult_t braidAllToAll(braidComm_t comm, const void* sendbuff, void* recvbuff, size_t count,
                            braidDataType_t datatype, braidStream_t stream);
/* MPI_Alltoallv's shape: host arrays of one entry per rank, in elements; NULL displacements: packed in rank
 * order (braid::Communicator::all_to_allv). */
braidResult_t braidAllToAllv(braidComm_t comm, const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                             void* recvbuff, const size_t* recvcounts, const size_t* rdispls, braidDataType_t datatype,
                             braidStream_t stream);
/* The send counts (and displacements, or NULL) in device memory as int64 elements; what arrives is packed into
 * recvbuff (recvcapacity elements), its counts written to the device array recvcounts (required) and its offsets
 * to the device array rdispls (may be NULL) (braid::Communicator::all_to_allv_device). sendbuff must be device
 * memory even where every count turns out 0. */
braidResult_t braidAllToAllvDevice(braidComm_t comm, const void* sendbuff, const int64_t* sendcounts,
                                   const int64_t* sdispls, void* recvbuff, size_t recvcapacity, int64_t* recvcounts,
                                   int64_t* rdispls, braidDataType_t datatype, braidStream_t stream);
/* Returns a failure a kernel of this communicator recorded (braid::Communicator::check): a fatal one (timeout,
 * mismatch, a peer's process that exited, braidAborted after braidCommAbort) every time, refused data once. Does
 * not synchronise. */
braidResult_t braidCommCheck(braidComm_t comm);
/* Aborts this rank's use of the communicator from any thread (braid::Communicator::abort): its waits end; then
 * braidCommCheck and every call that takes a stream return braidAborted (unless another fatal failure was recorded
 * first, which they return instead), on more than one rank every call that waits on the store (braidCommBarrier,
 * braidSymmetricAlloc, braidMoeBufferCreate; the latter two return braidUnsupported on the NCCL backend) returns
 * braidAborted, whatever was recorded before, while
 * braidCommRank, braidCommSize and braidCommDevice still succeed and braidCommShrink still works.
 * Local. Then braidCommDestroy. braidInvalidArgument for a NULL comm. */
braidResult_t braidCommAbort(braidComm_t comm);
/* Revokes the communicator for every rank (braid::Communicator::revoke): within about 10 ms every rank's waits
 * on the GPU end, and braidCommCheck and every call that takes a stream return braidRevoked on every rank (a rank
 * where another fatal failure was recorded first returns that one); on more than one rank every call waiting on
 * the store or a peer's fd (braidCommBarrier, braidSymmetricAlloc, braidMoeBufferCreate, a registration's
 * exposure), now or later, returns the same, or braidAborted after braidCommAbort. braidCommShrink still works.
 * braidUnsupported on the NCCL backend. */
braidResult_t braidCommRevoke(braidComm_t comm);
/* A new communicator of the ranks not in excluded[0..count) (braid::Communicator::shrink): collective over the
 * survivors alone. *newcomm is NULL on failure. */
braidResult_t braidCommShrink(braidComm_t comm, const int* excluded, size_t count, braidComm_t* newcomm);

/* Point to point, stream-ordered (braid::Communicator::send / recv: a batch of one op). The k-th send to a peer
 * matches the k-th receive that peer makes from this rank; their byte sizes must agree. A count of 0 still pairs
 * with the peer's op. */
braidResult_t braidSend(braidComm_t comm, const void* buffer, size_t count, braidDataType_t datatype, int peer,
                        braidStream_t stream);
braidResult_t braidRecv(braidComm_t comm, void* buffer, size_t count, braidDataType_t datatype, int peer,
                        braidStream_t stream);

/* NCCL's group of sends and receives: every op of the batch in flight together (braid::Communicator::send_recv).
 * ops may be NULL when count is 0. */
braidResult_t braidSendRecv(braidComm_t comm, const braidP2POp_t* ops, size_t count, braidStream_t stream);

/* User buffers served zero copy (braid::Communicator::register_buffer). braidDeregisterBuffer releases the
 * registration and frees the handle (braid::RegisteredBuffer's destruction); it may come after braidCommDestroy,
 * and returns braidSuccess: a failure to withdraw the range from the peers is logged, not returned. Free a
 * registered cudaMalloc buffer only after every rank has deregistered it (braid.hpp, Freeing). */
braidResult_t braidRegisterBuffer(braidComm_t comm, void* pointer, size_t bytes, braidRegisteredBuffer_t* buffer);
braidResult_t braidDeregisterBuffer(braidRegisteredBuffer_t buffer);

/* Memory handles between processes of this host (braid::export_handle, braid::import_handle). The blob is
 * *size bytes at *blob, valid while the handle lives; device -1: the current device (below -1, or not a
 * device this process sees: braidInvalidArgument; braidNoDevice where this process sees no device at all). */
braidResult_t braidExportHandle(const void* pointer, size_t bytes, int device, braidExportedHandle_t* handle);
braidResult_t braidExportedBlob(braidExportedHandle_t handle, const void** blob, size_t* size);
braidResult_t braidExportedHandleFree(braidExportedHandle_t handle);
braidResult_t braidImportHandle(const void* blob, size_t size, int device, braidImportedMemory_t* memory);
/* bytes may be NULL (here and in braidGlobalPeer). */
braidResult_t braidImportedPointer(braidImportedMemory_t memory, void** pointer, size_t* bytes);
braidResult_t braidImportedMemoryFree(braidImportedMemory_t memory);

/* Every rank's exported range mapped here, and one-sided copies into and out of it (braid::Communicator::
 * import_global, put, get, and all_to_all over it). braidGlobalMemoryFree may come after braidCommDestroy. A NULL
 * mine is taken as an empty handle: on the CUDA backend it is refused (braidInvalidArgument naming mine) after the
 * ranks' exchange, so every rank fails at once (the others braidMismatch); on the NCCL backend the call returns
 * braidUnsupported first. */
braidResult_t braidImportGlobal(braidComm_t comm, braidExportedHandle_t mine, braidGlobalMemory_t* memory);
braidResult_t braidGlobalPeer(braidGlobalMemory_t memory, int rank, void** pointer, size_t* bytes);
braidResult_t braidGlobalMemoryFree(braidGlobalMemory_t memory);
braidResult_t braidPut(braidComm_t comm, braidGlobalMemory_t memory, int peer, size_t offset, const void* source,
                       size_t bytes, braidStream_t stream);
braidResult_t braidGet(braidComm_t comm, braidGlobalMemory_t memory, int peer, size_t offset, void* destination,
                       size_t bytes, braidStream_t stream);
braidResult_t braidAllToAllGlobal(braidComm_t comm, braidGlobalMemory_t sendmemory, void* recvbuff, size_t count,
                                  braidDataType_t datatype, braidStream_t stream);

/* ---- MoE dispatch and combine (braid::MoeBuffer; docs/moe.md) ---- */
typedef struct braidMoeBuffer* braidMoeBuffer_t;
typedef enum { braidMoeExpertMajor = 0, braidMoeRankMajor = 1 } braidMoeLayout_t;
/* braid::MoeShape field for field; braidMoeShapeDefaults fills the defaults (bfloat16 rows, int64 ids, alignment
 * 1, expert-major), after which the caller sets hidden, max_tokens, top_k and experts. dispatch_datatype equal to
 * datatype: dispatch moves datatype rows; braidFloat8e4m3 or braidFloat8e5m2: fp8 rows with float32 scales; any
 * other value is braidInvalidArgument naming shape.dispatch_type (a caller who changes datatype sets
 * dispatch_datatype too). Every field is checked as braid::MoeBuffer::create checks it, inside the ranks' exchange
 * of shapes: a rank whose shape is refused returns braidInvalidArgument, and its peers braidMismatch, at once. */
typedef struct {
  size_t hidden;
  braidDataType_t datatype;
  braidDataType_t dispatch_datatype;
  braidDataType_t index_datatype;
  size_t max_tokens;
  int top_k;
  int experts;
  int expert_alignment;
  size_t capacity_rows;
  braidMoeLayout_t layout;
  int max_sms;
  int low_latency;
} braidMoeShape_t;
/* braid::MoeDispatchOutput: device views of the buffer, valid until the next dispatch; handle names the dispatch. */
typedef struct {
  void* x;
  const float* scales;
  const int64_t* expert_counts;
  const int64_t* expert_offsets;
  const float* weights;
  const int32_t* local_expert;
  const int32_t* source_rank;
  const int32_t* source_token;
  const int64_t* received_tokens;
  const int32_t* topk_expert;
  const float* topk_weights;
  void* combine_input;
  size_t capacity_rows;
  int local_experts;
  uint64_t handle;
} braidMoeDispatchOutput_t;
braidResult_t braidMoeShapeDefaults(braidMoeShape_t* shape);
/* Collective (braid::MoeBuffer::create). braidMoeBufferFree frees it at once, waiting for no peer (cudaFree waits
 * for this rank's GPU): call it only once no rank's call on it is in flight. The buffer holds its own reference to the communicator's state, so it
 * may come after braidCommDestroy. */
braidResult_t braidMoeBufferCreate(braidComm_t comm, const braidMoeShape_t* shape, braidMoeBuffer_t* buffer);
braidResult_t braidMoeBufferFree(braidMoeBuffer_t buffer);
braidResult_t braidMoeCapacityRows(braidMoeBuffer_t buffer, size_t* rows);
/* braid::MoeBuffer::dispatch: x_scales NULL unless the shape dispatches fp8; num_tokens_device NULL, or a device
 * int64 read instead of num_tokens. */
braidResult_t braidMoeDispatch(braidMoeBuffer_t buffer, const void* x, const float* x_scales, const void* topk_idx,
                               const float* topk_weights, size_t num_tokens, const int64_t* num_tokens_device,
                               braidStream_t stream, braidMoeDispatchOutput_t* output);
/* braid::MoeBuffer::combine of the last dispatch; weighted: 0 or 1 (another value: braidInvalidArgument; 1 is
 * refused on rank-major buffers). */
braidResult_t braidMoeCombine(braidMoeBuffer_t buffer, const void* y, void* out, int weighted, braidStream_t stream);
/* braid::MoeBuffer::redispatch (rank-major): new rows on the routing of the dispatch `handle` names, which must be
 * the buffer's last routed one. */
braidResult_t braidMoeRedispatch(braidMoeBuffer_t buffer, uint64_t handle, const void* x, const float* x_scales,
                                 braidStream_t stream, braidMoeDispatchOutput_t* output);
/* braid::MoeBuffer::copy_expert_counts: the last dispatch's [local_experts] int64 counts into host memory, on
 * stream. The split calls of braid::MoeHook have no C form. */
braidResult_t braidMoeCopyExpertCounts(braidMoeBuffer_t buffer, int64_t* host_counts, braidStream_t stream);

/* ---- GEMMs with their collective hidden under them (braid::FusedMatmul; docs/overlap.md) ---- */
typedef struct braidFusedMatmul* braidFusedMatmul_t;
/* Same values as braid::Layout: how a K x N matrix B is stored, dense and row-major either way. */
typedef enum { braidLayoutRowMajor = 0, braidLayoutTransposed = 1 } braidLayout_t;
/* Local (braid::FusedMatmul::create; loads cuBLASLt; the CUDA backend only). It holds its own reference to the
 * communicator's state, so braidFusedMatmulFree may come after braidCommDestroy; it waits for the side stream. */
braidResult_t braidFusedMatmulCreate(braidComm_t comm, braidFusedMatmul_t* fused);
braidResult_t braidFusedMatmulFree(braidFusedMatmul_t fused);
/* Collective (braid::FusedMatmul::reserve): the symmetric workspace holds at least bytes (before a graph capture). */
braidResult_t braidFusedMatmulReserve(braidFusedMatmul_t fused, size_t bytes);
braidResult_t braidFusedMatmulWorkspaceBytes(braidFusedMatmul_t fused, size_t* bytes);
/* braid::FusedMatmul::all_gather_matmul: out [rows * size, n] = the ranks' a_shard [rows, k] gathered, times B;
 * a_gathered NULL or [rows * size, k]. braidBfloat16 or braidFloat16. */
braidResult_t braidAllGatherMatmul(braidFusedMatmul_t fused, const void* a_shard, size_t rows, size_t k, const void* b,
                                   braidLayout_t b_layout, size_t n, void* out, void* a_gathered,
                                   braidDataType_t type, braidStream_t stream);
/* braid::FusedMatmul::matmul_reduce_scatter: out [m / size, n] = block rank of the sum (braidSum) or mean
 * (braidAvg) over ranks of a [m, k] times B. */
braidResult_t braidMatmulReduceScatter(braidFusedMatmul_t fused, const void* a, size_t m, size_t k, const void* b,
                                       braidLayout_t b_layout, size_t n, void* out, braidDataType_t type,
                                       braidRedOp_t op, braidStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* BRAID_BRAID_H_ */
