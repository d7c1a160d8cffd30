// Kernels over the public device primitives (braid/device/copy_device.hpp, ll_device.hpp), as a user's kernel
// would call them; test_device_primitives.cpp checks what they do.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace braid::testing {

enum class CopyGroup { kBlock, kWarp, kBlockToTwo };

// Copies `bytes` from `source` with one group (one block of 256 threads, or one warp): to `destination`, and
// for kBlockToTwo also to `second`. Returns the launch's error.
cudaError_t launch_group_copy(CopyGroup group, char* destination, char* second, const char* source, size_t bytes,
                              cudaStream_t stream);

// Packs `bytes` of `source` into wire lines at `wire` (16-byte aligned, ceil(bytes / 8) lines) with `flag`.
cudaError_t launch_ll_send(char* wire, const char* source, size_t bytes, uint32_t flag, cudaStream_t stream);

// Polls every line at `wire` for `flag` until it arrives or `timeout_ns` pass, unpacks the lines that arrived
// into `destination`, and adds the number of lines that arrived to *arrived.
cudaError_t launch_ll_receive(const char* wire, char* destination, size_t bytes, uint32_t flag, uint64_t timeout_ns,
                              unsigned long long* arrived, cudaStream_t stream);

}  // namespace braid::testing
