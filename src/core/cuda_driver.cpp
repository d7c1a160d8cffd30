#include "core/cuda_driver.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>

#include "core/error.hpp"

namespace braid {
namespace {

// ABI version of the entry points we ask for: the CUDA 12.0 signatures of these calls, 12.1 for multicast and
// 12.4 for function enumeration and loading (the versions that introduced them).
constexpr unsigned kEntryPointVersion = 12000;
constexpr unsigned kMulticastEntryPointVersion = 12010;
constexpr unsigned kFunctionLoadingEntryPointVersion = 12040;

std::atomic<const DriverApi*> g_fake{nullptr};

// Required entry points raise where missing; optional ones (multicast) are left nullptr.
template <typename Fn>
void fetch(const char* symbol, Fn& slot, unsigned version = kEntryPointVersion, bool required = true) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  cudaError_t result = cudaGetDriverEntryPointByVersion(symbol, &function, version, cudaEnableDefault, &status);
  if (result == cudaErrorInsufficientDriver || result == cudaErrorNoDevice || result == cudaErrorInitializationError) {
    raise(ErrorCode::kNoDevice, "no usable CUDA driver on this machine ({} while looking up {})",
          cudaGetErrorName(result), symbol);
  }
  if (result != cudaSuccess || status != cudaDriverEntryPointSuccess || function == nullptr) {
    if (!required) {
      slot = nullptr;
      return;
    }
    raise(ErrorCode::kNoDevice, "CUDA driver entry point {} is unavailable ({}, query status {}); driver too old?",
          symbol, cudaGetErrorName(result), static_cast<int>(status));
  }
  slot = reinterpret_cast<Fn>(function);
}

DriverApi load() {
  DriverApi api{};
#define BRAID_FETCH(name) fetch(#name, api.name)
  BRAID_FETCH(cuGetErrorName);
  BRAID_FETCH(cuCtxGetCurrent);
  BRAID_FETCH(cuCtxSetCurrent);
  BRAID_FETCH(cuDeviceGet);
  BRAID_FETCH(cuDeviceGetAttribute);
  BRAID_FETCH(cuMemGetAllocationGranularity);
  BRAID_FETCH(cuMemCreate);
  BRAID_FETCH(cuMemRelease);
  BRAID_FETCH(cuMemExportToShareableHandle);
  BRAID_FETCH(cuMemImportFromShareableHandle);
  BRAID_FETCH(cuMemAddressReserve);
  BRAID_FETCH(cuMemAddressFree);
  BRAID_FETCH(cuMemMap);
  BRAID_FETCH(cuMemUnmap);
  BRAID_FETCH(cuMemSetAccess);
  BRAID_FETCH(cuMemGetAddressRange);
  BRAID_FETCH(cuMemRetainAllocationHandle);
  BRAID_FETCH(cuMemGetAllocationPropertiesFromHandle);
  BRAID_FETCH(cuPointerGetAttribute);
#undef BRAID_FETCH
  fetch("cuTensorMapEncodeTiled", api.cuTensorMapEncodeTiled, kEntryPointVersion, false);
#define BRAID_FETCH_MULTICAST(name) fetch(#name, api.name, kMulticastEntryPointVersion, false)
  BRAID_FETCH_MULTICAST(cuMulticastGetGranularity);
  BRAID_FETCH_MULTICAST(cuMulticastCreate);
  BRAID_FETCH_MULTICAST(cuMulticastAddDevice);
  BRAID_FETCH_MULTICAST(cuMulticastBindAddr);
  BRAID_FETCH_MULTICAST(cuMulticastUnbind);
#undef BRAID_FETCH_MULTICAST
#define BRAID_FETCH_LOADING(name) fetch(#name, api.name, kFunctionLoadingEntryPointVersion, false)
  BRAID_FETCH_LOADING(cuFuncGetModule);
  BRAID_FETCH_LOADING(cuModuleGetFunctionCount);
  BRAID_FETCH_LOADING(cuModuleEnumerateFunctions);
  BRAID_FETCH_LOADING(cuFuncIsLoaded);
  BRAID_FETCH_LOADING(cuFuncLoad);
#undef BRAID_FETCH_LOADING
  return api;
}

}  // namespace

const DriverApi& driver() {
  if (const DriverApi* fake = g_fake.load(std::memory_order_acquire)) return *fake;
  // Not a function-local static: a failed load (no driver) must be retried and re-raised on every call.
  static std::mutex mutex;
  static DriverApi api;
  static bool loaded = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!loaded) {
    api = load();
    loaded = true;
  }
  return api;
}

void set_driver_for_testing(const DriverApi* fake) { g_fake.store(fake, std::memory_order_release); }

}  // namespace braid
