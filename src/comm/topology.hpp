// Who is where: each rank's host and GPU, and which peers it can reach over P2P (NVLink).
#pragma once

#include <string>
#include <vector>

#include "braid/braid.hpp"

namespace braid {

// What a rank tells its peers about itself at communicator init.
struct RankIdentity {
  std::string host;        // gethostname()
  std::string boot_id;     // /proc/sys/kernel/random/boot_id: same value <=> same host (containers too)
  std::string pci_bus_id;  // of the rank's GPU
  int device = -1;         // the rank's CUDA ordinal in its own process
  int pid = 0;
  std::string pid_namespace;  // /proc/self/ns/pid's target ("unknown" if unreadable): pids compare within one

  std::string encode() const;
  static RankIdentity decode(const std::string& text, int rank);  // kInternal on malformed text
};

RankIdentity local_identity(int device);

// The process of every rank as `me` can check it (FdExchanger::admit): its pid where it runs on this host in
// this pid namespace, else 0.
std::vector<int> checkable_pids(const std::vector<RankIdentity>& ranks, const RankIdentity& me);

// This rank's view of every peer: same host, the peer's GPU in this process's numbering, P2P access,
// native atomics and performance rank as CUDA reports them from `my_device`.
std::vector<PeerInfo> probe_peers(const std::vector<RankIdentity>& ranks, int my_rank, int my_device);

// A row of reachability as exchanged between ranks: character r is '1' when rank r is reachable.
std::string reachability_row(const std::vector<PeerInfo>& peers);

// Why ranks cannot form a CUDA-backend communicator, or "" when they can: ranks on different hosts, two
// ranks on one GPU (unless `shared_gpus` allows it: BRAID_ALLOW_SHARED_GPU), or a pair (in either direction)
// that is not P2P-reachable. Pure, for cpu tests.
std::string cuda_backend_topology_problem(const std::vector<RankIdentity>& ranks,
                                          const std::vector<std::string>& reachability_rows, bool shared_gpus = false);

// The most ranks that share one GPU (1: a GPU each).
int most_ranks_on_one_gpu(const std::vector<RankIdentity>& ranks);

// The blocks one launch may take where `ranks_per_gpu` (> 1) ranks share GPU `device` of `multiprocessors`
// multiprocessors: every rank's blocks must be resident together, one block a multiprocessor, so
// min(max_blocks, min(kMaxBlocks, multiprocessors) / ranks_per_gpu), at least 1. kInvalidArgument naming both
// counts where there are more ranks than multiprocessors. Pure, for cpu tests.
int shared_gpu_launch_blocks(int max_blocks, int multiprocessors, int ranks_per_gpu, int device);

// The most ranks that share one GPU as threads of one process, and so share its CUDA context (1: none share).
int most_threads_on_one_gpu(const std::vector<RankIdentity>& ranks);

// NOTE [shared hardware queues]
// A CUDA context feeds its GPU through CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 unless set; at most 32), and
// its streams are spread over them. A stream's wait for another stream (an event wait) at the head of a queue holds
// back the work behind it, of any stream (on H100 with driver R580, with 8 queues every stream sharing the waiting
// streams' queues was held; 31 streams made one after another over 32 queues never shared one; a kernel waiting for
// its own stream's previous kernel held nothing back). Where ranks share a context, one rank's launch can sit
// behind a peer's event wait for that peer's spinning kernel, which waits for this rank's launch: a hang until the
// timeout. 32 queues make two ranks' streams less likely to meet, not impossible; braid warns at init where fewer
// are set.
//
// The warning, or "" where none is due. `connections`: the variable's value, null where unset. Pure, for cpu tests.
std::string shared_queue_warning(int threads_per_gpu, const char* connections);

}  // namespace braid
