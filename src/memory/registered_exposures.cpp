#include "memory/registered_exposures.hpp"

#include <atomic>
#include <utility>

#include "bootstrap/job_secret.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "memory/memory_context.hpp"
#include "memory/page_blob.hpp"
#include "memory/shareable.hpp"

namespace braid::detail {

namespace {
std::atomic<bool> automatic_exposures{true};
}  // namespace

void set_automatic_exposures(bool on) { automatic_exposures.store(on, std::memory_order_relaxed); }

RegisteredExposures::RegisteredExposures(const MemoryContext& context,
                                         const std::function<std::unique_ptr<StoreClient>()>& connect,
                                         const std::string& prefix, std::function<bool(double)> wait_for_calls)
    : context_(context),
      wait_for_calls_(std::move(wait_for_calls)),
      table_(context.size, context.device, context.setup()),
      importer_(context, table_),
      service_(connect, prefix, context.rank, context.size, context.timeout_s, importer_) {}

RegisteredExposures::~RegisteredExposures() = default;

uint64_t RegisteredExposures::expose_blob(const std::string& blob, uint64_t address, uint64_t bytes) {
  const ExposureService::Exposure exposure =
      service_.expose(blob, [&](uint64_t id) { offer_exposure(context_, id, blob); });
  withdraw_exposure_offer(context_, exposure.id);  // every peer that imports it has done so
  if (exposure.everywhere()) return exposure.id;
  const auto level = warned_.exchange(true) ? LogLevel::kInfo : LogLevel::kWarn;
  BRAID_LOG(level, "range [{:#x}, +{}) is not exposed, so its eager calls stay staged: not every peer could map it:\n{}",
            address, bytes, exposure.reasons);
  try {
    service_.withdraw(exposure.id);
  } catch (const Error& error) {
    BRAID_WARN("withdrawing a range not every peer mapped: {}", error.what());
  }
  return 0;
}

bool RegisteredExposures::expose(uint64_t registration, const MemoryDescriptor& registered) {
  MemoryDescriptor descriptor = registered;
  FdOwner fd;  // kPosixFd: open until every peer answered (each takes its own copy with pidfd_getfd first)
  if (descriptor.kind == MemoryKind::kPosixFd) {
    fd.fd = export_allocation_fd(descriptor, context_.device);
    descriptor.fd = fd.fd;
  }
  const uint64_t id = expose_blob(pack(descriptor, job_secret()), descriptor.address, descriptor.bytes);
  if (id == 0) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  exposed_[registration] = Exposed{id, descriptor.address, descriptor.bytes};
  return true;
}

std::optional<RegisteredExposures::Found> RegisteredExposures::find_or_expose(uintptr_t pointer, size_t bytes) {
  if (std::optional<Found> found = find(pointer, bytes)) return found;
  if (bytes < kAutomaticExposureBytes || !automatic_exposures.load(std::memory_order_relaxed)) return std::nullopt;
  std::lock_guard<std::mutex> lock(automatic_mutex_);
  // NOTE [automatic exposures]
  for (size_t i = automatic_.size(); i-- > 0;) {  // newest first
    const Automatic& automatic = automatic_[i];
    if (!automatic.pages->holds(pointer, bytes)) continue;
    if (automatic.pages->unchanged()) {
      if (automatic.id == 0) return std::nullopt;  // some peer could not map it
      return Found{automatic.id, pointer - automatic.pages->base()};
    }
    drop_automatic(i);
  }
  std::unique_ptr<BackingPages> pages = BackingPages::find(reinterpret_cast<const void*>(pointer), bytes, context_.device);
  if (!pages) return std::nullopt;  // not memory of whole VMM allocations
  for (size_t i = automatic_.size(); i-- > 0;) {
    if (!automatic_[i].pages->unchanged()) drop_automatic(i);
  }
  if (automatic_.size() >= kMostAutomaticExposures) return std::nullopt;
  std::vector<MemoryDescriptor> described;
  std::vector<std::unique_ptr<FdOwner>> fds;  // open until every peer answered
  try {
    described = pages->describe();
    for (MemoryDescriptor& page : described) {
      fds.push_back(std::make_unique<FdOwner>(export_allocation_fd(page, context_.device)));
      page.fd = fds.back()->fd;
    }
  } catch (const Error& error) {  // an allocation this process imported, say: the buffer stays staged
    BRAID_DEBUG("buffer [{:#x}, +{}) is not exposed: {}", pointer, bytes, error.what());
    automatic_.push_back(Automatic{0, std::move(pages)});
    return std::nullopt;
  }
  const uint64_t id = expose_blob(pack_pages(described, job_secret()), pages->base(), pages->bytes());
  BRAID_DEBUG("buffer [{:#x}, +{}) {} as {} VMM allocations [{:#x}, +{})", pointer, bytes,
              id != 0 ? "exposed automatically" : "not exposed: not every peer could map it", pages->count(),
              pages->base(), pages->bytes());
  const uint64_t base = pages->base();
  automatic_.push_back(Automatic{id, std::move(pages)});
  if (id == 0) return std::nullopt;
  return Found{id, pointer - base};
}

void RegisteredExposures::drop_automatic(size_t index) {
  Automatic dropped = std::move(automatic_[index]);
  automatic_.erase(automatic_.begin() + static_cast<ptrdiff_t>(index));
  if (dropped.id == 0) return;
  if (!wait_for_calls_(context_.timeout_s)) {
    raise(ErrorCode::kTimeout,
          "rank {}'s calls of the communicator did not end within {} s, so its peers were not asked to release the "
          "automatically exposed range [{:#x}, +{}), whose memory was unmapped or replaced; it stays mapped there "
          "until the communicator is destroyed", context_.rank, context_.timeout_s, dropped.pages->base(),
          dropped.pages->bytes());
  }
  service_.withdraw(dropped.id);
}

size_t RegisteredExposures::automatic_count() const {
  std::lock_guard<std::mutex> lock(automatic_mutex_);
  size_t count = 0;
  for (const Automatic& automatic : automatic_) count += automatic.id != 0;
  return count;
}

void RegisteredExposures::withdraw(uint64_t registration) {
  Exposed exposed{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = exposed_.find(registration);
    if (it == exposed_.end()) return;
    exposed = it->second;
    exposed_.erase(it);  // no later call announces it
  }
  const bool ended = wait_for_calls_(context_.timeout_s);
  if (!ended) {
    // A peer may still read the range in a call that has not ended: it stays mapped there, so the owner's free
    // would be unsafe. Said in the error; the peers release it when their communicators go.
    raise(ErrorCode::kTimeout,
          "deregister: rank {}'s calls of the communicator did not end within {} s, so its peers were not asked to "
          "release the range [{:#x}, +{}); do not free it before the communicator is destroyed",
          context_.rank, context_.timeout_s, exposed.address, exposed.bytes);
  }
  service_.withdraw(exposed.id);
}

std::optional<RegisteredExposures::Found> RegisteredExposures::find(uintptr_t pointer, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = exposed_.rbegin(); it != exposed_.rend(); ++it) {  // newest registration first
    const Exposed& e = it->second;
    if (pointer >= e.address && pointer - e.address < e.bytes && bytes <= e.bytes - (pointer - e.address)) {
      return Found{e.id, pointer - e.address};
    }
  }
  return std::nullopt;
}

size_t RegisteredExposures::exposed_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exposed_.size();
}

size_t RegisteredExposures::imported_count() const { return service_.imported_count(); }

}  // namespace braid::detail
