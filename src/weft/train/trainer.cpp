// Trainer (see trainer.h).
#include "weft/train/trainer.h"

#include <ATen/Functions.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fmt/format.h>

#include "weft/core/error.h"
#include "weft/parallel/grad_access.h"
#include "weft/parallel/schedule.h"

namespace weft {
namespace {

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

std::string now_string() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

}  // namespace

void validate_train_config(const TrainConfig& c, int world_size) {
  LayoutConfig l = c.layout;
  l.world_size = world_size;
  Mesh mesh(l);  // validates the layout
  if (mesh.tp() > 1)
    fail_usage("--tensor-model-parallel-size {} is not supported by weft train yet (tensor "
               "parallelism is not implemented); use 1", mesh.tp());
  if (mesh.cp() > 1)
    fail_usage("--context-parallel-size {} is not supported by weft train yet (context "
               "parallelism is not implemented); use 1", mesh.cp());
  if (mesh.ep() > 1)
    fail_usage("--expert-model-parallel-size {} needs a mixture-of-experts model, which weft "
               "train does not have yet; use 1", mesh.ep());
  const auto& m = c.model;
  if (m.hidden_size < 1 || m.num_attention_heads < 1 || m.hidden_size % m.num_attention_heads)
    fail_usage("--hidden-size {} must be a positive multiple of --num-attention-heads {}",
               m.hidden_size, m.num_attention_heads);
  if (m.head_dim() % 2)
    fail_usage("head dim --hidden-size/--num-attention-heads = {} must be even for RoPE",
               m.head_dim());
  if (m.num_query_groups < 1 || m.num_attention_heads % m.num_query_groups)
    fail_usage("--num-attention-heads {} must be a multiple of --num-query-groups {}",
               m.num_attention_heads, m.num_query_groups);
  if (m.ffn_hidden_size < 1) fail_usage("--ffn-hidden-size must be >= 1");
  if (m.seq_length < 1) fail_usage("--seq-length must be >= 1");
  if (m.vocab_size < 2) fail_usage("--vocab-size must be >= 2");
  split_layers(m.num_layers, mesh.pp(), c.first_stage_layers, c.last_stage_layers);
  if (c.micro_batch_size < 1) fail_usage("--micro-batch-size must be >= 1");
  const int per_step = c.micro_batch_size * mesh.dp();
  if (c.global_batch_size < 1 || c.global_batch_size % per_step)
    fail_usage("--global-batch-size {} is not divisible by --micro-batch-size * dp = {}*{} = {}",
               c.global_batch_size, c.micro_batch_size, mesh.dp(), per_step);
  if (c.train_iters < 0) fail_usage("--train-iters must be >= 0");
  if (c.clip_grad < 0) fail_usage("--clip-grad must be >= 0");
  if (c.device != "cpu" && c.device != "cuda")
    fail_usage("--device must be cpu or cuda (got '{}')", c.device);
  validate_lr_schedule(c.lr);
}

Trainer::Trainer(const TrainConfig& cfg, const ProcessGroups& groups)
    : cfg_(cfg), groups_(groups), data_(cfg.seed, cfg.model.vocab_size, cfg.model.seq_length) {
  validate_train_config(cfg_, groups.mesh().world_size());
  if (cfg_.lr.decay_iters < 0) cfg_.lr.decay_iters = cfg_.train_iters;
  const Mesh& mesh = groups.mesh();
  StageOptions so;
  so.dtype = cfg_.model.bf16 ? at::kBFloat16 : at::kFloat;
  so.device = c10::Device(cfg_.device == "cuda" ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
  so.first_stage_layers = cfg_.first_stage_layers;
  so.last_stage_layers = cfg_.last_stage_layers;
  stage_ = std::make_unique<PipelineStage>(cfg_.model, groups, so);
  stage_->init_parameters(cfg_.seed);
  std::vector<FsdpUnit*> units;
  for (auto& u : stage_->units()) units.push_back(u.get());
  optimizer_ = std::make_unique<ShardedAdamW>(units, cfg_.adam);
  num_microbatches_ = cfg_.global_batch_size / (cfg_.micro_batch_size * mesh.dp());
  dp_rank_ = mesh.group_rank("dp_cp", groups.rank());
}

Trainer::~Trainer() = default;

Microbatch Trainer::microbatch(int m) const {
  const int64_t per_rank = static_cast<int64_t>(cfg_.micro_batch_size) * num_microbatches_;
  const int64_t first = consumed_samples_ + dp_rank_ * per_rank +
                        static_cast<int64_t>(m) * cfg_.micro_batch_size;
  Microbatch b;
  data_.batch(first, cfg_.micro_batch_size, &b.tokens, &b.labels);
  if (stage_->options().device.is_cuda()) {
    b.tokens = b.tokens.to(stage_->options().device);
    b.labels = b.labels.to(stage_->options().device);
  }
  return b;
}

IterationStats Trainer::train_step() {
  const auto t0 = std::chrono::steady_clock::now();
  const int it = iteration_ + 1;
  const double lr = lr_at(cfg_.lr, it);
  optimizer_->zero_grad();

  const double loss_scale =
      1.0 / (static_cast<double>(cfg_.global_batch_size) * cfg_.model.seq_length);
  const double loss_local =
      run_1f1b(*stage_, *groups_.get("pp"), num_microbatches_, cfg_.micro_batch_size,
               [this](int m) { return microbatch(m); }, loss_scale);

  Communicator* replicate = groups_.get("fsdp_replicate");
  if (replicate->size() > 1)
    for (auto& u : stage_->units()) replicate->all_reduce(grad_shard(*u), ReduceOp::kSum);

  if (cfg_.model.tied() && stage_->num_stages() > 1) {
    FsdpUnit* tied = stage_->is_first() ? stage_->embedding_unit() : stage_->tied_output_unit();
    if (tied) groups_.get("embedding")->all_reduce(grad_shard(*tied), ReduceOp::kSum);
  }

  // One world all-reduce carries the loss and the squared gradient norm.
  double sumsq = 0;
  if (replicate->rank() == 0)
    for (auto& u : stage_->units())
      if (!stage_->is_tied_copy(u.get()))
        sumsq += grad_shard(*u).to(at::kDouble).pow(2).sum().item<double>();
  at::Tensor red = at::tensor(std::vector<double>{loss_local, sumsq}, at::kDouble);
  groups_.world().all_reduce(red, ReduceOp::kSum);
  IterationStats s;
  s.iteration = it;
  s.lr = lr;
  s.lm_loss = red[0].item<double>();
  s.grad_norm = std::sqrt(red[1].item<double>());

  if (!std::isfinite(s.grad_norm) || !std::isfinite(s.lm_loss)) {
    s.skipped = true;
    ++skipped_iters_;
    ++nan_iters_;
  } else {
    if (cfg_.clip_grad > 0) {
      const double coef = cfg_.clip_grad / (s.grad_norm + 1e-6);
      if (coef < 1.0)
        for (auto& u : stage_->units()) grad_shard(*u).mul_(coef);
    }
    optimizer_->step(lr);
  }
  iteration_ = it;
  consumed_samples_ += cfg_.global_batch_size;
  s.consumed_samples = consumed_samples_;
  s.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  s.tokens_per_sec =
      static_cast<double>(cfg_.global_batch_size) * cfg_.model.seq_length / (s.ms / 1000.0);
  return s;
}

std::string Trainer::summary() const {
  const Mesh& mesh = groups_.mesh();
  const int r = groups_.rank();
  std::string out = fmt::format(
      "weft train: world {} order {} | pp {} dp {} (fsdp shard {} x replicate {}) | "
      "{} microbatches of {} per step\n",
      mesh.world_size(), mesh.order(), mesh.pp(), mesh.dp(), mesh.dp() / mesh.dp_outer(),
      mesh.dp_outer(), num_microbatches_, cfg_.micro_batch_size);
  for (const char* k : {"pp", "dp", "fsdp_shard", "fsdp_replicate", "embedding"})
    if (mesh.has_group(k, r)) out += fmt::format("  rank {} {:<15} {}\n", r, k, fmt::join(mesh.group_of(k, r), ","));
  int64_t local_params = 0, weight_bytes = 0;
  for (auto& u : stage_->units()) {
    weight_bytes += u->param_shard().numel() * u->param_shard().element_size();
    for (int i = 0; i < u->num_params(); ++i) local_params += u->segment(i).valid_numel();
  }
  int64_t total = 0;
  const ModelConfig& m = cfg_.model;
  total += embedding_param_spec(m).shape[0] * embedding_param_spec(m).shape[1];
  for (const auto& s : layer_param_specs(m, 0)) {
    int64_t n = 1;
    for (auto d : s.shape) n *= d;
    total += n * m.num_layers;
  }
  total += m.hidden_size;
  if (!m.tied()) total += static_cast<int64_t>(m.vocab_size) * m.hidden_size;
  out += fmt::format(
      "  parameters: {} in the model; this rank holds {} (stage {}: layers {}..{})\n"
      "  bytes on this rank: weights {} | gradients {} | optimizer state {}\n",
      total, local_params, stage_->stage(), stage_->first_layer(),
      stage_->first_layer() + stage_->num_layers() - 1, weight_bytes, optimizer_->grad_bytes(),
      optimizer_->state_bytes());
  return out;
}

std::vector<IterationStats> Trainer::train() {
  const bool rank0 = groups_.rank() == 0;
  FILE* jsonl = nullptr;
  if (rank0 && !cfg_.log_jsonl.empty()) {
    jsonl = std::fopen(cfg_.log_jsonl.c_str(), "a");
    if (!jsonl) fail_usage("--log-jsonl {}: cannot open for appending", cfg_.log_jsonl);
  }
  if (rank0 && !cfg_.quiet) fmt::print("{}", summary());
  std::vector<IterationStats> all;
  while (iteration_ < cfg_.train_iters) {
    IterationStats s = train_step();
    all.push_back(s);
    if (rank0 && !cfg_.quiet && (s.iteration % cfg_.log_interval == 0)) {
      fmt::print(
          " [{}] iteration {:>8}/{:>8} | consumed samples: {:>12} | elapsed time per iteration "
          "(ms): {:.1f} | throughput (tokens/s): {:.1f} | learning rate: {:.6E} | global batch "
          "size: {:>5} | lm loss: {:.6E} | grad norm: {:.3f} | number of skipped iterations: {:>3} "
          "| number of nan iterations: {:>3} | peak memory (MB): {:.1f}\n",
          now_string(), s.iteration, cfg_.train_iters, s.consumed_samples, s.ms, s.tokens_per_sec,
          s.lr, cfg_.global_batch_size, s.lm_loss, s.grad_norm, skipped_iters_, nan_iters_,
          peak_rss_mb());
      std::fflush(stdout);
    }
    if (jsonl) {
      std::fprintf(jsonl,
                   "{\"iteration\": %d, \"consumed_samples\": %lld, \"lm_loss\": %.17g, "
                   "\"grad_norm\": %.17g, \"lr\": %.17g, \"tokens_per_sec\": %.17g, "
                   "\"ms\": %.17g, \"skipped\": %s}\n",
                   s.iteration, static_cast<long long>(s.consumed_samples), s.lm_loss,
                   s.grad_norm, s.lr, s.tokens_per_sec, s.ms, s.skipped ? "true" : "false");
      std::fflush(jsonl);
    }
  }
  if (jsonl) std::fclose(jsonl);
  return all;
}

}  // namespace weft
