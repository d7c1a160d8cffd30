#include "memory/shareable.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>

#include "core/capture_mode.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "memory/vmm.hpp"

namespace braid::detail {
namespace {

template <typename T>
bool pointer_attribute(T* value, CUpointer_attribute attribute, const void* pointer) {
  return driver().cuPointerGetAttribute(value, attribute, reinterpret_cast<CUdeviceptr>(pointer)) == CUDA_SUCCESS;
}

std::string pci_bus_id(int device) {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), device) != cudaSuccess) return {};
  return id;
}

}  // namespace

MemoryDescriptor describe_shareable(const char* function, const char* argument, const void* pointer, size_t bytes,
                                    int device) {
  if (pointer == nullptr) raise_invalid_argument(function, argument, "is null");
  if (bytes == 0) raise_invalid_argument(function, "bytes", "is 0; a shared range needs at least one byte");
  const uintptr_t begin = reinterpret_cast<uintptr_t>(pointer);
  if (bytes > UINTPTR_MAX - begin) raise_invalid_argument(function, "bytes", "is {}: {} + bytes overflows", bytes, pointer);
  RelaxedCaptureMode relaxed;
  DeviceGuard guard(device);  // makes the device's primary context current, which the driver queries need

  unsigned int memory_type = 0;
  if (!pointer_attribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pointer)) {
    raise_invalid_argument(function, argument, "({}) is not memory CUDA knows (not a device allocation)", pointer);
  }
  unsigned int managed = 0;
  pointer_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, pointer);
  if (managed) raise_invalid_argument(function, argument, "({}) is managed memory, which cannot be shared between processes", pointer);
  if (memory_type != CU_MEMORYTYPE_DEVICE) {
    raise_invalid_argument(function, argument, "({}) is host memory; only device memory can be registered or exported", pointer);
  }
  int ordinal = -1;
  pointer_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pointer);
  if (ordinal != device) {
    raise_invalid_argument(function, argument, "({}) is memory of GPU {}; this call works on GPU {}", pointer, ordinal, device);
  }

  CUdeviceptr base = 0;
  size_t allocation_bytes = 0;
  BRAID_CU(cuMemGetAddressRange, &base, &allocation_bytes, reinterpret_cast<CUdeviceptr>(pointer));
  if (bytes > allocation_bytes - (begin - base)) {
    raise_invalid_argument(function, "bytes", "is {}: [{}, +{}) runs past the end of its allocation [{:#x}, +{})", bytes,
                           pointer, bytes, base, allocation_bytes);
  }

  MemoryDescriptor d;
  d.host_id = this_host_id();
  d.pid = static_cast<uint32_t>(getpid());
  d.device = device;
  d.pci_bus_id = pci_bus_id(device);
  d.address = begin;
  d.bytes = bytes;
  d.allocation_base = base;
  d.allocation_bytes = allocation_bytes;

  int legacy_ipc = 0;
  pointer_attribute(&legacy_ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, pointer);
  if (legacy_ipc) {
    cudaIpcMemHandle_t handle;
    BRAID_CUDA(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)));
    static_assert(sizeof(handle) == sizeof(d.ipc_handle));
    std::memcpy(d.ipc_handle.data(), &handle, sizeof(handle));
    d.kind = MemoryKind::kLegacyIpc;
    return d;
  }
  CUmemGenericAllocationHandle handle = 0;
  if (driver().cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(base)) == CUDA_SUCCESS) {
    CUmemAllocationProp prop = {};
    const CUresult got = driver().cuMemGetAllocationPropertiesFromHandle(&prop, handle);
    release_quietly(driver().cuMemRelease(handle), "cuMemRelease");
    if (got == CUDA_SUCCESS && (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
      d.kind = MemoryKind::kPosixFd;
      return d;
    }
    raise(ErrorCode::kUnsupported,
          "{}: argument '{}' ({}) is VMM memory made without POSIX-fd handles (requestedHandleTypes {:#x}); other "
          "processes cannot map it",
          function, argument, pointer, static_cast<unsigned>(prop.requestedHandleTypes));
  }
  raise(ErrorCode::kUnsupported,
        "{}: argument '{}' ({}) is device memory that cannot be shared: neither cudaMalloc memory (legacy CUDA IPC) "
        "nor VMM memory with POSIX-fd handles (cudaMallocAsync memory is such, whatever its pool's handle types)",
        function, argument, pointer);
}

int export_allocation_fd(const MemoryDescriptor& descriptor, int device) {
  RelaxedCaptureMode relaxed;
  DeviceGuard guard(device);
  CUmemGenericAllocationHandle handle = 0;
  BRAID_CU(cuMemRetainAllocationHandle, &handle, reinterpret_cast<void*>(descriptor.allocation_base));
  int fd = -1;
  const CUresult exported = driver().cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  release_quietly(driver().cuMemRelease(handle), "cuMemRelease");
  if (exported != CUDA_SUCCESS) raise_driver(exported, "cuMemExportToShareableHandle", __FILE__, __LINE__);
  return fd;
}

std::shared_ptr<PeerMapping> PeerMapping::open(const char* function, const char* argument,
                                               const MemoryDescriptor& descriptor, int fd, int device,
                                               bool unmap_at_once) {
  FdOwner owned_fd(fd);
  std::shared_ptr<PeerMapping> mapping(new PeerMapping());
  mapping->descriptor_ = descriptor;
  mapping->device_ = device;
  mapping->unmap_at_once_ = unmap_at_once;
  RelaxedCaptureMode relaxed;  // a first use may come during a graph capture: these calls enqueue nothing
  DeviceGuard guard(device);
  const bool same_process = descriptor.pid == static_cast<uint32_t>(getpid()) && descriptor.host_id == this_host_id();
  if (descriptor.kind == MemoryKind::kLegacyIpc) {
    if (same_process) {
      // Another thread's (or our own) cudaMalloc memory: usable where it lies once peer access is on.
      if (descriptor.device != device) {
        const cudaError_t enabled = cudaDeviceEnablePeerAccess(descriptor.device, 0);
        if (enabled == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();  // not an error: clear it
        } else if (enabled != cudaSuccess) {
          raise_cuda(enabled, "cudaDeviceEnablePeerAccess", __FILE__, __LINE__);
        }
      }
      mapping->address_ = reinterpret_cast<char*>(descriptor.address);
      return mapping;
    }
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, descriptor.ipc_handle.data(), sizeof(handle));
    BRAID_CUDA(cudaIpcOpenMemHandle(&mapping->ipc_base_, handle, cudaIpcMemLazyEnablePeerAccess));
    // The blob's sizes are the exporter's word; the allocation the handle opened is the driver's. A range that
    // does not lie inside what was opened is refused (the mapping closes with `mapping`).
    CUdeviceptr opened_base = 0;
    size_t opened_bytes = 0;
    BRAID_CU(cuMemGetAddressRange, &opened_base, &opened_bytes, reinterpret_cast<CUdeviceptr>(mapping->ipc_base_));
    if (descriptor.allocation_bytes > opened_bytes) {
      raise_invalid_argument(function, argument,
                             "describes an allocation of {} bytes of process {}, but the memory its IPC handle opens "
                             "has {}: it is not what that process exported",
                             descriptor.allocation_bytes, descriptor.pid, opened_bytes);
    }
    mapping->address_ = static_cast<char*>(mapping->ipc_base_) + descriptor.offset();
    return mapping;
  }
  if (owned_fd.fd < 0) raise(ErrorCode::kInternal, "mapping VMM memory of pid {} without a file descriptor", descriptor.pid);
  CUmemGenericAllocationHandle handle = 0;
  BRAID_CU(cuMemImportFromShareableHandle, &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(owned_fd.fd)),
           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  try {
    mapping->vmm_base_ = reserve_and_map(descriptor.allocation_bytes, 0, handle, device);
  } catch (...) {
    release_quietly(driver().cuMemRelease(handle), "cuMemRelease");
    throw;
  }
  mapping->vmm_handle_ = handle;
  mapping->address_ = reinterpret_cast<char*>(mapping->vmm_base_) + descriptor.offset();
  return mapping;
}

char* PeerMapping::at(uint64_t exporter_address) const {
  const MemoryDescriptor& d = descriptor_;
  if (exporter_address < d.allocation_base || exporter_address - d.allocation_base >= d.allocation_bytes) {
    raise(ErrorCode::kInternal, "address {:#x} lies outside the mapped allocation [{:#x}, +{})", exporter_address,
          d.allocation_base, d.allocation_bytes);
  }
  return address_ + static_cast<ptrdiff_t>(exporter_address - d.address);
}

PeerMapping::~PeerMapping() {
  if (ipc_base_ == nullptr && vmm_handle_ == 0) return;  // nothing mapped: memory of this process
  DeviceGuard guard(device_);
  if (!unmap_at_once_) cudaDeviceSynchronize();  // no kernel of ours may still read or write through the mapping
  if (ipc_base_ != nullptr) {
    const cudaError_t closed = cudaIpcCloseMemHandle(ipc_base_);
    if (closed != cudaSuccess) BRAID_WARN("cudaIpcCloseMemHandle failed: {}", cudaGetErrorName(closed));
  }
  if (vmm_handle_ != 0) {
    release_quietly(driver().cuMemUnmap(vmm_base_, descriptor_.allocation_bytes), "cuMemUnmap");
    release_quietly(driver().cuMemAddressFree(vmm_base_, descriptor_.allocation_bytes), "cuMemAddressFree");
    release_quietly(driver().cuMemRelease(vmm_handle_), "cuMemRelease");
  }
}

}  // namespace braid::detail
