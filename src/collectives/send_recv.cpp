// Point-to-point batches (Communicator::send, recv, send_recv) of the CUDA backend, host side. A batch is an all-to-all-v restricted to
// the peers it names: the pipelined all-to-all kernel (all_to_all_pipelined.cu) pushes only to the launch's
// send_peers and pulls only from its recv_peers. Each direction of a pair is a FIFO stream of its own on the
// signal pad, so the k-th send to q meets q's k-th receive from this rank whatever else either rank does, and
// ranks a batch does not name never hear of it.
//
// A launch carries at most one send to and one receive from each peer, so a batch with several ops for one peer
// is split: launch k carries the k-th send to and the k-th receive from every peer. Where both sides of a pair
// batch its ops alike, launch k of one waits only on launch k of the other, never on a launch queued behind it.
// Every launch has the table's send/recv width (select_algorithm), whatever its sizes: a piece of block b goes to
// the FIFO of block b on the peer, so both sides must launch the same blocks.
//
// A pair (one direction of one launch) whose bytes the table gives the copy engines leaves the FIFO launch and
// moves as chunks through the receiver's pipeline area (send_recv_bulk_launch.hpp): its sends after the FIFO
// launch, its copies on the caller's stream and their kernels on the second side stream, its receives on the side
// stream beside them. Both sides of a pair ask the table with the pair's bytes, so they take the same path where
// their sizes agree. A launch's bulk sends go in rank order, and so do its bulk receives: a pair whose sender is
// busy with a lower receiver, or whose receiver with a lower sender, waits only on pairs that do progress, so
// they never wait on each other in a cycle.
//
// The copy-engine pairs also carry all-to-all, all-gather and broadcast on buffers no peer maps, and
// reduce-scatter and reduce on 2 ranks (copy_engine_pairs.hpp), defined at the end of this file beside the
// machinery they share.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/all_to_all.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/collectives.hpp"
#include "collectives/copy_engine.hpp"
#include "collectives/copy_engine_pairs.hpp"
#include "kernels/kernels.hpp"
#include "collectives/peer_bases.hpp"
#include "collectives/planner.hpp"
#include "collectives/selection.hpp"
#include "kernels/send_recv_bulk_launch.hpp"
#include "kernels/send_recv_lines_launch.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "sync/device_sync.hpp"

namespace braid::collectives {
namespace {

// The launches of a batch: launch k holds the k-th send to and the k-th receive from each peer. Per launch and
// direction, fifo.send (fifo.recv) is the lowest address among its buffers and each peer's offset is its buffer's
// address minus that base (user buffers of one batch lie anywhere: the kernel only adds offsets to the base).
std::vector<kernels::AllToAllLaunch> plan_launches(const CollectiveContext& state, const std::vector<CheckedOp>& ops) {
  std::vector<size_t> launch_of(ops.size());
  std::vector<size_t> sends(state.size, 0), recvs(state.size, 0);
  size_t launches = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    launch_of[i] = (ops[i].send ? sends : recvs)[ops[i].peer]++;
    launches = std::max(launches, launch_of[i] + 1);
  }
  std::vector<char*> send_base(launches, nullptr), recv_base(launches, nullptr);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].bytes == 0) continue;  // its buffer may be null: never read, never a base
    char*& base = (ops[i].send ? send_base : recv_base)[launch_of[i]];
    if (base == nullptr || std::less<>{}(ops[i].buffer, base)) base = ops[i].buffer;  // a total order across allocations
  }
  std::vector<kernels::AllToAllLaunch> plan;
  for (size_t k = 0; k < launches; ++k) {
    plan.push_back(pipelined_launch(state, Collective::kSendRecv, send_base[k], recv_base[k], 1));
    plan.back().send_peers = plan.back().recv_peers = 0;
    plan.back().mismatch_in_bytes = true;  // ops of several datatypes: sizes are compared (and reported) in bytes
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    kernels::AllToAllLaunch& launch = plan[launch_of[i]];
    const CheckedOp& op = ops[i];
    const char* base = op.send ? launch.fifo.send : launch.fifo.recv;
    const uint64_t offset = op.bytes == 0 ? 0 : reinterpret_cast<uintptr_t>(op.buffer) - reinterpret_cast<uintptr_t>(base);
    (op.send ? launch.send_bytes : launch.recv_bytes)[op.peer] = op.bytes;
    (op.send ? launch.send_offset : launch.recv_offset)[op.peer] = offset;
    // This rank's own pair needs no mask: the kernel copies send_bytes[rank] itself.
    if (op.peer != state.rank) (op.send ? launch.send_peers : launch.recv_peers) |= 1u << op.peer;
  }
  return plan;
}

// One direction of a pair that moves through the copy engines.
struct BulkPair {
  int peer;
  char* buffer;
  uint64_t bytes;
};

// The protocol of a pair of `bytes`, one plan per pair: LL128 lines (where the GPUs carry lines whole and the
// communicator has their area, send_recv_lines_launch.hpp), the copy engines (where the pipeline area has slots),
// or the FIFOs.
Algorithm pair_protocol(const CollectiveContext& state, const AreaCapacities& capacities,
                        const kernels::BulkLayout& layout, uint64_t bytes) {
  const CallShape shape{Collective::kSendRecv, bytes, state.size, DataType::kUint8, &state.algorithm_override, false,
                        state.max_blocks, state.ll128_lines};
  BufferFacts facts{};
  facts.peers_map = true;  // lines and chunks go into the communicator's own areas, which every peer maps
  const Algorithm algorithm = plan_call(shape, capacities, facts).algorithm;
  // An area too small for FIFO pieces has no slots either.
  if (algorithm == Algorithm::kCopyEngine && layout.slot_payload == 0) return Algorithm::kPipelined;
  return algorithm;
}

// Takes the pairs of `launch` that go through the copy engines (into `sends`, `recvs`) or in lines (into `lines`)
// out of it: their bytes 0, their peers unnamed. The FIFO launch keeps the rest.
void take_pairs(const CollectiveContext& state, const kernels::BulkLayout& layout, kernels::AllToAllLaunch& launch,
                std::vector<BulkPair>& sends, std::vector<BulkPair>& recvs, kernels::SendRecvLinesLaunch& lines) {
  const AreaCapacities capacities = area_capacities(state);
  lines.send_count = lines.recv_count = lines.blocks = 0;
  // One direction of the pair with `peer`: its bit in `peers`, its bytes and its buffer.
  auto take = [&](int peer, unsigned int& peers, uint64_t& bytes, char* buffer, std::vector<BulkPair>& bulk,
                  kernels::SendRecvLinesPair* line_pairs, int& line_count) {
    if (((peers >> peer) & 1u) == 0) return;
    const Algorithm algorithm = pair_protocol(state, capacities, layout, bytes);
    if (algorithm == Algorithm::kCopyEngine) {
      bulk.push_back({peer, buffer, bytes});
    } else if (algorithm == Algorithm::kLL128) {
      const int blocks = kernels::send_recv_lines_blocks(bytes);
      line_pairs[line_count++] = {peer, buffer, bytes, blocks};
      lines.blocks += blocks;
    } else {
      return;
    }
    peers &= ~(1u << peer);
    bytes = 0;
  };
  for (int q = 0; q < state.size; ++q) {
    if (q == state.rank) continue;
    take(q, launch.send_peers, launch.send_bytes[q], const_cast<char*>(launch.fifo.send) + launch.send_offset[q], sends,
         lines.sends, lines.send_count);
    take(q, launch.recv_peers, launch.recv_bytes[q], launch.fifo.recv + launch.recv_offset[q], recvs, lines.recvs,
         lines.recv_count);
  }
}

// A copy-engine step of one pair of this call (either side), with the fields both sides share set.
template <typename Step>
Step pair_step(const CollectiveContext& state, Collective collective, const BulkPair& pair, uint64_t plan) {
  Step step{};
  step.pad = state.sync->pad();
  step.collective = static_cast<unsigned int>(collective);
  step.peer = pair.peer;
  step.total_bytes = pair.bytes;
  step.plan = plan;
  return step;
}

// The sender's side of one pair: a drain step, then the engine's copies back to back on `copies` (chunk c into
// slot c % 2 of the peer: whole rows in one 2D copy, then the rest), and per chunk on `steps` the step that posts
// it and waits for its slot. The copy of chunk c waits for the step of chunk c - 2 (its slot back), ordered in
// before that copy is enqueued, while the step of chunk c - 1 is not enqueued yet: the engine waits for no more
// than the slot it needs.
void enqueue_bulk_send(CollectiveContext& state, Collective collective, const kernels::BulkLayout& layout,
                       const BulkPair& pair, uint64_t plan,
                       cudaStream_t copies, cudaStream_t steps, SideStream& handover) {
  char* const area = static_cast<char*>(state.pipeline.peer(pair.peer));
  const uint64_t chunks = kernels::bulk_chunk_count(layout, pair.bytes);
  auto step = pair_step<kernels::BulkSendStep>(state, collective, pair, plan);
  step.drain = true;
  kernels::launch_bulk_send_step(step, copies);
  step.drain = false;
  auto post = [&](uint64_t c) {  // on `steps`, which waits for the copy of chunk c already
    const int slot_index = static_cast<int>(c % kernels::kBulkSlots);
    step.post_chunk = static_cast<int64_t>(c);
    step.post_slot = step.wait_slot = slot_index;
    step.header = layout.header(area, state.rank, slot_index);
    kernels::launch_bulk_send_step(step, steps);
  };
  for (uint64_t c = 0; c < chunks; ++c) {
    if (c >= kernels::kBulkSlots) handover.order(steps, copies);  // the step of chunk c - 2: the slot is back
    const kernels::BulkChunk chunk = kernels::bulk_chunk(layout, pair.bytes, c);
    const char* source = pair.buffer + chunk.offset;
    const uint64_t bytes = chunk.bytes;
    char* const slot = layout.slot(area, state.size, state.rank, static_cast<int>(c % kernels::kBulkSlots));
    const uint64_t rows = bytes / layout.row_bytes, tail = bytes % layout.row_bytes;
    if (rows > 0) {
      BRAID_CUDA(cudaMemcpy2DAsync(slot, layout.row_pitch, source, layout.row_bytes, layout.row_bytes, rows,
                                   cudaMemcpyDefault, copies));
    }
    if (tail > 0) {
      BRAID_CUDA(cudaMemcpyAsync(slot + rows * layout.row_pitch, source + rows * layout.row_bytes, tail,
                                 cudaMemcpyDefault, copies));
    }
    if (c >= 1) post(c - 1);
    handover.order(copies, steps);  // the step of chunk c follows its copy
  }
  if (chunks > 0) post(chunks - 1);
}

// What a receiver does with each chunk instead of copying it out (reduce-scatter, reduce): reduce it with `own`,
// the same part of this rank's own input, into the pair's buffer.
struct PairReduction {
  DataType type;
  ReduceOp op;
  const char* own;
};

// The receiver's side of one pair: per chunk, the step kernel (hand back the previous chunk's slot, wait for
// this one and check its header), then the SM copy (or reduction) out of the slot; a last step hands back the
// last slot.
void enqueue_bulk_recv(CollectiveContext& state, Collective collective, const kernels::BulkLayout& layout,
                       const BulkPair& pair, uint64_t plan, const PairReduction* reduction, cudaStream_t stream) {
  char* const area = static_cast<char*>(state.pipeline.local());
  const uint64_t chunks = kernels::bulk_chunk_count(layout, pair.bytes);
  auto step = pair_step<kernels::BulkRecvStep>(state, collective, pair, plan);
  kernels::BulkCopyOut copy{};
  copy.layout = layout;
  copy.total_bytes = pair.bytes;
  kernels::BulkReduceOut reduce{};
  reduce.layout = layout;
  reduce.total_bytes = pair.bytes;
  reduce.world = state.size;
  // Every unit of a slot its own block, within the communicator's cap.
  const int copy_blocks = std::min(kernels::kBulkRowsPerSlot * kernels::kBulkCopyBlocksPerRow, state.max_blocks);
  for (uint64_t c = 0; c <= chunks; ++c) {
    const int slot_index = static_cast<int>(c % kernels::kBulkSlots);
    step.free_slot = c > 0 ? static_cast<int>((c - 1) % kernels::kBulkSlots) : -1;
    step.wait_chunk = c == chunks ? -1 : static_cast<int64_t>(c);
    step.header = layout.header(area, pair.peer, slot_index);
    kernels::launch_bulk_recv_step(step, stream);
    if (c == chunks) break;
    const char* slot = layout.slot(area, state.size, pair.peer, slot_index);
    const kernels::BulkChunk chunk = kernels::bulk_chunk(layout, pair.bytes, c);
    if (reduction != nullptr) {
      reduce.slot = slot;
      reduce.header = step.header;
      reduce.own = reduction->own + chunk.offset;
      reduce.recv = pair.buffer + chunk.offset;
      reduce.bytes = chunk.bytes;
      reduce.chunk = c;
      kernels::launch_bulk_reduce_out(reduction->type, reduction->op, reduce, copy_blocks, stream);
      continue;
    }
    copy.slot = slot;
    copy.header = step.header;
    copy.recv = pair.buffer + chunk.offset;
    copy.bytes = chunk.bytes;
    copy.chunk = c;
    kernels::launch_bulk_copy_out(copy, copy_blocks, stream);
  }
}

// Enqueues one launch's copy-engine pairs: the recvs on `side`, forked from `stream` before anything of the
// launch (the caller's work there, the FIFO launch, runs beside them), the sends' copies on `stream` after that
// work and their kernels on `second_side`; both joined back into `stream`.
void enqueue_bulk_pairs(CollectiveContext& state, Collective collective, const kernels::BulkLayout& layout,
                        const std::vector<BulkPair>& sends, const std::vector<BulkPair>& recvs, uint64_t plan,
                        cudaStream_t stream, const std::function<void()>& on_stream,
                        const PairReduction* reduction = nullptr) {
  const cudaStream_t side = state.side->get(), steps = state.second_side->get();
  if (!recvs.empty()) state.side->order(stream, side);
  on_stream();
  for (const BulkPair& pair : sends) {
    enqueue_bulk_send(state, collective, layout, pair, plan, stream, steps, *state.second_side);
  }
  for (const BulkPair& pair : recvs) enqueue_bulk_recv(state, collective, layout, pair, plan, reduction, side);
  if (!sends.empty()) state.second_side->order(steps, stream);
  if (!recvs.empty()) state.side->order(side, stream);
}

}  // namespace

kernels::BulkLayout bulk_layout(const CollectiveContext& state) {
  return kernels::BulkLayout::of(kernels::pipeline_piece_bytes(state.pipeline.bytes(), state.size), state.size);
}

void send_recv(CollectiveContext& state, const PointToPointBatch& batch, Stream stream) {
  std::vector<kernels::AllToAllLaunch> launches = plan_launches(state, batch.checked);
  const CallPlan choice = pairwise_plan(state, Collective::kSendRecv, DataType::kUint8);
  const uint64_t plan = all_to_all_plan(Collective::kSendRecv, choice.algorithm, choice.blocks, 0, DataType::kUint8, false);
  for (kernels::AllToAllLaunch& launch : launches) launch.fifo.plan = plan;
  BRAID_TRACE("send_recv: {} op(s) in {} launch(es) of {} blocks", batch.count, launches.size(), choice.blocks);
  const kernels::BulkLayout layout = bulk_layout(state);
  DeviceGuard guard(state.device);
  for (kernels::AllToAllLaunch& launch : launches) {
    std::vector<BulkPair> sends, recvs;
    kernels::SendRecvLinesLaunch lines{};
    take_pairs(state, layout, launch, sends, recvs, lines);
    const bool in_lines = lines.send_count + lines.recv_count > 0;
    enqueue_bulk_pairs(state, Collective::kSendRecv, layout, sends, recvs, plan, stream, [&] {
      if (in_lines) {
        copy_peer_bases(state.send_recv_lines, lines.area);
        lines.pad = state.sync->pad();
        kernels::launch_send_recv_lines(lines, stream);
      }
      // A launch left with no peer and nothing for this rank itself has nothing to do.
      if (launch.send_peers != 0 || launch.recv_peers != 0 || launch.send_bytes[state.rank] != 0 ||
          (sends.empty() && recvs.empty() && !in_lines)) {
        kernels::launch_all_to_all_pipelined(launch, choice.blocks, stream);
      }
    });
  }
}

namespace {

// The pairs of one call in the rotated order (copy_engine_pairs.hpp), and this rank's own block; empty pairs are
// left out on both sides alike (every rank knows every pair's size).
struct PairExchange {
  Collective collective;
  std::vector<BulkPair> sends, recvs;
  char* own_destination = nullptr;
  const char* own_source = nullptr;
  size_t own_bytes = 0;
  std::optional<PairReduction> reduction;  // reduce-scatter, reduce: receives reduce instead of copying out
};

// An entry barrier announces the call's plan first: the pairs' waits have no barrier of their own, so a peer that
// took FIFO pushes for the call (an all-to-all in place there) would otherwise wait for pieces that never come
// until the timeout; it sees this plan announced and both fail with kMismatch (a peer with a barrier of its own
// is caught there as well).
void exchange_pairs(CollectiveContext& state, const PairExchange& exchange, uint64_t plan, Stream stream) {
  const kernels::BulkLayout layout = bulk_layout(state);
  if (layout.slot_payload == 0) {  // init refuses a pipeline area too small for FIFO pieces, which has no slots
    raise(ErrorCode::kInternal, "{}: the pipeline area has no copy-engine slots",
          collective_name(static_cast<unsigned int>(exchange.collective)));
  }
  DeviceGuard guard(state.device);
  const bool own = exchange.own_bytes != 0 && exchange.own_destination != exchange.own_source;
  if (own) {  // a local copy waits for no peer
    const cudaStream_t copier = state.third_side->get();
    state.third_side->order(stream, copier);
    copy_own_block(state, exchange.own_destination, exchange.own_source, exchange.own_bytes, copier);
  }
  kernels::launch_barrier(state.sync->pad(), static_cast<unsigned int>(exchange.collective), kSiteEntryBarrier, plan,
                          stream);
  enqueue_bulk_pairs(state, exchange.collective, layout, exchange.sends, exchange.recvs, plan, stream, [] {},
                     exchange.reduction ? &*exchange.reduction : nullptr);
  if (own) state.third_side->order(state.third_side->get(), stream);
}

// Reduce-scatter's and reduce's pairs: one peer's data completes a result only where there is one peer.
void require_two_ranks(const CollectiveContext& state, Collective collective) {
  if (state.size != 2) {
    raise(ErrorCode::kInternal, "{}: copy-engine pairs serve 2 ranks, not {}",
          collective_name(static_cast<unsigned int>(collective)), state.size);
  }
}

int step_to(const CollectiveContext& state, int step) { return (state.rank + step) % state.size; }
int step_from(const CollectiveContext& state, int step) { return (state.rank - step + state.size) % state.size; }

}  // namespace

void all_to_all_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t block_bytes,
                                  uint64_t plan, Stream stream) {
  char* const input = const_cast<char*>(static_cast<const char*>(send));  // only read
  char* const output = static_cast<char*>(recv);
  PairExchange exchange{Collective::kAllToAll};
  for (int step = 1; step < state.size && block_bytes != 0; ++step) {
    const int to = step_to(state, step), from = step_from(state, step);
    exchange.sends.push_back({to, input + to * block_bytes, block_bytes});
    exchange.recvs.push_back({from, output + from * block_bytes, block_bytes});
  }
  exchange.own_destination = output + state.rank * block_bytes;
  exchange.own_source = input + state.rank * block_bytes;
  exchange.own_bytes = block_bytes;
  exchange_pairs(state, exchange, plan, stream);
}

void all_gather_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t bytes, uint64_t plan,
                                  Stream stream) {
  char* const input = const_cast<char*>(static_cast<const char*>(send));  // only read
  char* const output = static_cast<char*>(recv);
  PairExchange exchange{Collective::kAllGather};
  for (int step = 1; step < state.size && bytes != 0; ++step) {
    const int from = step_from(state, step);
    exchange.sends.push_back({step_to(state, step), input, bytes});
    exchange.recvs.push_back({from, output + from * bytes, bytes});
  }
  exchange.own_destination = output + state.rank * bytes;
  exchange.own_source = input;
  exchange.own_bytes = bytes;
  exchange_pairs(state, exchange, plan, stream);
}

void reduce_scatter_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t block_bytes,
                                      DataType type, ReduceOp op, uint64_t plan, Stream stream) {
  require_two_ranks(state, Collective::kReduceScatter);
  char* const input = const_cast<char*>(static_cast<const char*>(send));  // only read
  const int peer = 1 - state.rank;
  PairExchange exchange{Collective::kReduceScatter};
  if (block_bytes != 0) {
    exchange.sends.push_back({peer, input + peer * block_bytes, block_bytes});
    exchange.recvs.push_back({peer, static_cast<char*>(recv), block_bytes});
  }
  exchange.reduction = PairReduction{type, op, input + state.rank * block_bytes};
  exchange_pairs(state, exchange, plan, stream);
}

void reduce_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t bytes, DataType type,
                              ReduceOp op, int root, uint64_t plan, Stream stream) {
  require_two_ranks(state, Collective::kReduce);
  char* const input = const_cast<char*>(static_cast<const char*>(send));  // only read
  PairExchange exchange{Collective::kReduce};
  if (bytes != 0 && state.rank == root) {
    exchange.recvs.push_back({1 - root, static_cast<char*>(recv), bytes});
  } else if (bytes != 0) {
    exchange.sends.push_back({root, input, bytes});
  }
  exchange.reduction = PairReduction{type, op, input};
  exchange_pairs(state, exchange, plan, stream);
}

void broadcast_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t bytes, int root,
                                 uint64_t plan, Stream stream) {
  PairExchange exchange{Collective::kBroadcast};
  if (state.rank == root) {
    for (int step = 1; step < state.size && bytes != 0; ++step) {
      exchange.sends.push_back({step_to(state, step), const_cast<char*>(static_cast<const char*>(send)), bytes});
    }
    exchange.own_destination = static_cast<char*>(recv);
    exchange.own_source = static_cast<const char*>(send);
    exchange.own_bytes = bytes;
  } else if (bytes != 0) {
    exchange.recvs.push_back({root, static_cast<char*>(recv), bytes});
  }
  exchange_pairs(state, exchange, plan, stream);
}

}  // namespace braid::collectives
