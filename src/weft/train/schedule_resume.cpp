// The resumed schedule against the checkpoint's (see schedule_resume.h).
#include "weft/train/schedule_resume.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "weft/core/error.h"

#include <string>
#include <vector>


namespace weft {
namespace {

int64_t saved_global_batch(const nlohmann::json& meta, int64_t fallback) {
  if (auto cfg = meta.find("config"); cfg != meta.end() && cfg->is_object())
    return cfg->value("global_batch_size", fallback);
  return fallback;
}

double saved_weight_decay(const nlohmann::json& meta, double fallback) {
  if (auto cfg = meta.find("config"); cfg != meta.end() && cfg->is_object())
    if (auto opt = cfg->find("optimizer"); opt != cfg->end() && opt->is_object())
      return opt->value("weight_decay", fallback);
  return fallback;
}

// How a weight-decay schedule reads in a message.
std::string describe_wd(const LrScheduleConfig& c) {
  if (c.wd_style == "constant") return fmt::format("{} (constant)", c.end_wd);
  return fmt::format("{} to {} ({}, over {} samples)", c.start_wd, c.end_wd, c.wd_style,
                     c.wd_incr_samples);
}

// The schedule metadata.json records (trainer.cpp, "lr_scheduler"); keys absent from older
// checkpoints keep their defaults (iteration-based lengths, no warmup fraction).
LrScheduleConfig saved_schedule(const nlohmann::json& meta, const LrScheduleConfig& run) {
  const nlohmann::json& s = meta.at("lr_scheduler");
  LrScheduleConfig c;
  c.lr = s.value("lr", c.lr);
  c.min_lr = s.value("min_lr", c.min_lr);
  c.warmup_iters = s.value("warmup_iters", c.warmup_iters);
  c.warmup_init = s.value("warmup_init", c.warmup_init);
  c.decay_iters = s.value("decay_iters", c.decay_iters);
  c.style = s.value("style", c.style);
  c.warmup_fraction = s.value("warmup_fraction", c.warmup_fraction);
  c.sample_based = s.value("sample_based", c.sample_based);
  c.warmup_samples = s.value("warmup_samples", c.warmup_samples);
  c.decay_samples = s.value("decay_samples", c.decay_samples);
  c.global_batch = s.value("global_batch", saved_global_batch(meta, run.global_batch));
  // Checkpoints that predate the weight-decay schedule had the constant --weight-decay (where
  // even that is missing: this run's, as before).
  const double wd = saved_weight_decay(meta, run.start_wd);
  c.wd_style = s.value("wd_incr_style", c.wd_style);
  c.start_wd = s.value("start_wd", wd);
  c.end_wd = s.value("end_wd", wd);
  c.wd_incr_samples = s.value("wd_incr_steps", c.wd_incr_samples);
  c.decoupled_lr = s.value("decoupled_lr", c.decoupled_lr);
  c.decoupled_min_lr = s.value("decoupled_min_lr", c.decoupled_min_lr);
  return c;
}

}  // namespace

std::string resume_lr_schedule(const nlohmann::json& meta, const ScheduleResume& how,
                               const std::string& load, LrScheduleConfig* run) {
  if (how.override_flags || !meta.contains("lr_scheduler")) return "";
  const LrScheduleConfig saved = saved_schedule(meta, *run);
  if (how.use_checkpoint) {  // its lengths with its batch: the same samples as it had
    // The optimizer's groups are built before the load: a decoupled group cannot come or go.
    if ((saved.decoupled_lr == -1) != (run->decoupled_lr == -1))
      fail_usage("--use-checkpoint-opt_param-scheduler: --load {} was trained {} --decoupled-lr "
                 "and this run {}; give the same (its value then comes from the checkpoint)", load,
                 saved.decoupled_lr == -1 ? "without" : "with",
                 run->decoupled_lr == -1 ? "has none" : "has one");
    const double init = run->warmup_init;
    *run = saved;
    run->warmup_init = init;
    return "";
  }
  const auto [w_run, d_run] = lr_warmup_and_decay_samples(*run);
  const auto [w_saved, d_saved] = lr_warmup_and_decay_samples(saved);
  std::vector<std::string> diff;
  if (run->lr != saved.lr) diff.push_back(fmt::format("--lr {} (checkpoint: {})", run->lr, saved.lr));
  if (run->min_lr != saved.min_lr)
    diff.push_back(fmt::format("--min-lr {} (checkpoint: {})", run->min_lr, saved.min_lr));
  const auto rate = [](double v) { return v == -1 ? std::string("none") : fmt::format("{}", v); };
  if (run->decoupled_lr != saved.decoupled_lr)
    diff.push_back(fmt::format("--decoupled-lr {} (checkpoint: {})", rate(run->decoupled_lr),
                               rate(saved.decoupled_lr)));
  if (run->decoupled_min_lr != saved.decoupled_min_lr)
    diff.push_back(fmt::format("--decoupled-min-lr {} (checkpoint: {})",
                               rate(run->decoupled_min_lr), rate(saved.decoupled_min_lr)));
  if (run->style != saved.style)
    diff.push_back(fmt::format("--lr-decay-style {} (checkpoint: {})", run->style, saved.style));
  if (w_run != w_saved)
    diff.push_back(fmt::format("a warmup of {} samples (checkpoint: {})", w_run, w_saved));
  const bool both_constant = run->wd_style == "constant" && saved.wd_style == "constant";
  if (run->wd_style != saved.wd_style || run->start_wd != saved.start_wd ||
      run->end_wd != saved.end_wd ||
      (!both_constant && run->wd_incr_samples != saved.wd_incr_samples))
    diff.push_back(both_constant
                       ? fmt::format("--weight-decay {} (checkpoint: {})", run->end_wd, saved.end_wd)
                       : fmt::format("a weight decay of {} (checkpoint: {}; --start-weight-decay, "
                                     "--end-weight-decay, --weight-decay-incr-style, over "
                                     "--train-iters or --train-samples)",
                                     describe_wd(*run), describe_wd(saved)));
  if (d_run != d_saved)
    diff.push_back(fmt::format("a decay of {} samples (checkpoint: {}; --lr-decay-iters defaults "
                               "to --train-iters, --lr-decay-samples to --train-samples)",
                               d_run, d_saved));
  if (diff.empty()) return "";
  return fmt::format("--load {}: this run's learning-rate schedule differs from the "
                     "checkpoint's: {}; training on with this run's (Megatron refuses this "
                     "resume: --override-opt_param-scheduler keeps this run's without this "
                     "warning, --use-checkpoint-opt_param-scheduler continues the checkpoint's)",
                     load, fmt::join(diff, ", "));
}

int64_t checkpoint_scheduler_samples(const nlohmann::json& meta, int64_t steps) {
  if (auto s = meta.find("lr_scheduler"); s != meta.end() && s->contains("num_steps"))
    return s->at("num_steps").get<int64_t>();
  return steps * saved_global_batch(meta, 1);
}

}  // namespace weft
