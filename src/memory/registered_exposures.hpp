// A rank's registered buffers exposed to its peers (docs/dev/registration.md, "Eager zero copy on registered
// memory"): registering a buffer posts it to every peer's exposure helper (memory/exposure.hpp), which maps it and
// writes it into the peer's ExposureTable; deregistering waits for this rank's calls of the communicator to end,
// then has every peer release it. Owned by the CUDA backend's communicator state; its table and helper live as
// long as the communicator.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "memory/exposure.hpp"
#include "memory/exposure_importer.hpp"
#include "memory/exposure_table.hpp"
#include "memory/memory_handle.hpp"
#include "memory/vmm.hpp"

namespace braid::detail {

struct MemoryContext;

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

  struct Found {
    uint64_t id;      // the exposure's id (what the peers' tables hold)
    uint64_t offset;  // of the buffer in the exposed range
  };
  // The exposed range that holds [pointer, pointer + bytes) (the newest where several do).
  std::optional<Found> find(uintptr_t pointer, size_t bytes) const;

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
  const MemoryContext& context_;
  std::function<bool(double)> wait_for_calls_;
  ExposureTable table_;
  CudaExposureImporter importer_;
  ExposureService service_;  // last: its helper stops before the importer and the table go
  mutable std::mutex mutex_;
  std::map<uint64_t, Exposed> exposed_;  // by registration id
};

}  // namespace braid::detail
