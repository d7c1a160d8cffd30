// Reductions of 2 ranks by copy engines (copy_engine.hpp), out of place: the peer's push lands in this rank's
// output before this rank has read its input there. Each rank owns a part of the result (all-reduce: half `rank`,
// split at a 256-byte boundary; reduce-scatter: block `rank`). Per chunk c of a part:
//   1. the engine pushes chunk c of the peer's part of the input to its place in the peer's output, then a step
//      kernel posts it (copies on the caller's stream, steps on the second side stream);
//   2. once the peer posted chunk c of this rank's part, SMs reduce it in place with this rank's own (side stream);
//   3. all-reduce only: the engine pushes the reduced chunk into the peer's output (third side stream).
// An entry barrier (the peer's output is free) and an exit barrier (every push into this rank's output
// completed) announce the plan.
//
// The posts use the pairs' signal channels (alternating as a pair's slots do) and one header a chunk in the
// receiver's pipeline area, checked as a pair's are; no slot is used or handed back, so the pairs' counters stay
// in step. Before its first post the sender waits until the receiver consumed every FIFO piece it sent, since
// FIFO pieces share the headers' rows; the copies, which land in the output, do not wait for that.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "collectives/chunks.hpp"
#include "collectives/collective_context.hpp"
#include "collectives/copy_engine.hpp"
#include "collectives/copy_engine_pairs.hpp"
#include "kernels/kernels.hpp"
#include "collectives/selection.hpp"
#include "kernels/send_recv_bulk_launch.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "core/side_stream.hpp"
#include "sync/device_sync.hpp"

namespace braid::collectives {
namespace {

// All-reduce: even chunks, so one's reduction and push back overlap the next's push. Reduce-scatter: nothing
// overlaps the last reduction, so the chunks taper towards the end of the part (chunks.hpp).

struct PushReduce {
  Collective collective;
  const char* push_source;     // the peer's part of this rank's input
  char* push_destination;      // its place in the peer's output
  Chunks push_chunks;
  const char* own;             // this rank's own part of its input
  char* result;                // its place in this rank's output
  Chunks own_chunks;
  char* push_back_destination; // all-reduce: this rank's part's place in the peer's output, else null
  DataType type;
  ReduceOp op;
  uint64_t plan;
};

void push_reduce(CollectiveContext& state, const PushReduce& call, Stream stream) {
  const unsigned int id = static_cast<unsigned int>(call.collective);
  const int rank = state.rank, peer = 1 - rank;
  const size_t push_bytes = call.push_chunks.total(), own_bytes = call.own_chunks.total();
  const kernels::BulkLayout area_layout = bulk_layout(state);
  char* const local_area = static_cast<char*>(state.pipeline.local());
  char* const peer_area = static_cast<char*>(state.pipeline.peer(peer));
  const device::SignalPad pad = state.sync->pad();
  const cudaStream_t reduces = state.side->get(), steps = state.second_side->get(), gathers = state.third_side->get();

  kernels::launch_barrier(pad, id, kSiteEntryBarrier, call.plan, stream);
  state.side->order(stream, reduces);
  state.side->order(stream, steps);
  if (call.push_back_destination != nullptr) state.side->order(stream, gathers);

  auto send_step = kernels::bulk_step<kernels::BulkSendStep>(pad, id, peer, push_bytes, call.plan);
  send_step.wait_slot = -1;
  if (call.push_chunks.count() > 0) {  // before the first header, not the first copy: the copies miss the area
    kernels::launch_fifo_drain(pad, id, peer, call.plan, steps);
  }
  for (size_t c = 0; c < call.push_chunks.count(); ++c) {
    const size_t at = call.push_chunks.offset(c);
    BRAID_CUDA(cudaMemcpyAsync(call.push_destination + at, call.push_source + at, call.push_chunks.bytes_of(c),
                               cudaMemcpyDefault, stream));
    state.second_side->order(stream, steps);
    send_step.post_chunk = static_cast<int64_t>(c);
    send_step.post_slot = static_cast<int>(c % kernels::kBulkSlots);
    send_step.header = area_layout.header(peer_area, rank, static_cast<int>(c));
    kernels::launch_bulk_send_step(send_step, steps);
  }

  auto recv_step = kernels::bulk_step<kernels::BulkRecvStep>(pad, id, peer, own_bytes, call.plan);
  recv_step.free_slot = -1;
  kernels::BulkReduceOut reduce{};
  reduce.total_bytes = own_bytes;
  reduce.world = state.size;
  const int reduce_blocks = std::min(kernels::kBulkRowsPerSlot * kernels::kBulkCopyBlocksPerRow, state.max_blocks);
  for (size_t c = 0; c < call.own_chunks.count(); ++c) {
    const size_t at = call.own_chunks.offset(c), chunk_bytes = call.own_chunks.bytes_of(c);
    recv_step.wait_chunk = static_cast<int64_t>(c);
    recv_step.header = area_layout.header(local_area, peer, static_cast<int>(c));
    kernels::launch_bulk_recv_step(recv_step, reduces);
    // The chunk as contiguous rows of a multiple of 256 bytes (no element straddles two).
    reduce.layout.row_bytes = round_up((chunk_bytes + kernels::kBulkRowsPerSlot - 1) / kernels::kBulkRowsPerSlot,
                                       Chunks::kAlignment);
    reduce.layout.row_pitch = reduce.layout.row_bytes;
    reduce.layout.slot_payload = reduce.layout.row_bytes * kernels::kBulkRowsPerSlot;
    reduce.slot = call.result + at;
    reduce.own = call.own + at;
    reduce.recv = call.result + at;
    reduce.bytes = chunk_bytes;
    reduce.header = recv_step.header;
    reduce.chunk = c;
    kernels::launch_bulk_reduce_out(call.type, call.op, reduce, reduce_blocks, reduces);
    if (call.push_back_destination == nullptr) continue;
    state.third_side->order(reduces, gathers);
    BRAID_CUDA(cudaMemcpyAsync(call.push_back_destination + at, call.result + at, chunk_bytes, cudaMemcpyDefault,
                               gathers));
  }

  state.second_side->order(steps, stream);
  state.side->order(reduces, stream);
  if (call.push_back_destination != nullptr) state.third_side->order(gathers, stream);
  kernels::launch_barrier(pad, id, kSiteExitBarrier, call.plan, stream);
}

// One header a chunk, in a row of the receiver's pipeline area.
size_t max_chunks_of(const CollectiveContext& state, Collective collective) {
  const char* const name = collective_name(static_cast<unsigned int>(collective));
  const size_t max_chunks = bulk_layout(state).row_bytes / sizeof(kernels::BulkHeader);
  if (state.size != 2) {
    raise(ErrorCode::kInternal, "{}: the copy-engine pushes into the peer's output serve 2 ranks, not {}", name,
          state.size);
  }
  if (max_chunks < 2) raise(ErrorCode::kInternal, "{}: the pipeline area has no room for chunk headers", name);
  return max_chunks;
}

}  // namespace

PairHalves pair_halves(size_t bytes, int rank) {
  const size_t boundary = std::min(bytes, round_up((bytes + 1) / 2, Chunks::kAlignment));
  return rank == 0 ? PairHalves{0, boundary, boundary, bytes - boundary}
                   : PairHalves{boundary, bytes - boundary, 0, boundary};
}

void all_reduce_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t bytes,
                            DataType type, ReduceOp op, uint64_t plan, Stream stream) {
  const size_t max_chunks = max_chunks_of(state, Collective::kAllReduce);
  const int rank = state.rank, peer = 1 - rank;
  const PairHalves halves = pair_halves(bytes, rank);
  const char* const input = static_cast<const char*>(send);
  PushReduce call{Collective::kAllReduce};
  call.push_source = input + halves.peer_offset;
  call.push_destination = recv.at[peer] + halves.peer_offset;
  call.push_chunks = Chunks::even(halves.peer_bytes, max_chunks);
  call.own = input + halves.own_offset;
  call.result = recv.at[rank] + halves.own_offset;
  call.own_chunks = Chunks::even(halves.own_bytes, max_chunks);
  call.push_back_destination = recv.at[peer] + halves.own_offset;
  call.type = type;
  call.op = op;
  call.plan = plan;
  push_reduce(state, call, stream);
}

void reduce_scatter_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv,
                                size_t block_bytes, DataType type, ReduceOp op, uint64_t plan, Stream stream) {
  const size_t max_chunks = max_chunks_of(state, Collective::kReduceScatter);
  const int rank = state.rank, peer = 1 - rank;
  const char* const input = static_cast<const char*>(send);
  PushReduce call{Collective::kReduceScatter};
  call.push_source = input + peer * block_bytes;
  call.push_destination = recv.at[peer];
  call.push_chunks = Chunks::tapered(block_bytes, max_chunks);
  call.own = input + rank * block_bytes;
  call.result = recv.at[rank];
  call.own_chunks = call.push_chunks;
  call.push_back_destination = nullptr;
  call.type = type;
  call.op = op;
  call.plan = plan;
  push_reduce(state, call, stream);
}

}  // namespace braid::collectives
