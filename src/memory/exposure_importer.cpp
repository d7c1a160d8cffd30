#include "memory/exposure_importer.hpp"

#include <unistd.h>

#include <tuple>

#include "bootstrap/job_secret.hpp"
#include "core/error.hpp"
#include "memory/export_import.hpp"
#include "memory/memory_context.hpp"
#include "memory/shareable.hpp"

namespace braid::detail {

namespace {

// The blobs ranks that are threads of this process offered for their exposures (NOTE [exposed descriptors of this
// process]), by (communicator uid, owner rank, exposure id).
class ExposureOffers {
 public:
  static ExposureOffers& get() {
    static ExposureOffers offers;
    return offers;
  }
  void offer(const std::string& uid, int owner, uint64_t id, const std::string& blob) {
    std::lock_guard<std::mutex> lock(mutex_);
    blobs_[{uid, owner, id}] = blob;
  }
  void withdraw(const std::string& uid, int owner, uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    blobs_.erase({uid, owner, id});
  }
  bool offered(const std::string& uid, int owner, uint64_t id, const std::string& blob) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blobs_.find({uid, owner, id});
    return it != blobs_.end() && it->second == blob;
  }

 private:
  std::mutex mutex_;
  std::map<std::tuple<std::string, int, uint64_t>, std::string> blobs_;
};

}  // namespace

void offer_exposure(const MemoryContext& context, uint64_t id, const std::string& blob) {
  ExposureOffers::get().offer(context.uid, context.rank, id, blob);
}

void withdraw_exposure_offer(const MemoryContext& context, uint64_t id) {
  ExposureOffers::get().withdraw(context.uid, context.rank, id);
}

CudaExposureImporter::CudaExposureImporter(const MemoryContext& context, ExposureTable& table)
    : context_(context), table_(table) {}

CudaExposureImporter::~CudaExposureImporter() = default;

uintptr_t CudaExposureImporter::import(int owner, uint64_t id, const std::string& blob) {
  constexpr const char* kFunction = "exposure";
  MemoryDescriptor descriptor = unpack(blob, kFunction, "descriptor", this_host_id(), job_secret());
  if (descriptor.pid == static_cast<uint32_t>(getpid()) &&
      !ExposureOffers::get().offered(context_.uid, owner, id, blob)) {
    raise_invalid_argument(kFunction, "descriptor",
                           "from rank {} names this process ({}), but no rank of this communicator that is a thread "
                           "of it offered it for exposure {} (a forged or replayed request)",
                           owner, getpid(), id);
  }
  if (descriptor.kind == MemoryKind::kLegacyIpc && descriptor.pid != static_cast<uint32_t>(getpid())) {
    // NOTE [no exposed cudaMalloc memory across processes]
    raise(ErrorCode::kUnsupported,
          "rank {}'s range is cudaMalloc memory of another process: closing its CUDA IPC mapping waits until this "
          "GPU is idle, which a withdrawal made while this rank's calls wait for rank {} would never see; VMM memory "
          "(PyTorch's expandable segments) can be exposed", owner, owner);
  }
  const int fd = descriptor.kind == MemoryKind::kPosixFd ? take_fd(descriptor.pid, descriptor.fd) : -1;
  // Released by a withdrawal, which comes only after the owner's calls that used the range have ended: no
  // kernel of this rank reads it then (docs/dev/registration.md), so the mapping need not wait for the device.
  std::shared_ptr<PeerMapping> mapping = PeerMapping::open(descriptor, fd, context_.device, /*unmap_at_once=*/true);
  const auto address = reinterpret_cast<uintptr_t>(mapping->address());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    mappings_[{owner, id}] = mapping;
  }
  if (!table_.put(owner, id, address, descriptor.bytes)) {
    std::lock_guard<std::mutex> lock(mutex_);
    mappings_.erase({owner, id});
    raise(ErrorCode::kUnsupported,
          "rank {}'s exposure {} lands in a slot of the exposure table that another of its ranges holds (more than "
          "{} ranges exposed at once)", owner, id, kExposureSlots);
  }
  return address;
}

void CudaExposureImporter::release(int owner, uint64_t id) noexcept {
  table_.remove(owner, id);
  std::shared_ptr<PeerMapping> mapping;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = mappings_.find({owner, id});
    if (it == mappings_.end()) return;
    mapping = std::move(it->second);
    mappings_.erase(it);
  }
  mapping.reset();  // unmaps, outside the lock
}

}  // namespace braid::detail
