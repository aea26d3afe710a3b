// Learning-rate schedule: linear warmup, then cosine, linear or constant decay to min_lr.
// A pure function of the iteration, so resuming needs only the iteration (Megatron semantics:
// iteration k, counted from 1, uses lr * k / warmup during warmup).
#pragma once

#include <string>

namespace weft {

struct LrScheduleConfig {
  double lr = 3e-4;           // --lr
  double min_lr = 3e-5;       // --min-lr
  int warmup_iters = 0;       // --lr-warmup-iters
  int decay_iters = -1;       // --lr-decay-iters (default: --train-iters)
  std::string style = "cosine";  // --lr-decay-style: cosine | linear | constant
};

// Throws UsageError naming the flag for an unknown style or inconsistent iterations.
void validate_lr_schedule(const LrScheduleConfig& c);
double lr_at(const LrScheduleConfig& c, int iteration);

}  // namespace weft
