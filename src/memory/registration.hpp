// User buffers registered with a communicator (Communicator::register_buffer): registration is local and
// cheap; the first collective that uses a registered buffer at a given address exchanges memory descriptors
// with the peers (CUDA IPC handles for cudaMalloc memory, fds for VMM memory), maps theirs, and caches the
// table; later calls with that address hit the cache and make no host exchange.
//
// Lifetimes: the cache belongs to the communicator's state; a Registration holds it weakly, so deregistering
// after the communicator is gone (or before) both work. A peer's allocation is mapped once per communicator
// (PeerMapping, shared by every cached table that uses it) and unmapped when the last table using it goes.
#pragma once

#include <atomic>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "braid/memory.hpp"
#include "memory/memory_handle.hpp"
#include "memory/peer_range.hpp"
#include "memory/shareable.hpp"

namespace braid::detail {

class RegistrationCache;
struct MemoryContext;
struct ExchangedTable;

// One register_buffer call.
struct Registration {
  uint64_t id = 0;
  MemoryDescriptor descriptor;  // the registered range and its allocation
  std::weak_ptr<RegistrationCache> cache;
  std::atomic<bool> released{false};

  // Forgets the registration and its cached tables (idempotent; safe after the communicator is destroyed).
  void release();
  ~Registration() { release(); }
};

class RegistrationCache {
 public:
  // Adds a registration of `descriptor`'s range (already checked by describe_shareable).
  std::shared_ptr<Registration> add(const std::shared_ptr<RegistrationCache>& self, const MemoryDescriptor& descriptor);
  void remove(uint64_t id);

  // The newest registration whose range holds [pointer, pointer + bytes): its id and descriptor.
  std::optional<std::pair<uint64_t, MemoryDescriptor>> containing(uintptr_t pointer, size_t bytes);
  // The cached table of registration `id` at `pointer` (counts a hit).
  std::optional<PeerRange> cached(uint64_t id, uintptr_t pointer);
  // A peer's allocation already mapped for this communicator (by the peer's registration id), or nullptr.
  std::shared_ptr<PeerMapping> mapping(int peer, uint64_t peer_id);
  // Caches a table made by an exchange, with the mappings it uses (dropped if `id` was deregistered meanwhile).
  void insert(uint64_t id, uintptr_t pointer, const PeerRange& range, std::vector<std::shared_ptr<PeerMapping>> mappings,
              const std::vector<int>& peers, const std::vector<uint64_t>& peer_ids);

  // An automatic registration's exchange (exchange_automatically): counted, and its mappings kept findable for
  // later exchanges while anything holds them; or counted alone when some rank could not share its buffer.
  void remember_automatic(const ExchangedTable& table);
  void count_automatic_exchange();

  RegistrationStats stats();
  // Called (outside the cache's lock) with the id of every registration removed: the NCCL backend deregisters it.
  void on_remove(std::function<void(uint64_t)> hook);

 private:
  struct Table {
    PeerRange range;
    std::vector<std::shared_ptr<PeerMapping>> mappings;  // keeps the peers' allocations mapped
  };
  struct Record {
    MemoryDescriptor descriptor;
    std::map<uintptr_t, Table> tables;  // by the address a collective passed
  };
  std::mutex mutex_;
  std::function<void(uint64_t)> on_remove_;
  std::map<uint64_t, Record> records_;
  std::map<std::pair<int, uint64_t>, std::weak_ptr<PeerMapping>> mappings_;  // (peer, peer's registration id)
  uint64_t exchanges_ = 0;
  uint64_t hits_ = 0;
  uint64_t automatic_exchanges_ = 0;

  void remember_locked(const std::vector<std::shared_ptr<PeerMapping>>& mappings, const std::vector<int>& peers,
                       const std::vector<uint64_t>& peer_ids);

  friend std::optional<PeerRange> find_registered_range(MemoryContext& state, const void* pointer, size_t bytes,
                                                        const std::function<void()>& before_exchange);
  void count_exchange() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++exchanges_;
  }
};

// What one exchange of a buffer's descriptors made: every rank's copy mapped here, and the mappings that keep the
// peers' allocations mapped (shared with every other table that uses them).
struct ExchangedTable {
  PeerRange range;
  std::vector<std::shared_ptr<PeerMapping>> mappings;
  std::vector<int> peers;          // whose allocation each mapping is
  std::vector<uint64_t> peer_ids;  // and its id there (the mapping cache's key with the peer)
};

// Collective: every rank sends its descriptor of the buffer it passes at `address` (`mine`; null: this rank cannot
// share it), all gather, and each maps the peers' allocations it has not mapped yet (VMM fds travel over the fd
// sockets). nullopt on every rank when some rank sent none. `what` names the exchange in errors.
// `graph_held`: the mappings opened will be held by CUDA graphs only (PeerMapping::open).
std::optional<ExchangedTable> exchange_tables(MemoryContext& state, const MemoryDescriptor* mine, uintptr_t address,
                                              const char* what, bool graph_held);

// The registered-buffer half of find_peer_range.
std::optional<PeerRange> find_registered_range(MemoryContext& state, const void* pointer, size_t bytes,
                                               const std::function<void()>& before_exchange);

}  // namespace braid::detail
