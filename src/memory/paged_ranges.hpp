// Ranges that several whole VMM allocations back side by side, as PyTorch's expandable segments grow (one reserved
// range, one allocation mapped at a time): finding the allocations behind a range of this process, and mapping a
// peer's such range here. The exposure of buffers nobody registered uses both (NOTE [automatic exposures],
// memory/registered_exposures.hpp).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "memory/memory_handle.hpp"

namespace braid::detail {

// The allocations behind a range of this process, each retained (held) until this goes, so that no other
// allocation can take its handle while this compares them.
class BackingPages {
 public:
  // The whole allocations that back [pointer, pointer + bytes) on `device`: nullptr where some byte of it is not VMM
  // memory of `device` made with POSIX-fd handles (cudaMalloc memory, a hole, another handle type, another GPU), or
  // more than kMostPages allocations back it. `device` is made current for the queries.
  static std::unique_ptr<BackingPages> find(const void* pointer, size_t bytes, int device);
  ~BackingPages();
  BackingPages(const BackingPages&) = delete;
  BackingPages& operator=(const BackingPages&) = delete;

  uint64_t base() const { return base_; }    // the first allocation's start
  uint64_t bytes() const { return bytes_; }  // up to the last one's end
  size_t count() const { return pages_.size(); }
  bool holds(uint64_t pointer, uint64_t bytes) const {
    return pointer >= base_ && pointer - base_ <= bytes_ && bytes <= bytes_ - (pointer - base_);
  }
  // Whether every allocation still lies where it was found (none unmapped, none replaced by another).
  bool unchanged() const;
  // Each allocation described for a peer (describe_shareable of the whole allocation: kPosixFd, fd not set).
  std::vector<MemoryDescriptor> describe() const;

 private:
  struct Page {
    uint64_t address;
    uint64_t bytes;
    CUmemGenericAllocationHandle handle;  // retained
  };
  BackingPages() = default;
  int device_ = -1;
  uint64_t base_ = 0, bytes_ = 0;
  std::vector<Page> pages_;
};

// A peer's range of whole VMM allocations (unpack_pages), mapped side by side here read/write for `device`. Unmapped
// at once when destroyed: its holder makes sure no kernel of this rank still uses it (an exposure is withdrawn only
// after every call that used it ended).
class PagedMapping {
 public:
  // `fds[i]`: a descriptor of allocation i valid in this process; the mapping takes and closes every one.
  static std::unique_ptr<PagedMapping> open(const std::vector<MemoryDescriptor>& pages, std::vector<int> fds,
                                            int device);
  ~PagedMapping();
  PagedMapping(const PagedMapping&) = delete;
  PagedMapping& operator=(const PagedMapping&) = delete;

  char* address() const { return reinterpret_cast<char*>(base_); }
  uint64_t bytes() const { return bytes_; }

 private:
  PagedMapping() = default;
  int device_ = -1;
  CUdeviceptr base_ = 0;
  uint64_t bytes_ = 0;
  struct Mapped {
    uint64_t offset;
    uint64_t bytes;
    CUmemGenericAllocationHandle handle;  // imported
  };
  std::vector<Mapped> mapped_;
};

}  // namespace braid::detail
