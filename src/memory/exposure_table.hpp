// The ranges the peers exposed to this rank (memory/exposure.hpp), as this rank's kernels read them: a table in
// pinned host memory, one row of slots per owner rank, filled by the exposure helper after it mapped a range, and
// its copy in this GPU's memory, which the kernels fill from it (NOTE [exposure cache], kernels/announced.cuh). A
// kernel that learns at its entry barrier that rank q passes (id, offset) finds q's range at slot
// exposure_slot(q, id) and checks the slot's id (docs/dev/registration.md, "Eager zero copy on registered memory").
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace braid {

// One exposed range as mapped here. Plain data, read by kernels.
struct ExposedRange {
  uint64_t id;     // the owner's exposure id; 0: the slot is empty
  uint64_t base;   // the range's start in this process
  uint64_t bytes;  // its length
};

// Slots a row: an owner's exposure id lands in slot id % kExposureSlots. An owner skips the ids whose slot one of
// its live ranges holds (NOTE [exposure ids], memory/exposure.hpp), so one with fewer than kExposureSlots live
// ranges never collides with itself; a collision is refused (the range stays staged).
// A row of 8192 slots is 192 KiB of pinned host memory and as much device memory (1.5 MiB each for 8 ranks).
constexpr uint64_t kExposureSlots = 8192;

#if defined(__CUDACC__)
#define BRAID_HOST_DEVICE __host__ __device__
#else
#define BRAID_HOST_DEVICE
#endif

BRAID_HOST_DEVICE inline size_t exposure_slot(int owner, uint64_t id) {
  return static_cast<size_t>(owner) * kExposureSlots + static_cast<size_t>(id % kExposureSlots);
}

#undef BRAID_HOST_DEVICE

namespace detail {

// NOTE [exposure table writes]
// The table lies in pinned host memory mapped for the GPU, so the helper thread fills it with plain stores and no
// CUDA call: a CUDA call of the helper could wait behind this rank's kernels, which may wait for the very owner
// that waits for the helper's answer. put stores a slot's length and base, then its id with release; a kernel
// loads the id with acquire (system scope) and then the rest. A kernel reads a slot only for an id a peer
// announced at a barrier of the same call, which the peer does only after its exposure returned, that is after
// every helper answered: so the slot is complete before any kernel looks for it. A withdrawn range's slot is
// only marked free here (no kernel looks for a withdrawn id: its owner announces it no more).
class ExposureTable {
 public:
  // A zeroed table for `world` owners, in pinned host memory mapped for `device`, and its zeroed copy there (zeroed
  // on `setup`, the communicator's set-up stream).
  ExposureTable(int world, int device, cudaStream_t setup);
  ~ExposureTable();
  ExposureTable(const ExposureTable&) = delete;
  ExposureTable& operator=(const ExposureTable&) = delete;

  // The table for kernels: [world * kExposureSlots], slot exposure_slot(owner, id).
  const ExposedRange* device_entries() const { return device_entries_; }
  // Its copy in the device's memory, for kernels only: [world * kExposureSlots], zeroed at first.
  ExposedRange* device_cache() const { return device_cache_; }

  // Writes (id, base, bytes) into owner's slot: false, writing nothing, where the slot holds another live range
  // of that owner, or `owner` is no rank, or id is 0.
  bool put(int owner, uint64_t id, uintptr_t base, uint64_t bytes);
  // Frees owner's slot for `id` (NOTE [exposure table writes]); nothing where it holds another id.
  void remove(int owner, uint64_t id) noexcept;
  // What owner's slot for `id` holds now (its id may be another's, or 0).
  ExposedRange read(int owner, uint64_t id) const;

 private:
  int world_;
  ExposedRange* entries_ = nullptr;               // host view
  const ExposedRange* device_entries_ = nullptr;  // the same memory as the GPU sees it
  ExposedRange* device_cache_ = nullptr;           // device memory
  std::mutex mutex_;
  std::map<size_t, uint64_t> live_;  // slot -> the id it holds
};

}  // namespace detail
}  // namespace braid
