// Small pieces of the CUDA virtual memory management (VMM) path that symmetric allocations and peer mappings
// of registered or exported memory share.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "core/fd_owner.hpp"

namespace braid::detail {

// Pinned device memory on `device`, exportable as a POSIX fd.
CUmemAllocationProp posix_fd_allocation_properties(int device);

// The recommended allocation granularity for `prop`.
size_t allocation_granularity(const CUmemAllocationProp& prop);

// Maps `handle` at `address` read/write for `device`.
void map_for_device(CUdeviceptr address, size_t bytes, CUmemGenericAllocationHandle handle, int device);

// Reserves a range of `bytes` (aligned to `alignment`, 0: the default) and maps `handle` there for `device`;
// on failure releases what it made and throws.
CUdeviceptr reserve_and_map(size_t bytes, size_t alignment, CUmemGenericAllocationHandle handle, int device);

// Destructors must not throw: a failed release is logged instead.
void release_quietly(CUresult result, const char* call);

}  // namespace braid::detail
