/* braid — C API. Every call returns a braidResult_t; braidGetLastError() gives the message of this
 * thread's last failure (the same text braid::Error carries in C++). A braid::Error maps to its code, a failed
 * host allocation (std::bad_alloc) to braidSystemError, any other C++ exception to braidInternalError with its
 * message. */
#ifndef BRAID_BRAID_H_
#define BRAID_BRAID_H_

#include <stddef.h>

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
  braidInternalError = 11
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

/* A cudaStream_t (the CUDA runtime defines it as exactly this), without including CUDA headers. */
typedef struct CUstream_st* braidStream_t;

const char* braidGetErrorString(braidResult_t result); /* name of a code */
const char* braidGetLastError(void);                   /* message of this thread's last failure, or "" */

/* Rendezvous from the environment (braid-run, torchrun, Open MPI, MPICH, Slurm). device < 0 (here and in
 * braidCommInitRank): BRAID_DEVICE where it is set, else the local rank (the rank where none is known). */
braidResult_t braidCommInitFromEnv(braidComm_t* comm, int device);
/* Explicit: every rank names the same store "host:port"; rank 0 serves it when rank0_serves_store. */
braidResult_t braidCommInitRank(braidComm_t* comm, const char* store_address, int rank, int size,
                                int rank0_serves_store, int device);
braidResult_t braidCommDestroy(braidComm_t comm);
braidResult_t braidCommRank(braidComm_t comm, int* rank);
braidResult_t braidCommSize(braidComm_t comm, int* size);
braidResult_t braidCommDevice(braidComm_t comm, int* device);
braidResult_t braidCommBarrier(braidComm_t comm);

/* Collective symmetric allocation; contiguous_view != 0 also maps a [world x stride] view. */
braidResult_t braidSymmetricAlloc(braidComm_t comm, size_t bytes, int contiguous_view, braidSymmetricMemory_t* memory);
braidResult_t braidSymmetricFree(braidSymmetricMemory_t memory);
braidResult_t braidSymmetricLocal(braidSymmetricMemory_t memory, void** pointer);
braidResult_t braidSymmetricPeer(braidSymmetricMemory_t memory, int rank, void** pointer);
braidResult_t braidSymmetricDevicePeers(braidSymmetricMemory_t memory, void* const** device_array);
/* *view: NULL unless allocated with contiguous_view. stride may be NULL; otherwise it receives the bytes between
 * consecutive ranks in the view (each rank's mapped size, also without a view). */
braidResult_t braidSymmetricView(braidSymmetricMemory_t memory, void** view, size_t* stride);

/* Point to point, stream-ordered (braid::Communicator::send / recv: a batch of one op). The k-th send to a peer
 * matches the k-th receive that peer makes from this rank; their byte sizes must agree. */
braidResult_t braidSend(braidComm_t comm, const void* buffer, size_t count, braidDataType_t datatype, int peer,
                        braidStream_t stream);
braidResult_t braidRecv(braidComm_t comm, void* buffer, size_t count, braidDataType_t datatype, int peer,
                        braidStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* BRAID_BRAID_H_ */
