// The wire form of a range that whole VMM allocations back side by side (memory/paged_ranges.hpp), as the exposure
// helper receives it: every allocation's packed MemoryDescriptor in address order. Pure byte packing, no CUDA: the
// unpacker refuses anything malformed (cpu tests).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "memory/memory_handle.hpp"

namespace braid::detail {

// The most allocations one range may have.
constexpr size_t kMostPages = 4096;

// Whether `blob` is in this form (else it is one packed MemoryDescriptor).
bool is_page_blob(const std::string& blob);

// Layout: magic "BRDP", count (u32), then each page's pack(descriptor, secret) as u32 length + bytes.
std::string pack_pages(const std::vector<MemoryDescriptor>& pages, const std::string& secret = "");

// Parses a blob of pack_pages. Throws Error(kInvalidArgument) naming `argument`: not this form, truncated or with
// bytes after its last page, no page or more than kMostPages, a page that unpack refuses (with `expected_host` and
// `secret` as there), a page that is not one whole VMM allocation, pages of different processes, GPUs or hosts, or
// pages not side by side in address order.
std::vector<MemoryDescriptor> unpack_pages(const std::string& blob, const char* function, const char* argument,
                                           const std::string& expected_host, const std::string& secret = "");

}  // namespace braid::detail
