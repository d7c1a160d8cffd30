// Point-to-point batches, host side: an all-to-all-v restricted to the peers a batch names (send_peers,
// recv_peers). Each direction of a pair is a FIFO stream of its own, so the k-th send to q meets q's k-th receive
// from this rank, and unnamed ranks never hear of it. Launch k carries the k-th send to and receive from each
// peer (where both sides batch alike, it waits only on the peer's launch k), at the table's send/recv width (a
// piece of block b goes to the peer's FIFO of block b).
//
// Pairs the table gives the copy engines (both sides ask with the pair's bytes) move as chunks through the
// receiver's pipeline area (send_recv_bulk_launch.hpp). Bulk sends go in rank order, as do bulk receives: a pair
// whose sender is busy with a lower receiver, or receiver with a lower sender, waits only on pairs that progress,
// never in a cycle. The collectives of copy_engine_pairs.hpp are at the end.
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

// Per launch and direction, the base (fifo.send, fifo.recv) is the lowest buffer address and each peer's offset
// its buffer's distance from it: the kernel only adds offsets to the base.
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
    plan.back().mismatch_in_bytes = true;  // ops of several datatypes: sizes compared in bytes
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

// One direction of a pair moved by the copy engines.
struct BulkPair {
  int peer;
  char* buffer;
  uint64_t bytes;
};

// A pair's protocol: LL128 lines (send_recv_lines_launch.hpp), the copy engines, or the FIFOs.
Algorithm pair_protocol(const CollectiveContext& state, const AreaCapacities& capacities, uint64_t bytes) {
  const CallShape shape{Collective::kSendRecv, bytes, state.size, DataType::kUint8, &state.algorithm_override, false,
                        state.max_blocks, state.ll128_lines};
  BufferFacts facts{};
  facts.peers_map = true;  // lines and chunks go into the communicator's own areas, which every peer maps
  return plan_call(shape, capacities, facts).algorithm;
}

// Moves the pairs of `launch` that go by copy engines or in lines out of it (bytes 0, peers unnamed).
void take_pairs(const CollectiveContext& state, kernels::AllToAllLaunch& launch,
                std::vector<BulkPair>& sends, std::vector<BulkPair>& recvs, kernels::SendRecvLinesLaunch& lines) {
  const AreaCapacities capacities = area_capacities(state);
  lines.send_count = lines.recv_count = lines.blocks = 0;
  auto take = [&](int peer, unsigned int& peers, uint64_t& bytes, char* buffer, std::vector<BulkPair>& bulk,
                  kernels::SendRecvLinesPair* line_pairs, int& line_count) {
    if (((peers >> peer) & 1u) == 0) return;
    const Algorithm algorithm = pair_protocol(state, capacities, bytes);
    switch (algorithm) {
      case Algorithm::kPipelined: return;  // stays in the FIFO launch
      case Algorithm::kCopyEngine: bulk.push_back({peer, buffer, bytes}); break;
      case Algorithm::kLL128: {
        const int blocks = kernels::send_recv_lines_blocks(bytes);
        line_pairs[line_count++] = {peer, buffer, bytes, blocks};
        lines.blocks += blocks;
        break;
      }
      default:
        raise(ErrorCode::kInternal, "send_recv: a pair has no {} path", algorithm_name(algorithm));
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

template <typename Step>
Step pair_step(const CollectiveContext& state, Collective collective, const BulkPair& pair, uint64_t plan) {
  return kernels::bulk_step<Step>(state.sync->pad(), static_cast<unsigned int>(collective), pair.peer, pair.bytes, plan);
}

// The sender's side: a drain step, then the copies back to back on `copies` (chunk c into the peer's slot c % 2:
// whole rows in one 2D copy, then the rest), and per chunk on `steps` the step that posts it and waits for its
// slot. The copy of chunk c waits for the step of chunk c - 2 (its slot back), ordered in before the step of
// chunk c - 1 is enqueued: the engine waits for no more than the slot it needs.
void enqueue_bulk_send(CollectiveContext& state, Collective collective, const kernels::BulkLayout& layout,
                       const BulkPair& pair, uint64_t plan,
                       cudaStream_t copies, cudaStream_t steps, SideStream& handover) {
  char* const area = static_cast<char*>(state.pipeline.peer(pair.peer));
  const uint64_t chunks = kernels::bulk_chunk_count(layout, pair.bytes);
  auto step = pair_step<kernels::BulkSendStep>(state, collective, pair, plan);
  kernels::launch_fifo_drain(step.pad, step.collective, pair.peer, plan, copies);
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
    const uint64_t rows = layout.row_pitch == layout.row_bytes ? 0 : bytes / layout.row_bytes;  // contiguous: none
    if (rows > 0) {
      BRAID_CUDA(cudaMemcpy2DAsync(slot, layout.row_pitch, source, layout.row_bytes, layout.row_bytes, rows,
                                   cudaMemcpyDefault, copies));
    }
    const uint64_t done = rows * layout.row_bytes;
    if (bytes > done) {  // the rest, or the whole chunk of a contiguous slot
      BRAID_CUDA(cudaMemcpyAsync(slot + rows * layout.row_pitch, source + done, bytes - done, cudaMemcpyDefault,
                                 copies));
    }
    if (c >= 1) post(c - 1);
    handover.order(copies, steps);  // the step of chunk c follows its copy
  }
  if (chunks > 0) post(chunks - 1);
}

// Reduce-scatter, reduce: each chunk reduced with the same part of `own` into the pair's buffer, not copied out.
// `divisor` is what avg divides by: the world at the last receive, 1 before it.
struct PairReduction {
  DataType type;
  ReduceOp op;
  const char* own;
  int divisor;
  char* push_back = nullptr;  // where each reduced chunk goes on to in the peer's buffer (the engines), or null
};

// NOTE [reduction pairs on more than 2 ranks]
// A rank's receives run one after another on one stream, in its peers' send order. The first reduces the
// peer's block with this rank's own block into the output; each later one reduces the next peer's block with the
// output so far, and the last divides for avg. So between receives the output holds a partial result rounded to
// the datatype, as after each step of NCCL's ring and of braid's reduce chain; on 2 ranks there is one receive
// and one rounding.
PairReduction reduction_of_receive(const PairReduction& call, size_t receive, size_t receives, char* output) {
  PairReduction step = call;
  if (receive > 0) step.own = output;
  if (receive + 1 < receives) step.divisor = 1;
  return step;
}

// The receiver's side: per chunk, the step (hand back the previous slot, wait for this chunk, check its header),
// then the SM copy or reduction out of the slot (and the reduced chunk's push back); a last step hands back the
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
      reduce.world = reduction->divisor;
      kernels::launch_bulk_reduce_out(reduction->type, reduction->op, reduce, copy_blocks, stream);
      if (reduction->push_back != nullptr) {  // on the third side stream, beside the next chunk's reduction
        const cudaStream_t pushes = state.third_side->get();
        state.third_side->order(stream, pushes);
        BRAID_CUDA(cudaMemcpyAsync(reduction->push_back + chunk.offset, pair.buffer + chunk.offset, chunk.bytes,
                                   cudaMemcpyDefault, pushes));
      }
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

// The recvs on `side`, forked from `stream` before `on_stream` (which runs beside them), the sends' copies on
// `stream` after it and their kernels on `second_side`; both joined back into `stream`.
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
  for (size_t i = 0; i < recvs.size(); ++i) {
    std::optional<PairReduction> step;
    if (reduction != nullptr) step = reduction_of_receive(*reduction, i, recvs.size(), recvs[i].buffer);
    enqueue_bulk_recv(state, collective, layout, recvs[i], plan, step ? &*step : nullptr, side);
  }
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
    take_pairs(state, launch, sends, recvs, lines);
    const bool in_lines = lines.send_count + lines.recv_count > 0;
    enqueue_bulk_pairs(state, Collective::kSendRecv, layout, sends, recvs, plan, stream, [&] {
      if (in_lines) {
        copy_peer_bases(state.send_recv_lines, lines.area);
        lines.pad = state.sync->pad();
        kernels::launch_send_recv_lines(lines, stream);
      }
      // Skipped when left with no peer and nothing for this rank.
      if (launch.send_peers != 0 || launch.recv_peers != 0 || launch.send_bytes[state.rank] != 0 ||
          (sends.empty() && recvs.empty() && !in_lines)) {
        kernels::launch_all_to_all_pipelined(launch, choice.blocks, stream);
      }
    });
  }
}

namespace {

// Empty pairs are left out on both sides alike (every rank knows every pair's size).
struct PairExchange {
  Collective collective;
  std::vector<BulkPair> sends, recvs;
  char* own_destination = nullptr;
  const char* own_source = nullptr;
  size_t own_bytes = 0;
  std::optional<PairReduction> reduction;
};

// The entry barrier announces the plan: the pairs' waits compare none, so a peer that took FIFO pushes would
// wait until the timeout for pieces that never come; it sees this plan instead, and both fail with kMismatch.
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
  if (state.size < 2) {  // the own block is reduced into each receive: one rank has none
    raise(ErrorCode::kInternal, "reduce_scatter: copy-engine pairs serve 2 or more ranks, not {}", state.size);
  }
  char* const input = const_cast<char*>(static_cast<const char*>(send));  // only read
  char* const output = static_cast<char*>(recv);
  PairExchange exchange{Collective::kReduceScatter};
  for (int step = 1; step < state.size && block_bytes != 0; ++step) {
    const int to = step_to(state, step);
    exchange.sends.push_back({to, input + to * block_bytes, block_bytes});
    exchange.recvs.push_back({step_from(state, step), output, block_bytes});
  }
  exchange.reduction = PairReduction{type, op, input + state.rank * block_bytes, state.size};
  exchange_pairs(state, exchange, plan, stream);
}

void all_reduce_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t count, DataType type,
                                  ReduceOp op, uint64_t plan, Stream stream) {
  if (state.size <= 2) {
    raise(ErrorCode::kInternal, "all_reduce: copy-engine pairs serve more than 2 ranks, not {}", state.size);
  }
  const size_t element = datatype_size(type);
  const auto size = static_cast<size_t>(state.size);
  auto begin = [&](int rank) { return count * static_cast<size_t>(rank) / size * element; };  // balanced blocks
  auto bytes_of = [&](int rank) { return begin(rank + 1) - begin(rank); };
  char* const input = const_cast<char*>(static_cast<const char*>(send));  // only read
  char* const output = static_cast<char*>(recv);
  const int rank = state.rank;
  PairExchange scatter{Collective::kAllReduce};  // every peer's block to its rank, reduced there into the output
  for (int step = 1; step < state.size; ++step) {
    const int to = step_to(state, step);
    if (bytes_of(to) != 0) scatter.sends.push_back({to, input + begin(to), bytes_of(to)});
    if (bytes_of(rank) != 0) scatter.recvs.push_back({step_from(state, step), output + begin(rank), bytes_of(rank)});
  }
  scatter.reduction = PairReduction{type, op, input + begin(rank), state.size};
  exchange_pairs(state, scatter, plan, stream);
  PairExchange gather{Collective::kAllReduce};  // the reduced block to every peer, theirs into their blocks
  for (int step = 1; step < state.size; ++step) {
    const int from = step_from(state, step);
    if (bytes_of(rank) != 0) gather.sends.push_back({step_to(state, step), output + begin(rank), bytes_of(rank)});
    if (bytes_of(from) != 0) gather.recvs.push_back({from, output + begin(from), bytes_of(from)});
  }
  exchange_pairs(state, gather, plan, stream);
}

// NOTE [all-reduce in place by the copy engines]
// On 2 ranks whose buffers the peer maps, in place, neither rank's buffer is free for the other's first push (its
// own half is its input until reduced, the other half the input the peer needs). So the first pushes go as pairs
// into the peer's pipeline area, the rest into the peer's buffer itself. Each rank owns a half (split at a
// 256-byte boundary, pair_halves, as out of place). The engines push the other half of its buffer, chunk by chunk, into the
// peer's slots, the area laid out as two contiguous ones (NOTE [contiguous window], send_recv_bulk_launch.hpp,
// from the larger half, so alike on both ranks; nothing else uses the area then: the entry barrier ends this
// rank's earlier calls, and the sender's drain the FIFO pieces it sent before); SMs reduce each received chunk in
// place into the own half (each own element read before the same thread writes it); the engines push each
// reduced chunk into the same place of the peer's buffer. That place is free: it held the peer's input for this
// half, whose chunk the peer posted only once its copy had completed.
// The exit barrier: every push into this rank's buffer has completed before its stream goes on. The plan word
// carries the placement (the out-of-place schedule pushes into the output at once), so mixed placement fails
// with kMismatch on both ranks.
void all_reduce_in_place_copy_engine(CollectiveContext& state, const PeerBuffers& buffers, size_t bytes,
                                     DataType type, ReduceOp op, uint64_t plan, Stream stream) {
  if (state.size != 2) {
    raise(ErrorCode::kInternal, "all_reduce: the copy engines in place serve 2 ranks, not {}", state.size);
  }
  const int rank = state.rank, peer = 1 - rank;
  const PairHalves halves = pair_halves(bytes, rank);
  const kernels::BulkLayout layout = kernels::BulkLayout::window_of(state.pipeline.bytes(), halves.larger());
  if (layout.slot_payload == 0) {
    raise(ErrorCode::kInternal, "all_reduce: the pipeline area has no room for copy-engine slots");
  }
  char* const buffer = buffers.at[rank];
  std::vector<BulkPair> sends, recvs;
  if (halves.peer_bytes != 0) sends.push_back({peer, buffer + halves.peer_offset, halves.peer_bytes});
  if (halves.own_bytes != 0) recvs.push_back({peer, buffer + halves.own_offset, halves.own_bytes});
  PairReduction reduction{type, op, buffer + halves.own_offset, state.size, buffers.at[peer] + halves.own_offset};
  const unsigned int id = static_cast<unsigned int>(Collective::kAllReduce);
  DeviceGuard guard(state.device);
  kernels::launch_barrier(state.sync->pad(), id, kSiteEntryBarrier, plan, stream);
  enqueue_bulk_pairs(state, Collective::kAllReduce, layout, sends, recvs, plan, stream, [] {}, &reduction);
  if (!recvs.empty()) state.third_side->order(state.third_side->get(), stream);  // the pushes back
  kernels::launch_barrier(state.sync->pad(), id, kSiteExitBarrier, plan, stream);
}

void reduce_copy_engine_pairs(CollectiveContext& state, const void* send, void* recv, size_t bytes, DataType type,
                              ReduceOp op, int root, uint64_t plan, Stream stream) {
  if (state.size != 2) {
    raise(ErrorCode::kInternal, "reduce: copy-engine pairs serve 2 ranks, not {}", state.size);
  }
  char* const input = const_cast<char*>(static_cast<const char*>(send));  // only read
  PairExchange exchange{Collective::kReduce};
  if (bytes != 0 && state.rank == root) {
    exchange.recvs.push_back({1 - root, static_cast<char*>(recv), bytes});
  } else if (bytes != 0) {
    exchange.sends.push_back({root, input, bytes});
  }
  exchange.reduction = PairReduction{type, op, input, state.size};
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
