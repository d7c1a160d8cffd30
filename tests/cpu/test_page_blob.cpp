// The wire form of a range that whole VMM allocations back side by side (memory/page_blob.hpp): round trips with
// and without a job secret, and every malformed list refused with kInvalidArgument naming the argument; truncations
// and random byte flips never crash and never yield a list that breaks the form's rules.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "memory/page_blob.hpp"

namespace braid::detail {
namespace {

constexpr uint64_t kBase = 0x7f2000000000;
constexpr uint64_t kPage = 20 << 20;

MemoryDescriptor page_at(uint64_t address, uint64_t bytes = kPage, uint32_t pid = 4242, int fd = 7) {
  MemoryDescriptor d;
  d.kind = MemoryKind::kPosixFd;
  d.host_id = this_host_id();
  d.pid = pid;
  d.device = 1;
  d.pci_bus_id = "00000000:1B:00.0";
  d.address = d.allocation_base = address;
  d.bytes = d.allocation_bytes = bytes;
  d.fd = fd;
  return d;
}

std::vector<MemoryDescriptor> side_by_side(size_t count) {
  std::vector<MemoryDescriptor> pages;
  for (size_t i = 0; i < count; ++i) pages.push_back(page_at(kBase + i * kPage, kPage, 4242, static_cast<int>(7 + i)));
  return pages;
}

void expect_refused(const std::string& blob, const std::string& words, const std::string& secret = "") {
  try {
    unpack_pages(blob, "exposure", "descriptor", this_host_id(), secret);
    ADD_FAILURE() << "accepted a bad list; expected '" << words << "'";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_NE(std::string(error.what()).find("argument 'descriptor'"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
  }
}

// The rules every accepted list keeps.
void expect_well_formed(const std::vector<MemoryDescriptor>& pages) {
  ASSERT_FALSE(pages.empty());
  ASSERT_LE(pages.size(), kMostPages);
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(pages[i].kind, MemoryKind::kPosixFd);
    EXPECT_EQ(pages[i].address, pages[i].allocation_base);
    EXPECT_EQ(pages[i].bytes, pages[i].allocation_bytes);
    EXPECT_GE(pages[i].fd, 0);
    if (i > 0) {
      EXPECT_EQ(pages[i].address, pages[i - 1].address + pages[i - 1].bytes);
      EXPECT_EQ(pages[i].pid, pages[i - 1].pid);
      EXPECT_EQ(pages[i].device, pages[i - 1].device);
    }
  }
}

TEST(PageBlob, RoundTripsOneAndManyAllocations) {
  for (const size_t count : {size_t(1), size_t(2), size_t(52)}) {
    for (const std::string secret : {std::string(), std::string(32, 's')}) {
      const std::vector<MemoryDescriptor> pages = side_by_side(count);
      const std::string blob = pack_pages(pages, secret);
      EXPECT_TRUE(is_page_blob(blob));
      const std::vector<MemoryDescriptor> back = unpack_pages(blob, "exposure", "descriptor", this_host_id(), secret);
      ASSERT_EQ(back.size(), count);
      for (size_t i = 0; i < count; ++i) {
        EXPECT_EQ(back[i].address, pages[i].address);
        EXPECT_EQ(back[i].bytes, pages[i].bytes);
        EXPECT_EQ(back[i].fd, pages[i].fd);
        EXPECT_EQ(back[i].pid, pages[i].pid);
      }
    }
  }
}

TEST(PageBlob, OnePackedDescriptorIsNotAList) {
  EXPECT_FALSE(is_page_blob(pack(page_at(kBase))));
  EXPECT_FALSE(is_page_blob(""));
  expect_refused(pack(page_at(kBase)), "magic bytes");
}

TEST(PageBlob, RefusesListsThatBreakTheRules) {
  expect_refused(pack_pages({}), "claims 0 allocations");
  {
    std::vector<MemoryDescriptor> pages = side_by_side(3);
    pages[2].address = pages[2].allocation_base = kBase + 4 * kPage;  // a hole before it
    expect_refused(pack_pages(pages), "does not follow allocation 1");
  }
  {
    std::vector<MemoryDescriptor> pages = side_by_side(3);
    std::swap(pages[0], pages[1]);  // out of order
    expect_refused(pack_pages(pages), "does not follow allocation 0");
  }
  {
    std::vector<MemoryDescriptor> pages = side_by_side(2);
    pages[1].pid = 4343;
    expect_refused(pack_pages(pages), "another process");
  }
  {
    std::vector<MemoryDescriptor> pages = side_by_side(2);
    pages[1].bytes = kPage / 2;  // part of its allocation
    expect_refused(pack_pages(pages), "is not whole");
  }
  {
    std::vector<MemoryDescriptor> pages = side_by_side(2);
    pages[0].kind = MemoryKind::kLegacyIpc;
    expect_refused(pack_pages(pages), "is not VMM memory");
  }
  {  // More than the most.
    std::vector<MemoryDescriptor> pages = side_by_side(kMostPages + 1);
    expect_refused(pack_pages(pages), "claims 4097 allocations");
  }
  // Signed with another secret, or not signed where this process has one.
  expect_refused(pack_pages(side_by_side(2), std::string(32, 'a')), "signature", std::string(32, 'b'));
  expect_refused(pack_pages(side_by_side(2)), "not signed", std::string(32, 'b'));
  // Bytes after the last allocation.
  expect_refused(pack_pages(side_by_side(2)) + "x", "follow its last allocation");
}

TEST(PageBlob, TruncatedAndFlippedBlobsNeverCrashNorBreakTheRules) {
  const std::string blob = pack_pages(side_by_side(4));
  for (size_t length = 0; length < blob.size(); ++length) {
    EXPECT_THROW(unpack_pages(blob.substr(0, length), "exposure", "descriptor", this_host_id()), Error)
        << "accepted a list truncated to " << length << " bytes";
  }
  std::mt19937_64 random(12345);
  for (int trial = 0; trial < 20000; ++trial) {
    std::string mutated = blob;
    const int flips = 1 + static_cast<int>(random() % 3);
    for (int f = 0; f < flips; ++f) mutated[random() % mutated.size()] ^= static_cast<char>(1 + random() % 255);
    try {
      expect_well_formed(unpack_pages(mutated, "exposure", "descriptor", this_host_id()));
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    }
  }
}

}  // namespace
}  // namespace braid::detail
