#include "memory/exposure_importer.hpp"

#include <unistd.h>

#include <tuple>

#include "bootstrap/job_secret.hpp"
#include "core/error.hpp"
#include "memory/export_import.hpp"
#include "memory/memory_context.hpp"
#include "memory/page_blob.hpp"
#include "memory/paged_ranges.hpp"
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

void CudaExposureImporter::check_offered(int owner, uint64_t id, uint32_t pid, const std::string& blob) const {
  if (pid == static_cast<uint32_t>(getpid()) && !ExposureOffers::get().offered(context_.uid, owner, id, blob)) {
    raise_invalid_argument("exposure", "descriptor",
                           "from rank {} names this process ({}), but no rank of this communicator that is a thread "
                           "of it offered it for exposure {} (a forged or replayed request)",
                           owner, getpid(), id);
  }
}

uintptr_t CudaExposureImporter::put_in_table(int owner, uint64_t id, uintptr_t address, uint64_t bytes) {
  if (!table_.put(owner, id, address, bytes)) {
    std::lock_guard<std::mutex> lock(mutex_);
    mappings_.erase({owner, id});
    paged_.erase({owner, id});
    raise(ErrorCode::kUnsupported,
          "rank {}'s exposure {} lands in a slot of the exposure table that another of its ranges holds (more than "
          "{} ranges exposed at once)", owner, id, kExposureSlots);
  }
  return address;
}

uintptr_t CudaExposureImporter::import_pages(int owner, uint64_t id, const std::string& blob) {
  const std::vector<MemoryDescriptor> pages =
      unpack_pages(blob, "exposure", "descriptor", this_host_id(), job_secret());
  check_offered(owner, id, pages.front().pid, blob);
  std::vector<int> fds;
  fds.reserve(pages.size());
  try {
    for (const MemoryDescriptor& page : pages) fds.push_back(take_fd(page.pid, page.fd));
  } catch (...) {
    for (int fd : fds) close(fd);
    throw;
  }
  std::shared_ptr<PagedMapping> mapping = PagedMapping::open(pages, std::move(fds), context_.device);
  const auto address = reinterpret_cast<uintptr_t>(mapping->address());
  const uint64_t bytes = mapping->bytes();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    paged_[{owner, id}] = std::move(mapping);
  }
  return put_in_table(owner, id, address, bytes);
}

uintptr_t CudaExposureImporter::import(int owner, uint64_t id, const std::string& blob) {
  constexpr const char* kFunction = "exposure";
  if (is_page_blob(blob)) return import_pages(owner, id, blob);
  MemoryDescriptor descriptor = unpack(blob, kFunction, "descriptor", this_host_id(), job_secret());
  check_offered(owner, id, descriptor.pid, blob);
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
  std::shared_ptr<PeerMapping> mapping =
      PeerMapping::open(kFunction, "descriptor", descriptor, fd, context_.device, /*unmap_at_once=*/true);
  const auto address = reinterpret_cast<uintptr_t>(mapping->address());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    mappings_[{owner, id}] = mapping;
  }
  return put_in_table(owner, id, address, descriptor.bytes);
}

void CudaExposureImporter::release(int owner, uint64_t id) noexcept {
  table_.remove(owner, id);
  std::shared_ptr<PeerMapping> mapping;
  std::shared_ptr<PagedMapping> paged;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = mappings_.find({owner, id}); it != mappings_.end()) {
      mapping = std::move(it->second);
      mappings_.erase(it);
    }
    if (auto it = paged_.find({owner, id}); it != paged_.end()) {
      paged = std::move(it->second);
      paged_.erase(it);
    }
  }
  mapping.reset();  // unmaps, outside the lock
  paged.reset();
}

}  // namespace braid::detail
