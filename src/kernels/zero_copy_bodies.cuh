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
