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
  if (c.decoupled_lr != -1 && !(c.decoupled_lr >= 0 && std::isfinite(c.decoupled_lr)))
    fail_usage("--decoupled-lr must be >= 0 (got {})", c.decoupled_lr);
  if (c.decoupled_lr != -1 && c.decoupled_min_lr == -1 && c.style != "constant" &&
      c.decoupled_lr < c.min_lr)
    fail_usage("--decoupled-lr {} is smaller than --min-lr {}, its minimum without "
               "--decoupled-min-lr", c.decoupled_lr, c.min_lr);
  if (c.decoupled_min_lr != -1) {
    if (c.decoupled_lr == -1)
      fail_usage("--decoupled-min-lr {} needs --decoupled-lr (the rate of the embedding and "
                 "output layer it ends at)", c.decoupled_min_lr);
    if (!(c.decoupled_min_lr >= 0) || c.decoupled_min_lr > c.decoupled_lr)
      fail_usage("--decoupled-min-lr {} must be between 0 and --decoupled-lr {}",
                 c.decoupled_min_lr, c.decoupled_lr);
  }
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

double decoupled_lr_at(const LrScheduleConfig& c, double n) {
  LrScheduleConfig d = c;
  d.lr = c.decoupled_lr;
  if (c.decoupled_min_lr != -1) d.min_lr = c.decoupled_min_lr;
  return lr_at(d, n);
}

void resolve_weight_decay(LrScheduleConfig* c, double weight_decay) {
  if (c->wd_style == "constant") {
    for (auto [flag, v] : {std::pair{"--start-weight-decay", c->start_wd},
                           std::pair{"--end-weight-decay", c->end_wd}})
      if (v != -1)
        fail_usage("{} {} needs --weight-decay-incr-style linear or cosine (with the constant "
                   "style the weight decay is --weight-decay; Megatron asserts the same)", flag, v);
    c->start_wd = c->end_wd = weight_decay;
    return;
  }
  if (c->wd_style != "linear" && c->wd_style != "cosine")
    fail_usage("--weight-decay-incr-style must be constant, linear or cosine (got '{}')",
               c->wd_style);
  for (auto [flag, v] : {std::pair{"--start-weight-decay", c->start_wd},
                         std::pair{"--end-weight-decay", c->end_wd}}) {
    if (v == -1)
      fail_usage("--weight-decay-incr-style {} needs {} (and the other end; Megatron asserts "
                 "both are given)", c->wd_style, flag);
    if (!(v >= 0) || !std::isfinite(v)) fail_usage("{} must be >= 0 (got {})", flag, v);
  }
  if (c->end_wd < c->start_wd)
    fail_usage("--end-weight-decay {} is smaller than --start-weight-decay {} (the schedule "
               "increases the weight decay, as Megatron's)", c->end_wd, c->start_wd);
}

double wd_at(const LrScheduleConfig& c, double n) {
  if (c.wd_style == "constant" || n > c.wd_incr_samples || c.wd_incr_samples <= 0)
    return c.end_wd;
  const double ratio = n / c.wd_incr_samples;
  const double coeff =
      c.wd_style == "linear" ? ratio : 0.5 * (std::cos(M_PI * (1.0 - ratio)) + 1.0);
  return c.start_wd + coeff * (c.end_wd - c.start_wd);
}

}  // namespace weft
