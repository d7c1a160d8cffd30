#include "memory/registered_exposures.hpp"

#include <utility>

#include "bootstrap/job_secret.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "memory/memory_context.hpp"
#include "memory/shareable.hpp"

namespace braid::detail {

RegisteredExposures::RegisteredExposures(const MemoryContext& context,
                                         const std::function<std::unique_ptr<StoreClient>()>& connect,
                                         const std::string& prefix, std::function<bool(double)> wait_for_calls)
    : context_(context),
      wait_for_calls_(std::move(wait_for_calls)),
      table_(context.size, context.device),
      importer_(context, table_),
      service_(connect, prefix, context.rank, context.size, context.timeout_s, importer_) {}

RegisteredExposures::~RegisteredExposures() = default;

bool RegisteredExposures::expose(uint64_t registration, const MemoryDescriptor& registered) {
  MemoryDescriptor descriptor = registered;
  FdOwner fd;  // kPosixFd: open until every peer answered (each takes its own copy with pidfd_getfd first)
  if (descriptor.kind == MemoryKind::kPosixFd) {
    fd.fd = export_allocation_fd(descriptor, context_.device);
    descriptor.fd = fd.fd;
  }
  const std::string blob = pack(descriptor, job_secret());
  const ExposureService::Exposure exposure =
      service_.expose(blob, [&](uint64_t id) { offer_exposure(context_, id, blob); });
  withdraw_exposure_offer(context_, exposure.id);  // every peer that imports it has done so
  if (!exposure.everywhere()) {
    BRAID_INFO("registered range [{:#x}, +{}) is not exposed: not every peer could map it:\n{}", descriptor.address,
               descriptor.bytes, exposure.reasons);
    try {
      service_.withdraw(exposure.id);
    } catch (const Error& error) {
      BRAID_WARN("withdrawing a range not every peer mapped: {}", error.what());
    }
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  exposed_[registration] = Exposed{exposure.id, descriptor.address, descriptor.bytes};
  return true;
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
