// The CUDA backend's collectives, host side: look up a call's buffers (unless it runs LL), plan it, and enqueue
// one launch, or one per chunk.
#include "collectives/collectives.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "collectives/call_buffers.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/copy_engine.hpp"
#include "collectives/copy_engine_pairs.hpp"
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

AreaCapacities area_capacities(const CollectiveContext& state) {
  AreaCapacities capacities{};
  capacities.staging_half = staging_half_bytes(state);
  capacities.ll_payload = (ll_slot_bytes(state) / kernels::kLLWireBytes - 1) * kernels::kLLLineBytes;  // the plan line
  capacities.multicast_half = multicast_half_bytes(state);
  capacities.ll128_payload = kernels::kLL128MaxPayloadBytes;
  capacities.send_recv_lines_payload = state.send_recv_lines ? kernels::kSendRecvLinesMaxPayload : 0;
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
                 const std::optional<PeerRange>& recv = std::nullopt) {
  PlanArguments arguments{};
  arguments.collective = call.collective;
  arguments.algorithm = plan.algorithm;
  arguments.zero_copy = plan.mode == BufferMode::kZeroCopy;
  arguments.blocks = plan.blocks;
  arguments.count = call.count;
  arguments.type = static_cast<uint64_t>(call.type);
  arguments.op = call.reduces() ? static_cast<uint64_t>(call.op) : 0;
  arguments.root = call.rooted() ? call.root : -1;
  arguments.send_identity = send ? send->identity : 0;
  arguments.recv_identity = recv ? recv->identity : 0;
  return plan_word(arguments);
}

kernels::StagedLaunch base_launch(const CollectiveContext& state, const CollectiveCall& call, const CallPlan& plan) {
  kernels::StagedLaunch launch{};
  launch.root = call.root;
  launch.collective = static_cast<unsigned int>(call.collective);
  launch.staging = reinterpret_cast<char* const*>(state.staging.device_peers());
  launch.half_bytes = staging_half_bytes(state);
  launch.pad = state.sync->pad();
  launch.epoch = state.sync->epoch();
  launch.blocks_done = state.sync->blocks_done();
  launch.plan = plan_of(call, plan);
  return launch;
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
void run_reduce_ll(kernels::LLLaunch launch, const CollectiveCall& call, const CallPlan& plan, cudaStream_t stream) {
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

kernels::ZeroCopyLaunch zero_copy_launch(const CollectiveContext& state, const CollectiveCall& call, const ZeroCopyBuffers& buffers) {
  kernels::ZeroCopyLaunch launch = zero_copy_base(state, call);
  launch.send = buffers.send->buffers;
  launch.recv_peers = buffers.recv->buffers;
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

void run_reduce_multicast(const CollectiveContext& state, const CollectiveCall& call, const CallPlan& plan,
                          cudaStream_t stream) {
  kernels::MulticastLaunch launch = multicast_launch(state, call);
  launch.plan = plan_of(call, plan);
  const auto kernel = call.collective == Collective::kAllReduce ? kernels::launch_all_reduce_multicast
                                                                 : kernels::launch_reduce_multicast;
  launch_in_chunks(launch, call.send, call.recv, call.count, plan.chunk, datatype_size(call.type),
                   [&](const auto& chunk) { kernel(call.type, call.op, chunk, plan.blocks, stream); });
}

}  // namespace

void all_reduce(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const auto& [function, collective, send, recv, count, type, op, root] = call;
  const size_t bytes = count * datatype_size(type);
  const CallShape shape = shape_of(state, call, bytes, multicast_ready(state, call, bytes));
  const AreaCapacities capacities = area_capacities(state);
  ZeroCopyBuffers zero_copy;
  BufferFacts facts{};
  if (!plans_ll(shape, capacities)) {
    zero_copy = ZeroCopyBuffers{call_buffer_range(state, collective, ExchangedBuffer::kSend, send, bytes),
                                call_buffer_range(state, collective, ExchangedBuffer::kRecv, recv, bytes)};
    facts.peers_map = zero_copy.usable();
    facts.same_process_peers =
        facts.peers_map && (zero_copy.send->same_process_peers || zero_copy.recv->same_process_peers);
    facts.in_place = overlap(send, bytes, recv, bytes);
  }
  const CallPlan plan = plan_call(shape, capacities, facts);
  trace_plan(call, plan);
  DeviceGuard guard(state.device);
  if (plan.algorithm == Algorithm::kCopyEngine) {  // 2 ranks, out of place: pushes into the peer's output
    all_reduce_copy_engine(state, send, zero_copy.recv->buffers, bytes, type, op,
                           plan_of(call, plan, zero_copy.send, zero_copy.recv), stream);
    return;
  }
  if (plan.mode == BufferMode::kZeroCopy) {
    kernels::ZeroCopyLaunch launch = zero_copy_launch(state, call, zero_copy);
    launch.plan = plan_of(call, plan, zero_copy.send, zero_copy.recv);
    kernels::launch_all_reduce_two_shot_zero_copy(type, op, launch, plan.blocks, stream);
    return;
  }
  switch (plan.algorithm) {
    case Algorithm::kMulticast: run_reduce_multicast(state, call, plan, stream); return;
    case Algorithm::kLL: run_reduce_ll(ll_launch(state, call, plan_of(call, plan)), call, plan, stream); return;
    case Algorithm::kLL128: {
      const kernels::LLLaunch launch = ll128_launch(state, call, plan_of(call, plan));
      launch_in_chunks(launch, send, recv, count, plan.chunk, datatype_size(type),
                       [&](const auto& chunk) { kernels::launch_all_reduce_ll128(type, op, chunk, plan.blocks, stream); });
      return;
    }
    case Algorithm::kTwoShot:
      kernels::launch_all_reduce_two_shot(type, op, pipeline_launch(state, call, count, 0, plan), plan.blocks, stream);
      return;
    default: {  // the staged one shot
      kernels::StagedLaunch launch = base_launch(state, call, plan);
      launch_in_chunks(launch, send, recv, count, plan.chunk, datatype_size(type),
                       [&](const auto& chunk) { kernels::launch_all_reduce_one_shot(type, op, chunk, plan.blocks, stream); });
      return;
    }
  }
}

void reduce(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const auto& [function, collective, send, recv, count, type, op, root] = call;
  const size_t bytes = count * datatype_size(type);
  // No reduce kernel reads a peer's buffer: the plan never depends on the buffers.
  const CallPlan plan = plan_call(shape_of(state, call, bytes, multicast_ready(state, call, bytes)), area_capacities(state));
  trace_plan(call, plan);
  DeviceGuard guard(state.device);
  switch (plan.algorithm) {
    case Algorithm::kMulticast: run_reduce_multicast(state, call, plan, stream); return;
    case Algorithm::kLL: {  // the LL all-reduce, whose result only the root stores
      kernels::LLLaunch launch = ll_launch(state, call, plan_of(call, plan));
      launch.root = root;
      run_reduce_ll(launch, call, plan, stream);
      return;
    }
    case Algorithm::kCopyEngine:  // the other rank's input into the root's pipeline area, reduced there
      reduce_copy_engine_pairs(state, send, recv, bytes, type, op, root, plan_of(call, plan), stream);
      return;
    case Algorithm::kPipelined:  // a chain of every rank that ends at the root; on two ranks, the other's pushes
    case Algorithm::kTwoShot: {  // the two shot gathered by the root
      kernels::PipelineLaunch launch = pipeline_launch(state, call, count, 0, plan);
      launch.root = root;
      const auto kernel = plan.algorithm == Algorithm::kTwoShot ? kernels::launch_reduce_two_shot
                          : state.size == 2                     ? kernels::launch_reduce_pushed
                                                                : kernels::launch_reduce_chain;
      kernel(type, op, launch, plan.blocks, stream);
      return;
    }
    default: {  // staged, in one phase or two (split)
      const auto kernel = plan.algorithm == Algorithm::kSplit ? kernels::launch_reduce_split : kernels::launch_reduce;
      kernels::StagedLaunch launch = base_launch(state, call, plan);
      launch_in_chunks(launch, send, recv, count, plan.chunk, datatype_size(type),
                       [&](const auto& chunk) { kernel(type, op, chunk, plan.blocks, stream); });
      return;
    }
  }
}

void reduce_scatter(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const auto& [function, collective, send, recv, recv_count, type, op, root] = call;
  const size_t size = datatype_size(type);
  const size_t input_bytes = recv_count * state.size * size;
  const CallShape shape = shape_of(state, call, input_bytes, false);
  const AreaCapacities capacities = area_capacities(state);
  // Zero-copy loads need every rank block 16-byte aligned; copy-engine pushes, the output mapped too. The same
  // lookups on every rank, in place or not, so the same answers.
  std::optional<PeerRange> send_range, recv_range;
  if (recv_count * size % 16 == 0 && !plans_ll(shape, capacities)) {
    send_range = call_buffer_range(state, collective, ExchangedBuffer::kSend, send, input_bytes);
    if (plans_output_pushes(shape, capacities)) {
      recv_range = call_buffer_range(state, collective, ExchangedBuffer::kRecv, recv, recv_count * size);
    }
  }
  BufferFacts facts{};
  facts.in_place = overlap(send, input_bytes, recv, recv_count * size);
  facts.peers_map = send_range && send_range->aligned16;
  facts.peers_map_output = recv_range.has_value();
  facts.same_process_peers = recv_range && recv_range->same_process_peers;
  const CallPlan plan = plan_call(shape, capacities, facts);
  trace_plan(call, plan);
  DeviceGuard guard(state.device);
  if (plan.algorithm == Algorithm::kCopyEngine && plan.mode == BufferMode::kZeroCopy) {  // into the peer's output
    reduce_scatter_copy_engine(state, send, recv_range->buffers, recv_count * size, type, op,
                               plan_of(call, plan, std::nullopt, recv_range), stream);
    return;
  }
  if (plan.algorithm == Algorithm::kCopyEngine) {  // pairs through the peer's pipeline area
    reduce_scatter_copy_engine_pairs(state, send, recv, recv_count * size, type, op, plan_of(call, plan), stream);
    return;
  }
  if (plan.mode == BufferMode::kZeroCopy) {
    kernels::ZeroCopyLaunch launch = zero_copy_base(state, call);  // count: recv_count
    launch.send = send_range->buffers;
    launch.rank_stride = recv_count * size;
    launch.plan = plan_of(call, plan, send_range);
    kernels::launch_reduce_scatter_zero_copy(type, op, launch, plan.blocks, stream);
    return;
  }
  switch (plan.algorithm) {
    case Algorithm::kPipelined:
      kernels::launch_reduce_scatter(type, op, pipeline_launch(state, call, recv_count, recv_count * size, plan),
                                     plan.blocks, stream);
      return;
    case Algorithm::kLL: {  // each peer's block of the input to that peer, reduced there
      kernels::LLLaunch launch = ll_launch(state, call, plan_of(call, plan));
      launch.send_rank_stride = recv_count * size;
      run_reduce_ll(launch, call, plan, stream);
      return;
    }
    default: {  // staged
      kernels::StagedLaunch launch = base_launch(state, call, plan);
      launch.rank_stride = recv_count;
      launch_in_chunks(launch, send, recv, recv_count, plan.chunk, size,
                       [&](const auto& chunk) {
                         kernels::launch_reduce_scatter_staged(type, op, chunk, plan.blocks, stream);
                       });
      return;
    }
  }
}

void all_gather(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const auto& [function, collective, send, recv, send_count, type, op, root] = call;
  const size_t bytes = send_count * datatype_size(type);
  const CallShape shape = shape_of(state, call, bytes * state.size, multicast_ready(state, call, bytes));
  const AreaCapacities capacities = area_capacities(state);
  // Zero copy needs every rank block 16-byte aligned; the input may be any buffer (only this rank reads it).
  std::optional<PeerRange> recv_range;
  if (bytes % 16 == 0 && !plans_ll(shape, capacities)) {
    recv_range = call_buffer_range(state, collective, ExchangedBuffer::kRecv, recv, bytes * state.size);
  }
  BufferFacts facts{};
  facts.peers_map = recv_range && recv_range->aligned16;
  facts.same_process_peers = recv_range && recv_range->same_process_peers;
  const CallPlan plan = plan_call(shape, capacities, facts);
  trace_plan(call, plan);
  DeviceGuard guard(state.device);
  if (plan.algorithm == Algorithm::kCopyEngine && plan.mode == BufferMode::kZeroCopy) {
    all_gather_copy_engine(state, send, recv_range->buffers, bytes, plan_of(call, plan, std::nullopt, recv_range),
                           stream);
    return;
  }
  if (plan.algorithm == Algorithm::kCopyEngine) {  // pairs through the peers' pipeline areas
    all_gather_copy_engine_pairs(state, send, recv, bytes, plan_of(call, plan), stream);
    return;
  }
  if (plan.mode == BufferMode::kZeroCopy) {  // pipelined on buffers peers map: stores into their outputs
    kernels::ZeroCopyLaunch launch = zero_copy_base(state, call);
    launch.recv_peers = recv_range->buffers;
    launch.count = bytes;  // the kernel moves bytes
    launch.rank_stride = bytes;
    launch.plan = plan_of(call, plan, std::nullopt, recv_range);
    kernels::launch_all_gather_zero_copy(launch, plan.blocks, stream);
    return;
  }
  switch (plan.algorithm) {
    case Algorithm::kMulticast: {  // each rank's block in chunks that fill a half
      kernels::MulticastLaunch launch = multicast_launch(state, call);
      launch.plan = plan_of(call, plan);
      launch.rank_stride = bytes;
      launch_in_chunks(launch, send, recv, bytes, plan.chunk, 1,
                       [&](const auto& chunk) { kernels::launch_all_gather_multicast(chunk, plan.blocks, stream); });
      return;
    }
    case Algorithm::kPipelined:
      kernels::launch_all_gather(pipeline_launch(state, call, bytes, bytes, plan), plan.blocks, stream);
      return;
    case Algorithm::kLL: {  // the input to every peer, as an all-to-all of identical blocks
      kernels::LLLaunch launch = ll_launch(state, call, plan_of(call, plan));
      launch.recv_rank_stride = bytes;
      launch_in_chunks(launch, send, recv, bytes, plan.chunk, 1,
                       [&](const auto& chunk) { kernels::launch_blocks_ll(chunk, plan.blocks, stream); });
      return;
    }
    default: {  // staged
      kernels::StagedLaunch launch = base_launch(state, call, plan);
      launch.rank_stride = bytes;
      launch_in_chunks(launch, send, recv, bytes, plan.chunk, 1,
                       [&](const auto& chunk) { kernels::launch_all_gather_staged(chunk, plan.blocks, stream); });
      return;
    }
  }
}

void broadcast(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const auto& [function, collective, send, recv, count, type, op, root] = call;
  const size_t bytes = count * datatype_size(type);
  const CallShape shape = shape_of(state, call, bytes, false);
  const AreaCapacities capacities = area_capacities(state);
  std::optional<PeerRange> recv_range;
  if (!plans_ll(shape, capacities)) recv_range = call_buffer_range(state, collective, ExchangedBuffer::kRecv, recv, bytes);
  BufferFacts facts{};
  facts.peers_map = recv_range.has_value();
  facts.same_process_peers = recv_range && recv_range->same_process_peers;
  const CallPlan plan = plan_call(shape, capacities, facts);
  trace_plan(call, plan);
  DeviceGuard guard(state.device);
  switch (plan.algorithm) {
    case Algorithm::kCopyEngine:
      if (plan.mode == BufferMode::kZeroCopy) {
        broadcast_copy_engine(state, send, recv_range->buffers, bytes, root,
                              plan_of(call, plan, std::nullopt, recv_range), stream);
      } else {  // pairs through the peers' pipeline areas
        broadcast_copy_engine_pairs(state, send, recv, bytes, root, plan_of(call, plan), stream);
      }
      return;
    case Algorithm::kLL: {
      kernels::LLLaunch launch = ll_launch(state, call, plan_of(call, plan));
      launch.root = root;
      launch_in_chunks(launch, send, recv, bytes, plan.chunk, 1,
                       [&](const auto& chunk) { kernels::launch_broadcast_ll(chunk, plan.blocks, stream); });
      return;
    }
    case Algorithm::kPipelined: {  // two ranks: the pipelined all-gather, pushed by the root alone; more: a chain
      kernels::PipelineLaunch launch = pipeline_launch(state, call, bytes, 0, plan);
      launch.root = root;
      const auto kernel = state.size > 2 ? kernels::launch_broadcast_chain : kernels::launch_broadcast_pipelined;
      kernel(launch, plan.blocks, stream);
      return;
    }
    default: {  // staged, in one phase or two (split)
      const auto kernel = plan.algorithm == Algorithm::kSplit ? kernels::launch_broadcast_split : kernels::launch_broadcast;
      kernels::StagedLaunch launch = base_launch(state, call, plan);
      launch_in_chunks(launch, send, recv, bytes, plan.chunk, 1,
                       [&](const auto& chunk) { kernel(chunk, plan.blocks, stream); });
      return;
    }
  }
}

void raise_recorded_failure(CollectiveContext& state) { state.sync->raise_recorded_error(collective_name, describe_plan); }

void check(CollectiveContext& state) {
  raise_recorded_failure(state);
  state.sync->raise_refused_data(collective_name);
}

}  // namespace braid::collectives
