// braid — C++ API, memory: symmetric allocations, registered buffers, and memory handles shared between
// processes (part of braid/braid.hpp, which includes it; the memory layer implements it). A Communicator
// (braid/braid.hpp) makes the symmetric allocations and registered buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braid {

namespace detail {
struct SymmetricAllocation;
struct Registration;
struct ExportedRange;
class PeerMapping;
}  // namespace detail

class Communicator;
class GlobalMemory;

// The handles below (SymmetricMemory, RegisteredBuffer, ExportedHandle, ImportedMemory) may be empty (default-made,
// reset, or moved from): operator bool says so, and every other accessor of an empty one throws kInvalidArgument.

struct AllocOptions {
  bool contiguous_view = false;  // also map every rank's memory into one [world × view_stride()] range
};

// Counters of a communicator's registered buffers (tests and diagnostics).
struct RegistrationStats {
  uint64_t buffers = 0;        // registrations alive
  uint64_t exchanges = 0;      // host exchanges made by first uses of a registered buffer at an address
  uint64_t cache_hits = 0;     // uses that found the peers' mappings cached (no host exchange)
  uint64_t automatic_exchanges = 0;  // exchanges made by automatic registration (calls captured into CUDA graphs
                                     // with buffers neither symmetric nor registered; BRAID_AUTO_REGISTER)
  uint64_t peer_mappings = 0;  // peers' ranges mapped here now: one for each peer registration, or automatically
                               // registered allocation, exchanged (two registrations of one allocation count twice)
  uint64_t nccl_registered = 0;  // NCCL backend: ranges NCCL has registered (ncclCommRegister) now; 0 once the
                                 // NCCL communicator was aborted (abort(), or the watchdog at a timeout)
  // BRAID_EAGER_ZERO_COPY=1 (the CUDA backend, more than one rank; 0 otherwise): this rank's ranges every peer maps
  // now, registered buffers' and those of buffers exposed at their first use; of those, the latter; and the peers'
  // exposed ranges mapped here now.
  uint64_t exposed = 0;
  uint64_t exposed_at_first_use = 0;
  uint64_t peer_exposures = 0;
};

// One symmetric allocation: the same size on every rank, every rank's copy mapped here.
class SymmetricMemory {
 public:
  SymmetricMemory() = default;  // empty
  explicit operator bool() const { return impl_ != nullptr; }

  size_t bytes() const;
  int world_size() const;
  int rank() const;
  void* local() const;
  void* peer(int rank) const;           // this process's mapping of rank's copy (local() for own rank)
  void* const* peers() const;           // host array [world]
  void* const* device_peers() const;    // device array [world], for kernels
  void* view() const;                   // contiguous view, or nullptr when not asked for
  size_t view_stride() const;           // bytes between consecutive ranks in view()

  // Drops this copy. When the last copy is reset or destroyed, this rank's mappings are unmapped and released
  // (local; peers keep theirs), after a synchronisation of this rank's GPU (cudaFree). Safe after the
  // communicator is destroyed.
  void reset();

 private:
  friend class Communicator;
  explicit SymmetricMemory(std::shared_ptr<detail::SymmetricAllocation> impl);
  std::shared_ptr<detail::SymmetricAllocation> impl_;
};

// A user buffer registered with one communicator (Communicator::register_buffer). Copies share the
// registration; the last copy's destruction, reset() of it, or Communicator::deregister of any copy releases it.
// deregister empties the copy it is given; the other copies stay non-empty but hold nothing (deregistering one of
// them releases nothing more and empties that copy).
class RegisteredBuffer {
 public:
  RegisteredBuffer() = default;
  explicit operator bool() const { return impl_ != nullptr; }
  void* data() const;
  size_t bytes() const;
  void reset() { impl_.reset(); }

 private:
  friend class Communicator;
  std::shared_ptr<detail::Registration> impl_;
};

// Device memory of this process described for other processes of this host: blob() is an opaque, versioned byte
// string that import_handle() maps elsewhere. It stays importable while this handle (or a copy) lives: for VMM
// memory the handle keeps the file descriptor importers take (with pidfd_getfd, which needs ptrace permission
// over this process: the same user and Yama's ptrace_scope 0, or 1 where the importer is an ancestor of this
// process, or CAP_SYS_PTRACE). Import a blob only while its handle lives: the blob names the fd by its number,
// which this process may give to another export (or another file) once the handle is gone, so a stale blob may be
// refused or may map other memory of this process.
class ExportedHandle {
 public:
  ExportedHandle() = default;
  explicit operator bool() const { return impl_ != nullptr; }
  const std::string& blob() const;
  void* data() const;
  size_t bytes() const;
  void reset() { impl_.reset(); }

 private:
  friend ExportedHandle export_handle(const void* pointer, size_t bytes, int device);
  friend class Communicator;
  std::shared_ptr<detail::ExportedRange> impl_;
};

// Exports [pointer, pointer + bytes) of device `device` (-1: the current device; below -1, or not a device this
// process sees: kInvalidArgument naming 'device'; kNoDevice where it sees none). Refused as register_buffer refuses.
ExportedHandle export_handle(const void* pointer, size_t bytes, int device = -1);

// Another process's exported range, mapped here. Stays mapped while a copy lives.
class ImportedMemory {
 public:
  ImportedMemory() = default;
  explicit operator bool() const { return mapping_ != nullptr; }
  void* data() const;                 // the range here
  size_t bytes() const;
  uint64_t exporter_address() const;  // where the range lies in the exporter's address space
  int exporter_pid() const;
  void reset() { mapping_.reset(); }

 private:
  friend ImportedMemory import_handle(const std::string& blob, int device);
  friend class GlobalMemory;
  std::shared_ptr<detail::PeerMapping> mapping_;
};

// Maps an export_handle() blob of another process of this host on `device` (-1: the current device; below -1, or
// not a device this process sees: kInvalidArgument naming 'device', checked after the blob; kNoDevice where it sees
// none). Refused
// (kInvalidArgument naming 'blob'): empty, truncated, damaged, another format version, another host or boot;
// unsigned, or signed with another key, where this process has BRAID_JOB_SECRET; naming this process as its
// exporter without being one of its live exports; a cudaMalloc handle stating a larger allocation than its IPC
// handle opens. Also refused: VMM memory whose exporter's fd cannot be taken (the exporter gone, or no ptrace
// permission over it for pidfd_getfd: kSystemError), a VMM handle stating more than its allocation (kDriverError
// from cuMemAddressReserve or cuMemMap).
ImportedMemory import_handle(const std::string& blob, int device = -1);

// Every rank's exported range, mapped here (Communicator::import_global). An empty one (default-made, or moved
// from) has world_size() 0 and rank() -1, and its peer() and bytes() refuse every rank (kInvalidArgument naming
// 'rank').
class GlobalMemory {
 public:
  GlobalMemory() = default;
  GlobalMemory(const GlobalMemory&) = default;
  GlobalMemory& operator=(const GlobalMemory&) = default;
  GlobalMemory(GlobalMemory&& other) noexcept;
  GlobalMemory& operator=(GlobalMemory&& other) noexcept;
  explicit operator bool() const { return !peers_.empty(); }
  int world_size() const { return static_cast<int>(peers_.size()); }
  int rank() const { return rank_; }
  void* peer(int rank) const;        // rank's range here (own rank: the exported buffer itself)
  size_t bytes(int rank) const;      // rank's range length
  void* const* peers() const { return peers_.data(); }

 private:
  friend class Communicator;
  int rank_ = -1;
  std::vector<void*> peers_;
  std::vector<size_t> bytes_;
  ExportedHandle own_;
  std::vector<std::shared_ptr<detail::PeerMapping>> mappings_;
  std::weak_ptr<const void> communicator_;  // the state of the communicator whose import_global made it
};

}  // namespace braid
