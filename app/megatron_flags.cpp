// Megatron's flags beyond the architecture (see megatron_flags.h): what weft does with each.
#include "megatron_flags.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "weft/core/error.h"

namespace weft {
namespace {

constexpr const char* kGroup = "Megatron flags weft accepts (same results) or refuses";

// Flags without a value that state what weft does anyway, or pick among implementations that
// compute the same values.
constexpr std::pair<const char*, const char*> kAccepted[] = {
    {"--log-throughput", "the log line always has the throughput"},
    {"--exit-signal-handler", "SIGTERM/SIGINT always save (with --save) and exit"},
    {"--accumulate-allreduce-grads-in-fp32",
     "gradients are reduced in float32 unless --grad-reduce-in-bf16 (which wins, as in Megatron)"},
    {"--attention-softmax-in-fp32", "the attention softmax is always in float32"},
    {"--apply-query-key-layer-scaling", "a scale and its inverse: the same attention in bf16"},
    {"--no-masked-softmax-fusion", "kernel choice; weft's attention is one fused kernel"},
    {"--no-bias-swiglu-fusion", "kernel choice (no biases; --no-fused-kernels is weft's)"},
    {"--no-bias-dropout-fusion", "kernel choice (no biases, no dropout)"},
    {"--no-bias-gelu-fusion", "kernel choice (SwiGLU, no biases)"},
    {"--no-rope-fusion", "kernel choice (--no-fused-kernels is weft's)"},
    {"--no-persist-layer-norm", "kernel choice"},
    {"--no-gradient-accumulation-fusion",
     "kernel choice: the weight gradients in the gradient buffer's dtype either way"},
    {"--cross-entropy-loss-fusion", "kernel choice: weft's cross entropy is fused on CUDA"},
    {"--moe-permute-fusion", "kernel choice"},
    {"--mla-down-proj-fusion", "kernel choice (MLA's down projections and their norm)"},
    {"--enable-experimental", "weft gates no feature behind it"},
    {"--disable-gloo-process-groups", "weft creates no gloo groups (MPI and NCCL only)"},
    {"--use-fused-weighted-squared-relu",
     "kernel choice: the experts' squared ReLU, then the routing weights (the same values)"},
    {"--moe-router-fusion", "kernel choice"},
    {"--moe-shared-expert-overlap", "scheduling only"},
    {"--overlap-moe-expert-parallel-comm",
     "scheduling only: the expert all-to-alls overlap other work in Megatron, the same values"},
    {"--delay-wgrad-compute", "scheduling only: the same weight gradients, computed later"},
    {"--tp-comm-overlap", "scheduling only (weft trains with tensor parallel size 1)"},
    {"--sequence-parallel", "with tensor parallel size 1 Megatron turns it off too"},
    {"--use-torch-fsdp2", "weft's FSDP shards parameters, gradients and optimizer state"},
    {"--use-megatron-fsdp", "weft's FSDP shards parameters, gradients and optimizer state"},
    {"--ckpt-fully-parallel-save", "every rank writes its own shards"},
    {"--ckpt-fully-parallel-load", "every rank reads only the chunks it needs"},
    {"--no-ckpt-fully-parallel-save", "the same checkpoint either way"},
    {"--ckpt-assume-constant-structure", "caching only"},
    {"--use-dist-ckpt", "Megatron's older name of --ckpt-format torch_dist"},
    {"--auto-detect-ckpt-format", "weft reads one format"},
    {"--use-persistent-ckpt-worker", "--async-save writes on a background thread of its own"},
    {"--manual-gc", "Python's garbage collector; nothing to collect in weft"},
    {"--no-create-attention-mask-in-dataloader", "weft's attention is causal without a mask"},
    {"--no-mmap-bin-files", "the same tokens either way"},
    {"--init-model-with-meta-device", "initialisation place only: the same values"},
    {"--use-cpu-initialization", "weft initialises on the CPU generator either way"},
    {"--use-nccl-ub", "buffer registration only"},
    {"--no-position-embedding", "no learned positions (rotary only)"},
    {"--log-validation-ppl-to-tensorboard", "always written (lm loss validation ppl)"},
    {"--log-memory-to-tensorboard", "always written (mem-max-allocated-bytes)"},
    {"--log-timers-to-tensorboard", "iteration-time is always written"},
    {"--no-log-loss-scale-to-tensorboard", "no loss scale in bf16/fp32"},
    {"--disable-log-loss-scale-to-tensorboard", "no loss scale in bf16/fp32"},
};

// Flags with a value that only a setting weft refuses reads (--fp16, --fp8-format, expert bias,
// WSD): without it they do nothing in Megatron either, so accepted.
constexpr std::pair<const char*, const char*> kAcceptedWithValue[] = {
    {"--initial-loss-scale", "read only with --fp16"},
    {"--min-loss-scale", "read only with --fp16"},
    {"--loss-scale-window", "read only with --fp16"},
    {"--hysteresis", "read only with --fp16"},
    {"--fp8-recipe", "read only with --fp8-format"},
    {"--fp8-amax-history-len", "read only with --fp8-format"},
    {"--fp8-amax-compute-algo", "read only with --fp8-format"},
    {"--moe-flex-dispatcher-backend",
     "read only with --moe-token-dispatcher-type flex, which weft refuses"},
    {"--moe-deepep-num-sms", "read only by the flex dispatcher's DeepEP backend"},
    {"--moe-hybridep-num-sms", "read only by the flex dispatcher's HybridEP backend"},
    {"--lr-wsd-decay-style", "read only with --lr-decay-style WSD"},
    {"--lr-wsd-decay-iters", "read only with --lr-decay-style WSD"},
    {"--lr-wsd-decay-samples", "read only with --lr-decay-style WSD"},
};

// Flags that change only Megatron output weft has not: accepted with a warning.
constexpr std::pair<const char*, const char*> kWarned[] = {
    {"--log-params-norm", "weft's log line has no params norm"},
    {"--log-num-zeros-in-grad", "weft's log line has no count of zero gradients"},
    {"--log-world-size-to-tensorboard", "weft's TensorBoard has no world-size scalar"},
    {"--log-straggler", "weft has no straggler detector"},
    {"--log-energy", "weft does not read the GPU's energy counters"},
    {"--moe-per-layer-logging",
     "weft logs the load-balancing and z-losses averaged over the MoE layers"},
    // The dataset's document-reset positions and mask, which Megatron-core's GPT model does not
    // read with RoPE and Transformer Engine's causal attention: the same loss as Megatron's.
    {"--reset-position-ids",
     "the rotary positions run 0..s-1 over the whole sample, as Megatron-core's (its position "
     "ids feed only learned absolute embeddings)"},
    {"--reset-attention-mask",
     "the attention is causal over the whole sample, as Megatron's with Transformer Engine, "
     "whose causal attention ignores the dataset's mask (Megatron applies it only in the "
     "PyTorch softmax of --transformer-impl local without bf16)"},
};
constexpr std::pair<const char*, const char*> kWarnedWithValue[] = {
    {"--wandb-project", "weft has no Weights & Biases logger (use --tensorboard-dir or --log-jsonl)"},
    {"--wandb-exp-name", "weft has no Weights & Biases logger"},
    {"--wandb-save-dir", "weft has no Weights & Biases logger"},
    {"--wandb-entity", "weft has no Weights & Biases logger"},
    {"--save-retain-interval",
     "weft keeps every checkpoint it saved (delete old ones with your own tools)"},
};

// Flags that change the training and that weft does not implement: refused. nargs: values the
// flag takes (0: none, -1: one or more).
struct Refused {
  const char* name;
  int nargs;
  const char* why;
};
constexpr Refused kRefused[] = {
    {"--fp16", 0, "weft trains in bf16 (--bf16) or float32, without loss scaling"},
    {"--loss-scale", 1, "weft does not scale the loss (Megatron applies it in bf16 too)"},
    {"--fp8-format", 1, "weft computes in bf16 or float32, not FP8"},
    {"--fp8-param-gather", 0, "weft computes in bf16 or float32, not FP8"},
    {"--fp32-residual-connection", 0, "weft's residual stream is in the compute dtype"},
    {"--num-layers-per-virtual-pipeline-stage", 1,
     "weft's pipeline schedule is 1F1B without virtual stages"},
    {"--num-virtual-stages-per-pipeline-rank", 1,
     "weft's pipeline schedule is 1F1B without virtual stages"},
    {"--pipeline-model-parallel-layout", 1,
     "give uneven stages with --decoder-first/last-pipeline-num-layers (or '|' in "
     "--hybrid-layer-pattern)"},
    {"--rampup-batch-size", 3,
     "deprecated in Megatron, which now ignores it with a warning; give the ramp as "
     "--step-batch-size-schedule \"0:START TOKENS:BATCH ...\""},
    {"--moe-input-jitter-eps", 1, "weft's router adds no input noise"},
    {"--moe-enable-deepep", 0,
     "deprecated in Megatron for the flex dispatcher, which weft has not; give "
     "--moe-token-dispatcher-type alltoall (the same values)"},
    {"--moe-router-topk-limited-devices", 1,
     "deprecated in Megatron; give --moe-router-num-groups (the expert-parallel size) and "
     "--moe-router-group-topk"},
    {"--moe-router-force-load-balancing", 0,
     "a benchmark mode of random router logits; weft routes by the router"},
    {"--moe-router-padding-for-quantization", 0,
     "weft computes in bf16 or float32, without FP8/FP4 alignment of the expert rows"},
    {"--moe-router-padding-for-fp8", 0,
     "weft computes in bf16 or float32, without FP8 alignment of the expert rows"},
    {"--moe-latent-size", 1, "weft's experts take the hidden state without a latent projection"},
    {"--moe-use-upcycling", 0, "weft does not upcycle a dense checkpoint into experts"},
    {"--apply-layernorm-1p", 0, "weft's RMSNorm multiplies by its weight, not 1 + weight"},
    {"--openai-gelu", 0, "weft's MLP is SwiGLU or squared ReLU (--squared-relu)"},
    {"--init-method-xavier-uniform", 0,
     "weft initialises from a normal of --init-method-std"},
    {"--cache-mla-latents", 0,
     "weft's generation caches MLA's keys and values per head, not the latents"},
    {"--heterogeneous-layers-config-path", 1, "weft's layers share one configuration"},
    {"--non-persistent-save-interval", 1, "weft saves every checkpoint to --save"},
    {"--non-persistent-ckpt-type", 1, "weft saves every checkpoint to --save"},
};

// The layer specs of Megatron's hybrid stack, which weft's hybrid model is.
constexpr const char* kHybridSpecs[][2] = {
    {"megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"},
    {"megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"},
};

template <typename T>
void one_of(const char* flag, const T& value, std::initializer_list<T> accepted,
            const char* why) {
  if (std::find(accepted.begin(), accepted.end(), value) == accepted.end())
    fail_usage("{} {}: {}", flag, value, why);
}

}  // namespace

void add_megatron_flags(CLI::App* c, MegatronFlags* f) {
  f->app = c;
  auto opt = [&](const char* name, auto& v, const char* help) {
    c->add_option(name, v, help)
        ->capture_default_str()
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
        ->group(kGroup);
  };
  opt("--ckpt-format", f->ckpt_format, "torch_dist: weft's own distributed format");
  opt("--dataloader-type", f->dataloader_type, "single (samples in order, as Megatron's)");
  opt("--optimizer", f->optimizer, "adam (AdamW with decoupled weight decay, as Megatron's)");
  opt("--attention-backend", f->attention_backend, "auto | flash | fused | unfused | local: exact "
      "attention either way");
  opt("--data-parallel-sharding-strategy", f->dp_sharding,
      "weft always shards as optim_grads_params (other values warn; same results)");
  opt("--outer-dp-sharding-strategy", f->outer_dp_sharding,
      "no_shard: HSDP replicas hold whole copies");
  opt("--rerun-mode", f->rerun_mode,
      "validate_results (Megatron's default) | disabled: weft's non-finite check "
      "(--check-for-nan-in-loss-and-grad) stands for the rerun machine; report_stats warns");
  opt("--cross-entropy-fusion-impl", f->ce_fusion_impl, "native | te: kernel choice");
  opt("--num-workers", f->num_workers, "data-loader workers (weft prefetches on a thread)");
  opt("--num-dataset-builder-threads", f->dataset_builder_threads, "accepted");
  opt("--tensorboard-queue-size", f->tensorboard_queue_size, "accepted (flushed every iteration)");
  opt("--timing-log-level", f->timing_log_level, "0 | 1 | 2 (weft logs the iteration time)");
  opt("--timing-log-option", f->timing_log_option, "minmax | max | all");
  opt("--logging-level", f->logging_level, "accepted");
  opt("--empty-unused-memory-level", f->empty_unused_memory_level, "0 | 1 | 2: allocator only");
  opt("--manual-gc-interval", f->manual_gc_interval, "accepted (no garbage collector)");
  c->add_option("--spec", f->spec,
                "MODULE NAME of a Megatron layer spec: the Mamba/hybrid stack specs name weft's "
                "hybrid model (the layers from --hybrid-layer-pattern or the ratios); others are "
                "refused")
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->group(kGroup);
  static std::vector<std::string> sink;  // values of accepted-with-value, warned and refused
                                         // flags: never read
  // CLI11 takes a const description (copied).
  const auto flag = [&](const char* name, const std::string& description) {
    c->add_flag(name, description)->group(kGroup);
  };
  const auto with_value = [&](const char* name, const std::string& description) {
    c->add_option(name, sink, description)->expected(1)->group(kGroup);
  };
  for (auto [name, help] : kAccepted) flag(name, help);
  for (auto [name, help] : kWarned) flag(name, std::string("warns: ") + help);
  for (auto [name, help] : kAcceptedWithValue) with_value(name, help);
  for (auto [name, help] : kWarnedWithValue) with_value(name, std::string("warns: ") + help);
  for (const Refused& r : kRefused) {
    const std::string help = std::string("refused: ") + r.why;
    if (r.nargs == 0)
      c->add_flag(r.name, help)->group(kGroup);
    else
      c->add_option(r.name, sink, help)->expected(r.nargs < 0 ? 1 : r.nargs,
                                                  r.nargs < 0 ? CLI::detail::expected_max_vector_size
                                                              : r.nargs)
          ->group(kGroup);
  }
}

bool spec_names_hybrid_stack(const MegatronFlags& f) {
  for (const auto& s : kHybridSpecs)
    if (f.spec.size() == 2 && f.spec[0] == s[0] && f.spec[1] == s[1]) return true;
  return false;
}

std::vector<std::string> check_megatron_flags(const MegatronFlags& f) {
  const auto given = [&](const char* flag) { return f.app->get_option(flag)->count() > 0; };
  for (const Refused& r : kRefused)
    if (given(r.name)) fail_usage("{} is not implemented in weft: {}", r.name, r.why);
  if (given("--spec") && !spec_names_hybrid_stack(f))
    fail_usage("--spec {}: weft builds one model code; it accepts the specs that name it, "
               "{} {} and {} {} (Megatron's pretrain_mamba.py / pretrain_hybrid.py stack), and "
               "builds the transformer without --spec", fmt::join(f.spec, " "), kHybridSpecs[0][0],
               kHybridSpecs[0][1], kHybridSpecs[1][0], kHybridSpecs[1][1]);
  one_of<std::string>("--ckpt-format", f.ckpt_format, {"torch_dist"},
                      "weft writes its own distributed format, which loads into any layout "
                      "(docs/checkpoint-format.md); give torch_dist or leave the flag out");
  one_of<std::string>("--dataloader-type", f.dataloader_type, {"single"},
                      "weft reads the shuffled sample index in order, as Megatron's single; "
                      "cyclic and external are not implemented");
  one_of<std::string>("--optimizer", f.optimizer, {"adam"},
                      "weft's optimizer is Megatron's adam (AdamW)");
  one_of<std::string>("--attention-backend", f.attention_backend,
                      {"auto", "flash", "fused", "unfused", "local"},
                      "must be auto, flash, fused, unfused or local");
  one_of<std::string>("--data-parallel-sharding-strategy", f.dp_sharding,
                      {"no_shard", "optim", "optim_grads", "optim_grads_params"},
                      "must be no_shard, optim, optim_grads or optim_grads_params");
  one_of<std::string>("--outer-dp-sharding-strategy", f.outer_dp_sharding, {"no_shard", "optim"},
                      "must be no_shard or optim");
  one_of<std::string>("--rerun-mode", f.rerun_mode, {"validate_results", "report_stats", "disabled"},
                      "must be validate_results, report_stats or disabled");
  one_of<std::string>("--cross-entropy-fusion-impl", f.ce_fusion_impl, {"native", "te"},
                      "must be native or te");
  one_of<std::string>("--timing-log-option", f.timing_log_option, {"minmax", "max", "all"},
                      "must be minmax, max or all");
  one_of<int>("--timing-log-level", f.timing_log_level, {0, 1, 2}, "must be 0, 1 or 2");
  one_of<int>("--empty-unused-memory-level", f.empty_unused_memory_level, {0, 1, 2},
              "must be 0, 1 or 2");
  if (f.num_workers < 0) fail_usage("--num-workers must be >= 0 (got {})", f.num_workers);
  if (f.dataset_builder_threads < 1)
    fail_usage("--num-dataset-builder-threads must be >= 1 (got {})", f.dataset_builder_threads);
  if (f.tensorboard_queue_size < 1)
    fail_usage("--tensorboard-queue-size must be >= 1 (got {})", f.tensorboard_queue_size);
  if (f.manual_gc_interval < 0)
    fail_usage("--manual-gc-interval must be >= 0 (got {})", f.manual_gc_interval);

  std::vector<std::string> warnings;
  for (auto [name, why] : kWarned)
    if (given(name)) warnings.push_back(fmt::format("{} has no effect: {}", name, why));
  for (auto [name, why] : kWarnedWithValue)
    if (given(name)) warnings.push_back(fmt::format("{} has no effect: {}", name, why));
  if (f.dp_sharding != "optim_grads_params")
    warnings.push_back(fmt::format(
        "--data-parallel-sharding-strategy {}: weft shards parameters, gradients and optimizer "
        "state over the data-parallel ranks as optim_grads_params (the same results; memory as "
        "`weft plan` shows)", f.dp_sharding));
  if (f.rerun_mode == "report_stats")
    warnings.push_back("--rerun-mode report_stats has no effect: weft does not rerun iterations "
                       "to measure their reproducibility");
  if (f.outer_dp_sharding != "no_shard")
    warnings.push_back(fmt::format(
        "--outer-dp-sharding-strategy {}: weft's HSDP replicas hold whole copies of their "
        "shard group's state, as no_shard (the same results)", f.outer_dp_sharding));
  return warnings;
}

}  // namespace weft
