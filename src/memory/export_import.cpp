// export_handle / import_handle (any two processes of one host) and the exchange behind
// Communicator::import_global (every rank of a communicator), on the descriptors of memory_handle.hpp and the
// mappings of shareable.hpp.
#include "memory/export_import.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "bootstrap/job_secret.hpp"
#include "braid/memory.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "memory/memory_context.hpp"
#include "memory/memory_handle.hpp"
#include "memory/shareable.hpp"
#include "memory/vmm.hpp"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace braid {
namespace detail {

// The blobs naming this process that it accepts (NOTE [descriptors naming this process]): its live exports, and
// the offers its thread-ranks make for their exchanges.
class OwnExports {
 public:
  static OwnExports& get() {
    static OwnExports exports;
    return exports;
  }
  void add(const std::string& blob) {
    std::lock_guard<std::mutex> lock(mutex_);
    blobs_.insert(blob);
  }
  void remove(const std::string& blob) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = blobs_.find(blob);
    if (found != blobs_.end()) blobs_.erase(found);
  }
  bool contains(const std::string& blob) {
    std::lock_guard<std::mutex> lock(mutex_);
    return blobs_.contains(blob);
  }

  void offer(const MemoryContext& context, const std::string& blob) {
    std::lock_guard<std::mutex> lock(mutex_);
    forget_gone_communicators();
    Offers& offers = offers_[{context.uid, context.rank}];
    offers.communicator = context.registrations;
    offers.blobs.push_back(blob);
  }
  void withdraw_all_but(const MemoryContext& context, const std::string& current) {
    std::lock_guard<std::mutex> lock(mutex_);
    forget_gone_communicators();
    const auto found = offers_.find({context.uid, context.rank});
    if (found == offers_.end()) return;
    std::vector<std::string>& blobs = found->second.blobs;
    std::erase_if(blobs, [&](const std::string& blob) { return blob != current; });
    if (blobs.empty()) offers_.erase(found);
  }
  bool offered(const std::string& communicator, int rank, const std::string& blob) {
    std::lock_guard<std::mutex> lock(mutex_);
    forget_gone_communicators();
    const auto found = offers_.find({communicator, rank});
    if (found == offers_.end()) return false;
    const std::vector<std::string>& blobs = found->second.blobs;
    return std::find(blobs.begin(), blobs.end(), blob) != blobs.end();
  }

 private:
  struct Offers {
    std::weak_ptr<const void> communicator;  // the offering rank's registration cache: gone with its communicator
    std::vector<std::string> blobs;          // at most this exchange's and the one before
  };
  void forget_gone_communicators() {
    std::erase_if(offers_, [](const auto& entry) { return entry.second.communicator.expired(); });
  }

  std::mutex mutex_;
  std::multiset<std::string> blobs_;  // one entry a live export (two exports of one range pack alike)
  std::map<std::pair<std::string, int>, Offers> offers_;  // by (communicator uid, offering rank)
};

ExportedRange::~ExportedRange() {
  if (!blob.empty()) OwnExports::get().remove(blob);
}

MemoryDescriptor unpack_for_import(const std::string& blob, const char* function, const char* argument,
                                   std::optional<BlobOrigin> origin) {
  MemoryDescriptor descriptor = unpack(blob, function, argument, this_host_id(), job_secret());
  if (descriptor.pid != static_cast<uint32_t>(getpid())) return descriptor;
  if (!origin) {
    if (OwnExports::get().contains(blob)) return descriptor;
    raise_invalid_argument(function, argument,
                           "names this process ({}) as its exporter, but this process has no such live export (a "
                           "forged blob, or one whose ExportedHandle is gone)",
                           getpid());
  }
  const MemoryContext& context = *origin->context;
  if (origin->peer == context.rank) {
    raise_invalid_argument(function, argument,
                           "is rank {}'s own (this rank's) descriptor handed over as a peer's; a rank never takes "
                           "its own memory from an exchange",
                           context.rank);
  }
  if (OwnExports::get().offered(context.uid, origin->peer, blob)) return descriptor;
  raise_invalid_argument(function, argument,
                         "from rank {} names this process ({}) as its exporter, but rank {} is no thread of this "
                         "process offering it for this exchange (a forged or replayed descriptor)",
                         origin->peer, getpid(), origin->peer);
}

void offer_to_thread_ranks(const MemoryContext& context, const std::string& blob) {
  if (!blob.empty()) OwnExports::get().offer(context, blob);
}

void withdraw_earlier_offers(const MemoryContext& context, const std::string& current) {
  OwnExports::get().withdraw_all_but(context, current);
}

namespace {

// `device`, or the current device for -1; refused below -1 (before CUDA is touched) and past the devices.
int current_device(const char* function, int device) {
  if (device < -1) {
    raise_invalid_argument(function, "device", "is {}; must be -1 (the current device) or a device ordinal", device);
  }
  const int count = require_cuda_devices("braid memory handles");
  if (device >= count) {
    raise_invalid_argument(function, "device", "is {}, but this process sees {} CUDA device(s)", device, count);
  }
  if (device >= 0) return device;
  int current = 0;
  BRAID_CUDA(cudaGetDevice(&current));
  return current;
}

}  // namespace

int take_fd(uint32_t pid, int fd) {
  if (pid == static_cast<uint32_t>(getpid())) {
    const int copy = dup(fd);
    if (copy < 0) raise_system("dup", errno, "copying an exported VMM handle of this process");
    return copy;
  }
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
  if (pidfd < 0) {
    raise_system("pidfd_open", errno, fmt::format("reaching exporting process {} (is it still running?)", pid));
  }
  const int copy = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  const int saved = errno;
  close(pidfd);
  if (copy < 0) {
    raise_system("pidfd_getfd", saved,
                 fmt::format("taking fd {} of process {} (importing VMM memory needs ptrace permission over the "
                             "exporter, and the exporter's ExportedHandle alive)", fd, pid));
  }
  return copy;
}

}  // namespace detail

ExportedHandle export_handle(const void* pointer, size_t bytes, int device) {
  device = detail::current_device("export_handle", device);
  auto exported = std::make_shared<detail::ExportedRange>();
  exported->descriptor = detail::describe_shareable("export_handle", "pointer", pointer, bytes, device);
  if (exported->descriptor.kind == detail::MemoryKind::kPosixFd) {
    exported->fd.fd = detail::export_allocation_fd(exported->descriptor, device);
    exported->descriptor.fd = exported->fd.fd;
  }
  exported->blob = detail::pack(exported->descriptor, job_secret());
  detail::OwnExports::get().add(exported->blob);
  ExportedHandle handle;
  handle.impl_ = std::move(exported);
  return handle;
}

namespace {
const detail::ExportedRange& checked(const std::shared_ptr<detail::ExportedRange>& impl, const char* call) {
  if (!impl) raise(ErrorCode::kInvalidArgument, "ExportedHandle::{}: the handle is empty", call);
  return *impl;
}
const detail::PeerMapping& checked(const std::shared_ptr<detail::PeerMapping>& mapping, const char* call) {
  if (!mapping) raise(ErrorCode::kInvalidArgument, "ImportedMemory::{}: the handle is empty", call);
  return *mapping;
}
}  // namespace

const std::string& ExportedHandle::blob() const { return checked(impl_, "blob").blob; }
void* ExportedHandle::data() const { return reinterpret_cast<void*>(checked(impl_, "data").descriptor.address); }
size_t ExportedHandle::bytes() const { return checked(impl_, "bytes").descriptor.bytes; }

ImportedMemory import_handle(const std::string& blob, int device) {
  const detail::MemoryDescriptor descriptor = detail::unpack_for_import(blob, "import_handle", "blob");
  device = detail::current_device("import_handle", device);
  const int fd = descriptor.kind == detail::MemoryKind::kPosixFd ? detail::take_fd(descriptor.pid, descriptor.fd) : -1;
  ImportedMemory imported;
  imported.mapping_ = detail::PeerMapping::open("import_handle", "blob", descriptor, fd, device);
  return imported;
}

void* ImportedMemory::data() const { return checked(mapping_, "data").address(); }
size_t ImportedMemory::bytes() const { return checked(mapping_, "bytes").descriptor().bytes; }
uint64_t ImportedMemory::exporter_address() const { return checked(mapping_, "exporter_address").descriptor().address; }
int ImportedMemory::exporter_pid() const { return static_cast<int>(checked(mapping_, "exporter_pid").descriptor().pid); }

void* GlobalMemory::peer(int rank) const {
  if (rank < 0 || rank >= world_size()) raise_invalid_argument("GlobalMemory::peer", "rank", "is {}; must be in [0, {})", rank, world_size());
  return peers_[rank];
}

GlobalMemory::GlobalMemory(GlobalMemory&& other) noexcept { *this = std::move(other); }

GlobalMemory& GlobalMemory::operator=(GlobalMemory&& other) noexcept {
  if (this == &other) return *this;
  rank_ = std::exchange(other.rank_, -1);  // moved from: empty, as default-made
  peers_ = std::exchange(other.peers_, {});
  bytes_ = std::exchange(other.bytes_, {});
  own_ = std::exchange(other.own_, ExportedHandle());
  mappings_ = std::exchange(other.mappings_, {});
  communicator_ = std::exchange(other.communicator_, {});
  return *this;
}

size_t GlobalMemory::bytes(int rank) const {
  if (rank < 0 || rank >= world_size()) raise_invalid_argument("GlobalMemory::bytes", "rank", "is {}; must be in [0, {})", rank, world_size());
  return bytes_[rank];
}

namespace detail {
namespace {

// Maps every peer's handle of an import whose blobs all name one (the peers' fds by `tag`).
detail::ImportedPeers import_peers(detail::MemoryContext& context, const detail::ExportedRange& mine,
                                   const std::vector<std::string>& blobs, const char* function, uint64_t tag) {
  std::vector<MemoryDescriptor> theirs(context.size);
  for (int q = 0; q < context.size; ++q) {  // this rank's own entry is its own export, never one from the store
    theirs[q] = q == context.rank ? mine.descriptor
                                  : unpack_for_import(blobs[q], function, "peer handle", BlobOrigin{&context, q});
  }
  ImportedPeers imported;
  imported.peers.resize(context.size);
  imported.bytes.resize(context.size);
  for (int q = 0; q < context.size; ++q) {
    imported.bytes[q] = theirs[q].bytes;
    if (q == context.rank) {
      imported.peers[q] = mine.descriptor.address == 0 ? nullptr : reinterpret_cast<void*>(mine.descriptor.address);
      continue;
    }
    const int fd = theirs[q].kind == MemoryKind::kPosixFd ? context.fds->receive(q, tag) : -1;
    imported.mappings.push_back(PeerMapping::open(function, "peer handle", theirs[q], fd, context.device));
    imported.peers[q] = imported.mappings.back()->address();
  }
  return imported;
}

}  // namespace
}  // namespace detail

detail::ImportedPeers detail::import_every_rank(detail::MemoryContext& context, const detail::ExportedRange* given,
                                                const std::string& refusal, const char* function) {
  // What a refusing rank puts in the exchange: never a blob (those start with braid's magic bytes).
  static const std::string kRefused = std::string("\0refused: ", 10);
  std::lock_guard<std::mutex> setup(context.setup_mutex);
  if (given != nullptr) offer_to_thread_ranks(context, given->blob);
  const std::vector<std::string> blobs =
      context.bootstrap->allgather(given != nullptr ? given->blob : kRefused + refusal, "import_global");
  if (given == nullptr) raise_invalid_argument(function, "mine", "{}", refusal);
  withdraw_earlier_offers(context, given->blob);
  for (int q = 0; q < context.size; ++q) {
    if (blobs[q].compare(0, kRefused.size(), kRefused) == 0) {
      raise(ErrorCode::kMismatch, "{}: rank {} refused its handle ('mine' {}), so no rank imports", function, q,
            blobs[q].substr(kRefused.size()));
    }
  }
  const detail::ExportedRange& mine = *given;
  const uint64_t tag = context.alloc_sequence++;
  if (mine.descriptor.kind == MemoryKind::kPosixFd) {  // first: a peer's bad blob below must not leave it waiting
    for (int q = 0; q < context.size; ++q) {
      if (q != context.rank) context.fds->send(q, mine.fd.fd, tag);
    }
  }
  try {
    return import_peers(context, mine, blobs, function, tag);
  } catch (...) {
    if (context.fds) context.fds->discard(tag);  // the peers' fds not taken: closed, so they keep no allocation alive
    throw;
  }
}

}  // namespace braid
