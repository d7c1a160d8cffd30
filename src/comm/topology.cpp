#include "comm/topology.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "collectives/selection.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"

namespace braid {
namespace {

std::string read_boot_id() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(file, id);
  return id.empty() ? "unknown-boot-id" : id;
}

constexpr const char* kUnknownPidNamespace = "unknown";

std::string pid_namespace() {
  char target[128] = {};
  const ssize_t length = ::readlink("/proc/self/ns/pid", target, sizeof(target) - 1);
  return length > 0 ? std::string(target, static_cast<size_t>(length)) : std::string(kUnknownPidNamespace);
}

std::string host_name() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return "unknown-host";
  return buffer;
}

}  // namespace

std::string RankIdentity::encode() const {
  return fmt::format("{}\n{}\n{}\n{}\n{}\n{}", host, boot_id, pci_bus_id, device, pid, pid_namespace);
}

RankIdentity RankIdentity::decode(const std::string& text, int rank) {
  std::istringstream in(text);
  RankIdentity identity;
  std::string device, pid;
  if (!std::getline(in, identity.host) || !std::getline(in, identity.boot_id) ||
      !std::getline(in, identity.pci_bus_id) || !std::getline(in, device) || !std::getline(in, pid) ||
      !std::getline(in, identity.pid_namespace)) {
    raise(ErrorCode::kInternal, "malformed identity from rank {}", rank);
  }
  identity.device = std::stoi(device);
  identity.pid = std::stoi(pid);
  return identity;
}

RankIdentity local_identity(int device) {
  RankIdentity identity;
  identity.host = host_name();
  identity.boot_id = read_boot_id();
  char bus_id[64] = {};
  BRAID_CUDA(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device));
  identity.pci_bus_id = bus_id;
  identity.device = device;
  identity.pid = static_cast<int>(getpid());
  identity.pid_namespace = pid_namespace();
  return identity;
}

std::vector<int> checkable_pids(const std::vector<RankIdentity>& ranks, const RankIdentity& me) {
  std::vector<int> pids;
  for (const RankIdentity& rank : ranks) {
    const bool comparable = rank.boot_id == me.boot_id && rank.host == me.host &&
                            me.pid_namespace != kUnknownPidNamespace && rank.pid_namespace == me.pid_namespace;
    pids.push_back(comparable ? rank.pid : 0);
  }
  return pids;
}

std::vector<PeerInfo> probe_peers(const std::vector<RankIdentity>& ranks, int my_rank, int my_device) {
  std::vector<PeerInfo> peers(ranks.size());
  const RankIdentity& me = ranks[my_rank];
  for (size_t r = 0; r < ranks.size(); ++r) {
    PeerInfo& peer = peers[r];
    peer.rank = static_cast<int>(r);
    peer.host = ranks[r].host;
    peer.pci_bus_id = ranks[r].pci_bus_id;
    peer.same_host = ranks[r].boot_id == me.boot_id && ranks[r].host == me.host;
    if (!peer.same_host) continue;
    int device = -1;
    if (cudaDeviceGetByPCIBusId(&device, ranks[r].pci_bus_id.c_str()) != cudaSuccess) {
      cudaGetLastError();  // the peer's GPU is hidden from this process (CUDA_VISIBLE_DEVICES)
      continue;
    }
    peer.device = device;
    if (device == my_device) {
      peer.p2p = true;  // our own GPU (another rank on it only with BRAID_ALLOW_SHARED_GPU=1)
      peer.native_atomics = true;
      peer.performance_rank = 0;
      continue;
    }
    int can_access = 0;
    BRAID_CUDA(cudaDeviceCanAccessPeer(&can_access, my_device, device));
    peer.p2p = can_access != 0;
    if (peer.p2p) {
      int atomics = 0;
      BRAID_CUDA(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, my_device, device));
      peer.native_atomics = atomics != 0;
      BRAID_CUDA(cudaDeviceGetP2PAttribute(&peer.performance_rank, cudaDevP2PAttrPerformanceRank, my_device, device));
    }
  }
  return peers;
}

std::string reachability_row(const std::vector<PeerInfo>& peers) {
  std::string row;
  for (const PeerInfo& peer : peers) row += peer.p2p ? '1' : '0';
  return row;
}

namespace {

// The most ranks that share one GPU and, with `same_process`, one process too.
int most_on_one_gpu(const std::vector<RankIdentity>& ranks, bool same_process) {
  int most = ranks.empty() ? 0 : 1;
  for (const RankIdentity& rank : ranks) {
    const auto same = std::count_if(ranks.begin(), ranks.end(), [&](const RankIdentity& other) {
      return other.host == rank.host && other.boot_id == rank.boot_id && other.pci_bus_id == rank.pci_bus_id &&
             (!same_process || (other.pid == rank.pid && other.pid_namespace == rank.pid_namespace));
    });
    most = std::max(most, static_cast<int>(same));
  }
  return most;
}

}  // namespace

int most_ranks_on_one_gpu(const std::vector<RankIdentity>& ranks) { return most_on_one_gpu(ranks, false); }

int most_threads_on_one_gpu(const std::vector<RankIdentity>& ranks) { return most_on_one_gpu(ranks, true); }

std::string shared_queue_warning(int threads_per_gpu, const char* connections) {
  constexpr int kMostQueues = 32;
  if (threads_per_gpu <= 1) return "";
  const int queues = connections != nullptr ? std::atoi(connections) : 8;
  if (queues >= kMostQueues) return "";
  return fmt::format("{} ranks share one GPU as threads of one process, and so its {} hardware queues "
                     "(CUDA_DEVICE_MAX_CONNECTIONS{}): a rank's launch can wait behind a peer's command that waits "
                     "for this rank, until the timeout. Set CUDA_DEVICE_MAX_CONNECTIONS=32 before the process's first "
                     "CUDA call",
                     threads_per_gpu, queues, connections != nullptr ? fmt::format("={}", connections) : " unset");
}

int shared_gpu_launch_blocks(int max_blocks, int multiprocessors, int ranks_per_gpu, int device) {
  if (ranks_per_gpu > multiprocessors) {
    raise(ErrorCode::kInvalidArgument,
          "BRAID_ALLOW_SHARED_GPU=1: {} ranks share one GPU, but GPU {} has {} multiprocessors, and every rank's "
          "blocks must be resident together (at least one multiprocessor a rank); use fewer ranks",
          ranks_per_gpu, device, multiprocessors);
  }
  return std::min(max_blocks, std::max(1, std::min(kMaxBlocks, multiprocessors) / ranks_per_gpu));
}

std::string cuda_backend_topology_problem(const std::vector<RankIdentity>& ranks,
                                          const std::vector<std::string>& rows, bool shared_gpus) {
  const size_t size = ranks.size();
  for (size_t r = 1; r < size; ++r) {
    if (ranks[r].boot_id != ranks[0].boot_id || ranks[r].host != ranks[0].host) {
      return fmt::format("rank {} is on host '{}' and rank 0 on host '{}': the CUDA backend needs every rank on one host",
                         r, ranks[r].host, ranks[0].host);
    }
  }
  for (size_t a = 0; a < size; ++a) {
    for (size_t b = a + 1; b < size; ++b) {
      if (!shared_gpus && ranks[a].pci_bus_id == ranks[b].pci_bus_id) {
        return fmt::format("ranks {} and {} both use GPU {}: each rank needs a GPU of its own (BRAID_ALLOW_SHARED_GPU=1 "
                           "lets ranks share one, for tests)", a, b, ranks[a].pci_bus_id);
      }
    }
  }
  for (size_t a = 0; a < size; ++a) {
    for (size_t b = 0; b < size; ++b) {
      if (a != b && (rows[a].size() != size || rows[a][b] != '1')) {
        return fmt::format("rank {} (GPU {}) cannot reach rank {} (GPU {}) over P2P: the CUDA backend needs every "
                           "pair of GPUs P2P-reachable (NVLink), and both GPUs visible to every rank",
                           a, ranks[a].pci_bus_id, b, ranks[b].pci_bus_id);
      }
    }
  }
  return "";
}

}  // namespace braid
