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

}  // namespace
}  // namespace braid::kernels
