// Makes a CUDA device current for a scope and restores what the thread had before (ranks may be threads of
// one process, each with its own device, and callers keep their own current device). A thread that had no
// context current gets none back: restoring "device 0" would create a context on GPU 0 in every rank.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "core/cuda_driver.hpp"

namespace braid {

class DeviceGuard {
 public:
  // Does not throw: a failure to switch shows up in the first CUDA call that follows.
  explicit DeviceGuard(int device) noexcept {
    CUcontext context = nullptr;
    try {
      if (driver().cuCtxGetCurrent(&context) == CUDA_SUCCESS && context != nullptr) cudaGetDevice(&previous_);
    } catch (...) {
      // no driver: nothing to restore
    }
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) {
      cudaSetDevice(previous_);
    } else {
      try {
        driver().cuCtxSetCurrent(nullptr);
      } catch (...) {
      }
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: no context was current
};

}  // namespace braid
