// NCCL's C API, part 3: memory. ncclMemAlloc gives VMM memory with POSIX-fd handles (what braid's registration
// maps between processes), accessible from every GPU of this process that can reach it (ranks as threads).
// ncclCommRegister registers with the real NCCL, for what it serves, and with BRAID_EAGER_ZERO_COPY=1 with braid
// too, which then exposes the range to the peers (PyTorch's allocator hook registers every segment it makes):
// there no eager call exchanges a registered buffer, so ranks need not register alike. Without it a registration
// stays NCCL's: braid's zero-copy paths on registered buffers need every rank to pass registered buffers to the same
// call, which a local registration cannot promise. Windows are collective (every rank registers together), so
// ncclCommWindowRegister also registers with braid.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_set>

#include "core/config.hpp"
#include "core/cuda_check.hpp"
#include "core/cuda_driver.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "memory/vmm.hpp"
#include "shim.hpp"
#include "shim_exports.hpp"
#include "shim_windows.hpp"

using namespace braid::shim;
using braid::driver;

namespace {

struct Allocation {
  CUmemGenericAllocationHandle handle;
  size_t bytes;  // reserved and mapped (rounded up to the granularity)
  int device;    // the GPU it was made on
};
std::mutex allocations_mutex;
std::map<void*, Allocation> allocations;

// What ncclCommRegister returns: the real NCCL's handle (null where it did not register), and braid's registration
// (BRAID_EAGER_ZERO_COPY=1, braid's CUDA backend, memory braid can share).
struct Registration {
  const ncclComm* comm = nullptr;  // the communicator it was made on
  void* real = nullptr;
  std::optional<braid::RegisteredBuffer> braid;
};

std::mutex registrations_mutex;
std::unordered_set<Registration*> registrations;  // every handle ncclCommRegister returned and nobody deregistered

std::mutex windows_mutex;
std::unordered_set<ShimWindow*> windows;  // every window the shim made and has not freed

void grant_peer_devices(CUdeviceptr address, size_t bytes, int device) {
  int count = 0;
  BRAID_CUDA(cudaGetDeviceCount(&count));
  for (int peer = 0; peer < count; ++peer) {
    int can = 0;
    if (peer == device || cudaDeviceCanAccessPeer(&can, peer, device) != cudaSuccess || !can) continue;
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = peer;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    BRAID_CU(cuMemSetAccess, address, bytes, &access, 1);
  }
}

}  // namespace

extern "C" {

SHIM_EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  SHIM_FORWARD_FROM_REAL(ncclMemAlloc, ptr, size);
  return guarded("ncclMemAlloc", [&] {
    if (ptr == nullptr) {  // NCCL passes it to its cudaMalloc fallback, which refuses it: ncclUnhandledCudaError
      braid::raise(braid::ErrorCode::kCudaError, "ncclMemAlloc: argument 'ptr' is NULL");
    }
    *ptr = nullptr;
    if (size == 0) return;  // as NCCL: nothing allocated
    int device = 0;
    BRAID_CUDA(cudaGetDevice(&device));
    const CUmemAllocationProp prop = braid::detail::posix_fd_allocation_properties(device);
    const size_t granularity = braid::detail::allocation_granularity(prop);
    const size_t bytes = (size + granularity - 1) / granularity * granularity;
    CUmemGenericAllocationHandle handle = 0;
    BRAID_CU(cuMemCreate, &handle, bytes, &prop, 0);
    CUdeviceptr address = 0;
    try {
      address = braid::detail::reserve_and_map(bytes, granularity, handle, device);
      grant_peer_devices(address, bytes, device);
    } catch (...) {
      if (address != 0) {
        driver().cuMemUnmap(address, bytes);
        driver().cuMemAddressFree(address, bytes);
      }
      driver().cuMemRelease(handle);
      throw;
    }
    std::lock_guard<std::mutex> lock(allocations_mutex);
    allocations[reinterpret_cast<void*>(address)] = Allocation{handle, bytes, device};
    *ptr = reinterpret_cast<void*>(address);
  });
}

SHIM_EXPORT ncclResult_t ncclMemFree(void* ptr) {
  SHIM_FORWARD_FROM_REAL(ncclMemFree, ptr);
  if (ptr == nullptr) return ncclSuccess;
  return guarded("ncclMemFree", [&] {
    Allocation allocation{};
    {
      std::lock_guard<std::mutex> lock(allocations_mutex);
      auto found = allocations.find(ptr);
      if (found == allocations.end()) {
        braid::raise_invalid_argument("ncclMemFree", "ptr", "({}) was not returned by ncclMemAlloc", ptr);
      }
      allocation = found->second;
      allocations.erase(found);
    }
    const CUdeviceptr address = reinterpret_cast<CUdeviceptr>(ptr);
    braid::DeviceGuard guard(allocation.device);
    BRAID_CUDA(cudaDeviceSynchronize());  // as cudaFree: no work of its GPU may still use it
    braid::detail::release_quietly(driver().cuMemUnmap(address, allocation.bytes), "cuMemUnmap");
    braid::detail::release_quietly(driver().cuMemAddressFree(address, allocation.bytes), "cuMemAddressFree");
    braid::detail::release_quietly(driver().cuMemRelease(allocation.handle), "cuMemRelease");
  });
}

SHIM_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommRegister, comm, buff, size, handle);
  return guarded("ncclCommRegister", [&] {
    ncclComm& shim = checked_comm(comm, "ncclCommRegister");
    require_pointer(handle, "ncclCommRegister", "handle");
    // As NCCL, a NULL buffer or a size of 0 is no error; braid has nothing of it to expose.
    const bool empty = buff == nullptr || size == 0;
    auto registration = std::make_unique<Registration>();
    if (shim.real != nullptr && shim.library->has_register()) {
      braid::DeviceGuard guard(shim.device);
      check_real(shim, shim.library->api().comm_register(shim.real, buff, size, &registration->real),
                 "ncclCommRegister");
    }
    if (!empty && shim.braid && shim.braid_on_cuda && braid::eager_zero_copy_enabled()) {
      try {
        registration->braid = shim.braid->register_buffer(buff, size);
      } catch (const braid::Error& error) {  // memory braid cannot share: the calls on it stage
        BRAID_INFO("ncclCommRegister: {} bytes at {} are not exposed to the peers: {}", size, buff, error.what());
      }
    }
    registration->comm = &shim;
    {
      std::lock_guard<std::mutex> lock(registrations_mutex);
      registrations.insert(registration.get());
    }
    *handle = registration.release();
  });
}

SHIM_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommDeregister, comm, handle);
  return guarded("ncclCommDeregister", [&] {
    ncclComm& shim = checked_comm(comm, "ncclCommDeregister");
    if (handle == nullptr) return;  // as NCCL: nothing to deregister
    {
      // As NCCL, a handle this communicator did not return (or one deregistered already) is refused:
      // kUnsupported, NCCL's ncclInvalidUsage.
      std::lock_guard<std::mutex> lock(registrations_mutex);
      auto found = registrations.find(static_cast<Registration*>(handle));
      if (found == registrations.end() || (*found)->comm != &shim) {
        braid::raise(braid::ErrorCode::kUnsupported, "ncclCommDeregister: argument 'handle' ({}) was not returned by "
                     "ncclCommRegister on this communicator, or was deregistered already", handle);
      }
      registrations.erase(found);
    }
    std::unique_ptr<Registration> registration(static_cast<Registration*>(handle));
    // braid's first: its withdrawal waits for this rank's calls and every peer's unmap, after which the caller
    // may free the memory (the real NCCL's deregistration runs even where it fails).
    std::exception_ptr failure;
    if (registration->braid && shim.braid) {
      try {
        shim.braid->deregister(*registration->braid);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (registration->real != nullptr && shim.real != nullptr) {
      braid::DeviceGuard guard(shim.device);
      check_real(shim, shim.library->api().comm_deregister(shim.real, registration->real), "ncclCommDeregister");
    }
    if (failure) std::rethrow_exception(failure);
  });
}

SHIM_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                                int winFlags) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommWindowRegister, comm, buff, size, win, winFlags);
  return guarded("ncclCommWindowRegister", [&] {
    if (buff == nullptr || size == 0) {  // as NCCL: no window, and success
      if (win != nullptr) *win = nullptr;
      return;
    }
    ncclComm& shim = checked_comm(comm, "ncclCommWindowRegister");
    require_pointer(win, "ncclCommWindowRegister", "win");
    *win = nullptr;
    auto window = std::make_unique<ShimWindow>();
    window->user = buff;
    if (shim.braid_on_cuda) window->braid = shim.braid->register_buffer(buff, size);
    if (shim.real != nullptr && shim.library->api().window_register != nullptr) {
      braid::DeviceGuard guard(shim.device);
      check_real(shim, shim.library->api().window_register(shim.real, buff, size, &window->real, winFlags),
                 "ncclCommWindowRegister");
    }
    remember_window(window.get());
    *win = reinterpret_cast<ncclWindow_t>(window.release());
  });
}

SHIM_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  SHIM_FORWARD_FOREIGN(comm, ncclCommWindowDeregister, comm, win);
  if (win == nullptr) return ncclSuccess;  // as NCCL: nothing to deregister, whatever comm is
  return guarded("ncclCommWindowDeregister", [&] {
    ncclComm& shim = checked_comm(comm, "ncclCommWindowDeregister");
    ShimWindow* const shim_made = shim_window(win);
    if (shim_made == nullptr) braid::raise_invalid_argument("ncclCommWindowDeregister", "win", "was not made by ncclCommWindowRegister");
    forget_window(shim_made);
    std::unique_ptr<ShimWindow> window(shim_made);
    // As ncclCommDeregister: the real NCCL's deregistration runs even where braid's fails.
    std::exception_ptr failure;
    if (window->braid) {
      try {
        shim.braid->deregister(window->braid);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (window->real != nullptr && shim.real != nullptr) {
      braid::DeviceGuard guard(shim.device);
      check_real(shim, shim.library->api().window_deregister(shim.real, window->real), "ncclCommWindowDeregister");
    }
    if (failure) std::rethrow_exception(failure);
  });
}

}  // extern "C"

namespace braid::shim {

void remember_window(ShimWindow* window) {
  std::lock_guard<std::mutex> lock(windows_mutex);
  windows.insert(window);
}

void forget_window(ShimWindow* window) {
  std::lock_guard<std::mutex> lock(windows_mutex);
  windows.erase(window);
}

ShimWindow* shim_window(ncclWindow_t window) {
  std::lock_guard<std::mutex> lock(windows_mutex);
  const auto found = windows.find(reinterpret_cast<ShimWindow*>(window));
  return found == windows.end() ? nullptr : *found;
}

ncclWindow_t real_window(ncclWindow_t window, const char* function) {
  const ShimWindow* shim = shim_window(window);
  if (shim == nullptr) return window;
  if (shim->real == nullptr) {
    raise(ErrorCode::kUnsupported, "{}: the window has no real NCCL window beside braid's registration", function);
  }
  return shim->real;
}

}  // namespace braid::shim

SHIM_ALIAS(ncclMemAlloc)
SHIM_ALIAS(ncclMemFree)
SHIM_ALIAS(ncclCommRegister)
SHIM_ALIAS(ncclCommDeregister)
SHIM_ALIAS(ncclCommWindowRegister)
SHIM_ALIAS(ncclCommWindowDeregister)
