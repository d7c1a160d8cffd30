// AlgorithmTrials (overlap/algorithm_trials.hpp): which cuBLASLt candidate each run of a GEMM shape tries, and which
// one the shape keeps (NOTE [GEMM algorithm choice]).
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "overlap/algorithm_trials.hpp"

namespace braid::detail {
namespace {

// Starts every trial next() offers and returns the candidates in the order offered.
std::vector<int> start_all(AlgorithmTrials& trials) {
  std::vector<int> order;
  for (int candidate = trials.next(); candidate >= 0; candidate = trials.next()) {
    trials.started(candidate);
    order.push_back(candidate);
  }
  return order;
}

TEST(AlgorithmTrials, OffersEachCandidateInTurnUntilEveryOneHasItsSamplesInFlight) {
  AlgorithmTrials trials(4, 3);
  EXPECT_FALSE(trials.settled());
  EXPECT_EQ(trials.chosen(), 0);
  EXPECT_EQ(start_all(trials), (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(trials.next(), -1);   // 12 in flight: no more until they are read
  EXPECT_FALSE(trials.settle());  // nothing read yet
  EXPECT_EQ(trials.chosen(), 0);
}

TEST(AlgorithmTrials, KeepsTheLowestMedianOnceEveryCandidateIsRead) {
  AlgorithmTrials trials(3, 3);
  start_all(trials);
  // Candidate 1 has the lowest median though candidate 2 has the single fastest run; candidate 0 is in between.
  const float times[3][3] = {{2.0f, 2.1f, 2.2f}, {1.5f, 9.0f, 1.6f}, {1.0f, 3.0f, 3.1f}};
  for (int c = 0; c < 3; ++c) {
    for (int s = 0; s < 2; ++s) trials.finished(c, times[c][s]);
  }
  EXPECT_FALSE(trials.settle());  // one run of each still in flight
  EXPECT_EQ(trials.next(), -1);
  for (int c = 0; c < 3; ++c) trials.finished(c, times[c][2]);
  EXPECT_TRUE(trials.settle());
  EXPECT_TRUE(trials.settled());
  EXPECT_EQ(trials.chosen(), 1);
  EXPECT_EQ(trials.next(), -1);
  EXPECT_EQ(trials.medians_us(), "2100000.0 1600000.0 3000000.0");
}

TEST(AlgorithmTrials, OnATieTheEarlierCandidateStays) {
  AlgorithmTrials trials(2, 1);
  start_all(trials);
  trials.finished(1, 5e-6f);
  trials.finished(0, 5e-6f);
  EXPECT_TRUE(trials.settle());
  EXPECT_EQ(trials.chosen(), 0);
}

TEST(AlgorithmTrials, ARefusedCandidateIsNeitherTriedAgainNorKept) {
  AlgorithmTrials trials(3, 2);
  EXPECT_EQ(trials.next(), 0);
  trials.started(0);
  EXPECT_EQ(trials.next(), 1);
  trials.refused(1);
  EXPECT_EQ(start_all(trials), (std::vector<int>{2, 0, 2}));
  trials.finished(0, 3e-6f);
  trials.finished(0, 3e-6f);
  trials.finished(2, 4e-6f);
  trials.finished(2, 4e-6f);
  EXPECT_TRUE(trials.settle());  // settles without the refused one's times
  EXPECT_EQ(trials.chosen(), 0);
  EXPECT_EQ(trials.medians_us(), "3.0 - 4.0");
  EXPECT_THROW(trials.refused(0), std::logic_error);
}

TEST(AlgorithmTrials, OneCandidateOrNoSamplesIsSettledFromTheStart) {
  AlgorithmTrials one(1, 3);
  EXPECT_TRUE(one.settled());
  EXPECT_EQ(one.next(), -1);
  EXPECT_EQ(one.chosen(), 0);
  AlgorithmTrials none(4, 0);
  EXPECT_TRUE(none.settled());
  EXPECT_EQ(none.next(), -1);
}

TEST(AlgorithmTrials, AFinishedTrialThatNeverStartedIsALogicError) {
  AlgorithmTrials trials(2, 1);
  EXPECT_THROW(trials.finished(1, 1.0f), std::logic_error);
  EXPECT_THROW(trials.started(2), std::out_of_range);
}

}  // namespace
}  // namespace braid::detail
