// The autotuner's choice rule (ChooseCandidate, kernels/autotune.h) on hand-made rounds.
#include <algorithm>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/autotune.h"

namespace dequantd {
namespace {

// A candidate with block size `block` (a label) and its rounds, in microseconds.
CandidateSamples C(int block, std::vector<double> micros) {
  CandidateSamples c;
  c.config.block_size = block;
  for (double m : micros) c.seconds.push_back(m * 1e-6);
  return c;
}

TEST(ChooseCandidateTest, ClearWinnerIsChosen) {
  // The default (first) is 5% slower than the third; rounds agree within 0.1%.
  const std::vector<CandidateSamples> cs = {C(128, {105.0, 105.1, 104.9, 105.0, 105.0}),
                                            C(256, {110.0, 110.0, 110.1, 109.9, 110.0}),
                                            C(512, {100.0, 100.1, 99.9, 100.0, 100.0})};
  absl::StatusOr<CandidateChoice> c = ChooseCandidate(cs);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->index, 2u);
  EXPECT_EQ(c->fastest, 2u);
  EXPECT_NEAR(c->seconds, 100.0e-6, 1e-12);
  EXPECT_DOUBLE_EQ(c->tolerance, 0.005);  // no spread between the quartiles -> the floor
}

TEST(ChooseCandidateTest, WithinNoiseTheEarlierCandidateWins) {
  // The third is 0.2% faster by median, inside the floor tolerance (0.5%): the first stays.
  const std::vector<CandidateSamples> cs = {C(128, {100.2, 100.2, 100.3, 100.1, 100.2}),
                                            C(256, {103.0, 103.0, 103.0, 103.0, 103.0}),
                                            C(512, {100.0, 100.0, 100.1, 99.9, 100.0})};
  absl::StatusOr<CandidateChoice> c = ChooseCandidate(cs);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->fastest, 2u);
  EXPECT_EQ(c->index, 0u);
  EXPECT_NEAR(c->seconds, 100.2e-6, 1e-12);
}

// The tie rule: candidates within the noise floor (0.5%) of the fastest are ties, and a tie goes
// to the earliest in the rule-based order (DefaultConfig first), however the rounds fell.
TEST(ChooseCandidateTest, TiesGoToTheEarliestCandidateWhateverTheRounds) {
  // Rounds without spread: a challenger 0.4% faster than the default is a tie, 0.6% is a win.
  const std::vector<CandidateSamples> tie = {C(128, {100.0, 100.0, 100.0, 100.0, 100.0}),
                                             C(256, {99.6, 99.6, 99.6, 99.6, 99.6})};
  absl::StatusOr<CandidateChoice> c = ChooseCandidate(tie);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->fastest, 1u);
  EXPECT_EQ(c->index, 0u);
  EXPECT_DOUBLE_EQ(c->tolerance, 0.005);
  const std::vector<CandidateSamples> win = {C(128, {100.0, 100.0, 100.0, 100.0, 100.0}),
                                             C(256, {99.4, 99.4, 99.4, 99.4, 99.4})};
  c = ChooseCandidate(win);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->index, 1u);
  // Three within the band of the fastest (the last, 100.0): the second, 0.3% slower, is the
  // earliest tie and wins although the first is outside the band (0.7%); every permutation of
  // the rounds of every candidate gives that same choice.
  std::vector<CandidateSamples> three = {C(128, {100.6, 100.8, 100.7, 100.7, 100.9}),
                                         C(256, {100.2, 100.3, 100.4, 100.3, 100.3}),
                                         C(512, {100.0, 100.1, 99.9, 100.0, 100.0})};
  for (int shuffle = 0; shuffle < 5; ++shuffle) {
    for (CandidateSamples& s : three) {
      std::rotate(s.seconds.begin(), s.seconds.begin() + shuffle, s.seconds.end());
    }
    c = ChooseCandidate(three);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->fastest, 2u);
    EXPECT_EQ(c->index, 1u);
    EXPECT_NEAR(c->seconds, 100.3e-6, 1e-12);
  }
}

TEST(ChooseCandidateTest, ToleranceFollowsTheMeasuredSpreadUpToTheCap) {
  // The fastest's rounds spread 0.6% (IQR 99.7..100.3 over median 100): a 0.5% faster
  // challenger does not displace the earlier one, a 0.8% faster one does.
  const std::vector<CandidateSamples> close = {C(128, {100.5, 100.5, 100.5, 100.5, 100.5}),
                                               C(512, {99.7, 99.7, 100.0, 100.3, 100.3})};
  absl::StatusOr<CandidateChoice> c = ChooseCandidate(close);
  ASSERT_TRUE(c.ok());
  EXPECT_NEAR(c->tolerance, 0.006, 1e-9);
  EXPECT_EQ(c->index, 0u);
  const std::vector<CandidateSamples> apart = {C(128, {100.8, 100.8, 100.8, 100.8, 100.8}),
                                               C(512, {99.7, 99.7, 100.0, 100.3, 100.3})};
  c = ChooseCandidate(apart);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->index, 1u);
  // Very noisy rounds: the tolerance is capped at 1%, so a 2% win is kept.
  const std::vector<CandidateSamples> noisy = {C(128, {102, 102, 102, 102, 102}),
                                               C(512, {90, 95, 100, 105, 110})};
  c = ChooseCandidate(noisy);
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->tolerance, 0.01);
  EXPECT_EQ(c->index, 1u);
}

TEST(ChooseCandidateTest, OneOutlierRoundDoesNotDecide) {
  // The second candidate has one very fast (bogus) round; its median is still slower.
  const std::vector<CandidateSamples> cs = {C(128, {100, 100, 100, 100, 100}),
                                            C(256, {50, 101, 101, 101, 101})};
  absl::StatusOr<CandidateChoice> c = ChooseCandidate(cs);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->index, 0u);
  EXPECT_EQ(c->fastest, 0u);
}

TEST(ChooseCandidateTest, SameRoundsGiveTheSameChoiceWhateverTheOrderOfRounds) {
  std::vector<CandidateSamples> cs = {C(128, {100.1, 100.4, 99.9, 100.2, 100.0}),
                                      C(256, {99.9, 100.3, 100.0, 100.1, 99.8})};
  absl::StatusOr<CandidateChoice> a = ChooseCandidate(cs);
  std::reverse(cs[0].seconds.begin(), cs[0].seconds.end());
  std::reverse(cs[1].seconds.begin(), cs[1].seconds.end());
  absl::StatusOr<CandidateChoice> b = ChooseCandidate(cs);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->index, b->index);
  EXPECT_EQ(a->index, 0u);  // 0.1% apart: a tie, the earlier one
}

TEST(ChooseCandidateTest, BadInputIsInvalidArgument) {
  EXPECT_EQ(ChooseCandidate({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseCandidate(std::vector<CandidateSamples>{C(128, {})}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status zero =
      ChooseCandidate(std::vector<CandidateSamples>{C(128, {1.0, 0.0})}).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("block=128"), std::string::npos) << zero;
}

TEST(MedianTest, OddAndEvenCounts) {
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(Median({7}), 7);
}

}  // namespace
}  // namespace dequantd
