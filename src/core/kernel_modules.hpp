// braid's kernels, loaded into a context before the first collective needs them.
//
// Under lazy loading (CUDA_MODULE_LOADING=LAZY, CUDA's default on Linux since 12.2) a module is loaded into a
// context when one of its kernels is first launched, and that load waits until the GPU is idle (CUDA Programming
// Guide, "Lazy Loading", Potential Hazards; tests/gpu/test_kernel_preload.cpp shows it). A braid rank's GPU is
// often busy: its last collective may still spin in a barrier for a peer. Its first launch of another collective
// would then block the host thread until the peers arrive, and one thread driving several GPUs (ncclCommInitAll
// through the shim) would wait on its own next launch until BRAID_TIMEOUT_S. NCCL loads its kernels at init for
// the same reason.
//
// So every .cu file of libbraid ends with BRAID_KERNEL_MODULE() (BRAID_KERNEL_MODULE_FOR(major, minor) where it
// is built for one compute capability alone), which registers its module (one per .cu translation unit);
// communicator init calls preload_kernels() with the communicator's GPU current, which loads every function of
// every registered module built for that GPU (BRAID_PRELOAD_KERNELS=off skips it and saves init that load time).
// It runs before init's first exchange with the peers, so the one wait it may have (for work the caller already
// queued on the GPU) holds up no peer's braid collective: none can be in flight on a context with nothing loaded.
#pragma once

#include <cstddef>

namespace braid::detail {

// Records the module holding `kernel` (a __global__ function of that module), built for GPUs of compute capability
// `major`.`minor` alone, or for every GPU libbraid is built for where major is 0. Host-only bookkeeping, safe in a
// static initialiser; returns true so it can initialise a constant.
bool register_kernel_module(const void* kernel, const char* file, int major = 0, int minor = 0);

// Modules registered so far (one per .cu file linked into this binary).
size_t registered_kernel_modules();

struct KernelLoadCount {
  size_t modules = 0;    // registered modules visited
  size_t skipped = 0;    // registered modules built for another compute capability than the current GPU's
  size_t functions = 0;  // functions in them
  size_t loaded = 0;     // functions loaded into the current context (after preload_kernels: all of them)
  size_t loaded_now = 0; // functions preload_kernels loaded itself
};

// Loads every function of every registered module built for the current GPU into the current context (a no-op
// for those already loaded, as under CUDA_MODULE_LOADING=EAGER). Raises braid::Error naming the driver call that
// failed.
KernelLoadCount preload_kernels();

// Counts without loading anything (for tests).
KernelLoadCount count_loaded_kernels();

}  // namespace braid::detail

#ifdef __CUDACC__
// At file scope of every .cu file of libbraid built for every GPU it targets: an empty kernel that names the file's
// module, registered at load.
#define BRAID_KERNEL_MODULE()                                                                         \
  namespace {                                                                                         \
  __global__ void braid_kernel_module_anchor() {}                                                     \
  [[maybe_unused]] const bool braid_kernel_module_registered = ::braid::detail::register_kernel_module( \
      reinterpret_cast<const void*>(&braid_kernel_module_anchor), __FILE__);                          \
  }
// The same for a .cu file built for one compute capability alone (an sm_90a file: BRAID_KERNEL_MODULE_FOR(9, 0)):
// preload skips it on other GPUs, which have no code of it to load.
#define BRAID_KERNEL_MODULE_FOR(major, minor)                                                         \
  namespace {                                                                                         \
  __global__ void braid_kernel_module_anchor() {}                                                     \
  [[maybe_unused]] const bool braid_kernel_module_registered = ::braid::detail::register_kernel_module( \
      reinterpret_cast<const void*>(&braid_kernel_module_anchor), __FILE__, major, minor);            \
  }
#endif
