#include "memory/page_blob.hpp"

#include <cstdint>
#include <cstring>

#include "core/error.hpp"

namespace braid::detail {
namespace {

constexpr char kMagic[4] = {'B', 'R', 'D', 'P'};

void put_u32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint32_t get_u32(const std::string& in, size_t at) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint32_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return value;
}

}  // namespace

bool is_page_blob(const std::string& blob) {
  return blob.size() >= sizeof(kMagic) && std::memcmp(blob.data(), kMagic, sizeof(kMagic)) == 0;
}

std::string pack_pages(const std::vector<MemoryDescriptor>& pages, const std::string& secret) {
  std::string out(kMagic, sizeof(kMagic));
  put_u32(out, static_cast<uint32_t>(pages.size()));
  for (const MemoryDescriptor& page : pages) {
    const std::string packed = pack(page, secret);
    put_u32(out, static_cast<uint32_t>(packed.size()));
    out += packed;
  }
  return out;
}

std::vector<MemoryDescriptor> unpack_pages(const std::string& blob, const char* function, const char* argument,
                                           const std::string& expected_host, const std::string& secret) {
  auto fail = [&](const std::string& problem) {
    raise_invalid_argument(function, argument, "is not a valid list of VMM allocations: {}", problem);
  };
  if (!is_page_blob(blob)) fail("it does not start with the magic bytes of one");
  if (blob.size() < sizeof(kMagic) + 4) fail("it ends before its count");
  const uint32_t count = get_u32(blob, sizeof(kMagic));
  if (count == 0 || count > kMostPages) fail(fmt::format("it claims {} allocations (1 to {})", count, kMostPages));
  std::vector<MemoryDescriptor> pages;
  pages.reserve(count);
  size_t at = sizeof(kMagic) + 4;
  for (uint32_t i = 0; i < count; ++i) {
    if (blob.size() - at < 4) fail(fmt::format("it ends before allocation {}", i));
    const uint32_t length = get_u32(blob, at);
    at += 4;
    if (blob.size() - at < length) fail(fmt::format("allocation {} claims {} bytes, past its end", i, length));
    MemoryDescriptor page = unpack(blob.substr(at, length), function, argument, expected_host, secret);
    at += length;
    if (page.kind != MemoryKind::kPosixFd) fail(fmt::format("allocation {} is not VMM memory", i));
    if (page.address != page.allocation_base || page.bytes != page.allocation_bytes) {
      fail(fmt::format("allocation {} is not whole: [{:#x}, +{}) of [{:#x}, +{})", i, page.address, page.bytes,
                       page.allocation_base, page.allocation_bytes));
    }
    if (!pages.empty()) {
      const MemoryDescriptor& last = pages.back();
      if (page.pid != last.pid || page.device != last.device || page.host_id != last.host_id ||
          page.pci_bus_id != last.pci_bus_id) {
        fail(fmt::format("allocation {} is of another process, GPU or host than allocation {}", i, i - 1));
      }
      if (last.address + last.bytes != page.address) {
        fail(fmt::format("allocation {} at {:#x} does not follow allocation {}, which ends at {:#x}", i, page.address,
                         i - 1, last.address + last.bytes));
      }
    }
    pages.push_back(std::move(page));
  }
  if (at != blob.size()) fail(fmt::format("{} bytes follow its last allocation", blob.size() - at));
  return pages;
}

}  // namespace braid::detail
