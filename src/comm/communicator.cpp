// Communicator init: rendezvous at the store, a namespace of its own, identities of every rank, the
// topology check, and the fd-passing socket that symmetric allocations use.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <random>

#include "bootstrap/rendezvous.hpp"
#include "kernels/ll128_launch.hpp"
#include "kernels/ll_launch.hpp"
#include "kernels/pipeline_launch.hpp"
#include "collectives/selection.hpp"
#include "kernels/send_recv_lines_launch.hpp"
#include "kernels/staged_launch.hpp"
#include "backends/cuda/cuda_backend.hpp"
#include "backends/nccl/nccl_collectives.hpp"
#include "comm/comm_state.hpp"
#include "comm/topology.hpp"
#include "core/config.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/kernel_modules.hpp"
#include "core/log.hpp"
#include "memory/multicast.hpp"
#include "memory/symmetric_memory.hpp"

namespace braid {
namespace {

// The store served by this process for `host:port`, shared by every communicator that names it (a second
// communicator made from the same rendezvous must not try to bind the port again).
std::shared_ptr<StoreServer> serve_store(const std::string& host, int port) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<StoreServer>> servers;
  const std::string bind_host = store_bind_host(host);
  const std::string key = fmt::format("{}:{}", bind_host, port);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto server = servers[key].lock()) return server;
  auto server = std::make_shared<StoreServer>(bind_host, port);
  servers[key] = server;
  return server;
}

bool shared_gpus_allowed() { return Config::get().string("BRAID_ALLOW_SHARED_GPU").value_or("0") == "1"; }

int choose_device(const Rendezvous& rendezvous, const CommOptions& options, int device_count) {
  int device = options.device;
  const char* source = "options.device";
  if (device < 0) {
    if (std::optional<int64_t> configured = Config::get().integer_in("BRAID_DEVICE", 0, INT_MAX)) {
      device = static_cast<int>(*configured);
      source = "BRAID_DEVICE";
    } else {
      device = rendezvous.local_rank >= 0 ? rendezvous.local_rank : rendezvous.rank;
      source = "the local rank";
      if (shared_gpus_allowed()) {  // ranks beyond the GPUs take them round robin
        device %= device_count;
        source = "the local rank modulo the GPUs (BRAID_ALLOW_SHARED_GPU=1)";
      }
    }
  }
  if (device < 0 || device >= device_count) {
    raise_invalid_argument("Communicator::init", "device", "is {} (from {}), but this process sees {} CUDA device(s)",
                           device, source, device_count);
  }
  return device;
}

std::string random_hex() {
  std::random_device entropy;
  std::mt19937_64 generator((static_cast<uint64_t>(entropy()) << 32) ^ entropy());
  return fmt::format("{:016x}", generator());
}

void validate(const Rendezvous& rendezvous) {
  if (rendezvous.size < 1) raise_invalid_argument("Communicator::init", "rendezvous.size", "is {}; must be ≥ 1", rendezvous.size);
  // The device kernels keep per-peer state in fixed arrays (kernels::kMaxWorld): one host has at most 16 GPUs.
  if (rendezvous.size > kernels::kMaxWorld) {
    raise(ErrorCode::kUnsupported, "Communicator::init: rendezvous.size is {}; braid serves at most {} GPUs of one host",
          rendezvous.size, kernels::kMaxWorld);
  }
  if (rendezvous.rank < 0 || rendezvous.rank >= rendezvous.size) {
    raise_invalid_argument("Communicator::init", "rendezvous.rank", "is {}; must be in [0, {})", rendezvous.rank,
                           rendezvous.size);
  }
  if (rendezvous.store_port <= 0 || rendezvous.store_port > 65535) {
    raise_invalid_argument("Communicator::init", "rendezvous.store_port", "is {}; must be in [1, 65535]",
                           rendezvous.store_port);
  }
}

// Every rank's GPU has virtual memory management and POSIX-fd memory handles, which symmetric memory needs: each
// rank's answer is gathered, so every rank raises kUnsupported naming a rank that lacks them (not that rank alone,
// its peers then waiting for it in the backend's set-up).
void require_vmm_support(detail::CommState& state) {
  CUdevice cu_device = 0;
  BRAID_CU(cuDeviceGet, &cu_device, state.device);
  int vmm = 0, posix_fd = 0;
  BRAID_CU(cuDeviceGetAttribute, &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_device);
  BRAID_CU(cuDeviceGetAttribute, &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cu_device);
  const std::string mine =
      vmm && posix_fd ? "" : fmt::format("GPU {} lacks virtual memory management ({}) or POSIX-fd memory handles ({})",
                                         state.device, vmm, posix_fd);
  const std::vector<std::string> all = state.bootstrap->allgather(mine, "memory handles");
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) {
      raise(ErrorCode::kUnsupported, "rank {}'s {}, which symmetric memory needs (the CUDA backend)", r, all[r]);
    }
  }
}

// Agree on the topology: every rank computes its reachability row, all rows are gathered, and every rank
// applies the same check, so all reach the same verdict. `problem` says why the CUDA backend cannot serve these
// ranks ("" when it can).
struct Topology {
  std::vector<PeerInfo> peers;
  std::string problem;
  bool ll128_lines = false;  // every rank reports native P2P atomics with every peer (NVLink), BRAID_LL128 on
  int ranks_per_gpu = 1;     // the most ranks on one GPU (more than 1 only with BRAID_ALLOW_SHARED_GPU=1)
  int threads_per_gpu = 1;   // the most ranks on one GPU in one process (sharing its context)
  std::vector<int> pids;     // [world]: a rank's pid where this rank can watch it (this host and pid namespace), else 0
};

Topology agree_on_topology(detail::CommState& state) {
  std::vector<std::string> encoded = state.bootstrap->allgather(local_identity(state.device).encode(), "identity");
  std::vector<RankIdentity> ranks;
  for (int r = 0; r < state.size; ++r) ranks.push_back(RankIdentity::decode(encoded[r], r));
  Topology topology;
  topology.pids = checkable_pids(ranks, ranks[state.rank]);
  state.fds->admit(topology.pids);  // fds pass only between the ranks' processes
  topology.peers = probe_peers(ranks, state.rank, state.device);
  std::vector<std::string> rows = state.bootstrap->allgather(reachability_row(topology.peers), "reachability");
  topology.problem = cuda_backend_topology_problem(ranks, rows, shared_gpus_allowed());
  topology.ranks_per_gpu = most_ranks_on_one_gpu(ranks);
  topology.threads_per_gpu = most_threads_on_one_gpu(ranks);
  // LL128 lines land whole over NVLink, whose peers report native P2P atomics (kernels/ll128.cuh); any rank
  // with BRAID_LL128=off turns them off for all.
  bool mine = Config::get().string("BRAID_LL128").value_or("on") == "on";
  for (const PeerInfo& peer : topology.peers) mine = mine && peer.p2p && peer.native_atomics;
  const std::vector<std::string> atomics = state.bootstrap->allgather(mine ? "1" : "0", "native atomics");
  topology.ll128_lines =
      std::all_of(atomics.begin(), atomics.end(), [](const std::string& a) { return a == "1"; });
  return topology;
}

// BRAID_BACKEND, the same on every rank (kMismatch otherwise), applied to the agreed topology: auto takes the
// CUDA backend where it can serve the ranks and NCCL elsewhere; cuda refuses ranks it cannot serve.
bool use_nccl_backend(detail::CommState& state, const Topology& topology, const CommOptions& options) {
  const std::string wanted = !options.backend.empty() ? options.backend : Config::get().string("BRAID_BACKEND").value_or("auto");
  if (wanted != "auto" && wanted != "cuda" && wanted != "nccl") {
    raise_invalid_argument("Communicator::init", "options.backend", "is '{}'; must be auto, cuda or nccl", wanted);
  }
  const std::vector<std::string> all = state.bootstrap->allgather(wanted, "backend");
  for (int r = 0; r < state.size; ++r) {
    if (all[r] != wanted) {
      raise(ErrorCode::kMismatch, "Communicator::init: BRAID_BACKEND is {} on rank {} but {} on rank {}", wanted,
            state.rank, all[r], r);
    }
  }
  const bool shared_gpu = topology.problem.find("both use GPU") != std::string::npos;
  if (shared_gpu) {  // the device each rank chose (options.device, else BRAID_DEVICE, else its local rank)
    raise_invalid_argument("Communicator::init", "options.device", "(or BRAID_DEVICE, or the local rank): {}",
                           topology.problem);
  }
  if (wanted == "nccl") return true;
  if (topology.problem.empty()) return false;
  if (wanted == "cuda") raise(ErrorCode::kPeerUnreachable, "Communicator::init: {}", topology.problem);
  BRAID_INFO("the CUDA backend cannot serve these ranks ({}); collectives run on NCCL", topology.problem);
  return true;
}

// The cap on every launch's blocks: options.max_blocks, else BRAID_MAX_BLOCKS, else the table's widths (at most
// kMaxBlocks). Out of range: kInvalidArgument naming the option or the variable.
int max_blocks(int option) {
  const bool from_option = option != 0;
  const int64_t value = from_option ? option : Config::get().integer("BRAID_MAX_BLOCKS").value_or(0);
  if (value == 0) return kMaxBlocks;
  if (value < 1 || value > kMaxBlocks) {
    if (from_option) raise_invalid_argument("Communicator::init", "options.max_blocks", "is {}; must be in [1, {}] or 0", value, kMaxBlocks);
    raise(ErrorCode::kInvalidArgument, "BRAID_MAX_BLOCKS is {}; must be in [1, {}] or 0", value, kMaxBlocks);
  }
  return static_cast<int>(value);
}

// Settings that decide which kernels a call runs, and how they lay out the communicator's buffers, are the same
// on every rank: ranks that read them differently would run different protocols for one call. BRAID_ALGO is
// also parsed here, so a bad value fails init rather than the first collective.
void agree_on_settings(detail::CommState& state) {
  (void)select_algorithm(Collective::kAllReduce, 1, state.size, DataType::kFloat32, state.settings.algorithm_override);
  const Config& config = Config::get();
  const std::vector<std::pair<std::string, std::string>> settings = {
      {"BRAID_ALGO (or CommOptions::algorithms)", state.settings.algorithm_override},
      {"BRAID_MAX_BLOCKS (or CommOptions::max_blocks)", std::to_string(state.settings.max_blocks)},
      {"BRAID_STAGING_BYTES", std::to_string(*config.integer("BRAID_STAGING_BYTES"))},
      {"BRAID_PIPELINE_BYTES", std::to_string(*config.integer("BRAID_PIPELINE_BYTES"))},
      {"BRAID_ALLOW_SHARED_GPU", shared_gpus_allowed() ? "1" : "0"},
      {"BRAID_EAGER_ZERO_COPY", state.settings.eager_zero_copy ? "1" : "0"},
      // Multicast setup exchanges on the host only where it is on: ranks that differ would pair other exchanges.
      {"BRAID_ENABLE_MULTICAST", detail::multicast_enabled(config) ? "1" : "0"},
      {"BRAID_MULTICAST_BYTES (with BRAID_ENABLE_MULTICAST=1)",
       detail::multicast_enabled(config) ? std::to_string(*config.integer("BRAID_MULTICAST_BYTES")) : "-"},
  };
  std::string mine;
  for (const auto& setting : settings) mine += setting.second + '\x1f';
  const std::vector<std::string> all = state.bootstrap->allgather(mine, "settings");
  for (int r = 0; r < state.size; ++r) {
    size_t start = 0;
    for (const auto& setting : settings) {
      const size_t end = all[r].find('\x1f', start);
      const std::string theirs = all[r].substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (theirs != setting.second) {
        raise(ErrorCode::kMismatch, "Communicator::init: {} is '{}' on rank {} but '{}' on rank {}", setting.first,
              setting.second, state.rank, theirs, r);
      }
      start = end == std::string::npos ? all[r].size() : end + 1;
    }
  }
}

// The NCCL backend: rank 0 makes the unique id, the store carries it to every rank.
std::shared_ptr<detail::NcclBackend> make_nccl_backend(detail::CommState& state, const CommOptions& options) {
  using detail::NcclBackend;
  std::shared_ptr<detail::NcclLibrary> library = detail::NcclLibrary::load(options.nccl_library);
  const std::string id = state.bootstrap->broadcast(state.rank == 0 ? NcclBackend::make_unique_id(*library) : std::string(), 0,
                                                    "NCCL unique id");
  // BRAID_NCCL_WATCHDOG=off: an infinite bound, which the watchdog does not watch.
  const bool watched = Config::get().string("BRAID_NCCL_WATCHDOG").value_or("on") == "on";
  return std::make_shared<NcclBackend>(library, state.rank, state.size, state.device, id, detail::nccl_register_mode(),
                                       watched ? state.timeout_s : std::numeric_limits<double>::infinity());
}

// The communicator's bootstrap, fd exchanger and allocator, as multicast setup asks for them.
detail::MulticastTeam multicast_team(detail::CommState& state, Communicator& comm) {
  detail::MulticastTeam team;
  team.rank = state.rank;
  team.size = state.size;
  team.device = state.device;
  team.all_agree = [&state](bool mine) {
    const std::vector<std::string> all = state.bootstrap->allgather(mine ? "1" : "0", "multicast setup");
    return std::all_of(all.begin(), all.end(), [](const std::string& flag) { return flag == "1"; });
  };
  team.share_fd = [&state](int fd) {
    const uint64_t tag = state.alloc_sequence++;  // every rank shares once, in the same order
    if (state.rank != 0) return state.fds->receive(0, tag);
    for (int peer = 1; peer < state.size; ++peer) state.fds->send(peer, fd, tag);
    return -1;
  };
  team.allocate = [&comm](size_t bytes) { return comm.alloc(bytes); };
  return team;
}

// Every braid kernel into this GPU's context now, while nothing of braid runs on it (core/kernel_modules.hpp).
void load_kernels() {
  if (Config::get().string("BRAID_PRELOAD_KERNELS").value_or("on") != "on") return;
  const auto start = std::chrono::steady_clock::now();
  const detail::KernelLoadCount count = detail::preload_kernels();
  BRAID_DEBUG("loaded {} of {} kernels in {} modules ({} built for other GPUs skipped) in {:.1f} ms", count.loaded_now,
              count.functions, count.modules, count.skipped,
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace

Communicator Communicator::init(const Rendezvous& rendezvous, const CommOptions& options) {
  validate(rendezvous);
  set_log_rank(rendezvous.rank);
  const int device_count = require_cuda_devices("Communicator::init");
  auto state = std::make_shared<detail::CommState>();
  state->rank = rendezvous.rank;
  state->size = rendezvous.size;
  state->device = choose_device(rendezvous, options, device_count);
  state->timeout_s = timeout_seconds(options.timeout_s, "options.timeout_s");
  DeviceGuard guard(state->device);
  BRAID_CUDA(cudaFree(nullptr));  // creates the primary context that driver calls below use
  load_kernels();
  state->setup_stream = std::make_unique<detail::PrivateStream>();  // NOTE [streams made before the exchanges]

  if (rendezvous.serve_store) state->store_server = serve_store(rendezvous.store_host, rendezvous.store_port);
  state->store = std::make_shared<StoreClient>(rendezvous.store_host, rendezvous.store_port, state->timeout_s);

  // A namespace of its own: the k-th communicator this rank makes with this job id. Creation is collective
  // and ordered, so rank r's k-th communicator is every rank's k-th.
  const std::string job = rendezvous.job_id.empty() ? "job" : rendezvous.job_id;
  const int64_t index = state->store->add(fmt::format("braid/{}/comm-count/{}", job, state->rank), 1);
  state->rendezvous = rendezvous;
  state->rendezvous.job_id = fmt::format("{}/comm{}", job, index);
  state->options = options;
  state->options.device = state->device;
  state->bootstrap = std::make_unique<Bootstrap>(state->store, fmt::format("braid/{}/comm{}", job, index), state->rank,
                                                 state->size, state->timeout_s);
  state->uid = state->bootstrap->broadcast(state->rank == 0 ? random_hex() : std::string(), 0, "communicator id");
  state->fds = std::make_unique<FdExchanger>(state->uid, state->rank, state->size, state->timeout_s);
  const Topology topology = agree_on_topology(*state);  // its allgathers also ensure every fd socket is bound
  state->peers = topology.peers;
  collectives::CallSettings& settings = state->settings;
  settings.ll128_lines = topology.ll128_lines;
  settings.algorithm_override =
      !options.algorithms.empty() ? options.algorithms : Config::get().string("BRAID_ALGO").value_or("");
  settings.max_blocks = max_blocks(options.max_blocks);
  settings.eager_zero_copy = eager_zero_copy_enabled();
  agree_on_settings(*state);
  settings.ranks_per_gpu = topology.ranks_per_gpu;
  settings.threads_per_gpu = topology.threads_per_gpu;
  if (topology.ranks_per_gpu > 1) {
    // NOTE [shared GPUs]: ranks on one GPU spin on each other, so every rank's blocks must be resident together:
    // the ranks of a GPU share min(kMaxBlocks, its multiprocessors), one block a multiprocessor. A GPU with fewer
    // multiprocessors than ranks cannot seat them: refused here, since its kernels would wait for each other forever.
    int multiprocessors = 0;
    BRAID_CUDA(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, state->device));
    settings.max_blocks =
        shared_gpu_launch_blocks(settings.max_blocks, multiprocessors, topology.ranks_per_gpu, state->device);
    BRAID_INFO("shared-GPU mode (BRAID_ALLOW_SHARED_GPU=1): up to {} ranks on one GPU, launches capped at {} blocks; "
               "a test mode, timings mean nothing", topology.ranks_per_gpu, settings.max_blocks);
    const std::string queues =
        shared_queue_warning(topology.threads_per_gpu, std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"));
    static std::once_flag warned;  // once a process: the variable is the process's
    if (!queues.empty()) std::call_once(warned, [&] { BRAID_WARN("{} (docs/config.md)", queues); });
  }
  state->order = std::make_unique<detail::CallOrder>(state->device, state->setup());
  Communicator comm(state);
  if (use_nccl_backend(*state, topology, options)) {
    state->nccl = make_nccl_backend(*state, options);
    state->backend = std::make_unique<detail::NcclCollectives>(state->nccl, state->registrations);
    // Deregistering a buffer releases NCCL's registration of it too (held weakly: teardown in any order).
    state->registrations->on_remove([backend = std::weak_ptr<detail::NcclBackend>(state->nccl)](uint64_t id) {
      if (std::shared_ptr<detail::NcclBackend> nccl = backend.lock()) nccl->forget_registered(id);
    });
    BRAID_INFO("communicator {} ready on NCCL {}: rank {} of {} on GPU {}", state->uid, state->nccl->library().version(),
               state->rank, state->size, state->device);
    return comm;
  }
  require_vmm_support(*state);
  detail::CudaBackendSetup setup;
  setup.memory = state;
  setup.order = state->order.get();
  setup.settings = settings;
  setup.peer_pids = topology.pids;
  setup.allocate = [&comm](size_t bytes) { return comm.alloc(bytes); };
  setup.multicast = multicast_team(*state, comm);
  setup.connect = [host = rendezvous.store_host, port = rendezvous.store_port, timeout_s = state->timeout_s] {
    return std::make_unique<StoreClient>(host, port, timeout_s);
  };
  setup.store_prefix = state->bootstrap->prefix();
  auto cuda = std::make_unique<detail::CudaBackend>(setup);
  state->cuda = cuda.get();
  state->backend = std::move(cuda);
  if (settings.eager_zero_copy && state->cuda->context().exposures != nullptr) {
    // A registration dropped without deregister withdraws its exposure too (held weakly: teardown in any order).
    state->registrations->on_remove(
        [exposures = std::weak_ptr<detail::RegisteredExposures>(state->cuda->context().exposures)](uint64_t id) {
          std::shared_ptr<detail::RegisteredExposures> held = exposures.lock();
          if (held == nullptr) return;
          try {
            held->withdraw(id);
          } catch (const Error& error) {
            if (error.code() == ErrorCode::kAborted || error.code() == ErrorCode::kRevoked ||
                error.code() == ErrorCode::kRemoteError) {  // reported already: the communicator's fatal failure
              BRAID_INFO("a registered buffer dropped without deregister: {}", error.what());
            } else {
              BRAID_WARN("a registered buffer dropped without deregister: {}", error.what());
            }
          } catch (const std::exception& error) {  // a registration's teardown never throws out of a destructor
            BRAID_WARN("a registered buffer dropped without deregister: {}", error.what());
          }
        });
  }
  BRAID_INFO("communicator {} ready: rank {} of {} on GPU {}{}", state->uid, state->rank, state->size, state->device,
             state->cuda->context().multicast ? " with NVLink multicast" : "");
  return comm;
}

Communicator Communicator::shrink(const std::vector<int>& excluded) const {
  const char* function = "Communicator::shrink";
  detail::CommState& state = detail::usable(state_, function);
  std::vector<bool> out(static_cast<size_t>(state.size), false);
  for (const int rank : excluded) {
    if (rank < 0 || rank >= state.size) {
      raise_invalid_argument(function, "excluded", "names rank {}; the communicator has ranks 0..{}", rank, state.size - 1);
    }
    if (out[rank]) raise_invalid_argument(function, "excluded", "names rank {} twice", rank);
    if (rank == state.rank) raise_invalid_argument(function, "excluded", "names this rank ({}), which calls shrink", rank);
    out[rank] = true;
  }
  Rendezvous rendezvous = state.rendezvous;
  rendezvous.rank = static_cast<int>(std::count(out.begin(), out.begin() + state.rank, false));
  rendezvous.size = static_cast<int>(std::count(out.begin(), out.end(), false));
  rendezvous.local_rank = -1;
  rendezvous.local_size = 0;
  rendezvous.serve_store = false;  // the parent's server, where this rank holds it, serves on (kept below)
  // Every survivor's k-th shrink of this communicator, whatever it excluded: a new namespace in the same store.
  rendezvous.job_id += fmt::format("/shrink{}", ++state.shrinks);
  Communicator child = init(rendezvous, state.options);
  child.state_->store_server = state.store_server;
  return child;
}

Communicator::Communicator(std::shared_ptr<detail::CommState> state) : state_(std::move(state)) {}
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
Communicator::~Communicator() = default;

bool Communicator::uses_multicast() const {
  const detail::CommState& state = detail::usable(state_, "Communicator::uses_multicast");
  return state.cuda != nullptr && state.cuda->context().multicast != nullptr;
}

const char* Communicator::backend() const {
  return detail::usable(state_, "Communicator::backend").backend->name();
}

void* Communicator::nccl_communicator() const {
  const detail::CommState& state = detail::usable(state_, "Communicator::nccl_communicator");
  return state.nccl ? static_cast<void*>(state.nccl->comm()) : nullptr;
}

detail::CommState& detail::usable(const std::shared_ptr<CommState>& state, const char* function) {
  if (!state) raise(ErrorCode::kInvalidArgument, "{}: use of a moved-from communicator", function);
  return *state;
}

detail::CommState& detail::enter(const std::shared_ptr<CommState>& state_ptr, const char* function) {
  CommState& state = usable(state_ptr, function);
  set_log_rank(state.rank);
  state.backend->raise_recorded_failure();
  return state;
}

detail::CommState& detail::enter(const std::shared_ptr<CommState>& state_ptr, const char* function, Stream stream) {
  CommState& state = enter(state_ptr, function);
  collectives::refuse_shared_legacy_stream(function, state.settings.threads_per_gpu, stream);
  return state;
}

std::shared_ptr<collectives::CollectiveContext> Communicator::cuda_context(const char* function) const {
  // Aliasing the state: whoever holds the context keeps the communicator alive.
  return std::shared_ptr<collectives::CollectiveContext>(state_, &detail::cuda_context(detail::usable(state_, function), function));
}

void detail::require_cuda_backend(const CommState& state, const char* function) {
  if (state.nccl) {
    raise(ErrorCode::kUnsupported, "{} needs the CUDA backend (symmetric memory between the GPUs of one host); this "
          "communicator runs on NCCL (BRAID_BACKEND, or ranks the CUDA backend cannot serve)", function);
  }
}

collectives::CollectiveContext& detail::cuda_context(CommState& state, const char* function) {
  require_cuda_backend(state, function);
  if (state.cuda == nullptr) raise(ErrorCode::kInternal, "{}: the CUDA backend is not made yet", function);
  return state.cuda->context();
}

int Communicator::rank() const { return detail::usable(state_, "Communicator::rank").rank; }
int Communicator::size() const { return detail::usable(state_, "Communicator::size").size; }
int Communicator::device() const { return detail::usable(state_, "Communicator::device").device; }
double Communicator::timeout_s() const { return detail::usable(state_, "Communicator::timeout_s").timeout_s; }
const std::vector<PeerInfo>& Communicator::peers() const { return detail::usable(state_, "Communicator::peers").peers; }

const PeerInfo& Communicator::peer(int rank) const {
  const detail::CommState& state = detail::usable(state_, "Communicator::peer");
  if (rank < 0 || rank >= state.size) {
    raise_invalid_argument("Communicator::peer", "rank", "is {}; must be in [0, {})", rank, state.size);
  }
  return state.peers[rank];
}

std::string Communicator::describe() const {
  const detail::CommState& state = detail::usable(state_, "Communicator::describe");
  std::string text = fmt::format("rank {} of {}, GPU {} ({})\n", state.rank, state.size, state.device,
                                 state.peers[state.rank].pci_bus_id);
  for (const PeerInfo& peer : state.peers) {
    if (peer.rank == state.rank) continue;
    text += fmt::format("  peer {}: host {}, GPU {} ({}), p2p {}, native atomics {}, performance rank {}\n", peer.rank,
                        peer.host, peer.device, peer.pci_bus_id, peer.p2p ? "yes" : "no",
                        peer.native_atomics ? "yes" : "no", peer.performance_rank);
  }
  return text;
}

void Communicator::barrier() {
  detail::CommState& state = detail::usable(state_, "Communicator::barrier");
  std::lock_guard<std::mutex> lock(state.setup_mutex);
  set_log_rank(state.rank);
  state.bootstrap->barrier("Communicator::barrier");
}

std::vector<std::string> Communicator::host_allgather(const std::string& mine) {
  detail::CommState& state = detail::usable(state_, "Communicator::host_allgather");
  std::lock_guard<std::mutex> lock(state.setup_mutex);
  set_log_rank(state.rank);
  return state.bootstrap->allgather(mine, "Communicator::host_allgather");
}

SymmetricMemory Communicator::alloc(size_t bytes, const AllocOptions& options) {
  detail::require_cuda_backend(detail::usable(state_, "Communicator::alloc"), "Communicator::alloc");
  set_log_rank(state_->rank);
  return SymmetricMemory(allocate_symmetric(state_, bytes, options));
}

}  // namespace braid
