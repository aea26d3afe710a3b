// Learning-rate schedule: linear warmup from --lr-warmup-init, then cosine, linear or constant
// decay to min_lr. A pure function of n, the number of optimizer updates made so far (Megatron's
// OptimizerParamScheduler, whose num_steps counts samples of successful updates: it starts at 0
// and steps after each update that was not skipped). So an iteration updates with lr_at(n) of
// the updates before it: the first with --lr-warmup-init (0) during warmup, or with --lr; and
// Megatron's log, like weft's, shows lr_at(n) after the iteration's update, the rate of the next.
// Resuming needs only n, the optimizer's step count in the checkpoint.
//
// With --decoupled-lr the word embedding and output layer follow the same schedule with their
// own peak (--decoupled-lr) and minimum (--decoupled-min-lr, default --min-lr); the warmup
// starts from --lr-warmup-init for both (Megatron's max_lr and min_lr group overrides).
//
// The weight decay of the "decay" group follows the same count (Megatron's get_wd, in the same
// scheduler): --weight-decay-incr-style constant keeps --weight-decay; linear and cosine go from
// --start-weight-decay to --end-weight-decay over the run's samples (--train-iters x the global
// batch, or --train-samples), then stay at the end value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace weft {

struct LrScheduleConfig {
  double lr = 3e-4;           // --lr
  double min_lr = 0.0;        // --min-lr
  int warmup_iters = 0;       // --lr-warmup-iters
  double warmup_init = 0.0;   // --lr-warmup-init
  int decay_iters = -1;       // --lr-decay-iters (default: --train-iters)
  std::string style = "linear";  // --lr-decay-style: cosine | linear | constant (Megatron's defaults)
  // Megatron's other ways to give the lengths. As in Megatron the schedule counts samples:
  // each update adds global_batch; an iteration-based length L is L x global_batch samples.
  double warmup_fraction = -1;  // --lr-warmup-fraction: warmup = fraction x decay (-1: none)
  bool sample_based = false;    // --train-samples given: the lengths below, in samples
  int64_t warmup_samples = 0;   // --lr-warmup-samples
  int64_t decay_samples = -1;   // --lr-decay-samples (default: --train-samples)
  int64_t global_batch = 1;     // samples per iteration of the lengths in iterations (the
                                // trainer sets --global-batch-size; a checkpoint's, taken by
                                // --use-checkpoint-opt_param-scheduler, its own)
  double decoupled_lr = -1;      // --decoupled-lr (-1: none)
  double decoupled_min_lr = -1;  // --decoupled-min-lr (-1: --min-lr)
  // The weight decay (Megatron's start_wd, end_wd, wd_incr_style, wd_incr_steps). -1: not
  // given; resolve_weight_decay sets both to --weight-decay under the constant style.
  double start_wd = -1;              // --start-weight-decay
  double end_wd = -1;                // --end-weight-decay
  std::string wd_style = "constant";  // --weight-decay-incr-style: constant | linear | cosine
  double wd_incr_samples = 0;        // the run's samples (the trainer sets it)
};

// Throws UsageError naming the flag for an unknown style or inconsistent lengths.
void validate_lr_schedule(const LrScheduleConfig& c);
// `samples`: Megatron's num_steps, the samples of the updates made so far (updates x
// global_batch while the batch is constant; a resume at another batch continues the count).
double lr_at(const LrScheduleConfig& c, double samples);
// The rate of --decoupled-lr's parameters (decoupled_lr must be set).
double decoupled_lr_at(const LrScheduleConfig& c, double samples);
// Checks the weight-decay flags as Megatron does (constant: neither --start- nor
// --end-weight-decay given; linear, cosine: both, 0 <= start <= end) and, for constant, sets
// both to `weight_decay`. Throws UsageError naming the flag.
void resolve_weight_decay(LrScheduleConfig* c, double weight_decay);
// The decay group's weight decay for the update after `samples` (see the file comment).
double wd_at(const LrScheduleConfig& c, double samples);
// Megatron's lr_warmup_steps and lr_decay_steps: the warmup and decay lengths in samples.
std::pair<double, double> lr_warmup_and_decay_samples(const LrScheduleConfig& c);

}  // namespace weft
