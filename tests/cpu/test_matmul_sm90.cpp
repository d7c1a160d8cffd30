// Which GEMMs braid's Hopper kernel takes (kernels/matmul_sm90.hpp): the fused calls offer it as a candidate only
// for those, and leave the rest to cuBLASLt.
#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/matmul_sm90.hpp"

namespace braid::kernels {
namespace {

alignas(16) unsigned char g_memory[256];

Sm90Matmul taken() {
  Sm90Matmul m;
  m.type = DataType::kBFloat16;
  m.rows = 1000;
  m.k = 520;
  m.n = 264;
  m.a = g_memory;
  m.b = g_memory + 16;
  m.c = nullptr;
  m.d = g_memory + 32;
  return m;
}

TEST(Sm90Matmul, TakesBf16AndFp16WithKAndNMultiplesOf8) {
  Sm90Matmul m = taken();
  EXPECT_TRUE(sm90_matmul_supports(m));
  m.type = DataType::kFloat16;
  EXPECT_TRUE(sm90_matmul_supports(m));
  m.rows = 1;
  m.k = 8;
  m.n = 8;
  EXPECT_TRUE(sm90_matmul_supports(m));
  m.c = g_memory + 48;
  m.multiprocessors = 2;
  EXPECT_TRUE(sm90_matmul_supports(m));
}

TEST(Sm90Matmul, LeavesOtherTypesShapesAndAlignmentsToCublasLt) {
  auto refused = [](void (*change)(Sm90Matmul&)) {
    Sm90Matmul m = taken();
    change(m);
    return !sm90_matmul_supports(m);
  };
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.type = DataType::kFloat32; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.type = DataType::kFloat8E4M3; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.k = 516; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.n = 260; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.rows = 0; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.k = 0; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.n = 0; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.rows = size_t(1) << 30; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.a = g_memory + 8; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.b = g_memory + 2; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.c = g_memory + 4; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.d = g_memory + 34; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.multiprocessors = 1; }));  // a cluster is two blocks
}

// A reduce-scatter in the epilogue: 3 ranks of 384 rows, the exchange area laid out for that shape.
Sm90Matmul exchanged() {
  static uint8_t* const peers[3] = {g_memory, g_memory, g_memory};
  Sm90Matmul m = taken();
  m.rows = 3 * 384;
  m.exchange.world = 3;
  m.exchange.rank = 1;
  m.exchange.block_rows = 384;
  m.exchange.local = g_memory;
  m.exchange.peers = peers;
  m.exchange.host_peers = peers;
  m.exchange.received_offset =
      kSm90ExchangeFlagsOffset + sm90_exchange_flag_bytes(Sm90ExchangeKind::kReduceScatter, 3, 384, m.n);
  static device::ErrorWord error{};
  m.exchange.pad.error = &error;
  m.exchange.pad.timeout_ns = 1'000'000'000;
  return m;
}

// An all-gather under the loads: 3 ranks of 384 rows, this rank's block as A, the exchange area laid out for that
// shape (the received rows are rows of A, k wide).
Sm90Matmul gathering() {
  Sm90Matmul m = exchanged();
  m.exchange.kind = Sm90ExchangeKind::kAllGather;
  m.exchange.received_offset =
      kSm90ExchangeFlagsOffset + sm90_exchange_flag_bytes(Sm90ExchangeKind::kAllGather, 3, 384, m.k);
  m.exchange.gathered = g_memory + 64;
  return m;
}

TEST(Sm90Matmul, ExchangeAreaHoldsAFlagPerHalfTileAndTheReceivedBlocks) {
  constexpr Sm90ExchangeKind kReduceScatter = Sm90ExchangeKind::kReduceScatter;
  // 3 row tiles x 2 column tiles (264 columns), 2 halves each, from each of 2 peers.
  EXPECT_EQ(sm90_exchange_flag_bytes(kReduceScatter, 3, 384, 264), 2u * 3 * 2 * 2 * sizeof(uint64_t));
  EXPECT_EQ(sm90_exchange_flag_bytes(kReduceScatter, 2, 128, 8), 2u * sizeof(uint64_t));
  EXPECT_EQ(sm90_exchange_bytes(Sm90ExchangeKind::kReduceScatter, 3, 384, 264, DataType::kBFloat16, 4096),
            kSm90ExchangeFlagsOffset + 4096 + 2u * 384 * 264 * 2);
}

TEST(Sm90Matmul, AllGatherAreaHoldsAFlagPerPieceOfKAndTheReceivedRows) {
  constexpr Sm90ExchangeKind kAllGather = Sm90ExchangeKind::kAllGather;
  // A piece is 128 rows x 8 steps of 64 columns of K: 3 row tiles x 2 pieces (520 columns: 9 steps), from each of 2
  // peers; K of 8 (one step) is one piece.
  EXPECT_EQ(sm90_exchange_flag_bytes(kAllGather, 3, 384, 520), 2u * 3 * 2 * sizeof(uint64_t));
  EXPECT_EQ(sm90_exchange_flag_bytes(kAllGather, 3, 384, 512), 2u * 3 * 1 * sizeof(uint64_t));
  EXPECT_EQ(sm90_exchange_flag_bytes(kAllGather, 2, 128, 8), 1u * sizeof(uint64_t));
  EXPECT_EQ(sm90_exchange_flag_bytes(kAllGather, 8, 256, 4096), 7u * 2 * 8 * sizeof(uint64_t));
}

// The reduce-scatter by the copy engines: its words among the control words (no flags), the received blocks and
// this rank's products for its peers, chunks of 1024 rows (more where a block would need more than the most
// chunks), and a ready count of 8 warps a 128 x 256 tile.
TEST(Sm90Matmul, EngineReduceScatterAreaHoldsTheReceivedAndSentBlocks) {
  constexpr Sm90ExchangeKind kEngines = Sm90ExchangeKind::kEngineReduceScatter;
  EXPECT_EQ(sm90_exchange_flag_bytes(kEngines, 3, 384, 264), 0u);
  EXPECT_EQ(sm90_exchange_bytes(kEngines, 3, 384, 264, DataType::kBFloat16, 4096),
            kSm90ExchangeFlagsOffset + 4096 + 2u * 2 * 384 * 264 * 2);
  EXPECT_EQ(sm90_engine_chunk_rows(2048), 1024u);
  EXPECT_EQ(sm90_engine_chunks(2048), 2u);
  EXPECT_EQ(sm90_engine_chunk_rows(384), 384u);
  EXPECT_EQ(sm90_engine_chunks(384), 1u);
  EXPECT_EQ(sm90_engine_chunks(1536), 2u);  // 1024 rows, then 512
  EXPECT_EQ(sm90_engine_chunk_rows(size_t(1) << 16), 4096u);
  EXPECT_EQ(sm90_engine_chunks(size_t(1) << 16), kSm90EngineMaxChunks);
  EXPECT_LE(sm90_engine_chunks((size_t(1) << 16) + 128), kSm90EngineMaxChunks);
  EXPECT_EQ(sm90_engine_chunk_rows((size_t(1) << 16) + 128) % 128, 0u);
  EXPECT_EQ(sm90_engine_ready_target(1024, 4096), 8u * 16 * 8);
  EXPECT_EQ(sm90_engine_ready_target(128, 264), 8u * 1 * 2);
  // The counts and flags of every peer and chunk lie among the control words, apart from each other.
  const size_t last_ready = sm90_engine_ready_offset(kSm90ExchangeMaxWorld - 2, kSm90EngineMaxChunks - 1);
  EXPECT_LT(last_ready, sm90_engine_arrived_offset(0, 0));
  EXPECT_LE(sm90_engine_arrived_offset(kSm90ExchangeMaxWorld - 2, kSm90EngineMaxChunks - 1) + sizeof(uint64_t),
            kSm90ExchangeFlagsOffset);
  Sm90Matmul m = exchanged();
  m.exchange.kind = kEngines;
  EXPECT_TRUE(sm90_matmul_supports(m));
  EXPECT_EQ(sm90_engine_partials_offset(m.exchange, m.n, m.type, 1),
            m.exchange.received_offset + 3u * 384 * m.n * 2);
}

TEST(Sm90Matmul, TakesAnAllGatherWithItsOwnRowsAsA) {
  EXPECT_TRUE(sm90_matmul_supports(gathering()));
  {
    Sm90Matmul m = gathering();
    m.exchange.gathered = nullptr;  // the gathered A is optional
    EXPECT_TRUE(sm90_matmul_supports(m));
  }
  auto refused = [](void (*change)(Sm90Matmul&)) {
    Sm90Matmul m = gathering();
    change(m);
    return !sm90_matmul_supports(m);
  };
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.gathered = g_memory + 72; }));  // not 16-byte aligned
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.received_offset -= 8; }));      // flags would overlap the rows
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.kind = static_cast<Sm90ExchangeKind>(7); }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.c = g_memory + 48; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.rows = 2 * 384; }));  // rows != world x block_rows
  EXPECT_TRUE(refused([](Sm90Matmul& m) {  // a gathered A is an all-gather's only
    m.exchange.kind = Sm90ExchangeKind::kReduceScatter;
    m.exchange.received_offset =
        kSm90ExchangeFlagsOffset + sm90_exchange_flag_bytes(Sm90ExchangeKind::kReduceScatter, 3, 384, m.n);
  }));
}

TEST(Sm90Matmul, TakesAnExchangeOfWholeRowTilesWithoutC) {
  EXPECT_TRUE(sm90_matmul_supports(exchanged()));
  auto refused = [](void (*change)(Sm90Matmul&)) {
    Sm90Matmul m = exchanged();
    change(m);
    return !sm90_matmul_supports(m);
  };
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.world = 1; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.world = kSm90ExchangeMaxWorld + 1; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.rank = 3; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.rank = -1; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) {  // rows per rank not a multiple of 128
    m.exchange.block_rows = 320;
    m.rows = 3 * 320;
  }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.rows = 2 * 384; }));  // rows != world x block_rows
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.c = g_memory + 48; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.local = nullptr; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.peers = nullptr; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.host_peers = nullptr; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.received_offset -= 16; }));  // flags would overlap the rows
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.received_offset += 8; }));
  EXPECT_TRUE(refused([](Sm90Matmul& m) { m.exchange.pad.error = nullptr; }));  // waits report and stop there
}

}  // namespace
}  // namespace braid::kernels
