#include "collectives/copy_engine.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "collectives/call_checks.hpp"
#include "collectives/kernels.hpp"
#include "collectives/local_reduce_launch.hpp"
#include "collectives/selection.hpp"
#include "comm/comm_state.hpp"
#include "core/cuda_check.hpp"
#include "core/side_stream.hpp"
#include "sync/device_sync.hpp"

namespace braid::collectives {
namespace {

// The local kernels have no channel on the signal pad, so they may use more blocks than a collective launch:
// enough to finish a chunk (or the own block) well before the engines have moved the peers' ones.
constexpr int kLocalMaxBlocks = 2 * kMaxBlocks;
constexpr size_t kLocalBlockBytes = size_t(64) << 10;

int local_blocks(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((bytes + kLocalBlockBytes - 1) / kLocalBlockBytes, 1, kLocalMaxBlocks));
}

// The own block's copy runs beside the engines for the whole call, so it needs only to finish before them; with
// fewer blocks it takes less of the HBM bandwidth the engines' copies write into. 2×H200, float32, symmetric,
// 512 MiB (bench/results/*-x2-own-copy-blocks.txt): all-to-all 788 µs with 128 blocks, 741 with 64, 738 with 32
// or 16; all-gather 714 → 703, broadcast 1381 → 1368.
constexpr int kOwnCopyMaxBlocks = 16;

// Default copy kind: a source or destination may be another process's memory mapped here, or a VMM mapping.
void copy(void* destination, const void* source, size_t bytes, cudaStream_t stream) {
  BRAID_CUDA(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
}

// Runs `between` (copies on the caller's stream) between an entry and an exit barrier, with `own` (a local copy
// by SMs, or nothing) on the side stream beside it. The side stream forks before the entry barrier (a local copy
// waits for no peer) and joins before the exit barrier.
template <typename Between>
void between_barriers(detail::CommState& state, Collective collective, uint64_t plan, cudaStream_t stream,
                      void* own_destination, const void* own_source, size_t own_bytes, Between&& between) {
  const unsigned int id = static_cast<unsigned int>(collective);
  const device::SignalPad pad = state.sync->pad();
  const bool own = own_bytes != 0 && own_destination != own_source;
  if (own) {
    state.side->order(stream, state.side->get());
    kernels::launch_copy_local(own_destination, own_source, own_bytes, std::min(local_blocks(own_bytes), kOwnCopyMaxBlocks),
                               state.side->get());
    check_launch("copy-engine local copy launch");
  }
  kernels::launch_barrier(pad, id, kSiteEntryBarrier, plan, stream);
  check_launch("copy-engine barrier launch");
  between();
  if (own) state.side->order(state.side->get(), stream);
  kernels::launch_barrier(pad, id, kSiteExitBarrier, plan, stream);
  check_launch("copy-engine barrier launch");
}

// Copy engines pull `count` elements at byte `offset` of every peer's input into this rank's staging, in chunks
// through its two halves, and a kernel reduces each chunk with this rank's own elements (rank order) into
// `recv`. Even chunks go through the first half on the caller's stream, odd ones through the second on the side
// stream: each stream pulls a chunk, reduces it, and only then pulls the next one into the same half, so no
// stream waits on the other between chunks, and one stream's pulls keep the link busy while the other reduces.
// Every pull on one stream, each behind an event wait on the reduction that last read its half, measured the
// same (2×H200, 512 MiB: reduce 1506 against 1517 µs, reduce-scatter 837 against 841); both stay 10–16% above
// one bare pull. Part of that is the engines' cost per copy: bench/probes/chunked_pulls.cu measured ~4 µs of
// idle link per cudaMemcpyAsync (16 MiB pulls back to back: 342 GB/s a direction, two-way, against 371 for one
// 256 MiB pull), the same on one stream or two. Pulling a single peer straight into `recv` in halving pieces
// (few copies, no staging) won nothing in braid (reduce-scatter 833 against 840 µs, reduce 1526 against 1513;
// bench/results/*-x2-copy-engine-direct-pull.txt), so it was not kept. Staging is free here: every peer has
// passed the entry barrier, so none still reads it from an earlier call.
void pull_and_reduce(detail::CommState& state, const PeerBuffers& send, size_t offset, void* recv, size_t count,
                     DataType type, ReduceOp op, cudaStream_t stream) {
  const size_t size = datatype_size(type);
  const int peers = state.size - 1;
  const size_t half_bytes = state.staging.bytes() / 2;
  // A chunk's slice of each peer starts on a 256-byte boundary: the kernel loads whole vectors. One rank alone
  // pulls nothing and reduces its own elements, in chunks of a half as if it had one peer.
  const size_t chunk = half_bytes / std::max(peers, 1) / 256 * 256 / size;
  char* const staging = static_cast<char*>(state.staging.local());
  SideStream& side = *state.side;
  side.order(stream, side.get());  // after the entry barrier
  for (size_t c = 0, first = 0; first < count; ++c, first += chunk) {
    const size_t elements = std::min(chunk, count - first);
    const cudaStream_t lane = c % 2 == 0 ? stream : side.get();
    char* const half = staging + (c % 2) * half_bytes;
    kernels::LocalReduceLaunch launch{};
    for (int step = 0; step <= peers; ++step) {
      const int q = (state.rank + step) % state.size;
      if (step == 0) {
        launch.sources[q] = send.at[q] + offset + first * size;
        continue;
      }
      launch.sources[q] = half + (step - 1) * chunk * size;
      copy(half + (step - 1) * chunk * size, send.at[q] + offset + first * size, elements * size, lane);
    }
    launch.source_count = state.size;
    launch.destination = static_cast<char*>(recv) + first * size;
    launch.count = elements;
    launch.world = state.size;
    kernels::launch_reduce_local(type, op, launch, local_blocks(elements * size), lane);
    check_launch("copy-engine reduction launch");
  }
  side.order(side.get(), stream);
}

}  // namespace

void all_to_all_copy_engine(detail::CommState& state, const PeerBuffers& send, void* recv, size_t block_bytes,
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

void all_gather_copy_engine(detail::CommState& state, const void* send, const PeerBuffers& recv, size_t bytes,
                            uint64_t plan, Stream stream) {
  const size_t at = state.rank * bytes;
  between_barriers(state, Collective::kAllGather, plan, stream, recv.at[state.rank] + at, send, bytes, [&] {
    for (int step = 1; step < state.size; ++step) copy(recv.at[(state.rank + step) % state.size] + at, send, bytes, stream);
  });
}

void broadcast_copy_engine(detail::CommState& state, const void* send, const PeerBuffers& recv, size_t bytes, int root,
                           uint64_t plan, Stream stream) {
  const bool is_root = state.rank == root;
  between_barriers(state, Collective::kBroadcast, plan, stream, recv.at[state.rank], send, is_root ? bytes : 0, [&] {
    if (!is_root) return;
    for (int step = 1; step < state.size; ++step) copy(recv.at[(state.rank + step) % state.size], send, bytes, stream);
  });
}

void reduce_scatter_copy_engine(detail::CommState& state, const PeerBuffers& send, void* recv, size_t recv_count,
                                DataType type, ReduceOp op, uint64_t plan, Stream stream) {
  const size_t offset = state.rank * recv_count * datatype_size(type);
  between_barriers(state, Collective::kReduceScatter, plan, stream, nullptr, nullptr, 0,
                   [&] { pull_and_reduce(state, send, offset, recv, recv_count, type, op, stream); });
}

void reduce_copy_engine(detail::CommState& state, const PeerBuffers& send, void* recv, size_t count, DataType type,
                        ReduceOp op, int root, uint64_t plan, Stream stream) {
  between_barriers(state, Collective::kReduce, plan, stream, nullptr, nullptr, 0, [&] {
    if (state.rank == root) pull_and_reduce(state, send, 0, recv, count, type, op, stream);
  });
}

}  // namespace braid::collectives
