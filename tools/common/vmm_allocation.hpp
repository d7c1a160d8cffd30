// Device memory made as PyTorch's expandable segments make it: cuMemCreate allocations with POSIX-fd handles,
// mapped side by side into one reserved range, read/write for one GPU. For braid-bench's --vmm buffers and the GPU
// tests of registration and exposure. Driver calls go through the runtime's entry points: neither links libcuda.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace braid::check {

class VmmAllocation {
 public:
  // `allocations` allocations of at least `wanted` bytes each (rounded up to the granularity), read/write for
  // `device`. Throws std::runtime_error naming the driver call that failed (what it made is released).
  VmmAllocation(size_t wanted, int device, int allocations = 1) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop_ = prop;
    size_t granularity = 0;
    check(entry<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity")(
              &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
          "cuMemGetAllocationGranularity");
    each_ = (wanted + granularity - 1) / granularity * granularity;
    const size_t bytes = each_ * static_cast<size_t>(allocations);
    check(entry<decltype(&cuMemAddressReserve)>("cuMemAddressReserve")(&address_, bytes, granularity, 0, 0),
          "cuMemAddressReserve");
    bytes_ = bytes;
    try {
      for (int i = 0; i < allocations; ++i) {
        CUmemGenericAllocationHandle handle = 0;
        check(entry<decltype(&cuMemCreate)>("cuMemCreate")(&handle, each_, &prop, 0), "cuMemCreate");
        handles_.push_back(handle);
        check(entry<decltype(&cuMemMap)>("cuMemMap")(address_ + i * each_, each_, 0, handle, 0), "cuMemMap");
        ++mapped_;
        CUmemAccessDesc access = {};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        check(entry<decltype(&cuMemSetAccess)>("cuMemSetAccess")(address_ + i * each_, each_, &access, 1),
              "cuMemSetAccess");
      }
    } catch (...) {
      release();
      throw;
    }
  }
  // Unmaps and releases; waits for nothing (the caller's work on the memory must have completed).
  ~VmmAllocation() { release(); }
  VmmAllocation(const VmmAllocation&) = delete;
  VmmAllocation& operator=(const VmmAllocation&) = delete;

  // Unmaps allocation `index`, releases it and maps a new one in its place, as an allocator that gives memory back
  // and takes it again does. The caller's work on it must have completed.
  void replace(int index) {
    const CUdeviceptr at = address_ + static_cast<size_t>(index) * each_;
    check(entry<decltype(&cuMemUnmap)>("cuMemUnmap")(at, each_), "cuMemUnmap");
    check(entry<decltype(&cuMemRelease)>("cuMemRelease")(handles_.at(index)), "cuMemRelease");
    CUmemGenericAllocationHandle handle = 0;
    check(entry<decltype(&cuMemCreate)>("cuMemCreate")(&handle, each_, &prop_, 0), "cuMemCreate");
    handles_.at(index) = handle;
    check(entry<decltype(&cuMemMap)>("cuMemMap")(at, each_, 0, handle, 0), "cuMemMap");
    CUmemAccessDesc access = {};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check(entry<decltype(&cuMemSetAccess)>("cuMemSetAccess")(at, each_, &access, 1), "cuMemSetAccess");
  }

  void* pointer() const { return reinterpret_cast<void*>(address_); }
  size_t bytes() const { return bytes_; }  // of the whole range
  size_t each() const { return each_; }    // of one allocation

 private:
  template <typename F>
  static F entry(const char* name) {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion(name, &function, 12000, cudaEnableDefault, &status) != cudaSuccess ||
        function == nullptr) {
      throw std::runtime_error(std::string("no driver entry point ") + name);
    }
    return reinterpret_cast<F>(function);
  }
  static void check(CUresult result, const char* what) {
    if (result != CUDA_SUCCESS) throw std::runtime_error(std::string(what) + " failed: CUresult " + std::to_string(result));
  }
  void release() noexcept {
    try {
      for (size_t i = 0; i < mapped_; ++i) entry<decltype(&cuMemUnmap)>("cuMemUnmap")(address_ + i * each_, each_);
      if (address_ != 0) entry<decltype(&cuMemAddressFree)>("cuMemAddressFree")(address_, bytes_);
      for (CUmemGenericAllocationHandle handle : handles_) entry<decltype(&cuMemRelease)>("cuMemRelease")(handle);
    } catch (const std::exception&) {
      // no entry point: nothing was made through it either
    }
    mapped_ = 0;
    address_ = 0;
    handles_.clear();
  }

  CUmemAllocationProp prop_ = {};
  CUdeviceptr address_ = 0;
  size_t bytes_ = 0;
  size_t each_ = 0;
  size_t mapped_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
};

}  // namespace braid::check
