// The one argument check of every collective and point-to-point call (C++ API, C API, shim): each refusal
// (kInvalidArgument) names the function and the argument; nothing after it checks arguments again. Also byte
// arithmetic on user pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "braid/types.hpp"
#include "core/limits.hpp"
#include "collectives/selection.hpp"

namespace braid::collectives {

struct CallPlace {
  int rank;
  int world;
  int device;
};

// One collective call as the caller made it. `count`: elements, as the call counts (reduce-scatter: the output,
// all-gather: the input, all-to-all: each block). `op` only for reductions, `root` for reduce and broadcast.
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
  // Elements of the input and output, for `world` ranks (checked not to overflow).
  size_t send_elements(int world) const;
  size_t recv_elements(int world) const;
  // Only the root's input of a broadcast, and the root's output of a reduce, are used.
  bool uses_send(int rank) const;
  bool uses_recv(int rank) const;
};

// Checks the datatype and op, the root, byte sizes, and for count > 0 the buffers used: not null, device memory
// of this GPU, overlapping only in place (check_in_place). False for count 0: nothing to enqueue.
bool validate(const CollectiveCall& call, const CallPlace& place);

// Asks CUDA nothing. In place as NCCL takes it: recv == send; reduce-scatter's recv at send + rank * recv_count;
// all-gather's send at recv + rank * send_count.
void check_in_place(const CollectiveCall& call, const CallPlace& place);

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

// MPI_Alltoallv's arguments (counts and displacements in elements).
AllToAllvCall validate_all_to_allv(const char* function, const void* send, const size_t* send_counts,
                                   const size_t* send_displs, void* recv, const size_t* recv_counts,
                                   const size_t* recv_displs, DataType type, const CallPlace& place);

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

// Checks what the host can: the datatype, the capacity, every pointer (send whatever the counts turn out to be).
AllToAllvDeviceCall validate_all_to_allv_device(const char* function, const void* send, const int64_t* send_counts,
                                                const int64_t* send_displs, void* recv, size_t recv_capacity,
                                                int64_t* recv_counts, int64_t* recv_displs, DataType type,
                                                const CallPlace& place);

struct CheckedOp {
  bool send;
  int peer;
  char* buffer;
  size_t bytes;
};

// Checks every op, and that each send to self has a receive from self of the same size. `single`: send() or
// recv(), whose errors name their own parameters ("peer"), not the op ("ops[2].peer").
struct PointToPointBatch {
  const PointToPoint* ops;
  size_t count;
  std::vector<CheckedOp> checked;
};
PointToPointBatch validate_point_to_point(const char* function, bool single, const PointToPoint* ops, size_t op_count,
                                          const CallPlace& place);

// A value outside the enum is refused naming `argument`.
size_t element_size(const char* function, DataType type, const char* argument = "type");

// a * b, refusing overflow.
size_t checked_product(const char* function, const char* argument, size_t a, size_t b);

// Any pointer when bytes is 0; else not null, and check_device_pointer.
void check_buffer(const char* function, const void* pointer, const char* argument, size_t bytes, int device);

// Device memory of this GPU, or a mapping made here; host memory, unknown pointers and other GPUs' cudaMalloc
// memory are refused. Nothing is checked where BRAID_CHECK_POINTERS=off.
void check_device_pointer(const char* function, const void* pointer, const char* argument, int device);

// BRAID_CHECK_POINTERS, read once.
bool pointer_checks_on();


inline const char* at(const void* base, size_t bytes) { return static_cast<const char*>(base) + bytes; }
inline char* at(void* base, size_t bytes) { return static_cast<char*>(base) + bytes; }

inline bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace braid::collectives
