// The zero-copy bodies that run between a kernel's entry and exit barriers, on buffers every rank maps here: the
// symmetric kernels (all_gather_zero_copy.cu, reduce_scatter_zero_copy.cu, all_reduce_zero_copy.cu) and the
// announcing ones (announced.cuh) find the peers' buffers differently and share these. `buffers[r]`: rank r's
// buffer as mapped here. Every thread of the block calls them; each block takes its slice.
#pragma once

#include "kernels/elementwise.cuh"

namespace braid::kernels {

// All-gather: this rank's input (`bytes`) into block `rank` (`rank_stride` bytes apart) of every output.
__device__ __forceinline__ void all_gather_stores(char* const* outputs, const char* send, size_t bytes,
                                                  size_t rank_stride, int world, int rank) {
  const Slice part = block_slice<uint8_t>(bytes, blockIdx.x, gridDim.x);
  const char* source = send + part.begin;
  char* destinations[kMaxWorld];
  int count = 0;
  for (int k = 0; k < world; ++k) {
    char* to = outputs[(rank + k) % world] + rank * rank_stride + part.begin;  // rotated
    if (to != source) destinations[count++] = to;                               // in place
  }
  block_copy_to(destinations, count, source, part.end - part.begin);
}

// All-to-all: block q of rank r's send (`block_bytes` apart) into block r of rank q's recv, for this rank's
// blocks: pushed (its send into every recv) or, with `loads`, pulled (every send into its recv); only this rank's
// entry of the other array is read. Each block starts at another peer (rotated by rank and block), so copies
// within this GPU run beside the stores over the links instead of ahead of them.
__device__ __forceinline__ void all_to_all_copies(char* const* recvs, const char* const* sends, size_t block_bytes,
                                                  int world, int rank, bool loads) {
  const Slice part = block_slice<uint8_t>(block_bytes, blockIdx.x, gridDim.x);
  for (int step = 0; step < world; ++step) {
    const int q = (rank + step + blockIdx.x) % world;
    const int from = loads ? q : rank, to = loads ? rank : q;
    block_copy(recvs[to] + from * block_bytes + part.begin, sends[from] + to * block_bytes + part.begin,
               part.end - part.begin);
  }
}

// All-to-all where a rank may run in place (its send is its recv), on every rank's send and recv: rank r and each
// peer q swap block q of r's send with block r of q's send (NOTE [all-to-all pair exchanges]); the own block is
// copied unless in place. block_bytes: whole 16-byte vectors.
__device__ __forceinline__ void all_to_all_exchanges(char* const* recvs, const char* const* sends, size_t block_bytes,
                                                     int world, int rank) {
  const size_t vectors = block_bytes / 16, lower_half = (vectors + 1) / 2;
  for (int step = 0; step < world; ++step) {
    const int q = (rank + step + blockIdx.x) % world;  // rotated as all_to_all_copies
    if (q == rank) {
      const Slice part = block_slice<uint8_t>(block_bytes, blockIdx.x, gridDim.x);
      block_copy(recvs[rank] + rank * block_bytes + part.begin, sends[rank] + rank * block_bytes + part.begin,
                 part.end - part.begin);
      continue;
    }
    const size_t first = rank < q ? 0 : lower_half, count = rank < q ? lower_half : vectors - lower_half;
    const Slice part = block_slice<uint4>(count, blockIdx.x, gridDim.x);
    const uint4* mine = reinterpret_cast<const uint4*>(sends[rank] + q * block_bytes) + first;
    const uint4* theirs = reinterpret_cast<const uint4*>(sends[q] + rank * block_bytes) + first;
    uint4* into_mine = reinterpret_cast<uint4*>(recvs[rank] + q * block_bytes) + first;
    uint4* into_theirs = reinterpret_cast<uint4*>(recvs[q] + rank * block_bytes) + first;
    constexpr int kInFlight = device::kLoadsInFlight;
    for (size_t i = part.begin + threadIdx.x; i < part.end; i += kInFlight * blockDim.x) {
      uint4 own_values[kInFlight], peer_values[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const size_t at = i + u * blockDim.x;
        if (at < part.end) {
          own_values[u] = mine[at];
          peer_values[u] = theirs[at];
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const size_t at = i + u * blockDim.x;
        if (at < part.end) {
          into_theirs[at] = own_values[u];
          into_mine[at] = peer_values[u];
        }
      }
    }
  }
}

// NOTE [all-to-all pair exchanges]
// In place, a rank's recv is its send: a peer's store into it could land before the rank has read the block it
// overwrites. So a pair of ranks swaps its two blocks, each rank half of them (the lower rank the first half),
// and a thread loads its vectors of both sends before it stores any into the two recvs. Block q of r's recv and
// block r of q's recv (so also these blocks of their sends, in place) are touched by that pair's threads alone,
// each vector by one thread: nothing is overwritten before it is read, whoever of the two runs in place. Each
// rank loads half a block from every peer and stores half a block into it, the bytes an out-of-place call moves.

// Reduce-scatter: block `rank` (at `rank * rank_stride` bytes) of every input, `count` elements, reduced into
// `output`.
template <typename T, ReduceOp Op>
__device__ __forceinline__ void reduce_scatter_loads(const char* const* inputs, char* output, size_t count,
                                                     size_t rank_stride, int world, int rank) {
  const char* sources[kMaxWorld];
  for (int r = 0; r < world; ++r) sources[r] = inputs[r] + rank * rank_stride;
  block_reduce<T, Op, kLoadBatch<T>>(sources, world, &output, 1, block_slice<T>(count, blockIdx.x, gridDim.x), 0, 0,
                                     world);
}

// All-reduce, two shot: shard `rank` of every input (`count` elements each) reduced into `output` and stored into
// every peer's output. A block loads its whole part before it stores any, so in place is safe.
template <typename T, ReduceOp Op>
__device__ __forceinline__ void all_reduce_two_shot_stores(const char* const* inputs, char* output,
                                                           char* const* outputs, size_t count, int world, int rank) {
  const Slice shard = block_slice<T>(count, rank, world);
  Slice part = block_slice<T>(shard.end - shard.begin, blockIdx.x, gridDim.x);
  part.begin += shard.begin;
  part.vector_end += shard.begin;
  part.end += shard.begin;
  const char* sources[kMaxWorld];
  for (int r = 0; r < world; ++r) sources[r] = inputs[r];
  block_reduce<T, Op, kLoadBatch<T>>(sources, world, &output, 1, part, 0, 0, world);
  __syncthreads();  // all loads done before any peer's output (maybe its input) is overwritten; the sums visible
  char* peers[kMaxWorld];
  int peer_count = 0;
  for (int k = 1; k < world; ++k) peers[peer_count++] = outputs[(rank + k) % world] + part.begin * sizeof(T);
  block_copy_to(peers, peer_count, output + part.begin * sizeof(T), (part.end - part.begin) * sizeof(T));
}

}  // namespace braid::kernels
