// The exchange area of braid's Hopper GEMM (matmul_sm90.hpp), on the host: its size, its flags' bytes, and where
// kEngineReduceScatter's chunks, words and products lie. The kernel (matmul_sm90.cu) reads the same layout
// through matmul_sm90_layout.hpp.
#include "kernels/matmul_sm90.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/matmul_sm90_layout.hpp"

namespace braid::kernels {
namespace {

constexpr size_t kEngineChunkRows = 1024;

// The bytes of an element of the kernel's datatypes (bf16, fp16); 0 for any other.
size_t element_bytes(DataType type) { return type == DataType::kFloat16 || type == DataType::kBFloat16 ? 2 : 0; }

}  // namespace

size_t sm90_exchange_flag_bytes(Sm90ExchangeKind kind, int world, size_t block_rows, size_t columns) {
  if (kind == Sm90ExchangeKind::kEngineReduceScatter) return 0;  // its words are control words
  const size_t row_blocks = (block_rows + kTileRows - 1) / kTileRows;
  const size_t steps = (columns + kTileK - 1) / kTileK;
  const size_t per_block = kind == Sm90ExchangeKind::kAllGather
                               ? (steps + kGatherPieceSteps - 1) / kGatherPieceSteps  // pieces of K
                               : (columns + kTileCols - 1) / kTileCols * 2;         // 64-row half-tiles
  return size_t(std::max(world - 1, 0)) * row_blocks * per_block * sizeof(uint64_t);
}

size_t sm90_exchange_bytes(Sm90ExchangeKind kind, int world, size_t block_rows, size_t columns, DataType type,
                           size_t flag_capacity) {
  const size_t element = element_bytes(type);
  const size_t blocks = size_t(std::max(world - 1, 0)) * (kind == Sm90ExchangeKind::kEngineReduceScatter ? 2 : 1);
  return kSm90ExchangeFlagsOffset + flag_capacity + blocks * block_rows * columns * element;
}

size_t sm90_engine_chunk_rows(size_t block_rows) {
  // kEngineChunkRows, or more where a block would otherwise need more than kSm90EngineMaxChunks; whole 128-row blocks.
  const size_t fewest = (block_rows + kSm90EngineMaxChunks - 1) / kSm90EngineMaxChunks;
  const size_t rows = std::max(kEngineChunkRows, (fewest + kTileRows - 1) / kTileRows * kTileRows);
  return std::min(rows, std::max(block_rows, size_t(1)));
}

size_t sm90_engine_chunks(size_t block_rows) {
  if (block_rows == 0) return 0;
  const size_t rows = sm90_engine_chunk_rows(block_rows);
  return (block_rows + rows - 1) / rows;
}

size_t sm90_engine_ready_offset(int destination, size_t chunk) {
  return kEngineReadyOffset + (size_t(destination) * kSm90EngineMaxChunks + chunk) * sizeof(uint64_t);
}

size_t sm90_engine_arrived_offset(int slot, size_t chunk) {
  return kEngineArrivedOffset + (size_t(slot) * kSm90EngineMaxChunks + chunk) * sizeof(uint64_t);
}

size_t sm90_engine_partials_offset(const Sm90Exchange& x, size_t columns, DataType type, int destination) {
  const size_t element = element_bytes(type);
  const size_t block_bytes = x.block_rows * columns * element;
  return x.received_offset + (size_t(x.world - 1) + size_t(destination)) * block_bytes;
}

uint32_t sm90_engine_ready_target(size_t chunk_rows, size_t columns) {
  // Each 128-row tile of the chunk's rows by 256 columns: 2 consumer warpgroups of 4 warps.
  return static_cast<uint32_t>((chunk_rows + kTileRows - 1) / kTileRows * ((columns + kTileCols - 1) / kTileCols) * 8);
}

}  // namespace braid::kernels
