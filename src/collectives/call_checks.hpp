// The one argument check of every collective and point-to-point call (C++ API, and the C API and shim over
// it): each check names the function and the argument it refuses (kInvalidArgument). A checked call goes on
// to the communicator's order and its backend unchanged, so nothing after this point checks arguments again.
// Also the small helpers the checks and the host sides of the collectives share: launch checking, byte
// arithmetic on user pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "braid/types.hpp"
#include "core/limits.hpp"
#include "collectives/selection.hpp"

namespace braid::collectives {

// Where a call runs: this rank of `world` ranks, on GPU `device`.
struct CallPlace {
  int rank;
  int world;
  int device;
};

// One call of all-reduce, reduce, reduce-scatter, all-gather, broadcast or all-to-all, as the caller made it.
// `count`: elements per rank of the call's own count argument (reduce-scatter: of the output, all-gather: of
// the input, all-to-all: of each block). `op` is used only by reductions, `root` only by reduce and broadcast.
struct CollectiveCall {
  const char* function;  // names the call in errors ("Communicator::all_reduce")
  Collective collective;
  const void* send;
  void* recv;
  size_t count;
  DataType type;
  ReduceOp op;
  int root;

  bool reduces() const;
  bool rooted() const;
  // Elements of the input and of the output on this rank, for `world` ranks (already checked not to overflow).
  size_t send_elements(int world) const;
  size_t recv_elements(int world) const;
  // Whether this rank reads the input or writes the output: only the root's input of a broadcast, and only the
  // root's output of a reduce, are used.
  bool uses_send(int rank) const;
  bool uses_recv(int rank) const;
};

// Checks `call` at `place`: a datatype and (for reductions) an operator braid applies to it, the root in range,
// byte sizes that do not overflow, and for count > 0 the buffers the call uses: not null, device memory this
// rank's GPU can use, and overlapping only in place as NCCL takes it (recv == send; reduce-scatter's recv at
// send + rank * recv_count; all-gather's send at recv + rank * send_count). Returns false for a call with
// nothing to move (count 0), which enqueues nothing.
bool validate(const CollectiveCall& call, const CallPlace& place);

// validate's overlap rule alone (it asks CUDA nothing): kInvalidArgument naming recv when the buffers the call
// uses on this rank overlap other than in place.
void check_in_place(const CollectiveCall& call, const CallPlace& place);

// An all-to-all-v with host counts, checked: every block's bytes and offset, in the launch's layout.
struct AllToAllvCall {
  const void* send;
  const size_t* send_counts;
  const size_t* send_displs;  // null: packed in rank order
  void* recv;
  const size_t* recv_counts;
  const size_t* recv_displs;  // null: packed in rank order
  DataType type;
  uint64_t send_bytes[kMaxWorld];
  uint64_t send_offset[kMaxWorld];
  uint64_t recv_bytes[kMaxWorld];
  uint64_t recv_offset[kMaxWorld];
  size_t send_extent;  // bytes from send to the end of its furthest block
  size_t recv_extent;
};

// Checks an all-to-all-v (MPI_Alltoallv's arguments, counts and displacements in elements) and lays it out.
AllToAllvCall validate_all_to_allv(const char* function, const void* send, const size_t* send_counts,
                                   const size_t* send_displs, void* recv, const size_t* recv_counts,
                                   const size_t* recv_displs, DataType type, const CallPlace& place);

// An all-to-all-v whose counts and displacements live on the device (Communicator::all_to_allv_device), checked.
struct AllToAllvDeviceCall {
  const void* send;
  const int64_t* send_counts;
  const int64_t* send_displs;  // null: packed in rank order
  void* recv;
  size_t recv_capacity_bytes;
  int64_t* recv_counts;
  int64_t* recv_displs;  // null: not written
  DataType type;
};

// Checks what the host can of an all-to-all-v with device counts: the datatype, the capacity's size, and every
// pointer (device memory of this rank's GPU; send whatever the counts turn out to be).
AllToAllvDeviceCall validate_all_to_allv_device(const char* function, const void* send, const int64_t* send_counts,
                                                const int64_t* send_displs, void* recv, size_t recv_capacity,
                                                int64_t* recv_counts, int64_t* recv_displs, DataType type,
                                                const CallPlace& place);

// One op of a point-to-point batch, checked: its direction, peer, buffer and size in bytes.
struct CheckedOp {
  bool send;
  int peer;
  char* buffer;
  size_t bytes;
};

// A point-to-point batch of `op_count` ops, checked: every op's kind, peer, datatype, size and buffer, and every
// send to this rank matched by a receive from it of the same size. `single`: send() or recv(), whose errors
// name their own parameters ("peer"); otherwise errors name the op ("ops[2].peer").
struct PointToPointBatch {
  const PointToPoint* ops;
  size_t count;
  std::vector<CheckedOp> checked;
};
PointToPointBatch validate_point_to_point(const char* function, bool single, const PointToPoint* ops, size_t op_count,
                                          const CallPlace& place);

// Bytes of one element of `type`; a value outside the enum is refused naming the argument `argument`.
size_t element_size(const char* function, DataType type, const char* argument = "type");

// a * b, refusing a product that overflows, naming the argument.
size_t checked_product(const char* function, const char* argument, size_t a, size_t b);

// A buffer `bytes` long: none needed when bytes is 0; otherwise not null, and (check_device_pointer) device memory
// of `device`.
void check_buffer(const char* function, const void* pointer, const char* argument, size_t bytes, int device);

// A device pointer this rank's GPU can use: device memory of this GPU, or a mapping made here (symmetric
// memory, peer mappings). Host memory, unknown pointers and other GPUs' cudaMalloc memory are refused
// (kInvalidArgument) naming `function` and `argument`. Nothing is asked of CUDA, and nothing refused, where
// BRAID_CHECK_POINTERS=off (pointer_checks_on).
void check_device_pointer(const char* function, const void* pointer, const char* argument, int device);

// BRAID_CHECK_POINTERS of the process environment, read once: whether check_device_pointer asks CUDA.
bool pointer_checks_on();


inline const char* at(const void* base, size_t bytes) { return static_cast<const char*>(base) + bytes; }
inline char* at(void* base, size_t bytes) { return static_cast<char*>(base) + bytes; }

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace braid::collectives
