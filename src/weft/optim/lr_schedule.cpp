// LR schedule (see lr_schedule.h).
#include "weft/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "weft/core/error.h"

namespace weft {

void validate_lr_schedule(const LrScheduleConfig& c) {
  if (c.style != "cosine" && c.style != "linear" && c.style != "constant")
    fail_usage("--lr-decay-style must be cosine, linear or constant (got '{}')", c.style);
  if (c.lr < 0 || c.min_lr < 0) fail_usage("--lr and --min-lr must be >= 0");
  if (c.min_lr > c.lr) fail_usage("--min-lr {} is larger than --lr {}", c.min_lr, c.lr);
  if (c.warmup_iters < 0) fail_usage("--lr-warmup-iters must be >= 0");
  if (!(c.warmup_init >= 0)) fail_usage("--lr-warmup-init must be >= 0");
  if (c.decay_iters >= 0 && c.decay_iters < c.warmup_iters)
    fail_usage("--lr-decay-iters {} is smaller than --lr-warmup-iters {}", c.decay_iters,
               c.warmup_iters);
  if (c.warmup_fraction != -1 && !(c.warmup_fraction >= 0 && c.warmup_fraction <= 1))
    fail_usage("--lr-warmup-fraction must be in [0, 1] (got {})", c.warmup_fraction);
  if (c.warmup_samples < 0) fail_usage("--lr-warmup-samples must be >= 0");
  if (c.decay_samples != -1 && c.decay_samples < 1)
    fail_usage("--lr-decay-samples must be >= 1 (got {})", c.decay_samples);
  if (c.decay_samples >= 0 && c.decay_samples < c.warmup_samples)
    fail_usage("--lr-decay-samples {} is smaller than --lr-warmup-samples {}", c.decay_samples,
               c.warmup_samples);
}

std::pair<double, double> lr_warmup_and_decay_samples(const LrScheduleConfig& c) {
  const double g = static_cast<double>(c.global_batch);
  const double decay = c.sample_based ? static_cast<double>(c.decay_samples)
                                      : static_cast<double>(c.decay_iters) * g;
  const double warmup = c.warmup_fraction >= 0 ? c.warmup_fraction * decay
                        : c.sample_based       ? static_cast<double>(c.warmup_samples)
                                               : static_cast<double>(c.warmup_iters) * g;
  return {warmup, decay};
}

double lr_at(const LrScheduleConfig& c, double n) {
  const auto [warmup, decay] = lr_warmup_and_decay_samples(c);
  if (warmup > 0 && n <= warmup) return c.warmup_init + (c.lr - c.warmup_init) * n / warmup;
  if (c.style == "constant") return c.lr;
  if (n >= decay) return c.min_lr;  // also a decay no longer than the warmup
  const double ratio = (n - warmup) / (decay - warmup);
  const double coeff = c.style == "linear" ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return c.min_lr + coeff * (c.lr - c.min_lr);
}

}  // namespace weft
