#include "core/cuda_check.hpp"

#include "core/error.hpp"
#include "core/log.hpp"

namespace braid {

void raise_cuda(cudaError_t result, const char* call, const char* file, int line) {
  ErrorCode code = (result == cudaErrorNoDevice || result == cudaErrorInsufficientDriver) ? ErrorCode::kNoDevice
                                                                                         : ErrorCode::kCudaError;
  raise(code, "{} failed on rank {}: {} ({}): {} [{}:{}]", call, current_rank_text(), cudaGetErrorName(result),
        static_cast<int>(result), cudaGetErrorString(result), file, line);
}

void raise_driver(CUresult result, const char* call, const char* file, int line) {
  const char* name = nullptr;
  if (driver().cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  raise(ErrorCode::kDriverError, "{} failed on rank {}: {} ({}) [{}:{}]", call, current_rank_text(), name,
        static_cast<int>(result), file, line);
}

int require_cuda_devices(const char* what) {
  int count = 0;
  cudaError_t result = cudaGetDeviceCount(&count);
  if (result == cudaErrorInsufficientDriver) {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);  // 0: no driver at all
    cudaRuntimeGetVersion(&runtime);
    if (driver == 0) raise(ErrorCode::kNoDevice, "{}: no CUDA device on this machine (no NVIDIA driver is installed)", what);
    raise(ErrorCode::kNoDevice,
          "{}: no CUDA device usable: the NVIDIA driver supports CUDA {}.{}, older than the CUDA {}.{} runtime braid is "
          "built with; install a driver of the R580 series or newer (CUDA 13)",
          what, driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
  }
  if (result == cudaErrorNoDevice || result == cudaErrorInsufficientDriver || (result == cudaSuccess && count == 0)) {
    raise(ErrorCode::kNoDevice, "{}: no CUDA device on this machine ({})", what,
          result == cudaSuccess ? "device count is 0" : cudaGetErrorName(result));
  }
  if (result != cudaSuccess) raise_cuda(result, "cudaGetDeviceCount", __FILE__, __LINE__);
  return count;
}

}  // namespace braid
