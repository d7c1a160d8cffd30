#include "collectives/copy_engine.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "collectives/call_checks.hpp"
#include "collectives/chunks.hpp"
#include "collectives/collective_context.hpp"
#include "kernels/kernels.hpp"
#include "kernels/send_recv_bulk_launch.hpp"
#include "collectives/selection.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "core/side_stream.hpp"
#include "sync/device_sync.hpp"

namespace braid::collectives {
namespace {

// Local kernels have no signal-pad channel, so they may use more blocks than a collective launch: enough to
// finish well before the engines.
constexpr int kLocalMaxBlocks = 2 * kMaxBlocks;
constexpr size_t kLocalBlockBytes = size_t(64) << 10;

int local_blocks(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((bytes + kLocalBlockBytes - 1) / kLocalBlockBytes, 1, kLocalMaxBlocks));
}

// cudaMemcpyDefault: either side may be another process's memory mapped here, or a VMM mapping.
void copy(void* destination, const void* source, size_t bytes, cudaStream_t stream) {
  BRAID_CUDA(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
}

// `between` (copies on the caller's stream) between the barriers, the own block's SM copy on the side stream,
// forked before the entry barrier (a local copy waits for no peer) and joined before the exit barrier.
template <typename Between>
void between_barriers(CollectiveContext& state, Collective collective, uint64_t plan, cudaStream_t stream,
                      void* own_destination, const void* own_source, size_t own_bytes, Between&& between) {
  const unsigned int id = static_cast<unsigned int>(collective);
  const device::SignalPad pad = state.sync->pad();
  const bool own = own_bytes != 0 && own_destination != own_source;
  if (own) {
    state.side->order(stream, state.side->get());
    copy_own_block(state, own_destination, own_source, own_bytes, state.side->get());
  }
  kernels::launch_barrier(pad, id, kSiteEntryBarrier, plan, stream);
  between();
  if (own) state.side->order(state.side->get(), stream);
  kernels::launch_barrier(pad, id, kSiteExitBarrier, plan, stream);
}

}  // namespace

// 16 blocks still finish in time (docs/dev/tuning-notes.md); the communicator's cap holds too.
void copy_own_block(const CollectiveContext& state, void* destination, const void* source, size_t bytes,
                    cudaStream_t stream) {
  constexpr int kOwnCopyMaxBlocks = 16;
  const int blocks = std::min({local_blocks(bytes), kOwnCopyMaxBlocks, state.max_blocks});
  kernels::launch_copy_local(destination, source, bytes, blocks, stream);
}

void all_to_all_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t block_bytes,
                            uint64_t plan, Stream stream) {
  const char* const input = static_cast<const char*>(send);
  const size_t at = state.rank * block_bytes;
  between_barriers(state, Collective::kAllToAll, plan, stream, recv.at[state.rank] + at, input + at, block_bytes, [&] {
    for (int step = 1; step < state.size; ++step) {
      const int q = (state.rank + step) % state.size;
      copy(recv.at[q] + at, input + q * block_bytes, block_bytes, stream);
    }
  });
}

void all_to_all_pull_copy_engine(CollectiveContext& state, const PeerBuffers& send, void* recv, size_t block_bytes,
                                 uint64_t plan, Stream stream) {
  char* const output = static_cast<char*>(recv);
  between_barriers(state, Collective::kAllToAll, plan, stream, output + state.rank * block_bytes,
                   send.at[state.rank] + state.rank * block_bytes, block_bytes, [&] {
                     for (int step = 1; step < state.size; ++step) {
                       const int q = (state.rank + step) % state.size;
                       copy(output + q * block_bytes, send.at[q] + state.rank * block_bytes, block_bytes, stream);
                     }
                   });
}

namespace {

// NOTE [all-to-all in place by the copy engines]
// On 2 ranks in place, block `peer` of this rank's buffer (its input for the peer, and where the peer's block for
// it goes) and block `rank` of the peer's swap places. Neither may be written before the other side has read it.
// Where a block fits in the pipeline area, the engines swap them by pushes alone, as out of place (pushes moved
// more than pulls with both directions busy: docs/dev/collectives.md), in tapered chunks (the last chunk's copy
// out is overlapped by nothing):
//   1. the engines push this rank's chunk into the same place of the peer's area (caller's stream, back to back);
//   2. a step kernel posts the chunk to the peer once its push has completed (second side stream);
//   3. once this rank's push of a chunk has read it and the peer's post of that chunk has come, SMs copy the
//      chunk out of this rank's area into its place (side stream).
// Each direction of the link carries one block of pushes, back to back from the entry barrier on.
// Otherwise each rank swaps one half of the pair (pair_halves: rank 0 the bytes before a 256-byte boundary, rank 1
// the rest), chunk by chunk through two slots of its own pipeline area:
//   1. the engines pull the peer's chunk into the slot (caller's stream), once the slot's previous chunk is copied
//      out;
//   2. then push this rank's chunk into the peer's place, which the pull has read (side stream);
//   3. then SMs copy the slot into this rank's place, which the push has read (second side stream).
// A rank's pulls and its peer's pushes take one direction of the link, its pushes and the peer's pulls the other:
// each carries one block, as out of place. No rank touches the other's half or pipeline area, so no signal passes
// between the barriers.
// Either way the areas are free: the entry barrier ends both ranks' earlier calls, and follows each rank's drain
// step, so the FIFO pieces either rank sent into the other's area before (a send whose receive comes later) have
// been received; a receive that never comes ends the sender's drain with kTimeout rather than the copies
// overwriting the pieces. The exit barrier, which this rank reaches once its pushes and copies have completed, keeps the peer's
// next call out until then. The posts count on the copy-engine pairs' data channels, one wait for each post, so
// the pairs' counts stay in step.
void swap_by_pushes(CollectiveContext& state, const PeerBuffers& buffers, size_t block_bytes, uint64_t plan,
                    Stream stream) {
  const int rank = state.rank, peer = 1 - rank;
  const Chunks chunks = Chunks::tapered(block_bytes, SIZE_MAX, Chunks::kMaxEvenBytes);
  char* const mine = buffers.at[rank] + peer * block_bytes;
  char* const area = static_cast<char*>(state.pipeline.local());
  char* const peer_area = static_cast<char*>(state.pipeline.peer(peer));
  const cudaStream_t pushes = stream, posts = state.second_side->get(), copies_out = state.side->get();
  SideStream& handover = *state.side;
  const auto id = static_cast<unsigned int>(Collective::kAllToAll);
  auto post = kernels::bulk_step<kernels::BulkSendStep>(state.sync->pad(), id, peer, block_bytes, plan);
  post.wait_slot = -1;
  auto arrival = kernels::bulk_step<kernels::BulkRecvStep>(post.pad, id, peer, block_bytes, plan);
  arrival.free_slot = -1;
  for (size_t c = 0; c < chunks.count(); ++c) {
    const size_t at = chunks.offset(c), bytes = chunks.bytes_of(c);
    copy(peer_area + at, mine + at, bytes, pushes);
    handover.order(pushes, posts);
    post.post_chunk = static_cast<int64_t>(c);
    post.post_slot = static_cast<int>(c % kernels::kBulkSlots);
    kernels::launch_bulk_send_step(post, posts);
    handover.order(pushes, copies_out);  // this rank's push of the chunk has read its place
    arrival.wait_chunk = static_cast<int64_t>(c);
    kernels::launch_bulk_recv_step(arrival, copies_out);
    kernels::launch_copy_local(mine + at, area + at, bytes, std::min(local_blocks(bytes), state.max_blocks),
                               copies_out);
  }
  if (chunks.count() > 0) {
    handover.order(posts, stream);
    handover.order(copies_out, stream);
  }
}

void swap_by_pulls(CollectiveContext& state, const PeerBuffers& buffers, size_t block_bytes, Stream stream) {
  const int rank = state.rank, peer = 1 - rank;
  const size_t slot_bytes = state.pipeline.bytes() / 2 / Chunks::kAlignment * Chunks::kAlignment;
  if (slot_bytes < 2 * Chunks::kAlignment) {  // a last chunk holds up to 511 bytes
    raise(ErrorCode::kInternal, "all_to_all: the pipeline area has no room for two slots");
  }
  const PairHalves halves = pair_halves(block_bytes, rank);
  // No chunk larger than a slot: at most half a slot, plus a first chunk merged into it.
  const Chunks chunks = Chunks::tapered(halves.own_bytes, SIZE_MAX, std::min(Chunks::kMaxTaperedBytes, slot_bytes / 2));
  char* const mine = buffers.at[rank] + peer * block_bytes + halves.own_offset;
  char* const theirs = buffers.at[peer] + rank * block_bytes + halves.own_offset;
  char* const area = static_cast<char*>(state.pipeline.local());
  const cudaStream_t pulls = stream, pushes = state.side->get(), copies_out = state.second_side->get();
  SideStream& handover = *state.side;
  for (size_t c = 0; c < chunks.count(); ++c) {
    const size_t at = chunks.offset(c), bytes = chunks.bytes_of(c);
    char* const slot = area + (c % 2) * slot_bytes;
    copy(slot, theirs + at, bytes, pulls);
    handover.order(pulls, pushes);
    copy(theirs + at, mine + at, bytes, pushes);
    // The pull of chunk c + 1 waits for the copy out of chunk c - 1 (its slot), and for nothing later.
    if (c >= 1) handover.order(copies_out, pulls);
    handover.order(pushes, copies_out);
    kernels::launch_copy_local(mine + at, slot, bytes, std::min(local_blocks(bytes), state.max_blocks), copies_out);
  }
  if (chunks.count() > 0) {  // the side streams joined (a capture's too) only where they had work
    handover.order(pushes, stream);
    handover.order(copies_out, stream);
  }
}

}  // namespace

void all_to_all_in_place_copy_engine(CollectiveContext& state, const PeerBuffers& buffers, size_t block_bytes,
                                     uint64_t plan, Stream stream) {
  if (state.size != 2) {
    raise(ErrorCode::kInternal, "all_to_all: the copy engines in place serve 2 ranks, not {}", state.size);
  }
  const int peer = 1 - state.rank;
  const unsigned int id = static_cast<unsigned int>(Collective::kAllToAll);
  const device::SignalPad pad = state.sync->pad();
  kernels::launch_fifo_drain(pad, id, peer, plan, stream);  // the peer's area holds no FIFO piece of this rank's
  kernels::launch_barrier(pad, id, kSiteEntryBarrier, plan, stream);
  if (block_bytes <= state.pipeline.bytes()) {
    swap_by_pushes(state, buffers, block_bytes, plan, stream);
  } else {
    swap_by_pulls(state, buffers, block_bytes, stream);
  }
  kernels::launch_barrier(pad, id, kSiteExitBarrier, plan, stream);
}

void all_gather_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t bytes,
                            uint64_t plan, Stream stream) {
  const size_t at = state.rank * bytes;
  between_barriers(state, Collective::kAllGather, plan, stream, recv.at[state.rank] + at, send, bytes, [&] {
    for (int step = 1; step < state.size; ++step) copy(recv.at[(state.rank + step) % state.size] + at, send, bytes, stream);
  });
}

void broadcast_copy_engine(CollectiveContext& state, const void* send, const PeerBuffers& recv, size_t bytes, int root,
                           uint64_t plan, Stream stream) {
  const bool is_root = state.rank == root;
  between_barriers(state, Collective::kBroadcast, plan, stream, recv.at[state.rank], send, is_root ? bytes : 0, [&] {
    if (!is_root) return;
    for (int step = 1; step < state.size; ++step) copy(recv.at[(state.rank + step) % state.size], send, bytes, stream);
  });
}

}  // namespace braid::collectives
