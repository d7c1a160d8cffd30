#include "memory/paged_ranges.hpp"

#include <unistd.h>

#include "core/capture_mode.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "memory/page_blob.hpp"
#include "memory/shareable.hpp"
#include "memory/vmm.hpp"

namespace braid::detail {

std::unique_ptr<BackingPages> BackingPages::find(const void* pointer, size_t bytes, int device) {
  const auto begin = reinterpret_cast<uint64_t>(pointer);
  if (pointer == nullptr || bytes == 0 || bytes > UINT64_MAX - begin) return nullptr;
  RelaxedCaptureMode relaxed;  // these calls enqueue nothing
  DeviceGuard guard(device);
  std::unique_ptr<BackingPages> found(new BackingPages());
  found->device_ = device;
  uint64_t at = begin;
  const uint64_t end = begin + bytes;
  while (at < end) {
    if (found->pages_.size() == kMostPages) return nullptr;
    CUdeviceptr base = 0;
    size_t size = 0;
    if (driver().cuMemGetAddressRange(&base, &size, at) != CUDA_SUCCESS || size == 0 || base > at ||
        at - base >= size) {
      return nullptr;  // nothing mapped there (the error is not sticky)
    }
    if (!found->pages_.empty() && base != at) return nullptr;  // allocations not side by side
    CUmemGenericAllocationHandle handle = 0;
    if (driver().cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(base)) != CUDA_SUCCESS) {
      return nullptr;  // not VMM memory (cudaMalloc memory, a pool)
    }
    found->pages_.push_back(Page{base, size, handle});  // released by the destructor from here on
    CUmemAllocationProp prop = {};
    if (driver().cuMemGetAllocationPropertiesFromHandle(&prop, handle) != CUDA_SUCCESS ||
        !(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ||
        prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != device) {
      return nullptr;
    }
    at = base + size;
  }
  found->base_ = found->pages_.front().address;
  found->bytes_ = at - found->base_;
  return found;
}

BackingPages::~BackingPages() {
  for (const Page& page : pages_) release_quietly(driver().cuMemRelease(page.handle), "cuMemRelease");
}

bool BackingPages::unchanged() const {
  RelaxedCaptureMode relaxed;
  DeviceGuard guard(device_);
  for (const Page& page : pages_) {
    CUmemGenericAllocationHandle handle = 0;
    if (driver().cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(page.address)) != CUDA_SUCCESS) {
      return false;  // unmapped
    }
    release_quietly(driver().cuMemRelease(handle), "cuMemRelease");
    // The allocation found is still retained here, so no other one can have its handle.
    if (handle != page.handle) return false;
  }
  return true;
}

std::vector<MemoryDescriptor> BackingPages::describe() const {
  std::vector<MemoryDescriptor> pages;
  pages.reserve(pages_.size());
  for (const Page& page : pages_) {
    pages.push_back(describe_shareable("exposure", "buffer", reinterpret_cast<const void*>(page.address), page.bytes,
                                       device_));
  }
  return pages;
}

std::unique_ptr<PagedMapping> PagedMapping::open(const std::vector<MemoryDescriptor>& pages, std::vector<int> fds,
                                                 int device) {
  struct ClosesFds {  // every descriptor not yet imported, whatever happens
    std::vector<int>& fds;
    ~ClosesFds() {
      for (int& fd : fds) {
        if (fd >= 0) close(fd);
      }
    }
  } closes{fds};
  if (pages.empty() || fds.size() != pages.size()) {
    raise(ErrorCode::kInternal, "mapping {} VMM allocations with {} file descriptors", pages.size(), fds.size());
  }
  RelaxedCaptureMode relaxed;
  DeviceGuard guard(device);
  std::unique_ptr<PagedMapping> mapping(new PagedMapping());  // its destructor undoes what was made on a throw
  mapping->device_ = device;
  const uint64_t first = pages.front().address;
  const uint64_t bytes = pages.back().address + pages.back().bytes - first;
  BRAID_CU(cuMemAddressReserve, &mapping->base_, bytes, 0, 0, 0);
  mapping->bytes_ = bytes;
  for (size_t i = 0; i < pages.size(); ++i) {
    CUmemGenericAllocationHandle handle = 0;
    BRAID_CU(cuMemImportFromShareableHandle, &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i])),
             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fds[i]);
    fds[i] = -1;
    const uint64_t offset = pages[i].address - first;
    try {
      map_for_device(mapping->base_ + offset, pages[i].bytes, handle, device);
    } catch (...) {
      driver().cuMemUnmap(mapping->base_ + offset, pages[i].bytes);  // harmless when the map itself failed
      release_quietly(driver().cuMemRelease(handle), "cuMemRelease");
      throw;
    }
    mapping->mapped_.push_back(Mapped{offset, pages[i].bytes, handle});
  }
  return mapping;
}

PagedMapping::~PagedMapping() {
  if (base_ == 0) return;
  DeviceGuard guard(device_);
  for (const Mapped& page : mapped_) {
    release_quietly(driver().cuMemUnmap(base_ + page.offset, page.bytes), "cuMemUnmap");
    release_quietly(driver().cuMemRelease(page.handle), "cuMemRelease");
  }
  release_quietly(driver().cuMemAddressFree(base_, bytes_), "cuMemAddressFree");
}

}  // namespace braid::detail
