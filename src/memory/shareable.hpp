// Device memory that other processes (or threads) of this host can map: describing a range of ours, and
// mapping a range another rank described. Used by registration (the first collective on a registered buffer)
// and by export_handle()/import_handle().
#pragma once

#include <memory>

#include "memory/memory_handle.hpp"

namespace braid::detail {

// Checks [pointer, pointer + bytes) of this process and describes it for sharing (no fd is made here).
// Refused with kInvalidArgument naming `argument`: null, zero length, a range that overflows the address
// space or its allocation, host or managed memory, memory of another GPU than `device`. Refused with
// kUnsupported: device memory that cannot be shared (neither cudaMalloc nor VMM made with POSIX-fd handles,
// e.g. cudaMallocAsync memory of any pool, whatever its handle types). `device` is made current for the checks.
MemoryDescriptor describe_shareable(const char* function, const char* argument, const void* pointer, size_t bytes,
                                    int device);

// kPosixFd: a new file descriptor of the described allocation, owned by the caller.
int export_allocation_fd(const MemoryDescriptor& descriptor, int device);

// Another rank's range, mapped here read/write for `device`. Destroying it waits for `device` to go idle (no
// kernel of ours may still use the mapping), then unmaps; one opened with unmap_at_once unmaps at once.
class PeerMapping {
 public:
  // `fd` (kPosixFd): a descriptor of the allocation valid in this process; the mapping takes and closes it.
  // A cudaMalloc descriptor stating a larger allocation than its IPC handle opens is refused with kInvalidArgument
  // naming `function` and `argument` (where the descriptor came from).
  // A range of this very process is used where it lies (peer access enabled between the two GPUs) rather than
  // mapped again: CUDA IPC cannot open a handle of its own process.
  // `unmap_at_once`: once the mapping's last holder lets go, no kernel of this rank still uses it (it is held by
  // CUDA graphs only, which release what they hold after their launches complete; or by an exposure, withdrawn
  // only after every call that used it ended), so its destructor need not wait for the device.
  static std::shared_ptr<PeerMapping> open(const char* function, const char* argument,
                                           const MemoryDescriptor& descriptor, int fd, int device,
                                           bool unmap_at_once = false);
  ~PeerMapping();
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;

  char* address() const { return address_; }  // the range's start here
  // Where the exporter's `exporter_address` (inside the same allocation) lies here.
  char* at(uint64_t exporter_address) const;
  const MemoryDescriptor& descriptor() const { return descriptor_; }
  // Another GPU's memory of this process, used where it lies (nothing mapped).
  bool in_place() const { return ipc_base_ == nullptr && vmm_handle_ == 0; }

 private:
  PeerMapping() = default;
  MemoryDescriptor descriptor_;
  int device_ = -1;
  bool unmap_at_once_ = false;
  char* address_ = nullptr;
  void* ipc_base_ = nullptr;             // kLegacyIpc from another process: what cudaIpcOpenMemHandle returned
  unsigned long long vmm_handle_ = 0;    // kPosixFd: the imported allocation
  unsigned long long vmm_base_ = 0;      // kPosixFd: where it is mapped here
};

}  // namespace braid::detail
