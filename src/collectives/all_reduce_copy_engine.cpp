// All-reduce of 2 ranks by copy engines (copy_engine.hpp), on buffers the peer maps, out of place. Rank r owns
// half r of the buffer (the halves split at a 256-byte boundary). Per chunk c of a half, in three streams:
//   1. this rank's engine pushes chunk c of the peer's half of its input into the same place of the peer's output,
//      and a step kernel then posts the chunk (the caller's stream for the copies, the second side stream for
//      the steps, as send/recv's copy-engine pairs do: send_recv_bulk_launch.hpp);
//   2. once the peer posted chunk c of this rank's half, landed in this rank's output, SMs reduce it there, in
//      place, with the same part of this rank's own input (the side stream);
//   3. the engine pushes that reduced chunk into the peer's output (the third side stream).
// Every byte crosses NVLink once each way by copy engines, which move more than SM loads and stores
// (docs/dev/collectives.md), and the SMs only reduce locally. The peer's push lands in this rank's output before
// this rank has read its own input there, hence out of place only (the planner's gate).
// An entry barrier (the peer's output is free) and an exit barrier (every push into this rank's output completed)
// enclose it; both announce the call's plan.
//
// The posts use the pairs' signal channels (a chunk's channel alternates as a pair's slots do) and one header a
// chunk in the receiver's pipeline area, where a pair's headers lie, checked by the receiver as a pair's are; no
// slot is used or handed back, so the pairs' counters stay in step. The sender first waits until the receiver
// consumed every FIFO piece it sent it, as a pair's sender does, since FIFO pieces share the headers' rows.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "collectives/collective_context.hpp"
#include "collectives/copy_engine.hpp"
#include "collectives/copy_engine_pairs.hpp"
#include "collectives/kernels.hpp"
#include "collectives/selection.hpp"
#include "collectives/send_recv_bulk_launch.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "core/side_stream.hpp"
#include "sync/device_sync.hpp"

namespace braid::collectives {
namespace {

// The largest chunk: fewer, larger chunks cost the engines less (about 4 us a copy), and two chunks a half at
// least let the reduction and the gather of one overlap the push of the next (docs/dev/selection.md).
constexpr size_t kMaxChunkBytes = size_t(64) << 20;
constexpr size_t kChunkAlignment = 256;

size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// The chunks of a half of `bytes`, the same on both ranks: whole multiples of 256 bytes but the last, at most
// `max_chunks` of them (one header each).
struct HalfChunks {
  size_t chunk_bytes = 0, count = 0;
  HalfChunks(size_t bytes, size_t max_chunks) {
    if (bytes == 0) return;
    const size_t wanted = std::max<size_t>(2, (bytes + kMaxChunkBytes - 1) / kMaxChunkBytes);
    chunk_bytes = round_up((bytes + wanted - 1) / wanted, kChunkAlignment);
    chunk_bytes = std::max(chunk_bytes, round_up((bytes + max_chunks - 1) / max_chunks, kChunkAlignment));
    count = (bytes + chunk_bytes - 1) / chunk_bytes;
  }
  size_t offset(size_t c) const { return c * chunk_bytes; }
  size_t bytes_of(size_t c, size_t total) const { return std::min(chunk_bytes, total - offset(c)); }
};

}  // namespace

void all_reduce_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t bytes,
                            DataType type, ReduceOp op, uint64_t plan, Stream stream) {
  if (state.size != 2) {
    raise(ErrorCode::kInternal, "all_reduce: the copy-engine all-reduce serves 2 ranks, not {}", state.size);
  }
  const unsigned int id = static_cast<unsigned int>(Collective::kAllReduce);
  const kernels::BulkLayout area_layout = bulk_layout(state);
  const size_t max_chunks = area_layout.row_bytes / sizeof(kernels::BulkHeader);
  if (max_chunks == 0) raise(ErrorCode::kInternal, "all_reduce: the pipeline area has no room for chunk headers");

  const int rank = state.rank, peer = 1 - rank;
  const size_t boundary = std::min(bytes, round_up((bytes + 1) / 2, kChunkAlignment));
  const size_t own_offset = rank == 0 ? 0 : boundary, own_bytes = rank == 0 ? boundary : bytes - boundary;
  const size_t peer_offset = rank == 0 ? boundary : 0, peer_bytes = bytes - own_bytes;
  const HalfChunks own_chunks(own_bytes, max_chunks), peer_chunks(peer_bytes, max_chunks);

  const char* const input = static_cast<const char*>(send);
  char* const output = recv.at[rank];
  char* const peer_output = recv.at[peer];
  char* const local_area = static_cast<char*>(state.pipeline.local());
  char* const peer_area = static_cast<char*>(state.pipeline.peer(peer));
  const device::SignalPad pad = state.sync->pad();
  const cudaStream_t reduces = state.side->get(), steps = state.second_side->get(), gathers = state.third_side->get();

  kernels::launch_barrier(pad, id, kSiteEntryBarrier, plan, stream);
  state.side->order(stream, reduces);
  state.side->order(stream, steps);
  state.side->order(stream, gathers);

  // 1. The peer's half of this rank's input into the peer's output, each chunk posted after its copy.
  kernels::BulkSendStep send_step{};
  send_step.pad = pad;
  send_step.collective = id;
  send_step.peer = peer;
  send_step.total_bytes = peer_bytes;
  send_step.plan = plan;
  send_step.wait_slot = -1;
  if (peer_chunks.count > 0) {
    send_step.drain = true;
    kernels::launch_bulk_send_step(send_step, stream);
    send_step.drain = false;
  }
  for (size_t c = 0; c < peer_chunks.count; ++c) {
    const size_t at = peer_offset + peer_chunks.offset(c);
    BRAID_CUDA(cudaMemcpyAsync(peer_output + at, input + at, peer_chunks.bytes_of(c, peer_bytes), cudaMemcpyDefault,
                               stream));
    state.second_side->order(stream, steps);
    send_step.post_chunk = static_cast<int64_t>(c);
    send_step.post_slot = static_cast<int>(c % kernels::kBulkSlots);
    send_step.header = area_layout.header(peer_area, rank, static_cast<int>(c));
    kernels::launch_bulk_send_step(send_step, steps);
  }

  // 2. and 3. Each chunk of this rank's half, once posted: reduced in place, then pushed into the peer's output.
  kernels::BulkRecvStep recv_step{};
  recv_step.pad = pad;
  recv_step.collective = id;
  recv_step.peer = peer;
  recv_step.free_slot = -1;
  recv_step.total_bytes = own_bytes;
  recv_step.plan = plan;
  kernels::BulkReduceOut reduce{};
  reduce.total_bytes = own_bytes;
  reduce.world = state.size;
  const int reduce_blocks = std::min(kernels::kBulkRowsPerSlot * kernels::kBulkCopyBlocksPerRow, state.max_blocks);
  for (size_t c = 0; c < own_chunks.count; ++c) {
    const size_t at = own_offset + own_chunks.offset(c), chunk_bytes = own_chunks.bytes_of(c, own_bytes);
    recv_step.wait_chunk = static_cast<int64_t>(c);
    recv_step.header = area_layout.header(local_area, peer, static_cast<int>(c));
    kernels::launch_bulk_recv_step(recv_step, reduces);
    // The chunk as the kernel's rows: contiguous, each a multiple of 256 bytes (no element straddles two).
    reduce.layout.row_bytes = round_up((chunk_bytes + kernels::kBulkRowsPerSlot - 1) / kernels::kBulkRowsPerSlot,
                                       kChunkAlignment);
    reduce.layout.row_pitch = reduce.layout.row_bytes;
    reduce.layout.slot_payload = reduce.layout.row_bytes * kernels::kBulkRowsPerSlot;
    reduce.slot = output + at;
    reduce.own = input + at;
    reduce.recv = output + at;
    reduce.bytes = chunk_bytes;
    reduce.header = recv_step.header;
    reduce.chunk = c;
    kernels::launch_bulk_reduce_out(type, op, reduce, reduce_blocks, reduces);
    state.third_side->order(reduces, gathers);
    BRAID_CUDA(cudaMemcpyAsync(peer_output + at, output + at, chunk_bytes, cudaMemcpyDefault, gathers));
  }

  state.second_side->order(steps, stream);
  state.side->order(reduces, stream);
  state.third_side->order(gathers, stream);
  kernels::launch_barrier(pad, id, kSiteExitBarrier, plan, stream);
}

}  // namespace braid::collectives
