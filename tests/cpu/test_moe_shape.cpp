// MoE shape classes without a GPU: the worst-case receive rows, what a shape costs in symmetric memory, and
// bad shapes refused naming the field.
#include <gtest/gtest.h>

#include <string>

#include "braid/moe.hpp"
#include "core/limits.hpp"
#include "kernels/moe_launch.hpp"

namespace braid {
namespace {

MoeShape deepseek_like() {
  MoeShape shape;
  shape.hidden = 7168;
  shape.type = DataType::kBFloat16;
  shape.max_tokens = 4096;
  shape.top_k = 8;
  shape.experts = 64;
  return shape;
}

TEST(MoeShape, WorstCaseRowsIsEveryTokenOfEveryRankOnOneRankPlusPadding) {
  MoeShape shape = deepseek_like();
  // 4 ranks, 16 experts each: a token brings at most min(K, 16) = 8 rows to one rank.
  EXPECT_EQ(MoeBuffer::worst_case_rows(shape, 4), size_t(4) * 4096 * 8);
  shape.expert_alignment = 128;
  EXPECT_EQ(MoeBuffer::worst_case_rows(shape, 4), size_t(4) * 4096 * 8 + 16 * 127);
  // 16 ranks, 4 experts each: at most 4 rows a token, however large K is.
  shape.expert_alignment = 1;
  EXPECT_EQ(MoeBuffer::worst_case_rows(shape, 16), size_t(16) * 4096 * 4);
}

TEST(MoeShape, SymmetricBytesAreDominatedByTheRowsAndTheCombineArea) {
  MoeShape shape = deepseek_like();
  const size_t row_bytes = 7168 * 2;
  const size_t rows = MoeBuffer::worst_case_rows(shape, 4);
  const size_t bytes = MoeBuffer::symmetric_bytes(shape, 4);
  const size_t dominant = rows * row_bytes + size_t(4) * 4096 * row_bytes;
  EXPECT_GE(bytes, dominant);
  EXPECT_LE(bytes, dominant + dominant / 50);  // metadata is a few percent at most
  // A smaller capacity shrinks it.
  shape.capacity_rows = rows / 4;
  EXPECT_LT(MoeBuffer::symmetric_bytes(shape, 4), bytes);
}

TEST(MoeShape, Fp8DispatchHalvesTheReceiveRowsAndAddsTheirScales) {
  const MoeShape bf16 = deepseek_like();
  MoeShape fp8 = bf16;
  fp8.dispatch_type = DataType::kFloat8E4M3;
  const size_t rows = MoeBuffer::worst_case_rows(bf16, 4);
  EXPECT_EQ(MoeBuffer::worst_case_rows(fp8, 4), rows);
  // Rows of 7168 bytes instead of 14336, plus 56 float32 scales each; the combine area stays bf16. Each piece is
  // carved 256-byte aligned, so the two may differ by a few hundred bytes more.
  const size_t saved = rows * 7168 - rows * (7168 / kMoeScaleColumns) * sizeof(float);
  const size_t difference = MoeBuffer::symmetric_bytes(bf16, 4) - MoeBuffer::symmetric_bytes(fp8, 4);
  EXPECT_NEAR(static_cast<double>(difference), static_cast<double>(saved), 512.0);
  MoeShape e5m2 = fp8;
  e5m2.dispatch_type = DataType::kFloat8E5M2;
  EXPECT_EQ(MoeBuffer::symmetric_bytes(e5m2, 4), MoeBuffer::symmetric_bytes(fp8, 4));
}

void expect_refused(MoeShape shape, const std::string& field) {
  try {
    MoeBuffer::symmetric_bytes(shape, 4);
    ADD_FAILURE() << "accepted a bad " << field;
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("'shape." + field + "'"), std::string::npos) << error.what();
  }
}

TEST(MoeShape, BadShapesAreRefusedNamingTheField) {
  MoeShape shape = deepseek_like();
  shape.hidden = 0;
  expect_refused(shape, "hidden");
  shape = deepseek_like();
  shape.type = DataType::kInt32;
  expect_refused(shape, "type");
  shape = deepseek_like();
  shape.index_type = DataType::kFloat32;
  expect_refused(shape, "index_type");
  shape = deepseek_like();
  shape.max_tokens = 0;
  expect_refused(shape, "max_tokens");
  shape = deepseek_like();
  shape.top_k = 0;
  expect_refused(shape, "top_k");
  shape.top_k = kMaxTopK + 1;
  expect_refused(shape, "top_k");
  shape = deepseek_like();
  shape.experts = 62;  // not a multiple of 4
  expect_refused(shape, "experts");
  shape = deepseek_like();
  shape.expert_alignment = 0;
  expect_refused(shape, "expert_alignment");
  shape = deepseek_like();
  shape.dispatch_type = DataType::kBFloat16;  // set only for fp8
  expect_refused(shape, "dispatch_type");
  shape.dispatch_type = DataType::kInt8;
  expect_refused(shape, "dispatch_type");
  shape = deepseek_like();
  shape.dispatch_type = DataType::kFloat8E4M3;
  shape.hidden = 7168 + 64;  // not a multiple of the 128 columns a scale covers
  expect_refused(shape, "hidden");
  shape = deepseek_like();
  shape.capacity_rows = size_t(1) << 31;  // past the 32-bit row index
  expect_refused(shape, "capacity_rows");
  shape = deepseek_like();
  shape.max_tokens = size_t(1) << 30;  // the worst case it implies is past the 32-bit row index
  expect_refused(shape, "max_tokens");
  shape = deepseek_like();
  shape.layout = MoeLayout::kRankMajor;
  shape.expert_alignment = 128;  // no expert blocks to align
  expect_refused(shape, "expert_alignment");
  shape.expert_alignment = 1;
  shape.capacity_rows = 1000;  // always world * max_tokens rows
  expect_refused(shape, "capacity_rows");
  shape.capacity_rows = 0;
  shape.layout = static_cast<MoeLayout>(5);
  expect_refused(shape, "layout");
  shape = deepseek_like();
  shape.max_sms = -1;
  expect_refused(shape, "max_sms");
  shape = deepseek_like();
  shape.low_latency = true;  // fixed rows are rank-major's
  expect_refused(shape, "low_latency");
}

void expect_refused_naming(const MoeShape& shape, int world, const std::string& argument) {
  try {
    MoeBuffer::symmetric_bytes(shape, world);
    ADD_FAILURE() << "accepted world " << world << "; expected '" << argument << "' refused";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_NE(std::string(error.what()).find("MoeBuffer::symmetric_bytes: argument '" + argument + "'"), std::string::npos)
        << error.what();
  }
}

TEST(MoeShape, AWorldOutsideOneToSixteenRanksIsRefusedNamingIt) {
  const MoeShape shape = deepseek_like();  // 64 experts: a multiple of every world tried
  for (const int world : {0, -1, -4, kMaxWorld + 1, 64}) expect_refused_naming(shape, world, "world");
  EXPECT_GT(MoeBuffer::symmetric_bytes(shape, 1), 0u);
  EXPECT_GT(MoeBuffer::symmetric_bytes(shape, kMaxWorld), 0u);
}

// Every piece below SIZE_MAX / 2 bytes, their sum past SIZE_MAX: the rows and the combine area of one token.
TEST(MoeShape, ByteSizesWhoseSumWrapsAreRefusedNamingHidden) {
  for (const MoeLayout layout : {MoeLayout::kExpertMajor, MoeLayout::kRankMajor}) {
    MoeShape shape;
    shape.hidden = (size_t(1) << 62) - 1;  // bf16 rows of 2^63 - 2 bytes
    shape.max_tokens = 1;
    shape.top_k = 1;
    shape.experts = 16;
    shape.layout = layout;
    expect_refused_naming(shape, 1, "shape.hidden");
    // A quarter as wide: the rows and the combine area, 2^61 bytes each, fit.
    shape.hidden = size_t(1) << 60;
    EXPECT_GE(MoeBuffer::symmetric_bytes(shape, 1), size_t(1) << 62);
  }
}

TEST(MoeShape, RowsPastTheIndexAreBlamedOnTheAlignmentWhenItsPaddingAloneIsTooMany) {
  MoeShape shape = deepseek_like();
  shape.expert_alignment = 1 << 28;  // 16 local experts on 4 ranks: 16 * (2^28 - 1) padding rows, past 2^31 - 1
  expect_refused_naming(shape, 4, "shape.expert_alignment");
  shape.max_tokens = 1;  // no max_tokens makes it fit
  expect_refused_naming(shape, 4, "shape.expert_alignment");
  // Padding that fits with fewer tokens: max_tokens is to blame.
  shape.expert_alignment = 128;
  shape.max_tokens = size_t(1) << 30;
  expect_refused_naming(shape, 4, "shape.max_tokens");
}

TEST(MoeShape, RankMajorHoldsEveryTokenOfEveryRankOnceAndAsMuchCombineInput) {
  MoeShape shape = deepseek_like();
  shape.layout = MoeLayout::kRankMajor;
  EXPECT_EQ(MoeBuffer::worst_case_rows(shape, 4), size_t(4) * 4096);
  EXPECT_EQ(MoeBuffer::worst_case_rows(shape, 16), size_t(16) * 4096);
  // The rows and the combine input, a row per (source, token) each, dominate; top_k experts and weights per row
  // and the small pieces add the rest.
  const size_t row_bytes = 7168 * 2, rows = size_t(4) * 4096;
  const size_t bytes = MoeBuffer::symmetric_bytes(shape, 4);
  const size_t dominant = 2 * rows * row_bytes;
  EXPECT_GE(bytes, dominant + rows * 8 * 8);
  EXPECT_LE(bytes, dominant + dominant / 50);
  // A fraction of the expert-major worst case (a token once per rank, not once per expert).
  MoeShape expert_major = deepseek_like();
  EXPECT_LT(bytes, MoeBuffer::symmetric_bytes(expert_major, 4) / 3);
  // Fixed rows take the same rows.
  shape.low_latency = true;
  EXPECT_EQ(MoeBuffer::symmetric_bytes(shape, 4), bytes);
  EXPECT_EQ(MoeBuffer::worst_case_rows(shape, 4), size_t(4) * 4096);
  // A decode-sized low-latency buffer adds a line area: two parities of a slot per (source, token) of 128-byte
  // lines (120 payload bytes each: one of metadata, then the row; 121 lines, rounded up to 124) and a T line per
  // source.
  shape.max_tokens = 128;
  const size_t decode_bytes = MoeBuffer::symmetric_bytes(shape, 4);
  shape.low_latency = false;
  EXPECT_EQ(decode_bytes, MoeBuffer::symmetric_bytes(shape, 4) + 2 * size_t(4) * 128 * 124 * 128 + 2 * 4 * 128);
}

}  // namespace
TEST(MoeShape, DecodeBuffersTakeFewerMultiprocessorsUnlessTheShapeNamesABudget) {
  MoeShape shape;
  shape.layout = MoeLayout::kRankMajor;
  shape.max_tokens = 128;
  EXPECT_EQ(kernels::moe::moe_sms(shape, 132), kernels::moe::kDecodeSms);
  EXPECT_EQ(kernels::moe::moe_sms(shape, 40), 40);  // never more than the GPU has
  shape.max_tokens = kernels::moe::kDecodeTokens + 1;
  EXPECT_EQ(kernels::moe::moe_sms(shape, 132), 132);  // a training-sized buffer takes every one
  shape.max_tokens = 128;
  shape.layout = MoeLayout::kExpertMajor;
  EXPECT_EQ(kernels::moe::moe_sms(shape, 132), 132);
  shape.max_sms = 16;
  EXPECT_EQ(kernels::moe::moe_sms(shape, 132), 16);  // a budget the shape names wins
  shape.layout = MoeLayout::kRankMajor;
  shape.max_sms = 100;
  EXPECT_EQ(kernels::moe::moe_sms(shape, 132), 100);
  shape.max_sms = 200;
  EXPECT_EQ(kernels::moe::moe_sms(shape, 132), 132);
}

}  // namespace braid
