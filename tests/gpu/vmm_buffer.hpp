// VMM memory made with POSIX-fd handles, as PyTorch's expandable segments make it (check::VmmAllocation), for the
// GPU tests of registration (explicit and automatic) and exposure.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "vmm_allocation.hpp"

namespace braid::testing {

// `allocations` allocations of at least `wanted` bytes each, mapped side by side into one range of `bytes`.
struct VmmBuffer {
  VmmBuffer(size_t wanted, int device, int allocations = 1)
      : allocation(wanted, device, allocations), bytes(allocation.bytes()), each(allocation.each()) {}
  ~VmmBuffer() {
    if (synchronize_on_free) cudaDeviceSynchronize();  // before `allocation` goes
  }
  VmmBuffer(const VmmBuffer&) = delete;
  VmmBuffer& operator=(const VmmBuffer&) = delete;
  void* pointer() const { return allocation.pointer(); }

  check::VmmAllocation allocation;
  size_t bytes;  // of the whole range
  size_t each;   // of one allocation
  // Whether the destructor waits for the device first (cudaDeviceSynchronize). A test that frees while peers sharing
  // the GPU may still run clears it after waiting for its own work (unmapping does not wait for the device).
  bool synchronize_on_free = true;
};

}  // namespace braid::testing
