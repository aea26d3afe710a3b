// Learning-rate schedule: linear warmup from --lr-warmup-init, then cosine, linear or constant
// decay to min_lr. A pure function of n, the number of optimizer updates made so far (Megatron's
// OptimizerParamScheduler, whose num_steps counts samples of successful updates: it starts at 0
// and steps after each update that was not skipped). So an iteration updates with lr_at(n) of
// the updates before it: the first with --lr-warmup-init (0) during warmup, or with --lr; and
// Megatron's log, like weft's, shows lr_at(n) after the iteration's update, the rate of the next.
// Resuming needs only n, the optimizer's step count in the checkpoint.
#pragma once

#include <cstdint>
#include <string>

namespace weft {

struct LrScheduleConfig {
  double lr = 3e-4;           // --lr
  double min_lr = 0.0;        // --min-lr
  int warmup_iters = 0;       // --lr-warmup-iters
  double warmup_init = 0.0;   // --lr-warmup-init
  int decay_iters = -1;       // --lr-decay-iters (default: --train-iters)
  std::string style = "linear";  // --lr-decay-style: cosine | linear | constant (Megatron's defaults)
};

// Throws UsageError naming the flag for an unknown style or inconsistent iterations.
void validate_lr_schedule(const LrScheduleConfig& c);
double lr_at(const LrScheduleConfig& c, int64_t updates);

}  // namespace weft
