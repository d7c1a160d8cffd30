// Host-side checks and small helpers shared by every collective entry point (collectives.cpp, all_to_all.cpp,
// send_recv.cpp): device-pointer validation that names the argument, launch checking, byte arithmetic on user
// pointers.
#pragma once

#include <cstddef>
#include <memory>

#include "braid/types.hpp"

namespace braid::detail {
struct CommState;
}

namespace braid::collectives {

// Raises a fatal failure recorded by an earlier call (a kernel's timeout, or NCCL's asynchronous error) before
// anything of this call is enqueued. `collective_name` names recorded collective ids.
void raise_recorded_failure(detail::CommState& state, const char* (*collective_name)(unsigned int));

// The entry of a call: the communicator's state (refusing a moved-from one), this rank set for logging, and a
// fatal failure an earlier kernel recorded raised before anything of this call is enqueued.
detail::CommState& enter(const std::shared_ptr<detail::CommState>& state, const char* function);

// Bytes of one element of `type`; a value outside the enum is refused naming the argument `argument`.
size_t element_size(const char* function, DataType type, const char* argument = "type");

// a * b, refusing a product that overflows, naming the argument.
size_t checked_product(const char* function, const char* argument, size_t a, size_t b);

// A buffer `bytes` long: none needed when bytes is 0; otherwise not null, and device memory of `device`.
void check_buffer(const char* function, const void* pointer, const char* argument, size_t bytes, int device);

// NCCL backend: lets NCCL register a user buffer that lies in a range registered with the communicator (lazily:
// the first collective that uses the range registers it, later ones hit NCCL's cache).
void register_with_nccl(detail::CommState& state, const void* buffer, size_t bytes);

// A device pointer this rank's GPU can use: device memory of this GPU, or a mapping made here (symmetric
// memory, peer mappings). Host memory, unknown pointers and other GPUs' cudaMalloc memory are refused
// (kInvalidArgument) naming `function` and `argument`.
void check_device_pointer(const char* function, const void* pointer, const char* argument, int device);

// Raises the launch error CUDA recorded for the kernel just enqueued (bad configuration, no kernel image).
void check_launch(const char* what);

inline const char* at(const void* base, size_t bytes) { return static_cast<const char*>(base) + bytes; }
inline char* at(void* base, size_t bytes) { return static_cast<char*>(base) + bytes; }

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace braid::collectives
