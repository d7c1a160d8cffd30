#include "core/kernel_modules.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/log.hpp"

namespace braid::detail {
namespace {

struct ModuleAnchor {
  const void* kernel;  // host stub of the module's anchor kernel
  const char* file;
  int major, minor;    // the only compute capability it is built for; major 0: every one libbraid is built for
};

// Filled by static initialisers (one per .cu file), read at communicator init: a function-local static, so it
// exists before the first initialiser of any translation unit runs.
struct Registry {
  std::mutex mutex;
  std::vector<ModuleAnchor> anchors;
};
Registry& registry() {
  static Registry instance;
  return instance;
}

std::vector<ModuleAnchor> anchors() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.anchors;
}

bool driver_can_enumerate(const DriverApi& api) {
  return api.cuFuncGetModule && api.cuModuleGetFunctionCount && api.cuModuleEnumerateFunctions && api.cuFuncIsLoaded &&
         api.cuFuncLoad;
}

// Visits every function of every registered module in the current context; loads those not yet loaded when
// `load` is set.
KernelLoadCount visit(bool load) {
  KernelLoadCount count;
  const DriverApi& api = driver();
  if (!driver_can_enumerate(api)) {
    static std::once_flag warned;
    std::call_once(warned, [] {
      BRAID_WARN("this CUDA driver cannot enumerate a module's functions (CUDA 12.4+); braid's kernels load on "
                 "first launch, which may wait for the GPU to go idle");
    });
    return count;
  }
  std::vector<CUfunction> functions;
  int device = 0, major = 0, minor = 0;
  BRAID_CUDA(cudaGetDevice(&device));
  BRAID_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  BRAID_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  for (const ModuleAnchor& anchor : anchors()) {
    if (anchor.major != 0 && (anchor.major != major || anchor.minor != minor)) {
      ++count.skipped;
      continue;
    }
    cudaFunction_t anchor_function = nullptr;
    BRAID_CUDA(cudaGetFuncBySymbol(&anchor_function, anchor.kernel));
    CUmodule module = nullptr;
    BRAID_CU(cuFuncGetModule, &module, reinterpret_cast<CUfunction>(anchor_function));
    unsigned int n = 0;
    BRAID_CU(cuModuleGetFunctionCount, &n, module);
    functions.assign(n, nullptr);
    if (n > 0) BRAID_CU(cuModuleEnumerateFunctions, functions.data(), n, module);
    ++count.modules;
    count.functions += n;
    BRAID_TRACE("kernel module of {}: {} functions", anchor.file, n);
    for (CUfunction function : functions) {
      CUfunctionLoadingState state = CU_FUNCTION_LOADING_STATE_UNLOADED;
      BRAID_CU(cuFuncIsLoaded, &state, function);
      if (state != CU_FUNCTION_LOADING_STATE_LOADED && load) {
        BRAID_CU(cuFuncLoad, function);
        ++count.loaded_now;
        state = CU_FUNCTION_LOADING_STATE_LOADED;
      }
      if (state == CU_FUNCTION_LOADING_STATE_LOADED) ++count.loaded;
    }
  }
  return count;
}

}  // namespace

bool register_kernel_module(const void* kernel, const char* file, int major, int minor) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.anchors.push_back({kernel, file, major, minor});
  return true;
}

size_t registered_kernel_modules() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.anchors.size();
}

KernelLoadCount preload_kernels() { return visit(true); }

KernelLoadCount count_loaded_kernels() { return visit(false); }

}  // namespace braid::detail
