// All-to-all(v) of the CUDA backend, host side. Paths: LL lines (blocks_ll.cu); FIFO pushes
// (all_to_all_pipelined.cu), any buffer and counts; direct stores into the peers' outputs, or loads from their
// inputs (all_to_all_direct.cu); copy engines into the peers' outputs (copy_engine.hpp) or pipeline areas
// (copy_engine_pairs.hpp). In place, only LL and FIFO pushes serve (planner.cpp, usable_facts). All-to-all-v is
// always pipelined: no rank knows the peers' displacements, and the FIFO headers carry the counts.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>

#include "collectives/all_to_all.hpp"
#include "kernels/all_to_all_launch.hpp"
#include "collectives/call_buffers.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/collectives.hpp"
#include "collectives/copy_engine.hpp"
#include "collectives/copy_engine_pairs.hpp"
#include "kernels/kernels.hpp"
#include "kernels/ll_launch.hpp"
#include "collectives/plan.hpp"
#include "collectives/planner.hpp"
#include "collectives/selection.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid::collectives {

kernels::AllToAllLaunch pipelined_launch(const CollectiveContext& state, Collective collective, const void* send,
                                         void* recv, size_t element_bytes) {
  kernels::AllToAllLaunch launch{};
  launch.fifo.send = static_cast<const char*>(send);
  launch.fifo.recv = static_cast<char*>(recv);
  launch.fifo.collective = static_cast<unsigned int>(collective);
  launch.element_bytes = static_cast<uint32_t>(element_bytes);
  launch.send_peers = launch.recv_peers = kernels::kEveryPeer;
  launch.mismatch_in_bytes = false;
  launch.in_place = false;
  launch.fifo.area = reinterpret_cast<char* const*>(state.pipeline.device_peers());
  launch.fifo.piece_bytes = kernels::pipeline_piece_bytes(state.pipeline.bytes(), state.size);
  launch.fifo.pad = state.sync->pad();
  return launch;
}

uint64_t all_to_all_plan(Collective collective, Algorithm algorithm, int blocks, size_t count, DataType type,
                         bool zero_copy, uint64_t send, uint64_t recv) {
  PlanArguments plan{};
  plan.collective = collective;
  plan.algorithm = algorithm;
  plan.zero_copy = zero_copy;
  plan.blocks = blocks;
  plan.count = count;
  plan.type = static_cast<uint64_t>(type);
  plan.root = -1;
  plan.send_identity = send;
  plan.recv_identity = recv;
  return plan_word(plan);
}

CallPlan pairwise_plan(const CollectiveContext& state, Collective collective, DataType type) {
  // The FIFO launch's own plan: pairs in LL128 lines or for the copy engines leave it (send_recv.cpp).
  const CallShape shape{collective, 0, state.size, type, &state.algorithm_override, false, state.max_blocks, false};
  return plan_call(shape, area_capacities(state));
}

void all_to_all(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const void* const send = call.send;
  void* const recv = call.recv;
  const size_t count = call.count;
  const DataType type = call.type;
  const size_t block_bytes = count * datatype_size(type);
  const size_t bytes = block_bytes * state.size;
  const CallShape shape{Collective::kAllToAll, bytes, state.size, type, &state.algorithm_override, false, state.max_blocks};
  const AreaCapacities capacities = area_capacities(state);
  std::optional<PeerRange> send_range, recv_range;
  BufferFacts facts{};
  if (!plans_ll(shape, capacities)) {
    send_range = call_buffer_range(state, Collective::kAllToAll, ExchangedBuffer::kSend, send, bytes);
    recv_range = call_buffer_range(state, Collective::kAllToAll, ExchangedBuffer::kRecv, recv, bytes);
    facts.peers_map = send_range && recv_range;
    facts.same_process_peers = facts.peers_map && send_range->same_process_peers;
    facts.in_place = send == recv;
  }
  const CallPlan plan = plan_call(shape, capacities, facts);
  BRAID_TRACE("all_to_all: {} elements a block, {} ({}) with {} blocks", count, algorithm_name(plan.algorithm),
              buffer_mode_name(plan.mode), plan.blocks);
  const bool zero_copy = plan.mode == BufferMode::kZeroCopy;
  const uint64_t plan_word = all_to_all_plan(Collective::kAllToAll, plan.algorithm, plan.blocks, count, type, zero_copy,
                                             zero_copy ? send_range->identity : 0, zero_copy ? recv_range->identity : 0);
  DeviceGuard guard(state.device);
  if (plan.algorithm == Algorithm::kLL) {
    kernels::LLLaunch launch = ll_launch(state, call, plan_word);
    launch.send = static_cast<const char*>(send);
    launch.recv = static_cast<char*>(recv);
    launch.count = block_bytes;
    launch.send_rank_stride = launch.recv_rank_stride = block_bytes;
    kernels::launch_blocks_ll(launch, plan.blocks, stream);
    return;
  }
  if (plan.algorithm == Algorithm::kCopyEngine && zero_copy) {
    all_to_all_copy_engine(state, send, recv_range->buffers, block_bytes, plan_word, stream);
    return;
  }
  if (plan.algorithm == Algorithm::kCopyEngine) {
    all_to_all_copy_engine_pairs(state, send, recv, block_bytes, plan_word, stream);
    return;
  }
  if (zero_copy) {  // pipelined on buffers peers map: direct stores into their outputs
    kernels::AllToAllDirectLaunch launch{};
    launch.send.at[state.rank] = const_cast<char*>(static_cast<const char*>(send));  // only read
    launch.recv = recv_range->buffers;
    launch.block_bytes = block_bytes;
    launch.loads = false;
    launch.collective = static_cast<unsigned int>(Collective::kAllToAll);
    launch.pad = state.sync->pad();
    launch.plan = plan_word;
    kernels::launch_all_to_all_direct(launch, plan.blocks, stream);
    return;
  }
  kernels::AllToAllLaunch launch = pipelined_launch(state, Collective::kAllToAll, send, recv, datatype_size(type));
  launch.in_place = send == recv;
  for (int q = 0; q < state.size; ++q) {
    launch.send_bytes[q] = launch.recv_bytes[q] = block_bytes;
    launch.send_offset[q] = launch.recv_offset[q] = q * block_bytes;
  }
  launch.fifo.plan = plan_word;
  kernels::launch_all_to_all_pipelined(launch, plan.blocks, stream);
}

void all_to_all_global(CollectiveContext& state, const PeerBuffers& table, bool same_process_peers, void* recv,
                       size_t count, DataType type, Stream stream) {
  const size_t block_bytes = count * datatype_size(type);
  const size_t bytes = block_bytes * state.size;
  BRAID_TRACE("all_to_all (one-sided): {} elements a block, {}", count, same_process_peers ? "SM loads" : "copy engines");
  if (!same_process_peers) {
    all_to_all_pull_copy_engine(state, table, recv, block_bytes,
                                all_to_all_plan(Collective::kAllToAll, Algorithm::kCopyEngine, 0, count, type, true),
                                stream);
    return;
  }
  kernels::AllToAllDirectLaunch launch{};
  launch.send = table;
  launch.recv.at[state.rank] = static_cast<char*>(recv);
  launch.block_bytes = block_bytes;
  launch.loads = true;
  launch.collective = static_cast<unsigned int>(Collective::kAllToAll);
  launch.pad = state.sync->pad();
  const Choice choice = select_algorithm(Collective::kAllToAll, bytes, state.size, type, "", Buffers::kSymmetric);
  const int blocks = std::min(choice.blocks, state.max_blocks);  // as many as symmetric buffers get, within the cap
  launch.plan = all_to_all_plan(Collective::kAllToAll, Algorithm::kPipelined, blocks, count, type, true);
  kernels::launch_all_to_all_direct(launch, blocks, stream);
}

void all_to_allv(CollectiveContext& state, const AllToAllvCall& call, Stream stream) {
  const size_t size = datatype_size(call.type);
  kernels::AllToAllLaunch launch = pipelined_launch(state, Collective::kAllToAllv, call.send, call.recv, size);
  for (int q = 0; q < state.size; ++q) {
    launch.send_bytes[q] = call.send_bytes[q];
    launch.send_offset[q] = call.send_offset[q];
    launch.recv_bytes[q] = call.recv_bytes[q];
    launch.recv_offset[q] = call.recv_offset[q];
  }
  // Every rank launches, even with nothing to move: its peers wait for its (empty) headers.
  const CallPlan choice = pairwise_plan(state, Collective::kAllToAllv, call.type);
  launch.fifo.plan = all_to_all_plan(Collective::kAllToAllv, choice.algorithm, choice.blocks, 0, call.type, false);
  BRAID_TRACE("all_to_allv: {} bytes out, {} in, {} with {} blocks", call.send_extent, call.recv_extent,
              algorithm_name(choice.algorithm), choice.blocks);
  DeviceGuard guard(state.device);
  kernels::launch_all_to_all_pipelined(launch, choice.blocks, stream);
}

void all_to_allv_device(CollectiveContext& state, const AllToAllvDeviceCall& call, Stream stream) {
  const size_t size = datatype_size(call.type);
  kernels::AllToAllLaunch launch = pipelined_launch(state, Collective::kAllToAllv, call.send, call.recv, size);
  launch.device_send_counts = call.send_counts;
  launch.device_send_displs = call.send_displs;
  launch.device_recv_counts = call.recv_counts;
  launch.device_recv_displs = call.recv_displs;
  launch.recv_capacity = call.recv_capacity_bytes;
  const CallPlan choice = pairwise_plan(state, Collective::kAllToAllv, call.type);
  launch.fifo.plan = all_to_all_plan(Collective::kAllToAllv, choice.algorithm, choice.blocks, 0, call.type, false);
  BRAID_TRACE("all_to_allv_device: capacity {} bytes, {} with {} blocks", call.recv_capacity_bytes,
              algorithm_name(choice.algorithm), choice.blocks);
  kernels::launch_all_to_all_pipelined(launch, choice.blocks, stream);
}

}  // namespace braid::collectives
