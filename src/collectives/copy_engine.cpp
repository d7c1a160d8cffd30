#include "collectives/copy_engine.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "collectives/call_checks.hpp"
#include "collectives/collective_context.hpp"
#include "kernels/kernels.hpp"
#include "collectives/selection.hpp"
#include "core/cuda_check.hpp"
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
