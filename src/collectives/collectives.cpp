// The CUDA backend's collectives, host side: look up a call's buffers (unless it runs LL), plan it, and enqueue
// one launch, or one per chunk.
#include "collectives/collectives.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "collectives/call_buffers.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/copy_engine.hpp"
#include "collectives/copy_engine_pairs.hpp"
#include "collectives/launches.hpp"
#include "collectives/announced_calls.hpp"
#include "kernels/announced_launch.hpp"
#include "kernels/kernels.hpp"
#include "kernels/ll128_launch.hpp"
#include "kernels/ll_launch.hpp"
#include "kernels/multicast_launch.hpp"
#include "collectives/peer_bases.hpp"
#include "kernels/pipeline_launch.hpp"
#include "collectives/plan.hpp"
#include "collectives/planner.hpp"
#include "collectives/selection.hpp"
#include "kernels/send_recv_lines_launch.hpp"
#include "kernels/staged_launch.hpp"
#include "kernels/zero_copy_launch.hpp"
#include "core/config.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid::collectives {
namespace {

CallShape shape_of(const CollectiveContext& state, const CollectiveCall& call, size_t bytes, bool multicast) {
  return CallShape{call.collective, bytes,     state.size,      call.type, &state.algorithm_override,
                   multicast,       state.max_blocks, state.ll128_lines};
}

size_t staging_half_bytes(const CollectiveContext& state) { return state.staging.bytes() / 2 / 256 * 256; }
size_t ll_slot_bytes(const CollectiveContext& state) { return state.ll.bytes() / 2 / state.size; }
size_t multicast_half_bytes(const CollectiveContext& state) {
  return state.multicast == nullptr ? 0 : state.multicast->bytes() / 2 / 256 * 256;
}

}  // namespace

kernels::StagedLaunch staged_call_launch(const CollectiveContext& state, const CollectiveCall& call, uint64_t plan) {
  kernels::StagedLaunch launch{};
  launch.send = static_cast<const char*>(call.send);
  launch.recv = static_cast<char*>(call.recv);
  launch.root = call.root;
  launch.collective = static_cast<unsigned int>(call.collective);
  launch.staging = reinterpret_cast<char* const*>(state.staging.device_peers());
  launch.half_bytes = staging_half_bytes(state);
  launch.pad = state.sync->pad();
  launch.epoch = state.sync->epoch();
  launch.blocks_done = state.sync->blocks_done();
  launch.plan = plan;
  return launch;
}

AreaCapacities area_capacities(const CollectiveContext& state) {
  AreaCapacities capacities{};
  capacities.staging_half = staging_half_bytes(state);
  capacities.ll_payload = (ll_slot_bytes(state) / kernels::kLLWireBytes - 1) * kernels::kLLLineBytes;  // the plan line
  capacities.multicast_half = multicast_half_bytes(state);
  capacities.ll128_payload = kernels::kLL128MaxPayloadBytes;
  capacities.send_recv_lines_payload = state.send_recv_lines ? kernels::kSendRecvLinesMaxPayload : 0;
  capacities.copy_engine_slot_payload = bulk_layout(state).slot_payload;
  // The window's room does not depend on the call's size: any area that holds its smallest rows holds it.
  capacities.copy_engine_window = kernels::BulkLayout::window_of(state.pipeline.bytes(), 1).slot_payload != 0;
  return capacities;
}

kernels::LLLaunch ll_launch(const CollectiveContext& state, const CollectiveCall& call, uint64_t plan) {
  kernels::LLLaunch launch{};
  launch.collective = static_cast<unsigned int>(call.collective);
  launch.plan = plan;
  copy_peer_bases(state.ll, launch.area);
  launch.slot_bytes = ll_slot_bytes(state);
  launch.plan_line = launch.slot_bytes - kernels::kLLWireBytes;
  launch.pad = state.sync->pad();
  launch.epoch = state.sync->ll_epoch();
  launch.blocks_done = state.sync->blocks_done();
  launch.root = -1;
  return launch;
}

namespace {

// LL's launch over the LL128 area and call counter.
kernels::LLLaunch ll128_launch(const CollectiveContext& state, const CollectiveCall& call, uint64_t plan) {
  kernels::LLLaunch launch = ll_launch(state, call, plan);
  copy_peer_bases(state.ll128, launch.area);
  launch.slot_bytes = kernels::kLL128SlotBytes;
  launch.plan_line = kernels::kLL128PlanLine;
  launch.epoch = state.sync->ll128_epoch();
  return launch;
}

}  // namespace

namespace {

void trace_plan(const CollectiveCall& call, const CallPlan& plan) {
  BRAID_TRACE("{}: {} elements, {} ({}) with {} blocks", collective_name(static_cast<unsigned int>(call.collective)),
              call.count, algorithm_name(plan.algorithm), buffer_mode_name(plan.mode), plan.blocks);
}

// `send`, `recv`: the ranges zero-copy kernels use.
uint64_t plan_of(const CollectiveCall& call, const CallPlan& plan, const std::optional<PeerRange>& send = std::nullopt,
                 const std::optional<PeerRange>& recv = std::nullopt, bool in_place = false) {
  PlanArguments arguments{};
  arguments.collective = call.collective;
  arguments.algorithm = plan.algorithm;
  arguments.zero_copy = plan.mode == BufferMode::kZeroCopy;
  arguments.announced = plan.mode == BufferMode::kAnnounced;
  arguments.blocks = plan.blocks;
  arguments.count = call.count;
  arguments.type = static_cast<uint64_t>(call.type);
  arguments.op = call.reduces() ? static_cast<uint64_t>(call.op) : 0;
  arguments.root = call.rooted() ? call.root : -1;
  arguments.send_identity = send ? send->identity : 0;
  arguments.recv_identity = recv ? recv->identity : 0;
  arguments.in_place = in_place;
  return plan_word(arguments);
}

kernels::StagedLaunch base_launch(const CollectiveContext& state, const CollectiveCall& call, const CallPlan& plan) {
  return staged_call_launch(state, call, plan_of(call, plan));
}

static_assert(kMaxBlocks <= kernels::kPipelineChannels, "a pipelined launch has a FIFO per block");
static_assert(kMaxBlocks <= device::kBarrierChannels, "an LL poll checks the barrier channel of its block (ll.cuh)");

// `count`: elements (bytes for all-gather) a rank block; `rank_stride`: bytes between rank blocks, if any.
kernels::PipelineLaunch pipeline_launch(const CollectiveContext& state, const CollectiveCall& call, size_t count,
                                        size_t rank_stride, const CallPlan& plan) {
  kernels::PipelineLaunch launch{};
  launch.send = static_cast<const char*>(call.send);
  launch.recv = static_cast<char*>(call.recv);
  launch.count = count;
  launch.rank_stride = rank_stride;
  launch.collective = static_cast<unsigned int>(call.collective);
  launch.area = reinterpret_cast<char* const*>(state.pipeline.device_peers());
  launch.piece_bytes = kernels::pipeline_piece_bytes(state.pipeline.bytes(), state.size);
  launch.pad = state.sync->pad();
  launch.plan = plan_of(call, plan);
  return launch;
}

// `enqueue(launch)` per chunk of at most `chunk` of `total` units (`unit` bytes each), the launch's send, recv and
// count set to the chunk; a null buffer (one this rank does not use) stays null.
template <typename Launch, typename Enqueue>
void launch_in_chunks(Launch launch, const void* send, void* recv, size_t total, size_t chunk, size_t unit,
                      Enqueue&& enqueue) {
  for (size_t offset = 0; offset < total; offset += chunk) {
    launch.send = send == nullptr ? nullptr : at(send, offset * unit);
    launch.recv = recv == nullptr ? nullptr : at(recv, offset * unit);
    launch.count = std::min(chunk, total - offset);
    enqueue(static_cast<const Launch&>(launch));
  }
}

// `launch` carries the strides and root; recv may be null (reduce).
void reduce_ll_in_chunks(kernels::LLLaunch launch, const CollectiveCall& call, const CallPlan& plan, cudaStream_t stream) {
  launch_in_chunks(launch, call.send, call.recv, call.count, plan.chunk, datatype_size(call.type),
                   [&](const auto& chunk) { kernels::launch_reduce_ll(call.type, call.op, chunk, plan.blocks, stream); });
}

// An all-reduce's buffers, usable where every peer maps both, 16-byte aligned (the kernels load whole vectors).
struct ZeroCopyBuffers {
  std::optional<PeerRange> send, recv;
  bool usable() const { return send && recv && send->aligned16 && recv->aligned16; }
};

kernels::ZeroCopyLaunch zero_copy_base(const CollectiveContext& state, const CollectiveCall& call) {
  kernels::ZeroCopyLaunch launch{};
  launch.local_send = static_cast<const char*>(call.send);
  launch.recv = static_cast<char*>(call.recv);
  launch.count = call.count;
  launch.collective = static_cast<unsigned int>(call.collective);
  launch.pad = state.sync->pad();
  return launch;
}

// `bytes`: all-reduce and reduce, the buffer; all-gather, one rank's block. The same on every rank.
bool multicast_ready(const CollectiveContext& state, const CollectiveCall& call, size_t bytes) {
  return state.multicast != nullptr && kernels::multicast_serves(call.collective, call.type, call.op, bytes);
}

kernels::MulticastLaunch multicast_launch(const CollectiveContext& state, const CollectiveCall& call) {
  kernels::MulticastLaunch launch{};
  launch.root = call.root;
  launch.collective = static_cast<unsigned int>(call.collective);
  launch.local = state.multicast->local();
  launch.multicast = state.multicast->multicast();
  launch.half_bytes = multicast_half_bytes(state);
  launch.pad = state.sync->pad();
  launch.epoch = state.sync->multicast_epoch();
  launch.blocks_done = state.sync->blocks_done();
  return launch;
}

}  // namespace

void launch(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  trace_plan(planned.call, planned.plan);
  if (planned.plan.protocol->launch == nullptr) {
    raise(ErrorCode::kInternal, "{}: the protocol {} runs only inside a grouped launch", planned.call.function,
          algorithm_name(planned.plan.algorithm));
  }
  DeviceGuard guard(state.device);
  planned.plan.protocol->launch(state, planned, stream);
}

// All-reduce: both buffers where it may run zero copy or by the engines.
void run_all_reduce_ll(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  reduce_ll_in_chunks(ll_launch(state, planned.call, plan_of(planned.call, planned.plan)), planned.call, planned.plan,
                      stream);
}

void run_all_reduce_ll128(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  const kernels::LLLaunch launch = ll128_launch(state, call, plan_of(call, plan));
  launch_in_chunks(launch, call.send, call.recv, call.count, plan.chunk, datatype_size(call.type), [&](const auto& chunk) {
    kernels::launch_all_reduce_ll128(call.type, call.op, chunk, plan.blocks, stream);
  });
}

void run_all_reduce_one_shot(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::StagedLaunch launch = base_launch(state, call, plan);
  launch_in_chunks(launch, call.send, call.recv, call.count, plan.chunk, datatype_size(call.type), [&](const auto& chunk) {
    kernels::launch_all_reduce_one_shot(call.type, call.op, chunk, plan.blocks, stream);
  });
}

void run_all_reduce_two_shot(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::launch_all_reduce_two_shot(call.type, call.op, pipeline_launch(state, call, call.count, 0, plan), plan.blocks,
                                      stream);
}

void run_all_reduce_two_shot_zero_copy(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::ZeroCopyLaunch launch = zero_copy_base(state, call);
  launch.send = planned.send->buffers;
  launch.recv_peers = planned.recv->buffers;
  launch.plan = plan_of(call, plan, planned.send, planned.recv);
  kernels::launch_all_reduce_two_shot_zero_copy(call.type, call.op, launch, plan.blocks, stream);
}

void run_all_reduce_copy_engine(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  const size_t bytes = call.count * datatype_size(call.type);
  if (call.send == call.recv) {  // NOTE [all-reduce in place by the copy engines]
    all_reduce_in_place_copy_engine(state, planned.recv->buffers, bytes, call.type, call.op,
                                    plan_of(call, plan, planned.send, planned.recv, true), stream);
    return;
  }
  all_reduce_copy_engine(state, call.send, planned.recv->buffers, bytes, call.type, call.op,
                         plan_of(call, plan, planned.send, planned.recv), stream);
}

void run_all_reduce_copy_engine_pairs(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  all_reduce_copy_engine_pairs(state, call.send, call.recv, call.count, call.type, call.op, plan_of(call, planned.plan),
                               stream);  // through the peers' pipeline areas
}

void run_reduce_multicast(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::MulticastLaunch launch = multicast_launch(state, call);
  launch.plan = plan_of(call, plan);
  const auto kernel = call.collective == Collective::kAllReduce ? kernels::launch_all_reduce_multicast
                                                                 : kernels::launch_reduce_multicast;
  launch_in_chunks(launch, call.send, call.recv, call.count, plan.chunk, datatype_size(call.type),
                   [&](const auto& chunk) { kernel(call.type, call.op, chunk, plan.blocks, stream); });
}

// Reduce: no kernel reads a peer's buffer, so no lookup.
void run_reduce_ll(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  kernels::LLLaunch launch = ll_launch(state, planned.call, plan_of(planned.call, planned.plan));
  launch.root = planned.call.root;  // the LL all-reduce, whose result only the root stores
  reduce_ll_in_chunks(launch, planned.call, planned.plan, stream);
}

void run_reduce_copy_engine_pairs(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  // The other rank's input into the root's pipeline area, reduced there.
  reduce_copy_engine_pairs(state, call.send, call.recv, call.count * datatype_size(call.type), call.type, call.op,
                           call.root, plan_of(call, plan), stream);
}

void run_reduce_pipelined(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::PipelineLaunch launch = pipeline_launch(state, call, call.count, 0, plan);
  launch.root = call.root;
  // Two ranks: the other's pushes; more: a chain of every rank that ends at the root.
  const auto kernel = state.size == 2 ? kernels::launch_reduce_pushed : kernels::launch_reduce_chain;
  kernel(call.type, call.op, launch, plan.blocks, stream);
}

void run_reduce_two_shot(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::PipelineLaunch launch = pipeline_launch(state, call, call.count, 0, plan);
  launch.root = call.root;  // the two shot gathered by the root
  kernels::launch_reduce_two_shot(call.type, call.op, launch, plan.blocks, stream);
}

namespace {

template <typename Kernel>
void reduce_staged_with(CollectiveContext& state, const PlannedCall& planned, Kernel kernel, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::StagedLaunch launch = base_launch(state, call, plan);
  launch_in_chunks(launch, call.send, call.recv, call.count, plan.chunk, datatype_size(call.type),
                   [&](const auto& chunk) { kernel(call.type, call.op, chunk, plan.blocks, stream); });
}

}  // namespace

void run_reduce_staged(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  reduce_staged_with(state, planned, kernels::launch_reduce, stream);
}

void run_reduce_split(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  reduce_staged_with(state, planned, kernels::launch_reduce_split, stream);  // rank r reduces part r
}

// Reduce-scatter: call.count is a rank block of the output.
void run_reduce_scatter_ll(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::LLLaunch launch = ll_launch(state, call, plan_of(call, plan));
  launch.send_rank_stride = call.count * datatype_size(call.type);  // each peer's block to that peer, reduced there
  reduce_ll_in_chunks(launch, call, plan, stream);
}

void run_reduce_scatter_staged(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::StagedLaunch launch = base_launch(state, call, plan);
  launch.rank_stride = call.count;
  launch_in_chunks(launch, call.send, call.recv, call.count, plan.chunk, datatype_size(call.type), [&](const auto& chunk) {
    kernels::launch_reduce_scatter_staged(call.type, call.op, chunk, plan.blocks, stream);
  });
}

void run_reduce_scatter_pipelined(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  const kernels::PipelineLaunch launch =
      pipeline_launch(state, call, call.count, call.count * datatype_size(call.type), plan);
  kernels::launch_reduce_scatter(call.type, call.op, launch, plan.blocks, stream);
}

void run_reduce_scatter_zero_copy(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::ZeroCopyLaunch launch = zero_copy_base(state, call);  // loads of the peers' inputs
  launch.send = planned.send->buffers;
  launch.rank_stride = call.count * datatype_size(call.type);
  launch.plan = plan_of(call, plan, planned.send);
  kernels::launch_reduce_scatter_zero_copy(call.type, call.op, launch, plan.blocks, stream);
}

void run_reduce_scatter_copy_engine(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  reduce_scatter_copy_engine(state, call.send, planned.recv->buffers, call.count * datatype_size(call.type), call.type,
                             call.op, plan_of(call, plan, std::nullopt, planned.recv), stream);  // into the peer's output
}

void run_reduce_scatter_copy_engine_pairs(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  reduce_scatter_copy_engine_pairs(state, call.send, call.recv, call.count * datatype_size(call.type), call.type, call.op,
                                   plan_of(call, plan), stream);  // through the peer's pipeline area
}

// All-gather: the kernels move bytes; `bytes` is one rank's block.
namespace {

size_t rank_block_bytes(const CollectiveCall& call) { return call.count * datatype_size(call.type); }

}  // namespace

void run_all_gather_ll(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  const size_t bytes = rank_block_bytes(call);
  kernels::LLLaunch launch = ll_launch(state, call, plan_of(call, plan));
  launch.recv_rank_stride = bytes;  // the input to every peer, as an all-to-all of identical blocks
  launch_in_chunks(launch, call.send, call.recv, bytes, plan.chunk, 1,
                   [&](const auto& chunk) { kernels::launch_blocks_ll(chunk, plan.blocks, stream); });
}

void run_all_gather_multicast(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  const size_t bytes = rank_block_bytes(call);
  kernels::MulticastLaunch launch = multicast_launch(state, call);
  launch.plan = plan_of(call, plan);
  launch.rank_stride = bytes;  // each rank's block in chunks that fill a half
  launch_in_chunks(launch, call.send, call.recv, bytes, plan.chunk, 1,
                   [&](const auto& chunk) { kernels::launch_all_gather_multicast(chunk, plan.blocks, stream); });
}

void run_all_gather_staged(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  const size_t bytes = rank_block_bytes(call);
  kernels::StagedLaunch launch = base_launch(state, call, plan);
  launch.rank_stride = bytes;
  launch_in_chunks(launch, call.send, call.recv, bytes, plan.chunk, 1,
                   [&](const auto& chunk) { kernels::launch_all_gather_staged(chunk, plan.blocks, stream); });
}

void run_all_gather_pipelined(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const size_t bytes = rank_block_bytes(planned.call);
  kernels::launch_all_gather(pipeline_launch(state, planned.call, bytes, bytes, planned.plan), planned.plan.blocks,
                             stream);
}

void run_all_gather_zero_copy(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  const size_t bytes = rank_block_bytes(call);
  kernels::ZeroCopyLaunch launch = zero_copy_base(state, call);  // stores into the peers' outputs
  launch.recv_peers = planned.recv->buffers;
  launch.count = bytes;
  launch.rank_stride = bytes;
  launch.plan = plan_of(call, plan, std::nullopt, planned.recv);
  kernels::launch_all_gather_zero_copy(launch, plan.blocks, stream);
}

void run_all_gather_announced(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const size_t bytes = rank_block_bytes(call);
  kernels::AnnouncedLaunch launch = announced_launch(state, base_launch(state, call, planned.plan),
                                                     {AnnouncedBuffer{call.recv, bytes * state.size, bytes}});
  launch.staged.count = bytes;
  launch.staged.rank_stride = bytes;
  kernels::launch_all_gather_announced(launch, planned.plan.blocks, stream);
}

void run_reduce_scatter_announced(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const size_t block = call.count * datatype_size(call.type);
  kernels::AnnouncedLaunch launch = announced_launch(state, base_launch(state, call, planned.plan),
                                                     {AnnouncedBuffer{call.send, block * state.size, block}});
  launch.staged.count = call.count;
  launch.staged.rank_stride = call.count;
  kernels::launch_reduce_scatter_announced(call.type, call.op, launch, planned.plan.blocks, stream);
}

void run_all_reduce_announced(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const size_t bytes = call.count * datatype_size(call.type);
  // The two-shot shards split at whole vectors; the buffers' own alignment is what announcement_of checks.
  kernels::AnnouncedLaunch launch =
      announced_launch(state, base_launch(state, call, planned.plan),
                       {AnnouncedBuffer{call.send, bytes, 16}, AnnouncedBuffer{call.recv, bytes, 16}});
  launch.staged.count = call.count;
  kernels::launch_all_reduce_announced(call.type, call.op, launch, planned.plan.blocks, stream);
}

void run_all_gather_copy_engine(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  all_gather_copy_engine(state, call.send, planned.recv->buffers, rank_block_bytes(call),
                         plan_of(call, plan, std::nullopt, planned.recv), stream);
}

void run_all_gather_copy_engine_pairs(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  all_gather_copy_engine_pairs(state, call.send, call.recv, rank_block_bytes(call), plan_of(call, plan), stream);
}

// Broadcast: the kernels move bytes.
void run_broadcast_ll(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::LLLaunch launch = ll_launch(state, call, plan_of(call, plan));
  launch.root = call.root;
  launch_in_chunks(launch, call.send, call.recv, rank_block_bytes(call), plan.chunk, 1,
                   [&](const auto& chunk) { kernels::launch_broadcast_ll(chunk, plan.blocks, stream); });
}

namespace {

template <typename Kernel>
void broadcast_staged_with(CollectiveContext& state, const PlannedCall& planned, Kernel kernel, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::StagedLaunch launch = base_launch(state, call, plan);
  launch_in_chunks(launch, call.send, call.recv, rank_block_bytes(call), plan.chunk, 1,
                   [&](const auto& chunk) { kernel(chunk, plan.blocks, stream); });
}

}  // namespace

void run_broadcast_staged(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  broadcast_staged_with(state, planned, kernels::launch_broadcast, stream);
}

void run_broadcast_split(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  broadcast_staged_with(state, planned, kernels::launch_broadcast_split, stream);  // rank r fetches part r
}

void run_broadcast_pipelined(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  kernels::PipelineLaunch launch = pipeline_launch(state, call, rank_block_bytes(call), 0, plan);
  launch.root = call.root;
  // Two ranks: the pipelined all-gather, pushed by the root alone; more: a chain.
  const auto kernel = state.size > 2 ? kernels::launch_broadcast_chain : kernels::launch_broadcast_pipelined;
  kernel(launch, plan.blocks, stream);
}

void run_broadcast_copy_engine(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  broadcast_copy_engine(state, call.send, planned.recv->buffers, rank_block_bytes(call), call.root,
                        plan_of(call, plan, std::nullopt, planned.recv), stream);
}

void run_broadcast_copy_engine_pairs(CollectiveContext& state, const PlannedCall& planned, Stream stream) {
  const CollectiveCall& call = planned.call;
  const CallPlan& plan = planned.plan;
  broadcast_copy_engine_pairs(state, call.send, call.recv, rank_block_bytes(call), call.root, plan_of(call, plan),
                              stream);  // through the peers' pipeline areas
}

// The entries: which buffers each collective looks up, the facts they give, the plan, its launch.
void all_reduce(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const size_t bytes = call.count * datatype_size(call.type);
  const CallShape shape = shape_of(state, call, bytes, multicast_ready(state, call, bytes));
  const AreaCapacities capacities = area_capacities(state);
  ZeroCopyBuffers zero_copy;
  BufferFacts facts{};
  if (!plans_ll(shape, capacities)) {
    const bool in_place = overlap(call.send, bytes, call.recv, bytes);  // the copy engines' schedules differ there
    zero_copy =
        ZeroCopyBuffers{call_buffer_range(state, call.collective, ExchangedBuffer::kSend, call.send, bytes, in_place),
                        call_buffer_range(state, call.collective, ExchangedBuffer::kRecv, call.recv, bytes, in_place)};
    facts.peers_map = zero_copy.usable();
    facts.same_process_peers =
        facts.peers_map && (zero_copy.send->same_process_peers || zero_copy.recv->same_process_peers);
    facts.in_place = in_place;
    facts.announced = !facts.peers_map && announces(state, shape, capacities);
  }
  launch(state, PlannedCall{call, plan_call(shape, capacities, facts), zero_copy.send, zero_copy.recv}, stream);
}

void reduce(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const size_t bytes = call.count * datatype_size(call.type);
  const CallShape shape = shape_of(state, call, bytes, multicast_ready(state, call, bytes));
  launch(state, PlannedCall{call, plan_call(shape, area_capacities(state))}, stream);
}

void reduce_scatter(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const size_t size = datatype_size(call.type);
  const size_t input_bytes = call.count * state.size * size;
  const CallShape shape = shape_of(state, call, input_bytes, false);
  const AreaCapacities capacities = area_capacities(state);
  // Zero-copy loads need every rank block 16-byte aligned; copy-engine pushes, the output mapped too. The same
  // lookups on every rank, in place or not, so the same answers.
  const bool in_place = overlap(call.send, input_bytes, call.recv, call.count * size);
  std::optional<PeerRange> send_range, recv_range;
  if (call.count * size % 16 == 0 && !plans_ll(shape, capacities)) {
    send_range = call_buffer_range(state, call.collective, ExchangedBuffer::kSend, call.send, input_bytes, in_place);
    if (plans_output_pushes(shape, capacities)) {
      recv_range =
          call_buffer_range(state, call.collective, ExchangedBuffer::kRecv, call.recv, call.count * size, in_place);
    }
  }
  BufferFacts facts{};
  facts.in_place = in_place;
  facts.peers_map = send_range && send_range->aligned16;
  facts.peers_map_output = recv_range.has_value();
  facts.same_process_peers = recv_range && recv_range->same_process_peers;
  // Announced where its zero copy could run: every rank block 16-byte aligned (the same on every rank).
  facts.announced = !facts.peers_map && call.count * size % 16 == 0 && announces(state, shape, capacities);
  launch(state, PlannedCall{call, plan_call(shape, capacities, facts), send_range, recv_range}, stream);
}

void all_gather(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const size_t bytes = rank_block_bytes(call);
  const CallShape shape = shape_of(state, call, bytes * state.size, multicast_ready(state, call, bytes));
  const AreaCapacities capacities = area_capacities(state);
  // Zero copy needs every rank block 16-byte aligned; the input may be any buffer (only this rank reads it).
  std::optional<PeerRange> recv_range;
  if (bytes % 16 == 0 && !plans_ll(shape, capacities)) {
    recv_range = call_buffer_range(state, call.collective, ExchangedBuffer::kRecv, call.recv, bytes * state.size);
  }
  BufferFacts facts{};
  facts.peers_map = recv_range && recv_range->aligned16;
  facts.same_process_peers = recv_range && recv_range->same_process_peers;
  facts.announced = !facts.peers_map && announces(state, shape, capacities);
  launch(state, PlannedCall{call, plan_call(shape, capacities, facts), std::nullopt, recv_range}, stream);
}

void broadcast(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const size_t bytes = rank_block_bytes(call);
  const CallShape shape = shape_of(state, call, bytes, false);
  const AreaCapacities capacities = area_capacities(state);
  std::optional<PeerRange> recv_range;
  if (!plans_ll(shape, capacities)) {
    recv_range = call_buffer_range(state, call.collective, ExchangedBuffer::kRecv, call.recv, bytes);
  }
  BufferFacts facts{};
  facts.peers_map = recv_range.has_value();
  facts.same_process_peers = recv_range && recv_range->same_process_peers;
  launch(state, PlannedCall{call, plan_call(shape, capacities, facts), std::nullopt, recv_range}, stream);
}

void raise_recorded_failure(CollectiveContext& state) { state.sync->raise_recorded_error(collective_name, describe_plan); }

void check(CollectiveContext& state) {
  raise_recorded_failure(state);
  state.sync->raise_refused_data(collective_name);
}

}  // namespace braid::collectives
