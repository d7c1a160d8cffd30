// The CUDA backend's collectives, host side: pick the algorithm from the selection table for a checked call and
// enqueue its launches (one per chunk that fits a staging half, an LL slot or a multicast half).
#include "collectives/collectives.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "collectives/call_buffers.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/copy_engine.hpp"
#include "collectives/kernels.hpp"
#include "collectives/ll_launch.hpp"
#include "collectives/multicast_launch.hpp"
#include "collectives/pipeline_launch.hpp"
#include "collectives/plan.hpp"
#include "collectives/selection.hpp"
#include "collectives/staged_launch.hpp"
#include "collectives/zero_copy_launch.hpp"
#include "core/config.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid::collectives {
namespace {

// The plan word of this call (collectives/plan.hpp), which its barriers compare across ranks: the same on every
// rank that makes the same call with the same kind of buffers. `send`, `recv`: the ranges the kernels use zero
// copy (none for staged, multicast and FIFO kernels).
uint64_t plan_of(const CollectiveCall& call, Algorithm algorithm, int blocks,
                 const std::optional<PeerRange>& send = std::nullopt,
                 const std::optional<PeerRange>& recv = std::nullopt) {
  PlanArguments plan{};
  plan.collective = call.collective;
  plan.algorithm = algorithm;
  plan.zero_copy = send.has_value() || recv.has_value();
  plan.blocks = blocks;
  plan.count = call.count;
  plan.type = static_cast<uint64_t>(call.type);
  plan.op = call.reduces() ? static_cast<uint64_t>(call.op) : 0;
  plan.root = call.rooted() ? call.root : -1;
  plan.send_identity = send ? send->identity : 0;
  plan.recv_identity = recv ? recv->identity : 0;
  return plan_word(plan);
}

kernels::StagedLaunch base_launch(const CollectiveContext& state, const CollectiveCall& call) {
  kernels::StagedLaunch launch{};
  launch.root = call.root;
  launch.collective = static_cast<unsigned int>(call.collective);
  launch.staging = reinterpret_cast<char* const*>(state.staging.device_peers());
  launch.half_bytes = state.staging.bytes() / 2 / 256 * 256;
  launch.pad = state.sync->pad();
  launch.epoch = state.sync->epoch();
  launch.blocks_done = state.sync->blocks_done();
  return launch;
}

static_assert(kMaxBlocks <= kernels::kPipelineChannels, "a pipelined launch has a FIFO per block");

// A whole call's pipelined launch: `count` elements (bytes for all-gather) per rank block, `rank_stride` bytes
// between rank blocks of the user's buffer where the collective has them.
kernels::PipelineLaunch pipeline_launch(const CollectiveContext& state, const CollectiveCall& call, size_t count,
                                        size_t rank_stride, const Choice& choice) {
  kernels::PipelineLaunch launch{};
  launch.send = static_cast<const char*>(call.send);
  launch.recv = static_cast<char*>(call.recv);
  launch.count = count;
  launch.rank_stride = rank_stride;
  launch.collective = static_cast<unsigned int>(call.collective);
  launch.area = reinterpret_cast<char* const*>(state.pipeline.device_peers());
  launch.piece_bytes = kernels::pipeline_piece_bytes(state.pipeline.bytes(), state.size);
  launch.pad = state.sync->pad();
  launch.plan = plan_of(call, choice.algorithm, choice.blocks);
  return launch;
}

// An LL launch without its buffers, count and strides (all zero).
kernels::LLLaunch ll_launch(const CollectiveContext& state, const CollectiveCall& call) {
  kernels::LLLaunch launch{};
  launch.collective = static_cast<unsigned int>(call.collective);
  launch.area = reinterpret_cast<char* const*>(state.ll.device_peers());
  launch.slot_bytes = state.ll.bytes() / 2 / state.size;
  launch.pad = state.sync->pad();
  launch.epoch = state.sync->ll_epoch();
  launch.blocks_done = state.sync->blocks_done();
  launch.root = -1;
  return launch;
}

// Payload bytes one LL launch carries from each sender (its slot in a receiver's LL area).
size_t ll_payload_bytes(const kernels::LLLaunch& launch) {
  return launch.slot_bytes / kernels::kLLWireBytes * kernels::kLLLineBytes;
}

// Enqueues `enqueue(launch)` once per chunk of at most `chunk` of `total` units (elements, or bytes; `unit`
// bytes each), with the launch's send, recv and count set to the chunk (a null buffer stays null: a rank whose
// buffer the call does not use). `what` names a launch that failed.
template <typename Launch, typename Enqueue>
void launch_in_chunks(Launch launch, const void* send, void* recv, size_t total, size_t chunk, size_t unit,
                      const char* what, Enqueue&& enqueue) {
  if (chunk == 0) raise(ErrorCode::kInternal, "staging too small for one element");
  for (size_t offset = 0; offset < total; offset += chunk) {
    launch.send = send == nullptr ? nullptr : at(send, offset * unit);
    launch.recv = recv == nullptr ? nullptr : at(recv, offset * unit);
    launch.count = std::min(chunk, total - offset);
    enqueue(static_cast<const Launch&>(launch));
    check_launch(what);
  }
}

// Enqueues an LL reduction (all-reduce, reduce, reduce-scatter: `launch` carries the strides and the root) of
// `count` elements a block, in chunks that fit an LL slot, each its own LL call. `recv` may be null (reduce,
// off the root).
void run_reduce_ll(kernels::LLLaunch launch, const CollectiveCall& call, size_t count, int blocks, cudaStream_t stream,
                   const char* what) {
  const size_t size = datatype_size(call.type);
  launch_in_chunks(launch, call.send, call.recv, count, ll_payload_bytes(launch) / size, size, what,
                   [&](const auto& chunk) { kernels::launch_reduce_ll(call.type, call.op, chunk, blocks, stream); });
}

// The zero-copy view of an all-reduce's buffers: both must be mapped by every peer (symmetric allocations of
// this communicator, or registered buffers) and 16-byte aligned on every rank (the kernels load whole vectors
// from the peers' buffers).
struct ZeroCopyBuffers {
  std::optional<PeerRange> send, recv;
  bool usable() const { return send && recv && send->aligned16 && recv->aligned16; }
};

// The peers' mappings of `bytes` of a call's buffer at `pointer` (the call's size as the table counts it); none
// for an LL call, which never depends on the buffers (runs_ll): it looks up nothing and exchanges nothing.
std::optional<PeerRange> mapped_range(CollectiveContext& state, const CollectiveCall& call, ExchangedBuffer which,
                                      const void* pointer, size_t bytes, bool multicast = false) {
  if (runs_ll(call.collective, bytes, state.size, call.type, state.algorithm_override, multicast)) return std::nullopt;
  return call_buffer_range(state, call.collective, which, pointer, bytes);
}

ZeroCopyBuffers find_zero_copy(CollectiveContext& state, const CollectiveCall& call, size_t bytes, bool multicast) {
  if (runs_ll(call.collective, bytes, state.size, call.type, state.algorithm_override, multicast)) return {};
  return ZeroCopyBuffers{call_buffer_range(state, call.collective, ExchangedBuffer::kSend, call.send, bytes),
                         call_buffer_range(state, call.collective, ExchangedBuffer::kRecv, call.recv, bytes)};
}

// What every zero-copy launch carries: this rank's buffers, the call's count, its id and the signal pad.
// The caller adds the peers' buffers it uses (and the rank stride).
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

// NVLink multicast serves the call where the communicator has a multicast region (BRAID_ENABLE_MULTICAST) and
// the kernels take it (`bytes`: all-reduce and reduce, the buffer; all-gather, one rank's block). What decides
// is the same on every rank.
bool multicast_ready(const CollectiveContext& state, const CollectiveCall& call, size_t bytes) {
  return state.multicast != nullptr && kernels::multicast_serves(call.collective, call.type, call.op, bytes);
}

kernels::MulticastLaunch multicast_launch(const CollectiveContext& state, const CollectiveCall& call) {
  kernels::MulticastLaunch launch{};
  launch.root = call.root;
  launch.collective = static_cast<unsigned int>(call.collective);
  launch.local = state.multicast->local();
  launch.multicast = state.multicast->multicast();
  launch.half_bytes = state.multicast->bytes() / 2 / 256 * 256;
  launch.pad = state.sync->pad();
  launch.epoch = state.sync->multicast_epoch();
  launch.blocks_done = state.sync->blocks_done();
  return launch;
}

// All-reduce or reduce through the multicast region, in chunks of a half.
void run_reduce_multicast(const CollectiveContext& state, const CollectiveCall& call, int blocks, cudaStream_t stream) {
  const size_t size = datatype_size(call.type);
  kernels::MulticastLaunch launch = multicast_launch(state, call);
  launch.plan = plan_of(call, Algorithm::kMulticast, blocks);
  const auto kernel = call.collective == Collective::kAllReduce ? kernels::launch_all_reduce_multicast
                                                                 : kernels::launch_reduce_multicast;
  launch_in_chunks(launch, call.send, call.recv, call.count, launch.half_bytes / size, size, "multicast kernel launch",
                   [&](const auto& chunk) { kernel(call.type, call.op, chunk, blocks, stream); });
}

}  // namespace

void all_reduce(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const auto& [function, collective, send, recv, count, type, op, root] = call;
  const size_t size = datatype_size(type);
  const bool multicast = multicast_ready(state, call, count * size);
  const ZeroCopyBuffers zero_copy = find_zero_copy(state, call, count * size, multicast);
  const Choice choice = select_algorithm(call.collective, count * size, state.size, type, state.algorithm_override,
                                         zero_copy.usable() ? Buffers::kSymmetric : Buffers::kAny, multicast);
  if (choice.algorithm == Algorithm::kMulticast) {
    DeviceGuard guard(state.device);
    run_reduce_multicast(state, call, choice.blocks, stream);
    return;
  }
  // One shot writes this rank's output while peers still read its input: in place it stays staged.
  const bool in_place_ok = choice.algorithm != Algorithm::kOneShot || !overlap(send, count * size, recv, count * size);
  const bool direct = zero_copy.usable() && in_place_ok && choice.algorithm != Algorithm::kLL;
  BRAID_TRACE("all_reduce: {} elements, {}{} with {} blocks", count, algorithm_name(choice.algorithm),
              direct ? " (zero copy)" : "", choice.blocks);
  DeviceGuard guard(state.device);
  if (direct) {
    kernels::ZeroCopyLaunch launch = zero_copy_launch(state, call, zero_copy);
    launch.plan = plan_of(call, choice.algorithm, choice.blocks, zero_copy.send, zero_copy.recv);
    if (choice.algorithm == Algorithm::kOneShot) {
      kernels::launch_all_reduce_one_shot_zero_copy(type, op, launch, choice.blocks, stream);
    } else {
      kernels::launch_all_reduce_two_shot_zero_copy(type, op, launch, choice.blocks, stream);
    }
    check_launch("all_reduce kernel launch");
    return;
  }
  if (choice.algorithm == Algorithm::kTwoShot) {
    kernels::launch_all_reduce_two_shot(type, op, pipeline_launch(state, call, count, 0, choice), choice.blocks, stream);
    check_launch("all_reduce kernel launch");
    return;
  }
  if (choice.algorithm == Algorithm::kLL) {
    run_reduce_ll(ll_launch(state, call), call, count, choice.blocks, stream, "all_reduce kernel launch");
    return;
  }
  kernels::StagedLaunch launch = base_launch(state, call);
  launch.plan = plan_of(call, Algorithm::kOneShot, choice.blocks);
  launch_in_chunks(launch, send, recv, count, launch.half_bytes / size, size, "all_reduce kernel launch",
                   [&](const auto& chunk) { kernels::launch_all_reduce_one_shot(type, op, chunk, choice.blocks, stream); });
}

void reduce(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const auto& [function, collective, send, recv, count, type, op, root] = call;
  const size_t size = datatype_size(type);
  // No reduce kernel reads a peer's buffer in place: the choice never depends on the buffers.
  const Choice choice = select_algorithm(call.collective, count * size, state.size, type, state.algorithm_override,
                                         Buffers::kAny, multicast_ready(state, call, count * size));
  DeviceGuard guard(state.device);
  if (choice.algorithm == Algorithm::kMulticast) {
    run_reduce_multicast(state, call, choice.blocks, stream);
    return;
  }
  if (choice.algorithm == Algorithm::kLL) {  // the LL all-reduce, whose result only the root stores
    kernels::LLLaunch launch = ll_launch(state, call);
    launch.root = root;
    run_reduce_ll(launch, call, count, choice.blocks, stream, "reduce kernel launch");
    return;
  }
  if (choice.algorithm == Algorithm::kPipelined) {  // the two shot, gathered by the root alone
    kernels::PipelineLaunch launch = pipeline_launch(state, call, count, 0, choice);
    launch.root = root;
    kernels::launch_reduce_pipelined(type, op, launch, choice.blocks, stream);
    check_launch("reduce kernel launch");
    return;
  }
  kernels::StagedLaunch launch = base_launch(state, call);
  launch.plan = plan_of(call, Algorithm::kStaged, choice.blocks);
  launch_in_chunks(launch, send, recv, count, launch.half_bytes / size, size, "reduce kernel launch",
                   [&](const auto& chunk) { kernels::launch_reduce(type, op, chunk, choice.blocks, stream); });
}

void reduce_scatter(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const auto& [function, collective, send, recv, recv_count, type, op, root] = call;
  const size_t size = datatype_size(type);
  // Zero copy when every peer maps the whole input and every rank block starts on a 16-byte boundary (the kernel
  // loads whole vectors from the peers' blocks): the same answer on every rank. The output may be any buffer.
  std::optional<PeerRange> send_range;
  if (recv_count * size % 16 == 0) {
    const size_t input_bytes = recv_count * state.size * size;
    send_range = mapped_range(state, call, ExchangedBuffer::kSend, send, input_bytes);
  }
  const bool zero_copy = send_range && send_range->aligned16;
  const Choice choice = select_algorithm(call.collective, recv_count * state.size * size, state.size, type,
                                         state.algorithm_override, zero_copy ? Buffers::kSymmetric : Buffers::kAny);
  DeviceGuard guard(state.device);
  if (zero_copy && choice.algorithm == Algorithm::kPipelined) {
    kernels::ZeroCopyLaunch launch = zero_copy_base(state, call);  // count: recv_count
    launch.send = send_range->buffers;
    launch.rank_stride = recv_count * size;
    launch.plan = plan_of(call, Algorithm::kPipelined, choice.blocks, send_range);
    kernels::launch_reduce_scatter_zero_copy(type, op, launch, choice.blocks, stream);
    check_launch("reduce_scatter kernel launch");
    return;
  }
  if (choice.algorithm == Algorithm::kPipelined) {
    kernels::launch_reduce_scatter(type, op, pipeline_launch(state, call, recv_count, recv_count * size, choice), choice.blocks, stream);
    check_launch("reduce_scatter kernel launch");
    return;
  }
  if (choice.algorithm == Algorithm::kLL) {  // each peer's block of the input to that peer, reduced there
    kernels::LLLaunch launch = ll_launch(state, call);
    launch.send_rank_stride = recv_count * size;
    run_reduce_ll(launch, call, recv_count, choice.blocks, stream, "reduce_scatter kernel launch");
    return;
  }
  kernels::StagedLaunch launch = base_launch(state, call);
  launch.plan = plan_of(call, Algorithm::kStaged, choice.blocks);
  launch.rank_stride = recv_count;
  // Staging holds the chunk's block of every rank, each rounded up to 256 bytes.
  const size_t chunk_elements = (launch.half_bytes / state.size - 256) / size;
  launch_in_chunks(launch, send, recv, recv_count, chunk_elements, size, "reduce_scatter kernel launch",
                   [&](const auto& chunk) {
                     kernels::launch_reduce_scatter_staged(type, op, chunk, choice.blocks, stream);
                   });
}

void all_gather(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const auto& [function, collective, send, recv, send_count, type, op, root] = call;
  const size_t bytes = send_count * datatype_size(type);
  // Zero copy when every peer maps the whole output and every rank block starts on a 16-byte boundary: the same
  // answer on every rank. The input may be any buffer (only this rank reads it).
  const bool multicast = multicast_ready(state, call, bytes);
  std::optional<PeerRange> recv_range;
  if (bytes % 16 == 0) {
    recv_range = mapped_range(state, call, ExchangedBuffer::kRecv, recv, bytes * state.size, multicast);
  }
  const bool zero_copy = recv_range && recv_range->aligned16;
  Choice choice = select_algorithm(call.collective, bytes * state.size, state.size, type, state.algorithm_override,
                                   zero_copy ? Buffers::kSymmetric : Buffers::kAny, multicast);
  DeviceGuard guard(state.device);
  if (choice.algorithm == Algorithm::kMulticast) {  // each rank's block in chunks that fill a half
    kernels::MulticastLaunch launch = multicast_launch(state, call);
    launch.plan = plan_of(call, Algorithm::kMulticast, choice.blocks);
    launch.rank_stride = bytes;
    launch_in_chunks(launch, send, recv, bytes, launch.half_bytes / state.size / 16 * 16, 1, "multicast kernel launch",
                     [&](const auto& chunk) { kernels::launch_all_gather_multicast(chunk, choice.blocks, stream); });
    return;
  }
  if (choice.algorithm == Algorithm::kCopyEngine) {
    if (zero_copy && !recv_range->same_process_peers) {
      all_gather_copy_engine(state, send, recv_range->buffers, bytes,
                             plan_of(call, Algorithm::kCopyEngine, choice.blocks, std::nullopt, recv_range), stream);
      return;
    }
    choice.algorithm = Algorithm::kPipelined;  // the zero-copy stores, or FIFOs on buffers peers cannot map
  }
  if (zero_copy && choice.algorithm == Algorithm::kPipelined) {
    kernels::ZeroCopyLaunch launch = zero_copy_base(state, call);
    launch.recv_peers = recv_range->buffers;
    launch.count = bytes;  // the kernel moves bytes
    launch.rank_stride = bytes;
    launch.plan = plan_of(call, Algorithm::kPipelined, choice.blocks, std::nullopt, recv_range);
    kernels::launch_all_gather_zero_copy(launch, choice.blocks, stream);
    check_launch("all_gather kernel launch");
    return;
  }
  if (choice.algorithm == Algorithm::kPipelined) {
    kernels::launch_all_gather(pipeline_launch(state, call, bytes, bytes, choice), choice.blocks, stream);
    check_launch("all_gather kernel launch");
    return;
  }
  if (choice.algorithm == Algorithm::kLL) {  // the input to every peer, as an all-to-all of identical blocks
    kernels::LLLaunch launch = ll_launch(state, call);
    launch.recv_rank_stride = bytes;
    launch_in_chunks(launch, send, recv, bytes, ll_payload_bytes(launch), 1, "all_gather kernel launch",
                     [&](const auto& chunk) { kernels::launch_blocks_ll(chunk, choice.blocks, stream); });
    return;
  }
  kernels::StagedLaunch launch = base_launch(state, call);
  launch.plan = plan_of(call, Algorithm::kStaged, choice.blocks);
  launch.rank_stride = bytes;
  launch_in_chunks(launch, send, recv, bytes, launch.half_bytes, 1, "all_gather kernel launch",
                   [&](const auto& chunk) { kernels::launch_all_gather_staged(chunk, choice.blocks, stream); });
}

void broadcast(CollectiveContext& state, const CollectiveCall& call, Stream stream) {
  const auto& [function, collective, send, recv, count, type, op, root] = call;
  const size_t size = datatype_size(type), bytes = count * size;
  // Copy engines when every peer maps the output (the root pushes into it).
  const std::optional<PeerRange> recv_range =
      mapped_range(state, call, ExchangedBuffer::kRecv, recv, bytes);
  const bool pushes = recv_range && !recv_range->same_process_peers;
  Choice choice = select_algorithm(call.collective, bytes, state.size, type, state.algorithm_override,
                                   pushes ? Buffers::kSymmetric : Buffers::kAny);
  DeviceGuard guard(state.device);
  if (choice.algorithm == Algorithm::kCopyEngine) {
    if (pushes) {
      broadcast_copy_engine(state, send, recv_range->buffers, bytes, root,
                            plan_of(call, Algorithm::kCopyEngine, choice.blocks, std::nullopt, recv_range), stream);
      return;
    }
    choice.algorithm = Algorithm::kPipelined;  // asked for on buffers peers cannot map
  }
  if (choice.algorithm == Algorithm::kLL) {
    kernels::LLLaunch launch = ll_launch(state, call);
    launch.root = root;
    launch_in_chunks(launch, send, recv, bytes, ll_payload_bytes(launch), 1, "broadcast kernel launch",
                     [&](const auto& chunk) { kernels::launch_broadcast_ll(chunk, choice.blocks, stream); });
    return;
  }
  if (choice.algorithm == Algorithm::kPipelined) {  // the pipelined all-gather, pushed by the root alone
    kernels::PipelineLaunch launch = pipeline_launch(state, call, bytes, 0, choice);
    launch.root = root;
    kernels::launch_broadcast_pipelined(launch, choice.blocks, stream);
    check_launch("broadcast kernel launch");
    return;
  }
  kernels::StagedLaunch launch = base_launch(state, call);
  launch.plan = plan_of(call, Algorithm::kStaged, choice.blocks);
  launch_in_chunks(launch, send, recv, bytes, launch.half_bytes, 1, "broadcast kernel launch",
                   [&](const auto& chunk) { kernels::launch_broadcast(chunk, choice.blocks, stream); });
}

void raise_recorded_failure(CollectiveContext& state) { state.sync->raise_recorded_error(collective_name, describe_plan); }

void check(CollectiveContext& state) {
  raise_recorded_failure(state);
  state.sync->raise_refused_data(collective_name);
}

}  // namespace braid::collectives
