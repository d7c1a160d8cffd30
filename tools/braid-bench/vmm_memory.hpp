// Device memory made as PyTorch's expandable segments make it (cuMemCreate with POSIX-fd handles, reserved and
// mapped read/write for this GPU), for braid-bench's --vmm buffers. Driver calls go through the runtime's entry
// points: braid-bench never links libcuda.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>

#include "cuda_objects.hpp"

namespace braid::bench {

class VmmMemory {
 public:
  VmmMemory(size_t bytes, int device) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    check(entry<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity")(
              &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
          "cuMemGetAllocationGranularity");
    bytes_ = (bytes + granularity - 1) / granularity * granularity;
    check(entry<decltype(&cuMemCreate)>("cuMemCreate")(&handle_, bytes_, &prop, 0), "cuMemCreate");
    check(entry<decltype(&cuMemAddressReserve)>("cuMemAddressReserve")(&address_, bytes_, granularity, 0, 0),
          "cuMemAddressReserve");
    check(entry<decltype(&cuMemMap)>("cuMemMap")(address_, bytes_, 0, handle_, 0), "cuMemMap");
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check(entry<decltype(&cuMemSetAccess)>("cuMemSetAccess")(address_, bytes_, &access, 1), "cuMemSetAccess");
  }
  ~VmmMemory() {
    if (address_ != 0) {
      entry<decltype(&cuMemUnmap)>("cuMemUnmap")(address_, bytes_);
      entry<decltype(&cuMemAddressFree)>("cuMemAddressFree")(address_, bytes_);
    }
    if (handle_ != 0) entry<decltype(&cuMemRelease)>("cuMemRelease")(handle_);
  }
  VmmMemory(const VmmMemory&) = delete;
  VmmMemory& operator=(const VmmMemory&) = delete;
  void* data() const { return reinterpret_cast<void*>(address_); }

 private:
  template <typename F>
  static F entry(const char* name) {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult status;
    cuda(cudaGetDriverEntryPointByVersion(name, &function, 12000, cudaEnableDefault, &status), name);
    if (function == nullptr) throw std::runtime_error(std::string("no driver entry point ") + name);
    return reinterpret_cast<F>(function);
  }
  static void check(CUresult result, const char* what) {
    if (result != CUDA_SUCCESS) throw std::runtime_error(std::string(what) + " failed: CUresult " + std::to_string(result));
  }

  size_t bytes_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr address_ = 0;
};

}  // namespace braid::bench
