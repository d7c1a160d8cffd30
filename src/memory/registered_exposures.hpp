// A rank's registered buffers exposed to its peers (docs/dev/registration.md, "Eager zero copy on registered
// memory"): registering a buffer posts it to every peer's exposure helper (memory/exposure.hpp), which maps it and
// writes it into the peer's ExposureTable; deregistering waits for this rank's calls of the communicator to end,
// then has every peer release it. Owned by the CUDA backend's communicator state; its table and helper live as
// long as the communicator.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "memory/exposure.hpp"
#include "memory/exposure_importer.hpp"
#include "memory/exposure_table.hpp"
#include "memory/memory_handle.hpp"
#include "memory/paged_ranges.hpp"
#include "memory/vmm.hpp"

namespace braid::detail {

struct MemoryContext;

// NOTE [automatic exposures]
// An eager call's buffer of kAutomaticExposureBytes or more that no registered range holds, but that whole VMM
// allocations with POSIX-fd handles back (PyTorch's expandable segments, which grow by mapping allocations that its
// allocator hook never registers), is exposed at its first use: the allocations behind it (BackingPages) go to every
// peer's helper as one range, which each maps side by side (PagedMapping). Nobody says when such memory is unmapped,
// so every later use first checks that each allocation still lies where it was found (each stays retained here, so
// no other allocation can take its handle): where one does not, the exposure is withdrawn as a deregistration would
// (after this rank's calls end) and the buffer exposed anew. Memory the owner unmaps stays allocated while exposed:
// until its next use, the next automatic exposure of this rank (which first withdraws every exposure whose
// allocations changed), or the communicator's destruction. A range some peer could not map is remembered while its
// allocations are unchanged, so later calls do not ask again (its allocations stay retained too). At most
// kMostAutomaticExposures buffers, exposed or remembered, live at once; beyond that such buffers stay staged.
// verify/models/automatic_exposure.pml checks the use, the check and the withdrawal.
constexpr size_t kAutomaticExposureBytes = size_t(4) << 20;
constexpr size_t kMostAutomaticExposures = 1024;

// Whether find_or_expose exposes buffers nobody registered, for every communicator of this process (on unless
// turned off). Tests turn it off to keep unregistered buffers unexposed; set it alike on every rank, with no call
// in flight.
void set_automatic_exposures(bool on);

class RegisteredExposures {
 public:
  // `wait_for_calls(timeout_s)`: waits until this rank's calls of the communicator made so far have ended on the
  // GPU, false where the timeout passed first. The service's store clients are made with `connect`.
  RegisteredExposures(const MemoryContext& context,
                      const std::function<std::unique_ptr<StoreClient>()>& connect, const std::string& prefix,
                      std::function<bool(double timeout_s)> wait_for_calls);
  ~RegisteredExposures();
  RegisteredExposures(const RegisteredExposures&) = delete;
  RegisteredExposures& operator=(const RegisteredExposures&) = delete;

  // Exposes the range of registration `registration` (its descriptor) to every peer. Where some peer could not
  // map it, the range stays registered but unexposed (withdrawn from the peers that did) and this returns false;
  // it never throws for a peer's refusal.
  bool expose(uint64_t registration, const MemoryDescriptor& descriptor);
  // Waits for this rank's calls to end, then has every peer release registration `registration`'s range (nothing
  // where it is not exposed). Throws Error(kTimeout) where the calls or a peer's answer did not come in time;
  // the range then counts as withdrawn here.
  void withdraw(uint64_t registration);
  // From any thread (Communicator::abort, a fatal failure the peer watch saw): every exposure and withdrawal, now or
  // later, raises Error(kAborted), or `code` with `reason` (NOTE [ended host waits]).
  void interrupt() { service_.interrupt(); }
  void interrupt(ErrorCode code, std::string_view reason) { service_.interrupt(code, reason); }

  struct Found {
    uint64_t id;      // the exposure's id (what the peers' tables hold)
    uint64_t offset;  // of the buffer in the exposed range
  };
  // The exposed range that holds [pointer, pointer + bytes) (the newest where several do).
  std::optional<Found> find(uintptr_t pointer, size_t bytes) const;
  // find's range, else the automatic exposure that holds the buffer, made now where there is none yet (NOTE
  // [automatic exposures]). nullopt where neither serves. Throws Error(kTimeout) where a changed automatic exposure
  // could not be withdrawn in time (as withdraw).
  std::optional<Found> find_or_expose(uintptr_t pointer, size_t bytes);
  size_t automatic_count() const;  // automatic exposures every peer maps, live now

  const ExposedRange* device_table() const { return table_.device_entries(); }
  ExposedRange* device_cache() const { return table_.device_cache(); }  // NOTE [exposure cache]
  // What this rank's table holds for `owner`'s exposure `id` (host view).
  ExposedRange table_entry(int owner, uint64_t id) const { return table_.read(owner, id); }
  size_t exposed_count() const;   // this rank's ranges every peer maps
  size_t imported_count() const;  // peers' ranges mapped here
  // Where this rank mapped `owner`'s exposure `id`, if it did.
  std::optional<uintptr_t> imported(int owner, uint64_t id) const { return service_.imported(owner, id); }

 private:
  struct Exposed {
    uint64_t id;
    uint64_t address;
    uint64_t bytes;
  };
  struct Automatic {
    uint64_t id;  // 0: some peer could not map it
    std::unique_ptr<BackingPages> pages;
  };
  // Posts `blob` (kPosixFd fds open until every peer answered); withdraws it where some peer could not map it.
  // The exposure's id, or 0 then.
  uint64_t expose_blob(const std::string& blob, uint64_t address, uint64_t bytes);
  // Withdraws automatic_[index] (after this rank's calls end) and forgets it.
  void drop_automatic(size_t index);

  const MemoryContext& context_;
  std::function<bool(double)> wait_for_calls_;
  ExposureTable table_;
  CudaExposureImporter importer_;
  mutable std::mutex automatic_mutex_;  // held across an automatic exposure's round trip: one at a time
  std::vector<Automatic> automatic_;    // oldest first
  ExposureService service_;  // last: its helper stops before the importer and the table go
  mutable std::mutex mutex_;
  std::map<uint64_t, Exposed> exposed_;  // by registration id
  std::atomic<bool> warned_{false};      // the first range some peer could not map is a warning, later ones info
};

}  // namespace braid::detail
