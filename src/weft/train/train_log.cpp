// MFU, ETA and TensorBoard scalars of the training loop (see train_log.h).
#include "weft/train/train_log.h"

#include <cmath>
#include <ctime>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "weft/train/flops.h"
#include "weft/train/tensorboard.h"

namespace weft {
namespace {

constexpr size_t kEtaWindow = 10;  // recent step times averaged for the ETA

std::string now_string() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

}  // namespace

std::string format_eta(double seconds) {
  const int64_t s = std::max<int64_t>(0, std::llround(seconds));
  return fmt::format("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60);
}

TrainLog::TrainLog(const TrainConfig& cfg, int world_size, bool writer_rank)
    : cfg_(cfg),
      world_size_(world_size),
      flops_per_token_(model_flops_per_token(cfg.model)),
      peak_flops_(cfg.peak_tflops >= 0 ? cfg.peak_tflops * 1e12
                                       : default_peak_flops(cfg.device, cfg.model.bf16)),
      batches_(train_batches(cfg)) {
  if (writer_rank && !cfg.tensorboard_dir.empty())
    tb_ = std::make_unique<TensorBoardWriter>(cfg.tensorboard_dir);
}

TrainLog::~TrainLog() = default;

void TrainLog::record(const IterationStats& s) {
  recent_.emplace_back(s.ms, s.global_batch);
  if (recent_.size() > kEtaWindow) recent_.pop_front();
  last_iteration_ = s.iteration;
  last_consumed_ = s.consumed_samples;
}

double TrainLog::mfu(const IterationStats& s) const {
  if (peak_flops_ <= 0) return -1;
  return flops_per_token_ * s.tokens_per_sec / (static_cast<double>(world_size_) * peak_flops_);
}

double TrainLog::eta_seconds() const {
  if (recent_.empty()) return 0;
  double ms = 0, samples = 0;
  for (const auto& [m, n] : recent_) {
    ms += m;
    samples += n;
  }
  const int left = std::max(0, cfg_.train_iters - last_iteration_);
  if (samples <= 0) return left * ms / recent_.size() / 1000.0;
  const int64_t todo = batches_.samples_after(last_consumed_, left) - last_consumed_;
  return static_cast<double>(todo) * ms / samples / 1000.0;
}

std::string TrainLog::line_fields(const IterationStats& s) const {
  const double m = mfu(s);
  return fmt::format("{} ETA: {} |", m >= 0 ? fmt::format(" MFU: {:.1f}% |", 100 * m) : "",
                     format_eta(eta_seconds()));
}

std::string TrainLog::console_line(const IterationStats& s, bool first_of_run,
                                   double peak_memory_mb) {
  Interval& in = interval_;
  if (s.skipped) {
    ++in.skipped;  // every skipped iteration is a non-finite one (weft has no loss scaler)
  } else {
    ++in.advanced;
    in.lm += s.lm_loss;
    in.aux += s.aux_loss;
    in.mtp += s.mtp_loss;
    in.z += s.z_loss;
  }
  in.ms += s.ms;
  in.samples += s.global_batch;
  if (s.iteration % cfg_.log_interval != 0 && !first_of_run) return {};
  const double n = std::max(1, in.advanced);
  IterationStats mean = s;  // the interval's time per iteration, for tokens/s and MFU
  mean.ms = in.ms / (in.advanced + in.skipped);
  mean.tokens_per_sec = in.samples * cfg_.model.seq_length / (in.ms / 1000.0);
  // An interval of skipped iterations only has no loss to average: its line leaves the losses
  // out, as Megatron's does (it prints a loss only where its interval mean is > 0).
  std::string losses;
  if (in.advanced > 0) {
    losses = fmt::format(" lm loss: {:.6E} |", in.lm / n);
    if (cfg_.model.moe()) losses += fmt::format(" load_balancing_loss: {:.6E} |", in.aux / n);
    if (cfg_.model.moe() && cfg_.model.moe_z_loss_coeff > 0)
      losses += fmt::format(" z_loss: {:.6E} |", in.z / n);
    if (cfg_.model.mtp_num_layers > 0) losses += fmt::format(" mtp_loss: {:.6E} |", in.mtp / n);
  }
  const std::string line = fmt::format(
      " [{}] iteration {:>8}/{:>8} | consumed samples: {:>12} | elapsed time per iteration "
      "(ms): {:.1f} | throughput (tokens/s): {:.1f} |{} learning rate: {:.6E} | global batch "
      "size: {:>5} |{} grad norm: {:.3f} | number of skipped iterations: {:>3} | number of nan "
      "iterations: {:>3} | peak memory (MB): {:.1f}\n",
      now_string(), s.iteration, cfg_.train_iters, s.consumed_samples, mean.ms,
      mean.tokens_per_sec, line_fields(mean), s.lr, s.global_batch, losses, s.grad_norm,
      in.skipped, in.skipped, peak_memory_mb);
  if (s.iteration % cfg_.log_interval == 0) in = Interval{};
  return line;
}

std::string jsonl_number(double v) {
  return std::isfinite(v) ? fmt::format("{:.17g}", v) : "null";
}

std::string TrainLog::jsonl_validation_line(int iteration, double loss, double ppl, bool test,
                                            const std::string& set) {
  const char* split = test ? "test" : "valid";
  const std::string named = set.empty() ? "" : fmt::format(", \"valid_set\": {}", nlohmann::json(set).dump());
  return fmt::format("{{\"iteration\": {}{}, \"{}_lm_loss\": {}, \"{}_lm_loss_ppl\": {}}}\n",
                     iteration, named, split, jsonl_number(loss), split, jsonl_number(ppl));
}

std::string TrainLog::jsonl_line(const IterationStats& s) const {
  const double m = mfu(s);
  return fmt::format(
      "{{\"iteration\": {}, \"consumed_samples\": {}, \"lm_loss\": {}, \"aux_loss\": {}, "
      "\"mtp_loss\": {}, \"z_loss\": {}, \"grad_norm\": {}, \"lr\": {}, \"tokens_per_sec\": {}, "
      "\"ms\": {}, \"skipped\": {}, \"mfu\": {}, \"eta_s\": {}, \"global_batch_size\": {}}}\n",
      s.iteration, s.consumed_samples, jsonl_number(s.lm_loss), jsonl_number(s.aux_loss),
      jsonl_number(s.mtp_loss), jsonl_number(s.z_loss), jsonl_number(s.grad_norm), jsonl_number(s.lr),
      jsonl_number(s.tokens_per_sec), jsonl_number(s.ms), s.skipped ? "true" : "false",
      m >= 0 ? jsonl_number(m) : "null", jsonl_number(eta_seconds()), s.global_batch);
}

void TrainLog::tensorboard_iteration(const IterationStats& s, int skipped, int nan,
                                     double peak_memory_mb) {
  if (!tb_ || s.iteration % cfg_.tensorboard_log_interval != 0) return;
  const int64_t it = s.iteration, samples = s.consumed_samples;
  auto both = [&](const std::string& tag, double v) {  // Megatron's tag and its "vs samples" twin
    tb_->add_scalar(tag, v, it);
    tb_->add_scalar(tag + " vs samples", v, samples);
  };
  both("learning-rate", s.lr);
  both("batch-size", s.global_batch);
  both("lm loss", s.lm_loss);
  if (cfg_.model.moe()) tb_->add_scalar("load_balancing_loss", s.aux_loss, it);
  if (cfg_.model.moe() && cfg_.model.moe_z_loss_coeff > 0) tb_->add_scalar("z_loss", s.z_loss, it);
  if (cfg_.model.mtp_num_layers > 0) tb_->add_scalar("mtp loss", s.mtp_loss, it);
  both("grad-norm", s.grad_norm);
  tb_->add_scalar("iteration-time", s.ms / 1000.0, it);
  tb_->add_scalar("throughput", flops_per_token_ * s.tokens_per_sec / world_size_ / 1e12, it);
  tb_->add_scalar("tokens-per-sec", s.tokens_per_sec, it);
  if (const double m = mfu(s); m >= 0) tb_->add_scalar("mfu", m, it);
  tb_->add_scalar("mem-max-allocated-bytes", peak_memory_mb * 1024.0 * 1024.0, it);
  tb_->add_scalar("skipped-iterations", skipped, it);
  tb_->add_scalar("nan-iterations", nan, it);
  tb_->flush();
}

void TrainLog::tensorboard_validation(int iteration, int64_t consumed_samples, double loss,
                                      double ppl, const std::string& suffix) {
  if (!tb_) return;
  const std::string tag = "lm loss validation" + suffix;
  tb_->add_scalar(tag, loss, iteration);
  tb_->add_scalar(tag + " vs samples", loss, consumed_samples);
  tb_->add_scalar(tag + " ppl", ppl, iteration);
  tb_->flush();
}

}  // namespace weft
