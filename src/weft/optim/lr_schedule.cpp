// LR schedule (see lr_schedule.h).
#include "weft/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

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
}

double lr_at(const LrScheduleConfig& c, int64_t it) {
  if (c.warmup_iters > 0 && it <= c.warmup_iters)
    return c.warmup_init + (c.lr - c.warmup_init) * static_cast<double>(it) / c.warmup_iters;
  if (c.style == "constant") return c.lr;
  const int decay = std::max(c.decay_iters, c.warmup_iters);
  if (it >= decay) return c.min_lr;
  const double ratio = static_cast<double>(it - c.warmup_iters) / (decay - c.warmup_iters);
  const double coeff = c.style == "linear" ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return c.min_lr + coeff * (c.lr - c.min_lr);
}

}  // namespace weft
