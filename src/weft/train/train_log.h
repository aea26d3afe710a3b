// What the trainer reports about each iteration beyond losses and timings: the MFU and the ETA
// (for the Megatron-style log line and the --log-jsonl line), and the TensorBoard scalars of
// --tensorboard-dir, written by the rank that logs (rank 0: the losses and the grad norm are
// all-reduced over the world, so rank 0 holds the same values as the last stage).
//
// TensorBoard tags follow Megatron's training_log where Megatron has the value ("lm loss",
// "learning-rate", "grad-norm", "batch-size", "iteration-time", "throughput" in TFLOP/s per
// device, "mem-max-allocated-bytes", "load_balancing_loss", "lm loss validation", the
// " vs samples" twins); weft's own are "tokens-per-sec", "mfu", "mtp loss" (the mean over the
// MTP depths), "skipped-iterations" and "nan-iterations" (the run's counts so far).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "weft/train/trainer.h"

namespace weft {

class TensorBoardWriter;

// 3723.4 -> "1h02m03s" (whole seconds, rounded; hours not bounded).
std::string format_eta(double seconds);
// A number for a JSON line: "%.17g" (exact round trip), or null where it is not finite (a
// skipped iteration's NaN grad norm): JSON has no NaN or Infinity.
std::string jsonl_number(double v);

class TrainLog {
 public:
  // `writer_rank`: this rank writes the TensorBoard file (when --tensorboard-dir is set).
  // Throws UsageError naming --tensorboard-dir when that file cannot be created.
  TrainLog(const TrainConfig& cfg, int world_size, bool writer_rank);
  ~TrainLog();

  // Records a finished iteration (its step time feeds the ETA). Call on every rank.
  void record(const IterationStats& s);
  // The iteration's model FLOPs utilisation: flops per token x tokens/s / (world x peak);
  // < 0 when no peak is known (CPU without --peak-tflops).
  double mfu(const IterationStats& s) const;
  // Seconds left: the samples of the steps to --train-iters (under a batch schedule, its
  // batches) at the rate of the last 10 steps.
  double eta_seconds() const;
  // " MFU: 41.2% | ETA: 0h01m02s |" for the log line (MFU only with a peak).
  std::string line_fields(const IterationStats& s) const;
  // The console line of a finished iteration (newline included), or "" where it prints none;
  // call once per iteration, in order, on the rank that prints. As Megatron's training_log: a
  // line at every --log-interval-th iteration and at the run's first (`first_of_run`); the
  // losses are means over the interval's iterations that were not skipped, the time per
  // iteration (so tokens/s and MFU) the mean over all of them, the skipped and nan counts the
  // interval's; the learning rate and grad norm are this iteration's. A first line off the
  // interval does not start a new one (as Megatron's). One difference: Megatron's first line
  // never does, also on the interval, so at --log-interval 1 its second line averages
  // iterations 1 and 2; weft's first line on the interval (iteration N x interval, e.g. any at
  // interval 1) starts a new one, so that a resumed run's lines equal the uninterrupted run's.
  // An interval whose iterations were all skipped shows no loss, as Megatron's.
  std::string console_line(const IterationStats& s, bool first_of_run, double peak_memory_mb);
  // The --log-jsonl line of an iteration (newline included); mfu is null without a peak.
  std::string jsonl_line(const IterationStats& s) const;
  // The --log-jsonl line of a validation at `iteration` (newline included); `set`: the name of
  // a --multiple-validation-sets set, written as "valid_set".
  static std::string jsonl_validation_line(int iteration, double loss, double ppl,
                                           bool test = false, const std::string& set = "");
  // TensorBoard scalars of one iteration (every --tensorboard-log-interval) and of one
  // validation; no-ops without a writer. `skipped`/`nan`: the run's counters so far.
  void tensorboard_iteration(const IterationStats& s, int skipped, int nan, double peak_memory_mb);
  // `suffix`: Megatron's "-NAME" of a --multiple-validation-sets set ("lm loss validation-NAME").
  void tensorboard_validation(int iteration, int64_t consumed_samples, double loss, double ppl,
                              const std::string& suffix = "");
  double flops_per_token() const { return flops_per_token_; }
  double peak_flops() const { return peak_flops_; }

 private:
  TrainConfig cfg_;
  int world_size_;
  double flops_per_token_;
  double peak_flops_;  // per device; 0: unknown
  BatchSchedule batches_;
  std::deque<std::pair<double, int>> recent_;  // (ms, samples) of the last steps
  int last_iteration_ = 0;
  int64_t last_consumed_ = 0;
  struct Interval {  // console_line's sums since its last line
    double lm = 0, aux = 0, mtp = 0, z = 0, ms = 0, samples = 0;
    int advanced = 0, skipped = 0;
  } interval_;
  std::unique_ptr<TensorBoardWriter> tb_;
};

}  // namespace weft
