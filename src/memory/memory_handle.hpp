// What another process of this host needs to map a range of device memory, and its wire form: the blob of
// export_handle()/import_handle() and the message ranks exchange when a registered buffer is first used.
// Pure data and byte packing, no CUDA: the unpacker refuses anything malformed (cpu tests fuzz it).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace braid::detail {

enum class MemoryKind : uint8_t {
  kLegacyIpc = 1,  // cudaMalloc memory: a cudaIpcMemHandle_t of the allocation
  kPosixFd = 2,    // VMM memory (cuMemCreate with POSIX-fd handles): a file descriptor of the allocation
};

const char* memory_kind_name(MemoryKind kind);

// A range [address, address + bytes) inside one allocation [allocation_base, allocation_base + allocation_bytes)
// of the exporter's address space.
struct MemoryDescriptor {
  MemoryKind kind = MemoryKind::kLegacyIpc;
  std::string host_id;         // which host (and boot) made it; import refuses another
  uint32_t pid = 0;            // the exporting process
  int32_t device = -1;         // the exporter's CUDA ordinal (its own numbering)
  std::string pci_bus_id;      // the exporter's GPU, comparable across processes
  uint64_t address = 0;        // the range's start in the exporter's address space
  uint64_t bytes = 0;          // the range's length (> 0)
  uint64_t allocation_base = 0;
  uint64_t allocation_bytes = 0;
  uint64_t id = 0;             // exporter-unique (a registration's id; 0 for a plain export)
  std::array<uint8_t, 64> ipc_handle{};  // kLegacyIpc: the cudaIpcMemHandle_t
  int32_t fd = -1;             // kPosixFd: the exporter's descriptor number (import takes it with pidfd_getfd)

  uint64_t offset() const { return address - allocation_base; }
};

// The format's version: blobs of another version are refused.
constexpr uint16_t kMemoryHandleVersion = 2;

// This host and boot: the kernel's boot id (shared by every process of one boot, containers included), else
// the host name.
const std::string& this_host_id();

// The versioned, checksummed wire form. With a job secret (`secret` not empty) the blob is signed: it carries an
// HMAC-SHA256 of its fields keyed with the secret (bootstrap/job_secret.hpp), which only the job's processes can
// make.
std::string pack(const MemoryDescriptor& descriptor, const std::string& secret = "");

// Parses a blob. Throws Error(kInvalidArgument) naming `argument` and what is wrong: empty or truncated, not a
// braid handle (magic), another version, a damaged checksum, fields that contradict each other (a range outside
// its allocation, an unknown kind). When `expected_host` is not empty, a blob made on another host (or boot) is
// refused too. With a job secret (`secret` not empty), a blob not signed with it is refused as well; without one,
// a signature is not checked (there is nothing to check it with).
MemoryDescriptor unpack(const std::string& blob, const char* function, const char* argument,
                        const std::string& expected_host, const std::string& secret = "");

}  // namespace braid::detail
