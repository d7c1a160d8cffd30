// Plan words (collectives/plan.hpp), which ranks compare to agree on a call (no GPU needed): the same call with
// the same buffers gives the same word on every rank, anything a rank may choose differently gives another
// word, and the description names what the word encodes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "braid/types.hpp"
#include "braid/device/sync_device.hpp"
#include "collectives/plan.hpp"
#include "kernels/announced_launch.hpp"

namespace braid {
namespace {

using collectives::describe_plan;
using collectives::exchange_plan_word;
using collectives::ExchangedBuffer;
using collectives::plan_word;
using collectives::PlanArguments;

PlanArguments one_shot() {
  PlanArguments plan{};
  plan.collective = Collective::kAllReduce;
  plan.algorithm = Algorithm::kOneShot;
  plan.zero_copy = false;
  plan.blocks = 32;
  plan.count = 262144;
  plan.type = static_cast<uint64_t>(DataType::kBFloat16);
  plan.op = static_cast<uint64_t>(ReduceOp::kSum);
  plan.root = -1;
  return plan;
}

TEST(PlanWord, TheSameCallGivesTheSameWordAndNeverZero) {
  EXPECT_EQ(plan_word(one_shot()), plan_word(one_shot()));
  EXPECT_NE(plan_word(one_shot()), 0u);
  PlanArguments empty{};  // every field zero still announces a plan
  EXPECT_NE(plan_word(empty), 0u);
}

TEST(PlanWord, EverythingARankMayChooseDifferentlyChangesTheWord) {
  const uint64_t base = plan_word(one_shot());
  std::vector<PlanArguments> variants(12, one_shot());
  variants[0].algorithm = Algorithm::kTwoShot;
  variants[1].zero_copy = true;
  variants[2].blocks = 16;
  variants[3].count = 262145;
  variants[4].type = static_cast<uint64_t>(DataType::kFloat16);
  variants[5].op = static_cast<uint64_t>(ReduceOp::kMax);
  variants[6].root = 0;
  variants[7].send_identity = 0x1234;
  variants[8].recv_identity = 0x1234;
  variants[9].collective = Collective::kReduce;
  variants[10].announced = true;
  variants[11].in_place = true;
  std::vector<uint64_t> words{base};
  for (const PlanArguments& variant : variants) {
    const uint64_t word = plan_word(variant);
    for (const uint64_t seen : words) EXPECT_NE(word, seen);
    words.push_back(word);
  }
  // Unequal offsets of the same symmetric allocation: another send identity, another word.
  PlanArguments a = one_shot(), b = one_shot();
  a.zero_copy = b.zero_copy = true;
  a.send_identity = 0xA;
  b.send_identity = 0xB;
  EXPECT_NE(plan_word(a), plan_word(b));
}

TEST(PlanWord, TheDescriptionNamesCollectiveAlgorithmBuffersAndBlocks) {
  PlanArguments zero_copy = one_shot();
  zero_copy.algorithm = Algorithm::kTwoShot;
  zero_copy.zero_copy = true;
  const std::string staged = describe_plan(plan_word(one_shot()));
  const std::string direct = describe_plan(plan_word(zero_copy));
  EXPECT_NE(staged.find(collective_name(static_cast<unsigned int>(Collective::kAllReduce))), std::string::npos) << staged;
  EXPECT_NE(staged.find(algorithm_name(Algorithm::kOneShot)), std::string::npos) << staged;
  EXPECT_EQ(staged.find("zero copy"), std::string::npos) << staged;
  EXPECT_NE(staged.find("32 blocks"), std::string::npos) << staged;
  EXPECT_NE(direct.find(algorithm_name(Algorithm::kTwoShot)), std::string::npos) << direct;
  EXPECT_NE(direct.find("zero copy"), std::string::npos) << direct;
  EXPECT_NE(describe_plan(0).find("no plan"), std::string::npos);
}

// The barrier before a registered buffer's first use: never the plan of a call's kernels (a rank that runs
// them instead must fail), the same for the same call, another one for the other buffer or size, and said so.
TEST(PlanWord, TheFirstUseOfARegisteredBufferHasAPlanOfItsOwn) {
  const uint64_t send = exchange_plan_word(Collective::kAllReduce, ExchangedBuffer::kSend, 1 << 20);
  EXPECT_EQ(send, exchange_plan_word(Collective::kAllReduce, ExchangedBuffer::kSend, 1 << 20));
  EXPECT_NE(send, exchange_plan_word(Collective::kAllReduce, ExchangedBuffer::kRecv, 1 << 20));
  EXPECT_NE(send, exchange_plan_word(Collective::kAllReduce, ExchangedBuffer::kSend, 2 << 20));
  EXPECT_NE(send, exchange_plan_word(Collective::kAllGather, ExchangedBuffer::kSend, 1 << 20));
  for (const Algorithm algorithm : {Algorithm::kLL, Algorithm::kOneShot, Algorithm::kTwoShot, Algorithm::kPipelined,
                                    Algorithm::kStaged, Algorithm::kCopyEngine, Algorithm::kMulticast,
                                    Algorithm::kSplit}) {
    PlanArguments call = one_shot();
    call.algorithm = algorithm;
    EXPECT_NE(plan_word(call) >> 60, send >> 60) << algorithm_name(algorithm);
  }
  const std::string said = describe_plan(send);
  EXPECT_NE(said.find("registered send buffer"), std::string::npos) << said;
  EXPECT_NE(said.find(collective_name(static_cast<unsigned int>(Collective::kAllReduce))), std::string::npos) << said;
  EXPECT_NE(describe_plan(exchange_plan_word(Collective::kAllReduce, ExchangedBuffer::kRecv, 8)).find("recv"),
            std::string::npos);
}

// A stopped rank (after any failure) answers its peers' barriers with kStoppedPlan: no call's word, named as what
// it is.
TEST(PlanWord, TheStoppedPlanIsNoCallsPlan) {
  for (const Algorithm algorithm : {Algorithm::kLL, Algorithm::kOneShot, Algorithm::kTwoShot, Algorithm::kPipelined,
                                    Algorithm::kStaged, Algorithm::kCopyEngine, Algorithm::kMulticast,
                                    Algorithm::kSplit}) {
    PlanArguments call = one_shot();
    call.algorithm = algorithm;
    call.collective = Collective::kSendRecv;
    call.blocks = 127;
    EXPECT_NE(plan_word(call), device::kStoppedPlan) << algorithm_name(algorithm);
    EXPECT_NE(plan_word(call) >> 56, device::kStoppedPlan >> 56) << algorithm_name(algorithm);
  }
  EXPECT_NE(exchange_plan_word(Collective::kSendRecv, ExchangedBuffer::kRecv, 1) >> 56, device::kStoppedPlan >> 56);
  EXPECT_NE(describe_plan(device::kStoppedPlan).find("stopped after a failure of its own"), std::string::npos);
}

// What an announcing kernel's block writes for its buffer (kernels/announced_launch.hpp): the id above the offset's
// 40 bits, and "staged" wherever either would not fit or there is no exposure, never a word a range could have.
TEST(Announcement, PacksTheIdAboveTheOffsetAndIsStagedWhereEitherDoesNotFit) {
  using kernels::announcement;
  using kernels::kAnnouncedOffsetBits;
  using kernels::kAnnouncedStaged;
  const uint64_t word = announcement(7, 0x12345);
  EXPECT_EQ(word >> kAnnouncedOffsetBits, 7u);
  EXPECT_EQ(word & kernels::kAnnouncedOffsetMask, 0x12345u);
  EXPECT_NE(announcement(1, 0), kAnnouncedStaged) << "the first exposure at offset 0 is no staged word";
  EXPECT_EQ(announcement(0, 16), kAnnouncedStaged) << "id 0 is no exposure";
  EXPECT_EQ(announcement(kernels::kMaxAnnouncedId + 1, 0), kAnnouncedStaged);
  EXPECT_EQ(announcement(1, kernels::kAnnouncedOffsetMask + 1), kAnnouncedStaged);
  EXPECT_EQ(announcement(kernels::kMaxAnnouncedId, kernels::kAnnouncedOffsetMask) >> kAnnouncedOffsetBits,
            kernels::kMaxAnnouncedId);
}

}  // namespace
}  // namespace braid
