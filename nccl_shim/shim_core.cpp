// A shim communicator's life: braid's communicator at the unique id's store, the real NCCL's communicator beside
// it, and their release.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>

#include "collectives/selection.hpp"  // kMaxBlocks
#include "comm/topology.hpp"
#include "core/config.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "shim.hpp"
#include "unique_id.hpp"

namespace braid::shim {
namespace {

thread_local std::string t_last_error;

}  // namespace

void set_last_error(const std::string& message) { t_last_error = message; }
const std::string& last_error() { return t_last_error; }

ncclComm& checked_comm(ncclComm_t comm, const char* function, const char* name) {
  if (comm == nullptr) raise_invalid_argument(function, name, "is NULL");
  if (comm->magic != ncclComm::kMagic) raise_invalid_argument(function, name, "is not a communicator of this library");
  if (!comm->ready) raise_invalid_argument(function, name, "has no completed initialisation (its init failed, is "
                                           "still pending in a group: call ncclGroupEnd first, or runs non-blocking: "
                                           "poll ncclCommGetAsyncError until it is not ncclInProgress)");
  return *comm;
}

void require_pointer(const void* pointer, const char* function, const char* name) {
  if (pointer == nullptr) raise_invalid_argument(function, name, "is NULL");
}

namespace {

std::once_flag real_once;
std::shared_ptr<detail::NcclLibrary> real_library;
std::string real_problem;

}  // namespace

std::shared_ptr<detail::NcclLibrary> real_nccl() {
  std::call_once(real_once, [] {
    try {
      real_library = detail::NcclLibrary::load();
      BRAID_INFO("braid shim: falls back to NCCL {} from {}", real_library->version(), real_library->path());
    } catch (const Error& error) {
      real_problem = error.what();
      BRAID_WARN("braid shim: no fallback to NCCL: {}", real_problem);
    }
  });
  return real_library;
}

namespace {

// The real NCCL's loaded range [begin, end), found once it is loaded: the object dladdr names for one of its entry
// points, and the end of its last loadable segment.
struct CodeRange {
  uintptr_t begin = 0, end = 0;
};

CodeRange real_code_range() {
  static const CodeRange range = [] {
    CodeRange found;
    const std::shared_ptr<detail::NcclLibrary> library = real_nccl();
    Dl_info info{};
    if (library == nullptr || dladdr(reinterpret_cast<void*>(library->api().get_version), &info) == 0) return found;
    found.begin = reinterpret_cast<uintptr_t>(info.dli_fbase);
    dl_iterate_phdr([](dl_phdr_info* object, size_t, void* data) {
      auto* range = static_cast<CodeRange*>(data);
      if (object->dlpi_addr != range->begin) return 0;
      for (int i = 0; i < object->dlpi_phnum; ++i) {
        const ElfW(Phdr)& segment = object->dlpi_phdr[i];
        if (segment.p_type == PT_LOAD) range->end = std::max<uintptr_t>(range->end, object->dlpi_addr + segment.p_vaddr + segment.p_memsz);
      }
      return 1;
    }, &found);
    return found;
  }();
  return range;
}

}  // namespace

void* real_entry(const char* name) {
  const std::shared_ptr<detail::NcclLibrary> library = real_nccl();
  return library != nullptr ? library->symbol(name) : nullptr;
}

bool is_shim_comm(const void* comm) {
  return comm != nullptr && static_cast<const ncclComm*>(comm)->magic == ncclComm::kMagic;
}

void* foreign_entry(const void* comm, const char* name) {
  if (comm == nullptr || is_shim_comm(comm)) return nullptr;
  return real_entry(name);
}

bool called_by_real_nccl(const void* return_address) {
  const CodeRange range = real_code_range();
  const auto address = reinterpret_cast<uintptr_t>(return_address);
  return address >= range.begin && address < range.end;
}

const std::string& real_nccl_problem() {
  real_nccl();
  return real_problem;
}

const detail::NcclLibrary& require_real(const ncclComm& comm, const char* what) {
  if (comm.library == nullptr || comm.real == nullptr) {
    raise(ErrorCode::kUnsupported, "{} needs the real NCCL, which this communicator does not have: {}", what,
          comm.library == nullptr ? real_nccl_problem() : "its NCCL communicator could not be made (see the log)");
  }
  return *comm.library;
}

void check_real(const ncclComm& comm, ncclResult_t result, const char* call) {
  if (result != ncclSuccess && result != ncclInProgress) {
    throw RealNcclError(result, comm.library->failure_message(result, call, comm.real, std::to_string(comm.rank)));
  }
}

void check_real(const detail::NcclLibrary& library, ncclResult_t result, const char* call) {
  if (result != ncclSuccess && result != ncclInProgress) {
    throw RealNcclError(result, library.failure_message(result, call, nullptr, "?"));
  }
}

namespace {

// The real NCCL's communicator of `size` ranks: with the caller's config where there is one and the real NCCL
// takes configs.
ncclComm_t init_real_comm(ncclComm& comm, const detail::NcclLibrary& library, int size, const ncclUniqueId& id,
                          int rank, RealConfig& config) {
  ncclComm_t real = nullptr;
  if (config.get() != nullptr && library.api().comm_init_rank_config != nullptr) {
    check_real(comm, library.api().comm_init_rank_config(&real, size, id, rank, config.get()), "ncclCommInitRankConfig");
  } else {
    check_real(comm, library.api().comm_init_rank(&real, size, id, rank), "ncclCommInitRank");
  }
  return real;
}

// The real NCCL's communicator on braid's ranks: rank 0 makes its id, braid's store carries it.
ncclComm_t make_real_comm(ncclComm& comm, detail::NcclLibrary& library, RealConfig& config) {
  std::string mine;
  if (comm.rank == 0) {
    ncclUniqueId id{};
    check_real(comm, library.api().get_unique_id(&id), "ncclGetUniqueId");
    mine.assign(id.internal, sizeof(id.internal));
  }
  const std::vector<std::string> all = comm.braid->host_allgather(mine);
  ncclUniqueId id{};
  std::memcpy(id.internal, all[0].data(), std::min(all[0].size(), sizeof(id.internal)));
  return init_real_comm(comm, library, comm.size, id, comm.rank, config);
}

}  // namespace

RealConfig::RealConfig(const ncclConfig_t* config) {
  if (config == nullptr) return;
  constexpr size_t kLargestConfig = 64 << 10;  // beyond any release's; a larger size field is garbage
  const size_t bytes = config->size >= sizeof(size_t) && config->size <= kLargestConfig ? config->size : sizeof(*config);
  bytes_.resize(std::max(bytes, sizeof(ncclConfig_t)));
  std::memcpy(bytes_.data(), config, bytes);
  reinterpret_cast<ncclConfig_t*>(bytes_.data())->blocking = 1;  // the same offset in every release
}

RealConfig child_config(const ncclComm& parent, const ncclConfig_t* config) {
  return config != nullptr ? RealConfig(config) : parent.config;
}

int RealConfig::max_ctas() const {
  if (bytes_.empty()) return 0;
  const auto* config = reinterpret_cast<const ncclConfig_t*>(bytes_.data());
  if (config->size < offsetof(ncclConfig_t, maxCTAs) + sizeof(config->maxCTAs)) return 0;  // an older config
  const int value = config->maxCTAs;
  if (value == NCCL_CONFIG_UNDEF_INT || value <= 0) return 0;
  return std::min(value, kMaxBlocks);
}

void initialise(ncclComm& comm, const ncclUniqueId& id, int size, int rank, int device, ncclComm_t real,
                RealConfig config) {
  comm.rank = rank;
  comm.size = size;
  comm.device = device;
  comm.config = config;
  comm.library = real_nccl();
  DeviceGuard guard(device);
  const std::optional<StoreAddress> store = read_unique_id(id);
  if (!store) {  // the real NCCL's own id: NCCL only
    const detail::NcclLibrary& library = require_real(comm, "an ncclUniqueId not made by braid's shim");
    if (real == nullptr) real = init_real_comm(comm, library, size, id, rank, config);
    comm.real = real;
    comm.owns_real = true;
    comm.ready = true;
    BRAID_INFO("braid shim: rank {}/{}: the unique id is not braid's; NCCL serves this communicator", rank, size);
    return;
  }
  comm.store = claim_store(store->nonce);
  Rendezvous rendezvous = Rendezvous::at_store(store->dial, rank, size, /*rank0_serves_store=*/false);
  rendezvous.job_id = fmt::format("ncclshim-{:016x}", store->nonce);
  CommOptions options;
  options.device = device;
  options.max_blocks = config.max_ctas();  // NCCL's CTA budget is braid's cap on a launch's blocks
  if (comm.library != nullptr) options.nccl_library = comm.library->path();  // never the shim itself
  comm.braid.emplace(Communicator::init(rendezvous, options));
  comm.braid_on_cuda = std::strcmp(comm.braid->backend(), "cuda") == 0;
  if (!comm.braid_on_cuda) {  // braid runs on NCCL: its communicator serves; a split's real child is not needed
    if (real != nullptr && comm.library != nullptr) {
      const ncclResult_t destroyed = comm.library->api().comm_destroy(real);
      if (destroyed != ncclSuccess) BRAID_WARN("braid shim: rank {}: ncclCommDestroy of a split's child failed ({})", rank, static_cast<int>(destroyed));
    }
    comm.real = static_cast<ncclComm_t>(comm.braid->nccl_communicator());
    comm.owns_real = false;
  } else if (real != nullptr) {
    comm.real = real;
    comm.owns_real = true;
  } else if (comm.library != nullptr) {
    try {
      comm.real = make_real_comm(comm, *comm.library, config);
      comm.owns_real = true;
    } catch (const Error& error) {  // braid still serves what it can; every rank reaches the same call
      BRAID_WARN("braid shim: rank {}: no NCCL communicator to fall back to: {}", rank, error.what());
    }
  }
  comm.ready = true;
  BRAID_INFO("braid shim: rank {}/{} on GPU {}: braid's {} backend{}", rank, size, device, comm.braid->backend(),
             comm.real != nullptr ? ", NCCL beside it" : ", no NCCL fallback");
}

namespace {

// The caller's config as NCCL reads it: its first `size` bytes over NCCL's defaults, and the fields of releases
// newer than its version back at their defaults.
ncclConfig_t read_config(const ncclConfig_t* config) {
  ncclConfig_t read = NCCL_CONFIG_INITIALIZER;
  read.magic = 0;
  std::memcpy(&read, config, std::min(config->size, sizeof(ncclConfig_t)));
  const ncclConfig_t defaults = NCCL_CONFIG_INITIALIZER;
  if (read.version < NCCL_VERSION(2, 14, 0)) read.blocking = defaults.blocking;
  if (read.version < NCCL_VERSION(2, 17, 0)) {
    read.cgaClusterSize = defaults.cgaClusterSize;
    read.minCTAs = defaults.minCTAs;
    read.maxCTAs = defaults.maxCTAs;
  }
  if (read.version < NCCL_VERSION(2, 27, 0)) {
    read.collnetEnable = defaults.collnetEnable;
    read.CTAPolicy = defaults.CTAPolicy;
    read.shrinkShare = defaults.shrinkShare;
    read.nvlsCTAs = defaults.nvlsCTAs;
  }
  if (read.version < NCCL_VERSION(2, 28, 0)) {
    read.nChannelsPerNetPeer = defaults.nChannelsPerNetPeer;
    read.nvlinkCentricSched = defaults.nvlinkCentricSched;
  }
  return read;
}

}  // namespace

void check_config(const char* function, const ncclConfig_t* config) {
  if (config == nullptr) return;
  const ncclConfig_t read = read_config(config);
  if (read.magic != ncclConfig_t(NCCL_CONFIG_INITIALIZER).magic) {
    raise_invalid_argument(function, "config", "was not initialised with NCCL_CONFIG_INITIALIZER");
  }
  constexpr int kUndefined = NCCL_CONFIG_UNDEF_INT, kMaxChannels = 64;  // NCCL's MAXCHANNELS
  auto flag = [&](const char* field, int value) {
    if (value != kUndefined && value != 0 && value != 1) {
      raise_invalid_argument(function, "config", "has {} {}; it must be 0 or 1", field, value);
    }
  };
  flag("blocking", read.blocking);
  if (read.cgaClusterSize != kUndefined && read.cgaClusterSize < 0) {
    raise_invalid_argument(function, "config", "has cgaClusterSize {}; it must not be negative", read.cgaClusterSize);
  }
  if ((read.minCTAs != kUndefined && read.minCTAs <= 0) || (read.maxCTAs != kUndefined && read.maxCTAs <= 0) ||
      read.minCTAs > read.maxCTAs) {
    raise_invalid_argument(function, "config", "has minCTAs {} and maxCTAs {}; both must be positive, min <= max",
                           read.minCTAs, read.maxCTAs);
  }
  flag("splitShare", read.splitShare);
  flag("collnetEnable", read.collnetEnable);
  if (read.CTAPolicy != kUndefined && (read.CTAPolicy < NCCL_CTA_POLICY_DEFAULT || read.CTAPolicy > NCCL_CTA_POLICY_ZERO)) {
    raise_invalid_argument(function, "config", "has CTAPolicy {}, not an NCCL_CTA_POLICY", read.CTAPolicy);
  }
  flag("shrinkShare", read.shrinkShare);
  if (read.nvlsCTAs != kUndefined && read.nvlsCTAs <= 0) {
    raise_invalid_argument(function, "config", "has nvlsCTAs {}; it must be positive", read.nvlsCTAs);
  }
  if (read.nChannelsPerNetPeer != kUndefined && (read.nChannelsPerNetPeer <= 0 || read.nChannelsPerNetPeer > kMaxChannels)) {
    raise_invalid_argument(function, "config", "has nChannelsPerNetPeer {}; it must be in [1, {}]",
                           read.nChannelsPerNetPeer, kMaxChannels);
  }
  flag("nvlinkCentricSched", read.nvlinkCentricSched);
}

bool nonblocking_config(const ncclConfig_t* config) {
  return config != nullptr && read_config(config).blocking == 0;
}

ncclResult_t run_in_background(ncclComm& comm, const char* function, std::function<void()> work) {
  if (comm.background.joinable()) comm.background.join();
  comm.nonblocking = true;
  comm.async_state = ncclInProgress;
  comm.background = std::thread([&comm, function, work = std::move(work)] {
    const ncclResult_t result = guarded(function, work);
    comm.async_error = result == ncclSuccess ? std::string() : last_error();
    comm.async_state = result;
  });
  return ncclInProgress;
}

void release(ncclComm& comm, bool abort) {
  if (comm.background.joinable()) comm.background.join();
  comm.ready = false;
  // braid's first: its kernels' waits end, so neither NCCL's abort (which may synchronise the device) nor
  // destroying braid's communicator below waits on a peer.
  if (abort && comm.braid) comm.braid->abort();
  if (comm.owns_real && comm.real != nullptr && comm.library != nullptr) {
    DeviceGuard guard(comm.device);
    const auto& api = comm.library->api();
    const ncclResult_t result = abort ? api.comm_abort(comm.real) : api.comm_destroy(comm.real);
    if (result != ncclSuccess) BRAID_WARN("braid shim: releasing NCCL's communicator: {}", detail::nccl_result_name(result));
  }
  comm.real = nullptr;
  {
    std::lock_guard<std::mutex> lock(comm.events_mutex);
    for (cudaEvent_t event : comm.events) cudaEventDestroy(event);
    comm.events.clear();
  }
  comm.braid.reset();
  comm.store.reset();
}

}  // namespace braid::shim
