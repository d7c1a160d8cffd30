// Splitting a call's elements between the blocks of a launch, in whole vectors with the last block taking the
// scalar tail: the same on every rank, host and device alike (the CPU tests check the arithmetic).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace braid::kernels {

struct Slice {
  size_t begin;  // elements
  size_t end;
  size_t vector_end;  // [vector_end, end): the scalar tail
};

// Block `block` of `blocks`' part of `count` elements, `per_vector` to a vector.
__host__ __device__ __forceinline__ Slice split_elements(size_t count, int block, int blocks, size_t per_vector) {
  const size_t vectors = count / per_vector;
  const size_t base = vectors / blocks, extra = vectors % blocks;
  const size_t b = static_cast<size_t>(block);
  const size_t first = b * base + (b < extra ? b : extra);
  const size_t mine = base + (b < extra ? 1 : 0);
  Slice slice;
  slice.begin = first * per_vector;
  slice.vector_end = slice.begin + mine * per_vector;
  slice.end = block == blocks - 1 ? count : slice.vector_end;
  return slice;
}

// `full` (a block's part of a split of more elements) clipped to the first `count`: the block keeps only elements
// of its own part, and the scalar tail goes to the block whose vectors reach it (the last block where none does).
// Over every block the clipped parts cover [0, count) once.
__host__ __device__ __forceinline__ Slice clip_slice(const Slice& full, size_t count, bool last_block, size_t per_vector) {
  const size_t vectors_end = count / per_vector * per_vector;
  const bool tail = (full.begin <= vectors_end && vectors_end < full.vector_end) || last_block;
  Slice part;
  part.begin = full.begin < count ? full.begin : count;
  part.vector_end = full.vector_end < vectors_end ? full.vector_end : vectors_end;
  if (part.vector_end < part.begin) part.vector_end = part.begin;
  part.end = tail ? count : part.vector_end;
  return part;
}

}  // namespace braid::kernels
