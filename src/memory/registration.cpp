#include "memory/registration.hpp"

#include <fmt/format.h>

#include "bootstrap/job_secret.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "memory/export_import.hpp"
#include "memory/memory_context.hpp"
#include "memory/symmetric_memory.hpp"
#include "memory/vmm.hpp"

namespace braid {
namespace detail {
namespace {

// Registration ids are unique in the process, so a peer's (rank, id) names one registration for good.
std::atomic<uint64_t> g_next_registration_id{1};

}  // namespace

void Registration::release() {
  if (released.exchange(true)) return;
  if (std::shared_ptr<RegistrationCache> owner = cache.lock()) owner->remove(id);
}

std::shared_ptr<Registration> RegistrationCache::add(const std::shared_ptr<RegistrationCache>& self,
                                                     const MemoryDescriptor& descriptor) {
  auto registration = std::make_shared<Registration>();
  registration->id = g_next_registration_id.fetch_add(1);
  registration->descriptor = descriptor;
  registration->descriptor.id = registration->id;
  registration->cache = self;
  std::lock_guard<std::mutex> lock(mutex_);
  records_[registration->id] = Record{registration->descriptor, {}};
  return registration;
}

void RegistrationCache::remove(uint64_t id) {
  Record record;  // destroyed outside the lock: dropping the last table of a peer mapping unmaps it (and waits)
  std::function<void(uint64_t)> hook;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = records_.find(id);
    if (it == records_.end()) return;
    record = std::move(it->second);
    records_.erase(it);
    hook = on_remove_;
  }
  if (hook) hook(id);
}

void RegistrationCache::on_remove(std::function<void(uint64_t)> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_remove_ = std::move(hook);
}

std::optional<std::pair<uint64_t, MemoryDescriptor>> RegistrationCache::containing(uintptr_t pointer, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Newest first (ids grow): of two registrations that hold the range, the later one serves it. Few
  // registrations live at once, so a scan is enough.
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    const MemoryDescriptor& d = it->second.descriptor;
    if (pointer >= d.address && pointer - d.address < d.bytes && bytes <= d.bytes - (pointer - d.address)) {
      return std::make_pair(it->first, d);
    }
  }
  return std::nullopt;
}

std::optional<PeerRange> RegistrationCache::cached(uint64_t id, uintptr_t pointer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto record = records_.find(id);
  if (record == records_.end()) return std::nullopt;
  auto table = record->second.tables.find(pointer);
  if (table == record->second.tables.end()) return std::nullopt;
  ++hits_;
  return table->second.range;
}

std::shared_ptr<PeerMapping> RegistrationCache::mapping(int peer, uint64_t peer_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = mappings_.find({peer, peer_id});
  return it == mappings_.end() ? nullptr : it->second.lock();
}

void RegistrationCache::remember_locked(const std::vector<std::shared_ptr<PeerMapping>>& mappings,
                                        const std::vector<int>& peers, const std::vector<uint64_t>& peer_ids) {
  for (size_t i = 0; i < peers.size(); ++i) mappings_[{peers[i], peer_ids[i]}] = mappings[i];
  for (auto it = mappings_.begin(); it != mappings_.end();) it = it->second.expired() ? mappings_.erase(it) : std::next(it);
}

void RegistrationCache::remember_automatic(const ExchangedTable& table) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++automatic_exchanges_;
  remember_locked(table.mappings, table.peers, table.peer_ids);
}

void RegistrationCache::count_automatic_exchange() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++automatic_exchanges_;
}

void RegistrationCache::insert(uint64_t id, uintptr_t pointer, const PeerRange& range,
                               std::vector<std::shared_ptr<PeerMapping>> mappings, const std::vector<int>& peers,
                               const std::vector<uint64_t>& peer_ids) {
  std::vector<std::shared_ptr<PeerMapping>> unused;  // declared before the lock: released after it (unmapping waits)
  std::lock_guard<std::mutex> lock(mutex_);
  remember_locked(mappings, peers, peer_ids);
  auto record = records_.find(id);
  if (record == records_.end()) {  // deregistered meanwhile: nothing keeps the mappings
    unused = std::move(mappings);
    return;
  }
  record->second.tables[pointer] = Table{range, std::move(mappings)};
}

RegistrationStats RegistrationCache::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  RegistrationStats stats;
  stats.buffers = records_.size();
  stats.exchanges = exchanges_;
  stats.cache_hits = hits_;
  stats.automatic_exchanges = automatic_exchanges_;
  for (const auto& [key, mapping] : mappings_) {
    if (!mapping.expired()) ++stats.peer_mappings;
  }
  return stats;
}

namespace {

// Maps every peer's range of an exchange whose blobs all name one (the peers' fds by `tag`).
ExchangedTable map_exchanged(MemoryContext& state, const MemoryDescriptor& own, const std::vector<std::string>& blobs,
                             uintptr_t address, const char* what, bool graph_held, uint64_t tag) {
  RegistrationCache& cache = *state.registrations;
  std::vector<MemoryDescriptor> theirs(state.size);
  for (int q = 0; q < state.size; ++q) {
    if (q == state.rank) continue;  // this rank's own entry is `own`, never one from the store
    theirs[q] = unpack_for_import(blobs[q], what, "peer descriptor", BlobOrigin{&state, q});
  }
  ExchangedTable table;
  PeerRange& range = table.range;
  range.aligned16 = true;
  range.same_process_peers = false;
  range.identity = 0;
  for (int q = 0; q < state.size; ++q) {
    const MemoryDescriptor& d = q == state.rank ? own : theirs[q];
    range.aligned16 = range.aligned16 && d.address % 16 == 0;
    range.identity = mix64(range.identity ^ mix64(d.id ^ mix64(d.address + static_cast<uint64_t>(q))));
    if (q == state.rank) {
      range.buffers.at[q] = reinterpret_cast<char*>(address);
      continue;
    }
    const int fd = d.kind == MemoryKind::kPosixFd ? state.fds->receive(q, tag) : -1;
    std::shared_ptr<PeerMapping> mapping = cache.mapping(q, d.id);
    if (mapping) {
      if (fd >= 0) FdOwner unused(fd);
    } else {
      mapping = PeerMapping::open(what, "peer descriptor", d, fd, state.device, graph_held);
    }
    range.buffers.at[q] = mapping->at(d.address);
    range.same_process_peers = range.same_process_peers || mapping->in_place();
    table.mappings.push_back(std::move(mapping));
    table.peers.push_back(q);
    table.peer_ids.push_back(d.id);
  }
  return table;
}

}  // namespace

std::optional<ExchangedTable> exchange_tables(MemoryContext& state, const MemoryDescriptor* mine, uintptr_t address,
                                              const char* what, bool graph_held) {
  std::lock_guard<std::mutex> setup(state.setup_mutex);
  FdOwner exported;  // VMM: a descriptor of the allocation for every peer (its number travels in the blob)
  MemoryDescriptor own = mine ? *mine : MemoryDescriptor{};
  if (mine && own.kind == MemoryKind::kPosixFd) own.fd = exported.fd = export_allocation_fd(own, state.device);
  const std::string own_blob = mine ? pack(own, job_secret()) : std::string();
  offer_to_thread_ranks(state, own_blob);  // NOTE [descriptors naming this process]
  const std::vector<std::string> blobs = state.bootstrap->allgather(own_blob, what);
  withdraw_earlier_offers(state, own_blob);
  // Every rank reads the same blobs: either all map, or none does (an empty blob is a rank that cannot share).
  for (const std::string& blob : blobs) {
    if (blob.empty()) return std::nullopt;
  }
  const uint64_t tag = state.alloc_sequence++;
  if (exported.fd >= 0) {  // first: a peer's blob this rank refuses below must not leave the peers waiting
    for (int q = 0; q < state.size; ++q) {
      if (q != state.rank) state.fds->send(q, exported.fd, tag);
    }
  }
  try {
    return map_exchanged(state, own, blobs, address, what, graph_held, tag);
  } catch (...) {
    if (state.fds) state.fds->discard(tag);  // the peers' fds not taken: closed, so they keep no allocation alive
    throw;
  }
}

std::optional<PeerRange> find_registered_range(MemoryContext& state, const void* pointer, size_t bytes,
                                               const std::function<void()>& before_exchange) {
  RegistrationCache& cache = *state.registrations;
  const uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  const auto found = cache.containing(address, bytes);
  if (!found) return std::nullopt;
  const auto& [id, registered] = *found;
  if (std::optional<PeerRange> hit = cache.cached(id, address)) return hit;
  if (before_exchange) before_exchange();

  // First use at this address: every rank describes its buffer (the registration's allocation, this call's
  // address), all gather, and each maps what it has not mapped yet. VMM peers' fds travel over the fd sockets.
  MemoryDescriptor mine = registered;
  mine.address = address;
  mine.bytes = bytes;
  std::optional<ExchangedTable> table = exchange_tables(state, &mine, address, "registered buffer exchange", false);
  if (!table) raise(ErrorCode::kInternal, "a peer sent no descriptor in a registered buffer's exchange");
  cache.count_exchange();
  const PeerRange range = table->range;
  cache.insert(id, address, range, std::move(table->mappings), table->peers, table->peer_ids);
  BRAID_DEBUG("registered buffer {} ({} bytes, registration {}): peers' mappings exchanged and cached", pointer, bytes, id);
  return range;
}

}  // namespace detail

std::optional<PeerRange> find_peer_range(detail::MemoryContext& state, const void* pointer, size_t bytes,
                                         const std::function<void()>& before_exchange) {
  if (pointer == nullptr || bytes == 0) return std::nullopt;
  if (std::optional<PeerRange> symmetric = find_symmetric_range(state, pointer, bytes)) return symmetric;
  return detail::find_registered_range(state, pointer, bytes, before_exchange);
}

// ---- Public API ----

namespace {
const detail::Registration& checked(const std::shared_ptr<detail::Registration>& impl, const char* call) {
  if (!impl) raise(ErrorCode::kInvalidArgument, "RegisteredBuffer::{}: the handle is empty", call);
  return *impl;
}
}  // namespace

void* RegisteredBuffer::data() const { return reinterpret_cast<void*>(checked(impl_, "data").descriptor.address); }
size_t RegisteredBuffer::bytes() const { return checked(impl_, "bytes").descriptor.bytes; }

}  // namespace braid
