// VMM memory made with POSIX-fd handles, as PyTorch's expandable segments make it, for the GPU tests of
// registration (explicit and automatic).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace braid::testing {

// `allocations` allocations of at least `wanted` bytes each (rounded up to the granularity), mapped side by side
// into one reserved range of `bytes`, read/write for `device`.
struct VmmBuffer {
  CUdeviceptr address = 0;
  size_t bytes = 0;
  size_t each = 0;  // bytes of one allocation
  std::vector<CUmemGenericAllocationHandle> handles;
  // Whether the destructor waits for the device first (cudaDeviceSynchronize). A test that frees while peers sharing
  // the GPU may still run clears it after waiting for its own work (unmapping does not wait for the device).
  bool synchronize_on_free = true;

  template <typename F>
  static F entry(const char* name) {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion(name, &function, 12000, cudaEnableDefault, &status) != cudaSuccess || function == nullptr) {
      throw std::runtime_error(std::string("no driver entry point ") + name);
    }
    return reinterpret_cast<F>(function);
  }

  VmmBuffer(size_t wanted, int device, int allocations = 1) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    entry<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity")(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    each = (wanted + granularity - 1) / granularity * granularity;
    bytes = each * static_cast<size_t>(allocations);
    entry<decltype(&cuMemAddressReserve)>("cuMemAddressReserve")(&address, bytes, 0, 0, 0);
    for (int i = 0; i < allocations; ++i) {
      CUmemGenericAllocationHandle handle = 0;
      if (entry<decltype(&cuMemCreate)>("cuMemCreate")(&handle, each, &prop, 0) != CUDA_SUCCESS) throw std::runtime_error("cuMemCreate");
      handles.push_back(handle);
      entry<decltype(&cuMemMap)>("cuMemMap")(address + i * each, each, 0, handle, 0);
      CUmemAccessDesc access = {};
      access.location = prop.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      entry<decltype(&cuMemSetAccess)>("cuMemSetAccess")(address + i * each, each, &access, 1);
    }
  }
  ~VmmBuffer() {
    if (synchronize_on_free) cudaDeviceSynchronize();
    for (size_t i = 0; i < handles.size(); ++i) entry<decltype(&cuMemUnmap)>("cuMemUnmap")(address + i * each, each);
    entry<decltype(&cuMemAddressFree)>("cuMemAddressFree")(address, bytes);
    for (CUmemGenericAllocationHandle handle : handles) entry<decltype(&cuMemRelease)>("cuMemRelease")(handle);
  }
  VmmBuffer(const VmmBuffer&) = delete;
  VmmBuffer& operator=(const VmmBuffer&) = delete;
  void* pointer() const { return reinterpret_cast<void*>(address); }
};

}  // namespace braid::testing
