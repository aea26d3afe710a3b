// --step-batch-size-schedule (train/batch_schedule.h) against Megatron's
// StepBatchsizeNumMicroBatchesCalculator, written out here step by step: the parse (suffixes,
// commas, tokens to samples by floor division, sorting), the batch of a step, the consumed
// samples after n steps and Megatron's update_train_iters loop, each against a plain loop over
// the steps; the checks (first threshold 0, increasing thresholds, positive and non-decreasing
// batch sizes, divisibility of the batches a run reaches, and only those), each naming the flag.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "weft/core/error.h"
#include "weft/train/batch_schedule.h"

namespace weft {
namespace {

// Megatron's loop, one step at a time.
int64_t loop_samples_after(const BatchSchedule& s, int64_t consumed, int64_t iterations) {
  for (int64_t i = 0; i < iterations; ++i) consumed += s.batch_at(consumed);
  return consumed;
}
int64_t loop_iterations_for(const BatchSchedule& s, int64_t train_samples) {
  int64_t consumed = 0, iterations = 0;
  while (consumed < train_samples) {
    consumed += s.batch_at(consumed);
    ++iterations;
  }
  return iterations;
}

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(BatchSchedule, ParsesMegatronsFormat) {
  // Megatron's example at --seq-length 4096: 250B tokens are 61035156 samples (rounded down).
  const BatchSchedule s = BatchSchedule::parse("0:768 250B:1536 500B:3072 750B:6144", 4096);
  ASSERT_EQ(s.entries().size(), 4u);
  EXPECT_EQ(s.entries()[1], (std::pair<int64_t, int>{250000000000 / 4096, 1536}));
  EXPECT_EQ(s.entries()[3], (std::pair<int64_t, int>{750000000000 / 4096, 6144}));
  // Commas, lower-case suffixes, decimals truncated after the multiplier, unsorted entries.
  const BatchSchedule t = BatchSchedule::parse(" 1.5k:16,0:8   2.0001K:0.032k ", 10);
  ASSERT_EQ(t.entries().size(), 3u);
  EXPECT_EQ(t.entries()[0], (std::pair<int64_t, int>{0, 8}));
  EXPECT_EQ(t.entries()[1], (std::pair<int64_t, int>{150, 16}));
  EXPECT_EQ(t.entries()[2], (std::pair<int64_t, int>{200, 32}));  // 2000.1 tokens: 200 samples
  EXPECT_TRUE(t.from_flag());
  EXPECT_FALSE(BatchSchedule::constant(8).from_flag());
  // A threshold below one sequence is sample 0.
  EXPECT_EQ(BatchSchedule::parse("15:4", 16).entries()[0].first, 0);
}

TEST(BatchSchedule, StepsAgreeWithMegatronsLoop) {
  const BatchSchedule s = BatchSchedule::parse("0:4 10:8 11:16 100:24 1K:40", 1);
  EXPECT_EQ(s.batch_at(0), 4);
  EXPECT_EQ(s.batch_at(9), 4);
  EXPECT_EQ(s.batch_at(10), 8);
  EXPECT_EQ(s.batch_at(12), 16);
  EXPECT_EQ(s.batch_at(5000), 40);
  // Thresholds that steps pass over, and (the second) ones that steps land on exactly.
  for (const BatchSchedule& b : {s, BatchSchedule::parse("0:4 8:8 24:16 64:32", 1)}) {
    for (int64_t start : {0, 3, 8, 12, 24, 99, 100, 999, 1000})
      for (int64_t n : {0, 1, 2, 3, 7, 50, 400})
        EXPECT_EQ(b.samples_after(start, n), loop_samples_after(b, start, n)) << start << " " << n;
    for (int64_t samples : {1, 4, 5, 8, 9, 12, 13, 24, 64, 100, 101, 999, 1000, 1001, 12345})
      EXPECT_EQ(b.iterations_for(samples), loop_iterations_for(b, samples)) << samples;
  }
  // Without a schedule: --train-samples / --global-batch-size, rounded down (Megatron's).
  EXPECT_EQ(BatchSchedule::constant(8).iterations_for(20), 2);
  EXPECT_EQ(BatchSchedule::parse("0:8", 1).iterations_for(20), 3);  // the loop passes 20
  EXPECT_EQ(BatchSchedule::constant(8).samples_after(16, 3), 40);
}

TEST(BatchSchedule, ChecksOnlyTheBatchesARunReaches) {
  // Steps start at 0, 4, 8, 12 (the step at 8 still uses 4): the entry at 10 (batch 6) is
  // passed over by every step, so micro-batch 2 x dp 2 never meets it.
  const BatchSchedule s = BatchSchedule::parse("0:4 10:6 11:8 30:10", 1);
  EXPECT_NO_THROW(s.check_reachable(0, 5, 2, 2));  // samples 0..27: batches 4, 8
  std::string e = usage_error([&] { s.check_reachable(0, 7, 2, 2); });  // reaches 10 at 36
  EXPECT_NE(e.find("--step-batch-size-schedule: the batch size 10 (the step at sample 36"),
            std::string::npos) << e;
  EXPECT_NE(e.find("--micro-batch-size * dp = 2*2 = 4"), std::string::npos) << e;
  // A resumed run past an entry that does not divide (scaled up since): not checked.
  const BatchSchedule up = BatchSchedule::parse("0:2 8:16", 1);
  EXPECT_NO_THROW(up.check_reachable(8, 3, 2, 4));
  EXPECT_NE(usage_error([&] { up.check_reachable(0, 3, 2, 4); }).find("batch size 2 "),
            std::string::npos);
  e = usage_error([&] { BatchSchedule::constant(6).check_reachable(0, 1, 2, 2); });
  EXPECT_NE(e.find("--global-batch-size 6 is not divisible"), std::string::npos) << e;
}

TEST(BatchSchedule, RefusesWhatMegatronRefuses) {
  auto err = [](const std::string& text, int64_t seq = 1) {
    return usage_error([&] { BatchSchedule::parse(text, seq); });
  };
  EXPECT_NE(err("8:4 16:8").find("the first threshold must be 0"), std::string::npos);
  EXPECT_NE(err("0:4 3:8", 4).find("two entries start at sample 0"), std::string::npos);
  EXPECT_NE(err("0:8 16:4").find("falls from 8 to 4"), std::string::npos);
  EXPECT_NE(err("0:0").find("positive"), std::string::npos);
  EXPECT_NE(err("0:4 16").find("has no ':'"), std::string::npos);
  EXPECT_NE(err("0:4 1X:8").find("not a number"), std::string::npos);
  EXPECT_NE(err("0:4 nan:8").find("not a number"), std::string::npos);
  EXPECT_NE(err("0:4 :8").find("a number is missing"), std::string::npos);
  EXPECT_NE(err("  ").find("is empty"), std::string::npos);
  // Python's float(): '_' only between digits, one sign.
  EXPECT_EQ(BatchSchedule::parse("0:4 1_000:8", 1).entries()[1].first, 1000);
  EXPECT_EQ(BatchSchedule::parse("+0:4", 1).entries()[0].first, 0);
  for (const char* bad : {"0:4 _1000:8", "0:4 1__0:8", "0:4 1_K:8", "0:4 1K_:8", "+-0:4"})
    EXPECT_NE(err(bad).find("not a number"), std::string::npos) << bad;
  for (const std::string& e : {err("0:0"), err("8:4")})
    EXPECT_EQ(e.rfind("--step-batch-size-schedule", 0), 0u) << e;
}

}  // namespace
}  // namespace weft
