// The global batch size of each step: constant (--global-batch-size), or Megatron's
// --step-batch-size-schedule "THRESHOLD:BS THRESHOLD:BS ...", where a step that starts with n
// consumed samples uses the batch size of the last entry whose threshold is <= n.
//
// As in Megatron (StepBatchsizeNumMicroBatchesCalculator): the entries are separated by spaces
// or commas; each number may end in K, M, B or T (1e3, 1e6, 1e9, 1e12; case-insensitive) and is
// read as a decimal, multiplied, and truncated to an integer ("1.5B" is 1500000000). Thresholds
// count tokens and become samples by floor division by --seq-length (Megatron passes its
// --seq-length, always set for GPT models). The entries are sorted by threshold; the first must
// then be 0, the thresholds strictly increasing, the batch sizes positive. Two checks Megatron
// makes only when a step reaches them are made up front by weft: the batch sizes must not
// decrease (Megatron asserts that the microbatches never do), and every batch a run will use
// must be divisible by --micro-batch-size x the data-parallel size (check_reachable).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace weft {

class BatchSchedule {
 public:
  // One batch size for every step.
  static BatchSchedule constant(int global_batch);
  // Megatron's schedule string; throws UsageError naming --step-batch-size-schedule.
  static BatchSchedule parse(const std::string& text, int64_t seq_length);

  // The global batch of the step that starts with `consumed` samples.
  int batch_at(int64_t consumed) const;
  // The consumed samples after `iterations` steps from `consumed`.
  int64_t samples_after(int64_t consumed, int64_t iterations) const;
  // Megatron's update_train_iters for --train-samples: the steps until at least `train_samples`
  // samples are consumed from 0 (the last step may pass it). Without a schedule (constant())
  // train_samples / batch, rounded down, as Megatron does there.
  int64_t iterations_for(int64_t train_samples) const;
  // Throws UsageError if a step of [consumed, `iterations` steps later) uses a batch that is not
  // a multiple of micro_batch x dp; names the entry.
  void check_reachable(int64_t consumed, int64_t iterations, int micro_batch, int dp) const;

  bool from_flag() const { return from_flag_; }
  int largest_batch() const { return entries_.back().second; }
  // (threshold in samples, global batch), sorted.
  const std::vector<std::pair<int64_t, int>>& entries() const { return entries_; }

 private:
  // Of at most `limit` steps from `consumed`, those that start below the next threshold.
  int64_t steps_below_next(int64_t consumed, int64_t limit) const;

  std::vector<std::pair<int64_t, int>> entries_;
  bool from_flag_ = false;  // error messages name --step-batch-size-schedule, else the batch
};

}  // namespace weft
