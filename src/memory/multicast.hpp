// NVLink multicast (NVLS), gated: off unless BRAID_ENABLE_MULTICAST=1. A multicast object is made at communicator init only when
// BRAID_ENABLE_MULTICAST=1 and every rank's GPU reports multicast support; with the variable unset nothing here
// calls the driver. Never set it on a shared GPU host: a multicast program there can take the host's GPUs out
// of service.
//
// Setup, each step agreed by every rank before the next (a rank that fails tells the others through the
// agreement, so none is left waiting inside the driver, where cuMulticastBindAddr blocks until every device of
// the team has been added):
//   1. every GPU reports CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED (and the driver has the multicast entry points);
//   2. the size is rounded up to the multicast granularity; a symmetric allocation of that size is made;
//   3. rank 0 creates the object (one device per rank) and exports it as a POSIX fd;
//   4. the fd travels over the communicator's Unix sockets; every other rank imports it;
//   5. every rank adds its GPU to the object;
//   6. every rank binds its copy of the allocation at offset 0;
//   7. every rank maps the object (the multicast address) read/write for its GPU.
// Any failure: every rank warns, undoes what it made, and the communicator runs the unicast algorithms.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <functional>
#include <memory>

#include "braid/memory.hpp"

namespace braid {
class Config;
}

namespace braid::detail {

// What setting multicast up needs from the communicator, as calls (the communicator passes its bootstrap, fd
// exchanger and symmetric allocator; cpu tests pass fakes). Each is collective.
struct MulticastTeam {
  int rank = 0;
  int size = 1;
  int device = 0;  // CUDA ordinal of this rank's GPU
  // True on every rank exactly when every rank passed true.
  std::function<bool(bool mine)> all_agree;
  // Rank 0 passes an fd (it keeps it) and gets -1; every other rank gets a duplicate of rank 0's fd, its own.
  std::function<int(int fd)> share_fd;
  // A symmetric allocation of `bytes` on every rank.
  std::function<SymmetricMemory(size_t bytes)> allocate;
};

// This rank's share of a multicast object: a symmetric allocation bound to it (peers' copies are mapped here
// too), and the multicast address, where a multimem access reaches every rank's copy at the same offset.
class MulticastRegion {
 public:
  MulticastRegion() = default;
  ~MulticastRegion();  // unmaps, unbinds and releases what this rank made; the allocation goes after
  MulticastRegion(const MulticastRegion&) = delete;
  MulticastRegion& operator=(const MulticastRegion&) = delete;

  size_t bytes() const { return bytes_; }
  char* local() const { return local_; }                                          // this rank's copy
  void* const* device_peers() const { return device_peers_; }                      // every rank's copy, for kernels
  char* multicast() const { return reinterpret_cast<char*>(multicast_address_); }  // the multicast mapping

 private:
  friend std::unique_ptr<MulticastRegion> open_multicast(const Config&, const MulticastTeam&, size_t);
  SymmetricMemory memory_;
  char* local_ = nullptr;
  void* const* device_peers_ = nullptr;
  size_t bytes_ = 0;
  CUdevice device_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
  bool has_handle_ = false;
  bool bound_ = false;
  CUdeviceptr multicast_address_ = 0;
  bool reserved_ = false;
  bool mapped_ = false;
};

// The gate and the setup above: nullptr, without one driver call, unless BRAID_ENABLE_MULTICAST=1 in `config`;
// nullptr after a warning on every rank when any rank cannot take part; otherwise a region of at least `bytes`.
std::unique_ptr<MulticastRegion> open_multicast(const Config& config, const MulticastTeam& team, size_t bytes);

// Whether BRAID_ENABLE_MULTICAST=1 in `config` (the gate alone).
bool multicast_enabled(const Config& config);

}  // namespace braid::detail
