#include "backends/cuda/cuda_backend.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "kernels/announced_launch.hpp"
#include "kernels/ll128_launch.hpp"
#include "kernels/ll_launch.hpp"
#include "kernels/pipeline_launch.hpp"
#include "kernels/send_recv_lines_launch.hpp"

namespace braid::detail {
namespace {

size_t area_bytes_from(const char* variable, int64_t at_least) {
  const int64_t bytes = *Config::get().integer(variable);
  if (bytes < at_least) {
    raise(ErrorCode::kInvalidArgument, "environment variable {}={} must be at least {} bytes", variable, bytes, at_least);
  }
  return static_cast<size_t>(bytes);
}

// Every rank of a GPU makes its own areas: where they would not fit in the GPU's memory (a tenth left for the
// contexts and the user), every rank refuses together, naming the cause, instead of one failing an allocation
// while its peers wait for it in the next exchange.
void require_room(MemoryContext& memory, int ranks_per_gpu, size_t area_bytes) {
  size_t free_bytes = 0, total_bytes = 0;
  BRAID_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t needed = area_bytes * static_cast<size_t>(ranks_per_gpu);
  const bool fits = needed <= total_bytes - total_bytes / 10;
  std::vector<std::string> all;
  {
    std::lock_guard<std::mutex> lock(memory.setup_mutex);
    all = memory.bootstrap->allgather(fits ? "" : fmt::format("{} {}", needed, total_bytes), "CUDA backend areas");
  }
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    if (all[r].empty()) continue;
    raise(ErrorCode::kInvalidArgument,
          "Communicator::init: the communicator's areas of the {} rank(s) on rank {}'s GPU take {} bytes of its {} "
          "(BRAID_STAGING_BYTES, BRAID_PIPELINE_BYTES, the LL areas; with BRAID_ALLOW_SHARED_GPU=1, every rank of a "
          "GPU has its own): make them smaller or put fewer ranks on a GPU",
          ranks_per_gpu, r, all[r].substr(0, all[r].find(' ')), all[r].substr(all[r].find(' ') + 1));
  }
}

// Collective (init): whether no two ranks share a process.
bool every_rank_its_own_process(MemoryContext& memory) {
  std::vector<std::string> pids;
  {
    std::lock_guard<std::mutex> lock(memory.setup_mutex);
    pids = memory.bootstrap->allgather(std::to_string(getpid()), "CUDA backend processes");
  }
  std::sort(pids.begin(), pids.end());
  return std::adjacent_find(pids.begin(), pids.end()) == pids.end();
}

}  // namespace

CudaBackend::CudaBackend(const CudaBackendSetup& setup) : context_(*setup.memory, *setup.order, setup.settings) {
  collectives::CollectiveContext& c = context_;
  // The streams the backend keeps, before the exchanges below (NOTE [streams made before the exchanges]).
  const bool side_streams_greatest_priority = c.ranks_per_gpu == 1;  // NOTE [side streams at the greatest priority]
  c.side = std::make_unique<SideStream>(c.device, side_streams_greatest_priority);
  c.second_side = std::make_unique<SideStream>(c.device, side_streams_greatest_priority);
  c.third_side = std::make_unique<SideStream>(c.device, side_streams_greatest_priority);
  {
    DeviceGuard guard(c.device);
    c.exchange_stream = std::make_unique<detail::PrivateStream>();
  }
  c.sync = std::make_unique<DeviceSync>(setup.memory, c.memory.timeout_s, kernels::kPadChannels);
  // Pipeline senders may fill every FIFO slot before the first credit comes back.
  c.sync->grant_credits(kernels::kFree1 * kernels::kPipelineChannels, kernels::kPipelineChannels, kernels::kFifoDepth);
  c.sync->grant_credits(kernels::kFree2 * kernels::kPipelineChannels, kernels::kPipelineChannels, kernels::kFifoDepth);
  const size_t staging_bytes = area_bytes_from("BRAID_STAGING_BYTES", int64_t(1) << 20);
  // The pipeline area holds at least one 256-byte piece per (phase, channel, sender, slot).
  const int64_t least_pipeline =
      int64_t(256) * kernels::kPipelinePhases * kernels::kPipelineChannels * c.size * kernels::kFifoDepth;
  const size_t pipeline_bytes = area_bytes_from("BRAID_PIPELINE_BYTES", least_pipeline);
  const size_t lines_bytes = c.ll128_lines ? kernels::send_recv_lines_area_bytes(c.size) : 0;
  require_room(c.memory, c.ranks_per_gpu,
               staging_bytes + pipeline_bytes + kernels::ll_area_bytes(c.size) + kernels::ll128_area_bytes(c.size) +
                   lines_bytes);
  c.staging = setup.allocate(staging_bytes);
  c.pipeline = setup.allocate(pipeline_bytes);
  c.ll = setup.allocate(kernels::ll_area_bytes(c.size));
  c.ll128 = setup.allocate(kernels::ll128_area_bytes(c.size));
  if (c.ll128_lines) c.send_recv_lines = setup.allocate(lines_bytes);
  c.multicast = open_multicast(Config::get(), setup.multicast, area_bytes_from("BRAID_MULTICAST_BYTES", int64_t(1) << 20));
  if (c.size > 1 && c.eager_zero_copy) {  // the helper thread and its store clients only where something uses them
    detail::CallOrder* order = &c.order;
    DeviceGuard guard(c.device);
    // The exposure table allocates host and device memory, which can wait for the whole device: made before the
    // announcement area's exchange, which no peer leaves before this rank joins it, no peer's call is in flight then
    // (NOTE [no device-wide waits]).
    c.exposures = std::make_shared<detail::RegisteredExposures>(
        c.memory, setup.connect, setup.store_prefix, [order](double wait_s) { return order->wait_for_calls(wait_s); });
    c.announcements = setup.allocate(kernels::announcement_words(c.size, device::kBarrierChannels) * sizeof(uint64_t));
    if (every_rank_its_own_process(c.memory)) {
      std::lock_guard<std::mutex> lock(c.memory.setup_mutex);
      c.exposure_exchange = std::make_unique<HostMailbox>(*c.memory.fds, c.rank, c.size, c.memory.alloc_sequence++,
                                                          c.memory.timeout_s);
    }
  }
  DeviceSync* sync = c.sync.get();
  auto exited = [this, sync](int rank, int pid) {
    if (sync->publish_failure(device::kErrorPeerExited, rank, pid)) {
      BRAID_WARN("rank {}'s process (pid {}) exited without destroying the communicator; this rank's calls fail "
                 "with kRemoteError", rank, pid);
    }
    end_host_waits();
  };
  auto revoked = [this, sync](int by) {
    sync->publish_failure(device::kErrorRevoked, by, 0);
    end_host_waits();
  };
  peer_watch_ = std::make_unique<PeerWatch>(c.memory, setup.peer_pids, exited, revoked);
}

// The failure the watch saw ends the host waits too (NOTE [ended host waits]), with the error the next call raises.
void CudaBackend::end_host_waits() noexcept {
  try {
    // The word is published (by this thread, or by a kernel that claimed it first and writes it within
    // microseconds): wait, bounded, until it reads back.
    for (int look = 0; look < 1000; ++look) {
      raise_recorded_failure();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    BRAID_WARN("a fatal failure was published but did not read back within a second; host waits are not ended");
  } catch (const Error& error) {
    MemoryContext& memory = context_.memory;
    if (memory.bootstrap) memory.bootstrap->store().interrupt(error.code(), error.what());
    if (memory.fds) memory.fds->interrupt(error.code(), error.what());
    if (context_.exposure_exchange) context_.exposure_exchange->interrupt(error.code(), error.what());
    if (context_.exposures) context_.exposures->interrupt(error.code(), error.what());
  } catch (...) {
    // raise_recorded_failure raises braid::Error alone
  }
}

void CudaBackend::revoke() { peer_watch_->revoke(); }

void CudaBackend::abort() noexcept {
  if (context_.exposure_exchange) context_.exposure_exchange->interrupt();  // a call waiting there ends
  if (context_.exposures) context_.exposures->interrupt();  // and a registration's exposure or withdrawal
  try {
    context_.sync->publish_failure(device::kErrorAborted, context_.rank, 0);
  } catch (...) {
    // The word is published before anything that can throw; the device flag is best effort.
  }
}

void CudaBackend::collective(const collectives::CollectiveCall& call, Stream stream) {
  switch (call.collective) {
    case Collective::kAllReduce: return collectives::all_reduce(context_, call, stream);
    case Collective::kReduce: return collectives::reduce(context_, call, stream);
    case Collective::kReduceScatter: return collectives::reduce_scatter(context_, call, stream);
    case Collective::kAllGather: return collectives::all_gather(context_, call, stream);
    case Collective::kBroadcast: return collectives::broadcast(context_, call, stream);
    case Collective::kAllToAll: return collectives::all_to_all(context_, call, stream);
    default: raise(ErrorCode::kInternal, "{}: collective {} is not a call of its own", call.function,
                   collective_name(static_cast<unsigned int>(call.collective)));
  }
}

void CudaBackend::all_to_allv(const collectives::AllToAllvCall& call, Stream stream) {
  collectives::all_to_allv(context_, call, stream);
}

void CudaBackend::send_recv(const collectives::PointToPointBatch& batch, Stream stream) {
  collectives::send_recv(context_, batch, stream);
}

void CudaBackend::raise_recorded_failure() { collectives::raise_recorded_failure(context_); }

void CudaBackend::check() { collectives::check(context_); }

}  // namespace braid::detail
