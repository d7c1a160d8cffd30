// All-to-all(v) of the CUDA backend, host side. Paths: LL lines (blocks_ll.cu); FIFO pushes
// (all_to_all_pipelined.cu), any buffer and counts; direct stores into the peers' outputs, or loads from their
// inputs (all_to_all_direct.cu); copy engines into the peers' outputs (copy_engine.hpp) or pipeline areas
// (copy_engine_pairs.hpp). In place, LL and FIFO pushes serve, and on 2 ranks whose buffers the peer maps the copy
// engines' swap (planner.cpp, usable_facts). All-to-all-v is
// always pipelined: no rank knows the peers' displacements, and the FIFO headers carry the counts.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>

#include "collectives/all_to_all.hpp"
#include "collectives/announced_calls.hpp"
#include "kernels/announced_launch.hpp"
#include "kernels/all_to_all_launch.hpp"
#include "collectives/call_buffers.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/collectives.hpp"
#include "collectives/copy_engine.hpp"
#include "collectives/copy_engine_pairs.hpp"
#include "collectives/launches.hpp"
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
                         bool zero_copy, uint64_t send, uint64_t recv, bool announced, bool in_place) {
  PlanArguments plan{};
  plan.collective = collective;
  plan.algorithm = algorithm;
  plan.zero_copy = zero_copy;
  plan.announced = announced;
  plan.in_place = in_place;
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

namespace {

size_t block_bytes_of(const CollectiveCall& call) { return call.count * datatype_size(call.type); }

// The ranges are in the word only where the plan uses them (zero copy).
uint64_t plan_word_of(const PlannedCall& planned) {
  const bool zero_copy = planned.plan.mode == BufferMode::kZeroCopy;
  return all_to_all_plan(Collective::kAllToAll, planned.plan.algorithm, planned.plan.blocks, planned.call.count,
                         planned.call.type, zero_copy, zero_copy ? planned.send->identity : 0,
                         zero_copy ? planned.recv->identity : 0, planned.plan.mode == BufferMode::kAnnounced,
                         zero_copy && planned.call.send == planned.call.recv);
}

}  // namespace

void run_all_to_all_ll(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const size_t block_bytes = block_bytes_of(planned.call);
  kernels::LLLaunch launch = ll_launch(state, planned.call, plan_word_of(planned));
  launch.send = static_cast<const char*>(planned.call.send);
  launch.recv = static_cast<char*>(planned.call.recv);
  launch.count = block_bytes;
  launch.send_rank_stride = launch.recv_rank_stride = block_bytes;
  kernels::launch_blocks_ll(launch, planned.plan.blocks, stream);
}

void run_all_to_all_copy_engine(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  all_to_all_copy_engine(state, planned.call.send, planned.recv->buffers, block_bytes_of(planned.call),
                         plan_word_of(planned), stream);
}

void run_all_to_all_copy_engine_swap(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  all_to_all_in_place_copy_engine(state, planned.recv->buffers, block_bytes_of(planned.call), plan_word_of(planned),
                                  stream);
}

void run_all_to_all_copy_engine_pairs(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  all_to_all_copy_engine_pairs(state, planned.call.send, planned.call.recv, block_bytes_of(planned.call),
                               plan_word_of(planned), stream);
}

void run_all_to_all_direct(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  kernels::AllToAllDirectLaunch launch{};  // stores into the peers' outputs
  launch.send.at[state.rank] = const_cast<char*>(static_cast<const char*>(planned.call.send));  // only read
  launch.recv = planned.recv->buffers;
  launch.block_bytes = block_bytes_of(planned.call);
  launch.loads = false;
  launch.collective = static_cast<unsigned int>(Collective::kAllToAll);
  launch.pad = state.sync->pad();
  launch.plan = plan_word_of(planned);
  kernels::launch_all_to_all_direct(launch, planned.plan.blocks, stream);
}

void run_all_to_all_announced(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const size_t block_bytes = block_bytes_of(call);
  // The output, then the input: a rank in place announces one range twice, which the kernel reads as in place.
  const size_t bytes = block_bytes * state.size;
  kernels::AnnouncedLaunch launch = announced_launch(state, staged_call_launch(state, call, plan_word_of(planned)),
                                                     {AnnouncedBuffer{call.recv, bytes, block_bytes},
                                                      AnnouncedBuffer{call.send, bytes, block_bytes}});
  launch.staged.count = block_bytes;
  launch.staged.rank_stride = block_bytes;
  kernels::launch_all_to_all_announced(launch, planned.plan.blocks, stream);
}

void run_all_to_all_pipelined(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const size_t block_bytes = block_bytes_of(call);
  kernels::AllToAllLaunch launch = pipelined_launch(state, Collective::kAllToAll, call.send, call.recv,
                                                    datatype_size(call.type));
  launch.in_place = call.send == call.recv;
  for (int q = 0; q < state.size; ++q) {
    launch.send_bytes[q] = launch.recv_bytes[q] = block_bytes;
    launch.send_offset[q] = launch.recv_offset[q] = q * block_bytes;
  }
  launch.fifo.plan = plan_word_of(planned);
  kernels::launch_all_to_all_pipelined(launch, planned.plan.blocks, stream);
}

void all_to_all(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const size_t bytes = block_bytes_of(call) * state.size;
  const CallShape shape{Collective::kAllToAll, bytes, state.size, call.type, &state.algorithm_override, false,
                        state.max_blocks};
  const AreaCapacities capacities = area_capacities(state);
  std::optional<PeerRange> send_range, recv_range;
  BufferFacts facts{};
  if (!plans_ll(shape, capacities)) {
    const bool in_place = call.send == call.recv;  // zero copy only by the engines' swap (usable_facts, planner.cpp)
    send_range = call_buffer_range(state, Collective::kAllToAll, ExchangedBuffer::kSend, call.send, bytes, in_place);
    recv_range = call_buffer_range(state, Collective::kAllToAll, ExchangedBuffer::kRecv, call.recv, bytes, in_place);
    facts.peers_map = send_range && recv_range;
    facts.same_process_peers = facts.peers_map && send_range->same_process_peers;
    facts.in_place = in_place;
    facts.announced = !facts.peers_map && announces(state, shape, capacities);
  }
  launch(state, PlannedCall{call, plan_call(shape, capacities, facts), send_range, recv_range}, stream);
}

// Planned like an all-to-all on buffers every peer maps, one-sided: BRAID_ALGO's "alltoall=" and the table choose
// between the engines' pulls and SM loads of the peers' blocks (all_to_all_direct.cu), never LL.
void all_to_all_global(CollectiveContext& state, const PeerBuffers& table, bool same_process_peers, void* recv,
                       size_t count, DataType type, Stream stream) {
  const size_t block_bytes = count * datatype_size(type);
  const CallShape shape{Collective::kAllToAll, block_bytes * state.size, state.size, type, &state.algorithm_override,
                        false, state.max_blocks};
  BufferFacts facts{};
  facts.peers_map = true;
  facts.same_process_peers = same_process_peers;
  facts.one_sided = true;
  const CallPlan plan = plan_call(shape, area_capacities(state), facts);
  BRAID_TRACE("all_to_all (one-sided): {} elements a block, {} with {} blocks", count, algorithm_name(plan.algorithm),
              plan.blocks);
  DeviceGuard guard(state.device);
  if (plan.algorithm == Algorithm::kCopyEngine) {
    all_to_all_pull_copy_engine(state, table, recv, block_bytes,
                                all_to_all_plan(Collective::kAllToAll, Algorithm::kCopyEngine, 0, count, type, true),
                                stream);
    return;
  }
  if (plan.algorithm != Algorithm::kPipelined) {
    raise(ErrorCode::kInternal, "all_to_all_global: the one-sided all-to-all has no {} path",
          algorithm_name(plan.algorithm));
  }
  kernels::AllToAllDirectLaunch launch{};
  launch.send = table;
  launch.recv.at[state.rank] = static_cast<char*>(recv);
  launch.block_bytes = block_bytes;
  launch.loads = true;
  launch.collective = static_cast<unsigned int>(Collective::kAllToAll);
  launch.pad = state.sync->pad();
  launch.plan = all_to_all_plan(Collective::kAllToAll, Algorithm::kPipelined, plan.blocks, count, type, true);
  kernels::launch_all_to_all_direct(launch, plan.blocks, stream);
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
