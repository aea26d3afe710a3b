// Trainer (see trainer.h).
#include "weft/comm/process_groups.h"
#include "weft/train/trainer.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "weft/checkpoint/async_save.h"
#include "weft/checkpoint/checkpoint.h"
#include "weft/checkpoint/format.h"
#include "weft/data/tokenizer.h"
#include "weft/comm/device.h"
#include "weft/core/error.h"
#include "weft/core/fault.h"
#include "weft/optim/grad_clip.h"
#include "weft/parallel/grad_access.h"
#include "weft/parallel/grad_sync.h"
#include "weft/parallel/graphed_schedule.h"
#include "weft/parallel/schedule.h"
#include "weft/train/config_json.h"
#include "weft/train/preflight.h"
#include "weft/train/schedule_resume.h"
#include "weft/train/validate_numbers.h"
#include "weft/train/tensorboard.h"
#include "weft/train/train_log.h"

namespace weft {
namespace {

volatile std::sig_atomic_t g_exit_signal = 0;
void on_exit_signal(int) { g_exit_signal = 1; }

// --exit-duration-in-mins counts from the process's start, as Megatron's (its clock starts when
// training.py is imported): a scheduler's wall-time limit covers the startup, the model's build,
// the --load and the dataset's index too. Set at the program's static initialisation.
const std::chrono::steady_clock::time_point kProcessStart = std::chrono::steady_clock::now();

}  // namespace

bool exit_signal_received() { return g_exit_signal != 0; }

nlohmann::json train_config_to_json(const TrainConfig& c) {
  const ModelConfig& m = c.model;
  auto dt = [](c10::ScalarType t) { return t == at::kBFloat16 ? "bf16" : "fp32"; };
  nlohmann::json j = {
      {"model",
       {{"num_layers", m.num_layers}, {"hidden_size", m.hidden_size},
        {"ffn_hidden_size", m.ffn_hidden_size}, {"squared_relu", m.squared_relu},
        {"num_attention_heads", m.num_attention_heads},
        {"num_query_groups", m.num_query_groups},
        {"kv_channels", m.mla() ? -1 : m.head_dim()},  // MLA: unused (hidden may be < heads)
        {"qk_layernorm", m.qk_layernorm}, {"add_qkv_bias", m.add_qkv_bias},
        {"seq_length", m.seq_length},
        {"vocab_size", m.vocab_size}, {"init_method_std", m.init_method_std},
        {"rotary_base", m.rotary_base}, {"rotary_percent", m.rotary_percent},
        {"use_rope_scaling", m.use_rope_scaling},
        {"rope_scaling_factor", m.rope_scaling_factor},
        {"rotary_seq_len_interpolation_factor", m.rotary_seq_len_interpolation_factor},
        {"norm_epsilon", m.norm_epsilon},
        {"untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights},
        {"bf16", m.bf16}, {"num_experts", m.num_experts}, {"moe_router_topk", m.moe_router_topk},
        {"moe_ffn_hidden_size", m.expert_ffn()},
        {"moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size},
        {"moe_aux_loss_coeff", m.moe_aux_loss_coeff}, {"moe_z_loss_coeff", m.moe_z_loss_coeff},
        {"moe_router_score_function", m.moe_router_score_function},
        {"position_embedding_type", m.position_embedding_type},
        {"moe_router_pre_softmax", m.moe_router_pre_softmax},
        {"moe_router_topk_scaling_factor", m.moe_router_topk_scaling_factor},
        {"moe_router_num_groups", m.moe_router_num_groups},
        {"moe_router_group_topk", m.moe_router_group_topk},
        {"moe_router_load_balancing_type", m.moe_router_load_balancing_type},
        {"moe_router_enable_expert_bias", m.moe_router_enable_expert_bias},
        {"moe_router_bias_update_rate", m.moe_router_bias_update_rate},
        {"moe_router_dtype", m.moe_router_dtype},
        {"moe_layer_pattern", m.moe_layer_pattern}, {"moe_grouped_gemm", m.moe_grouped_gemm},
        {"moe_expert_capacity_factor", m.moe_expert_capacity_factor},
        {"moe_token_drop_policy", m.moe_token_drop_policy},
        {"moe_pad_expert_input_to_capacity", m.moe_pad_expert_input_to_capacity},
        {"moe_apply_probs_on_input", m.moe_apply_probs_on_input},
        {"mtp_num_layers", m.mtp_num_layers}, {"layer_symbols", m.layer_symbols},
        {"hybrid_stage_layers", m.hybrid_stage_layers},
        {"mtp_layer_symbols", m.mtp_layer_symbols}, {"mamba_state_dim", m.mamba_state_dim},
        {"mamba_head_dim", m.mamba_head_dim}, {"mamba_num_groups", m.mamba_num_groups},
        {"mamba_num_heads", m.mamba_heads()},
        {"mtp_loss_scaling_factor", m.mtp_loss_scaling_factor}}},
      {"optimizer",
       {{"weight_decay", c.adam.weight_decay}, {"start_weight_decay", c.lr.start_wd},
        {"end_weight_decay", c.lr.end_wd}, {"weight_decay_incr_style", c.lr.wd_style},
        {"adam_beta1", c.adam.beta1},
        {"adam_beta2", c.adam.beta2}, {"adam_eps", c.adam.eps},
        {"exp_avg_dtype", dt(c.adam.exp_avg_dtype)}, {"exp_avg_sq_dtype", dt(c.adam.exp_avg_sq_dtype)},
        {"use_precision_aware_optimizer", c.adam.precision_aware},
        {"grad_reduce_in_bf16", c.adam.grad_dtype == at::kBFloat16}, {"clip_grad", c.clip_grad}}},
      {"lr", {{"lr", c.lr.lr}, {"min_lr", c.lr.min_lr}, {"warmup_iters", c.lr.warmup_iters},
              {"warmup_init", c.lr.warmup_init},
              {"decay_iters", c.lr.decay_iters}, {"style", c.lr.style},
              {"warmup_fraction", c.lr.warmup_fraction}, {"sample_based", c.lr.sample_based},
              {"warmup_samples", c.lr.warmup_samples}, {"decay_samples", c.lr.decay_samples},
              {"decoupled_lr", c.lr.decoupled_lr}, {"decoupled_min_lr", c.lr.decoupled_min_lr}}},
      {"train_samples", c.train_samples},
      {"micro_batch_size", c.micro_batch_size}, {"global_batch_size", c.global_batch_size},
      {"step_batch_size_schedule", c.step_batch_size_schedule},
      {"train_iters", c.train_iters}, {"overlap_param_gather", c.overlap_param_gather},
      {"overlap_grad_reduce", c.overlap_grad_reduce}, {"seed", c.seed}, {"device", c.device},
      {"save_interval", c.save_interval},
      {"data", {{"mock_data", !c.real_data()}, {"data_path", c.data_path}, {"split", c.split},
                {"train_data_path", c.split_data_path[0]},
                {"valid_data_path", c.split_data_path[1]},
                {"test_data_path", c.split_data_path[2]},
                {"eval_interval", c.eval_interval}, {"eval_iters", c.eval_iters},
                // As given (-1: the training's), so that a difference names its own flag.
                {"eval_global_batch_size", c.eval_global_batch_size},
                {"eval_micro_batch_size", c.eval_micro_batch_size},
                {"start_eval_at_iter", c.start_eval_at_iter}}}};
  if (m.mla()) {  // written only for MLA models, so that other configs keep their bytes
    nlohmann::json& model = j["model"];
    model["multi_latent_attention"] = true;
    model["q_lora_rank"] = m.q_lora_rank;
    model["kv_lora_rank"] = m.kv_lora_rank;
    model["qk_head_dim"] = m.qk_head_dim;
    model["qk_pos_emb_head_dim"] = m.qk_pos_emb_head_dim;
    model["v_head_dim"] = m.v_head_dim;
    model["rope_type"] = m.yarn() ? "yarn" : "rope";
    model["rotary_scaling_factor"] = m.rotary_scaling_factor;
    model["mscale"] = m.mscale;
    model["mscale_all_dim"] = m.mscale_all_dim;
  }
  return j;
}

BatchSchedule train_batches(const TrainConfig& c) {
  return c.step_batch_size_schedule.empty()
             ? BatchSchedule::constant(c.global_batch_size)
             : BatchSchedule::parse(c.step_batch_size_schedule, c.model.seq_length);
}

nlohmann::json layout_to_json(const Mesh& mesh, const TrainConfig& c) {
  return {{"world", mesh.world_size()}, {"tp", mesh.tp()}, {"cp", mesh.cp()},
          {"pp", mesh.pp()},           {"ep", mesh.ep()}, {"etp", mesh.etp()},
          {"dp", mesh.dp()},           {"dp_outer", mesh.dp_outer()}, {"order", mesh.order()},
          {"first_stage_layers", c.first_stage_layers},
          {"last_stage_layers", c.last_stage_layers}};
}

namespace {

// --cuda-graph-impl and --cuda-graph-warmup-steps (see TrainConfig).
void validate_cuda_graph(const TrainConfig& c, const Mesh& mesh) {
  if (c.cuda_graph_impl == "none") return;
  if (c.cuda_graph_impl == "transformer_engine")
    fail_usage("--cuda-graph-impl transformer_engine: weft has no Transformer Engine; use local");
  if (c.cuda_graph_impl != "local")
    fail_usage("--cuda-graph-impl must be none or local (got '{}')", c.cuda_graph_impl);
  if (c.device != "cuda") fail_usage("--cuda-graph-impl local needs --device cuda");
  if (mesh.pp() > 1)
    fail_usage("--cuda-graph-impl local needs --pipeline-model-parallel-size 1 (got {}): the "
               "graph holds one microbatch's forward and backward, which pipeline stages split "
               "with transfers between them", mesh.pp());
  const int shard = mesh.dp() * mesh.cp() / mesh.dp_outer();
  if (shard > 1)
    fail_usage("--cuda-graph-impl local needs an FSDP shard group of one rank (got {} = dp {} / "
               "--num-distributed-optimizer-instances {}): parameter gathers and gradient "
               "reduce-scatters would run inside the graph; set "
               "--num-distributed-optimizer-instances to dp", shard, mesh.dp(), mesh.dp_outer());
  if (c.model.num_moe_layers() > 0)
    fail_usage("--cuda-graph-impl local does not support routed experts (--num-experts {}): "
               "routing decides shapes from the data, which a graph cannot replay",
               c.model.num_experts);
  if (train_batches(c).entries().size() > 1)
    fail_usage("--cuda-graph-impl local does not support a --step-batch-size-schedule that "
               "changes the batch: the graph replays one loss scale, 1 / (the global batch x "
               "--seq-length), captured at its first step");
  if (c.eod_mask_loss)
    fail_usage("--cuda-graph-impl local does not support --eod-mask-loss: the graph replays one "
               "microbatch without its loss mask");
  if (c.pad_token >= 0)
    fail_usage("--cuda-graph-impl local does not support the tokenizer's pad id {} (labels equal "
               "to it leave the loss, as in Megatron's GPTDataset): the graph replays one "
               "microbatch without its loss mask", c.pad_token);
  if (c.cuda_graph_warmup_steps < 1)
    fail_usage("--cuda-graph-warmup-steps must be >= 1 (got {}): the first iteration runs "
               "eagerly to set up the kernels the graph records", c.cuda_graph_warmup_steps);
}

}  // namespace

void validate_train_config(const TrainConfig& c, int world_size) {
  validate_numeric_flags(c);
  LayoutConfig l = c.layout;
  l.world_size = world_size;
  Mesh mesh(l);  // validates the layout
  if (mesh.tp() > 1)
    fail_usage("--tensor-model-parallel-size {} is not supported by weft train yet (tensor "
               "parallelism is not implemented); use 1", mesh.tp());
  if (mesh.cp() > 1)
    fail_usage("--context-parallel-size {} is not supported by weft train yet (context "
               "parallelism is not implemented); use 1", mesh.cp());
  const auto& m = c.model;
  if (mesh.etp() > 1)
    fail_usage("--expert-tensor-parallel-size {} is not supported (tensor parallelism is not "
               "implemented); use 1", mesh.etp());
  // Megatron's MultiTokenPredictionLayer recomputes a depth only as one layer.
  if (m.recompute.mtp_depths() && m.mtp_num_layers > 0 && m.recompute.num_layers != 1)
    fail_usage("--recompute-num-layers {} with --mtp-num-layers {}: Megatron recomputes the MTP "
               "depths only with --recompute-num-layers 1 under --recompute-method uniform "
               "(its assertion); give 1, or --recompute-method block (which leaves the depths "
               "unrecomputed)", m.recompute.num_layers, m.mtp_num_layers);
  if (mesh.ep() > 1 && m.num_experts == 0)
    fail_usage("--expert-model-parallel-size {} needs a mixture-of-experts model: set "
               "--num-experts", mesh.ep());
  if (m.num_experts > 0 && m.num_experts % mesh.ep() != 0)
    fail_usage("--num-experts {} is not divisible by --expert-model-parallel-size {}",
               m.num_experts, mesh.ep());
  // Megatron's allgather (its default) and alltoall dispatchers send the same tokens to the same
  // experts and differ in their communication only; weft runs both as its all-to-all exchange.
  if (c.moe_token_dispatcher_type != "alltoall" && c.moe_token_dispatcher_type != "allgather")
    fail_usage("--moe-token-dispatcher-type must be allgather or alltoall (got '{}'; weft runs "
               "both as its all-to-all exchange and has no flex dispatcher)",
               c.moe_token_dispatcher_type);
  if (m.hidden_size < 1 || m.num_attention_heads < 1 ||
      (m.kv_channels == -1 && !m.mla() && m.hidden_size % m.num_attention_heads))
    fail_usage("--hidden-size {} must be a positive multiple of --num-attention-heads {}, or "
               "give the head dim with --kv-channels", m.hidden_size, m.num_attention_heads);
  if (m.kv_channels != -1 && m.kv_channels < 1)
    fail_usage("--kv-channels must be >= 1, or -1 for --hidden-size / --num-attention-heads "
               "(got {})", m.kv_channels);
  if (!m.mla() && m.head_dim() % 2)
    fail_usage("head dim ({} = {}) must be even for RoPE",
               m.kv_channels > 0 ? "--kv-channels" : "--hidden-size/--num-attention-heads",
               m.head_dim());
  if (m.num_query_groups < 1 || (!m.mla() && m.num_attention_heads % m.num_query_groups))
    fail_usage("--num-attention-heads {} must be a multiple of --num-query-groups {}",
               m.num_attention_heads, m.num_query_groups);
  if (m.ffn_hidden_size < 1) fail_usage("--ffn-hidden-size must be >= 1");
  if (m.seq_length < 1) fail_usage("--seq-length must be >= 1");
  if (m.vocab_size < 2) fail_usage("--vocab-size must be >= 2");
  check_model_config(m);
  if (!m.hybrid_stage_layers.empty()) {
    if (static_cast<int>(m.hybrid_stage_layers.size()) != mesh.pp())
      fail_usage("--hybrid-layer-pattern has {} pipeline stage(s) between '|', but "
                 "--pipeline-model-parallel-size is {}", m.hybrid_stage_layers.size(), mesh.pp());
  } else {
    if (m.hybrid() && c.first_stage_layers < 0 && c.last_stage_layers < 0 &&
        m.num_layers % mesh.pp() != 0)
      fail_usage("--hybrid-layer-pattern has {} layers, not divisible by "
                 "--pipeline-model-parallel-size {}; mark the stages with '|' in the pattern (or "
                 "use --decoder-first/last-pipeline-num-layers)", m.num_layers, mesh.pp());
    split_layers(m.num_layers, mesh.pp(), c.first_stage_layers, c.last_stage_layers);
  }
  if (c.micro_batch_size < 1) fail_usage("--micro-batch-size must be >= 1");
  const int per_step = c.micro_batch_size * mesh.dp();
  if (c.global_batch_size < 1 || c.global_batch_size % per_step)
    fail_usage("--global-batch-size {} is not divisible by --micro-batch-size * dp = {}*{} = {}",
               c.global_batch_size, c.micro_batch_size, mesh.dp(), per_step);
  if (c.train_iters < 0) fail_usage("--train-iters must be >= 0");
  // The evaluation's batch, as Megatron's validate_args.
  if (c.eval_global_batch_size != -1 && c.eval_global_batch_size < 1)
    fail_usage("--eval-global-batch-size must be >= 1 (got {})", c.eval_global_batch_size);
  if (c.eval_micro_batch_size != -1 && c.eval_micro_batch_size < 1)
    fail_usage("--eval-micro-batch-size must be >= 1 (got {})", c.eval_micro_batch_size);
  if (const int per_eval = c.eval_micro_batch() * mesh.dp(); c.eval_global_batch() % per_eval)
    fail_usage("--eval-global-batch-size {} is not divisible by --eval-micro-batch-size * dp = "
               "{}*{} = {} (they default to --global-batch-size and --micro-batch-size)",
               c.eval_global_batch(), c.eval_micro_batch(), mesh.dp(), per_eval);
  if (c.skip_train && !c.dump_first_batch.empty())
    fail_usage("--dump-first-batch with --skip-train: no training batch is read");
  if (c.skip_train && c.eval_iters == 0 && !c.full_validation)
    fail_usage("--skip-train with --eval-iters 0: nothing to evaluate");
  // Full validation fills its last round with masked copies of the last sample; with token
  // dropping those rows would take expert capacity from the real ones.
  if (c.full_validation && c.model.moe_drops_tokens())
    fail_usage("--full-validation with --moe-expert-capacity-factor: the padding rows of its "
               "last evaluation round would compete for the experts' capacity; validate "
               "dropless or with --eval-iters");
  if (c.start_eval_at_iter != -1 && c.start_eval_at_iter < 0)
    fail_usage("--start-eval-at-iter must be >= 0 (got {})", c.start_eval_at_iter);
  if (!c.step_batch_size_schedule.empty() && !c.skip_train) {  // nothing trains with it
    const BatchSchedule b = train_batches(c);
    // A run from sample 0; with --load (not --finetune) the Trainer checks from where the
    // checkpoint, if there is one, starts the run.
    if (c.load.empty() || c.finetune) b.check_reachable(0, c.train_iters, c.micro_batch_size, mesh.dp());
  }
  if (c.clip_grad < 0) fail_usage("--clip-grad must be >= 0");
  if (c.device != "cpu" && c.device != "cuda")
    fail_usage("--device must be cpu or cuda (got '{}')", c.device);
  validate_lr_schedule(c.lr);
  {
    LrScheduleConfig wd = c.lr;
    resolve_weight_decay(&wd, c.adam.weight_decay);
  }
  // Megatron asserts warmup < decay steps, the decay defaulting to --train-iters: a warmup
  // longer than the run never reaches --lr. (weft allows warmup == decay: the schedule is
  // defined there, and one-iteration runs with one warmup iteration are common in tests.)
  if (!c.skip_train && c.lr.decay_iters < 0 && c.train_iters > 0 &&
      c.lr.warmup_iters > c.train_iters)
    fail_usage("--lr-warmup-iters {} is larger than --train-iters {} (the decay's default "
               "length): the learning rate would never reach --lr; shorten the warmup or give "
               "--lr-decay-iters", c.lr.warmup_iters, c.train_iters);
  if (!c.skip_train && c.lr.sample_based && c.lr.decay_samples < 0 &&
      c.lr.warmup_samples > c.train_samples)
    fail_usage("--lr-warmup-samples {} is larger than --train-samples {} (the decay's default "
               "length): the learning rate would never reach --lr; shorten the warmup or give "
               "--lr-decay-samples", c.lr.warmup_samples, c.train_samples);
  ckpt_parse_strictness(c.strictness);
  if (c.save_interval < 0) fail_usage("--save-interval must be >= 0");
  if (c.save_interval > 0 && c.save.empty()) fail_usage("--save-interval needs --save DIR");
  if (c.async_save && c.save.empty()) fail_usage("--async-save needs --save DIR");
  if (c.ckpt_step >= 0 && c.load.empty()) fail_usage("--ckpt-step needs --load DIR");
  if (c.finetune && c.load.empty()) fail_usage("--finetune needs --load DIR");
  if (c.override_opt_param_scheduler && c.use_checkpoint_opt_param_scheduler)
    fail_usage("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler both "
               "given; give one (Megatron refuses both too)");
  if (c.exit_interval < 0) fail_usage("--exit-interval must be >= 0");
  if (c.exit_duration_mins < 0) fail_usage("--exit-duration-in-mins must be >= 0");
  if (!(c.distributed_timeout_minutes > 0))
    fail_usage("--distributed-timeout-minutes must be > 0 (got {})", c.distributed_timeout_minutes);
  validate_profile_config(c.profile);
  validate_data_config(c);
  for (int r : c.profile.ranks)
    if (c.profile.enabled && r >= world_size)
      fail_usage("--profile-ranks: rank {} is outside the world of {} ranks", r, world_size);
  if (c.profile.enabled && !c.profile.pytorch && c.device != "cuda")
    fail_usage("--profile without --use-pytorch-profiler marks an Nsight Systems capture range "
               "(cudaProfilerStart/Stop), which needs --device cuda; add --use-pytorch-profiler "
               "for a Kineto trace");
  if (!c.tensorboard_dir.empty() && !tensorboard_available())
    fail_usage("--tensorboard-dir: weft was built without protobuf (install libprotobuf-dev "
               "protobuf-compiler and rebuild)");
  if (c.tensorboard_log_interval < 1) fail_usage("--tensorboard-log-interval must be >= 1");
  validate_cuda_graph(c, mesh);
  if (c.peak_tflops < 0 && c.peak_tflops != -1)
    fail_usage("--peak-tflops must be >= 0 (0: no MFU; -1: the default) (got {})", c.peak_tflops);
}

namespace {

// Collective over `world`, first thing in the constructor: every rank must have been started
// with the same training config (model, optimizer, schedule, batch, data flags; the layout is
// checked by ProcessGroups). Ranks given, say, different --num-layers would otherwise build
// different stages and train silently wrong, or hang in a collective. Each leaf of the config
// JSON is hashed (std::hash: every rank runs the same binary); the hashes are all-gathered and
// every rank throws the same UsageError naming the lowest differing rank and the first key.
void check_same_config_on_every_rank(const TrainConfig& cfg, Communicator& world) {
  std::vector<std::pair<std::string, std::string>> leaves;  // (key path, value), fixed order
  std::function<void(const nlohmann::json&, const std::string&)> walk =
      [&](const nlohmann::json& j, const std::string& path) {
        if (!j.is_object()) {
          leaves.emplace_back(path, j.dump());
          return;
        }
        for (const auto& [k, v] : j.items()) walk(v, path.empty() ? k : path + "." + k);
      };
  walk(train_config_to_json(cfg), "");
  // Settings that decide collectives but are not stored in checkpoints (a checkpoint saved
  // with --async-save is byte for byte a synchronous one).
  leaves.emplace_back("async_save", cfg.async_save ? "true" : "false");
  // Evaluation-only runs and the validation sets decide which collectives run.
  leaves.emplace_back("skip_train", cfg.skip_train ? "true" : "false");
  leaves.emplace_back("full_validation", cfg.full_validation ? "true" : "false");
  leaves.emplace_back("multiple_validation_sets", cfg.multiple_validation_sets ? "true" : "false");
  leaves.emplace_back("exit_on_save_failure", cfg.exit_on_save_failure ? "true" : "false");
  // Not stored in checkpoints, but a rank without --check-for-nan-in-loss-and-grad would skip
  // the collective that names the parameter.
  leaves.emplace_back("check_for_nan_in_loss_and_grad", cfg.check_for_nan ? "true" : "false");
  leaves.emplace_back("max_skipped_iterations", std::to_string(cfg.max_skipped_iterations));
  // How the stages weigh the losses: ranks that disagree would train silently wrong.
  leaves.emplace_back("eod_mask_loss", cfg.eod_mask_loss ? "true" : "false");
  leaves.emplace_back("eod_token", std::to_string(cfg.eod_token));
  leaves.emplace_back("pad_token", std::to_string(cfg.pad_token));
  leaves.emplace_back("calculate_per_token_loss", cfg.calculate_per_token_loss ? "true" : "false");
  // What a --load restores, and how the schedule resumes: a rank that loads otherwise would
  // fail alone, or train at another rate.
  for (auto [name, on] : {std::pair{"finetune", cfg.finetune}, {"no_load_optim", cfg.no_load_optim},
                          {"no_load_rng", cfg.no_load_rng},
                          {"override_opt_param_scheduler", cfg.override_opt_param_scheduler},
                          {"use_checkpoint_opt_param_scheduler",
                           cfg.use_checkpoint_opt_param_scheduler}})
    leaves.emplace_back(name, on ? "true" : "false");
  const int64_t n = static_cast<int64_t>(leaves.size());
  at::Tensor mine = at::empty({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i)
    mine[i] = static_cast<int64_t>(std::hash<std::string>{}(leaves[i].second));
  at::Tensor all = at::empty({world.size() * n}, at::kLong);
  world.all_gather(mine, all);
  all = all.reshape({world.size(), n});
  for (int r = 1; r < world.size(); ++r)
    for (int64_t i = 0; i < n; ++i)
      if (all[r][i].item<int64_t>() != all[0][i].item<int64_t>())
        fail_usage("rank {} was started with another value of '{}' than rank 0 (the first "
                   "difference found); pass the same flags to every rank",
                   r, leaves[i].first);
}

// The valid samples `evaluations` evaluations of --eval-iters batches read.
int64_t evaluations_samples(const TrainConfig& c, int64_t evaluations) {
  return evaluations * c.eval_iters * c.eval_global_batch();
}

// The consumed_valid_samples of the checkpoint of `iteration` in --load, or, where its metadata
// lacks them (older checkpoints), the samples of the evaluations up to that iteration under this
// run's flags (Megatron's fallback). A metadata error is left to the load, which reports it.
int64_t checkpoint_consumed_valid(const TrainConfig& c, int iteration) {
  const int64_t implied = evaluations_samples(c, c.evaluations_through(iteration));
  nlohmann::json meta;
  CkptIndex index;
  if (!ckpt_read_metadata(ckpt_iter_dir(c.load, iteration), &meta, &index)) return implied;
  return meta.value("consumed_valid_samples", implied);
}

}  // namespace

Trainer::Trainer(const TrainConfig& cfg, const ProcessGroups& groups)
    : cfg_(cfg), groups_(groups) {
  check_same_config_on_every_rank(cfg_, groups.control());
  validate_train_config(cfg_, groups.mesh().world_size());
  ckpt_seed_rng(cfg_.seed + 100 * static_cast<uint64_t>(groups.mesh().coord(groups.rank(), "pp")));
  {
    // The splits are sized for --train-iters, or for the checkpoint's iteration when --load
    // resumes past it (its end-of-training evaluation reads the valid samples after that
    // iteration's evaluations).
    TrainConfig sized = cfg_;
    const int resumed = cfg_.load.empty() || cfg_.finetune
                            ? -1 : ckpt_load_iteration(cfg_.load, cfg_.ckpt_step);
    sized.train_iters = std::max(sized.train_iters, resumed);
    // The valid samples read before this run: the checkpoint's count, else its iteration's.
    const int64_t valid_from =
        resumed < 0 ? 0 : checkpoint_consumed_valid(cfg_, resumed);
    data_ = std::make_unique<TrainData>(sized, groups.control(), groups.rank(), valid_from,
                                        std::max(resumed, 0));
  }
  if (groups.rank() == 0 && !cfg_.quiet && !data_->no_test_reason().empty())
    fmt::print(stderr, "weft train: warning: no evaluation on the test split at the end: {}\n",
               data_->no_test_reason());
  batches_ = train_batches(cfg_);
  if (cfg_.lr.decay_iters < 0) cfg_.lr.decay_iters = cfg_.train_iters;
  if (cfg_.lr.sample_based && cfg_.lr.decay_samples < 0)
    cfg_.lr.decay_samples = cfg_.train_samples;
  cfg_.lr.global_batch = cfg_.global_batch_size;  // the schedule counts samples, as Megatron's
  if (batches_.from_flag() && !cfg_.lr.sample_based) {
    // Lengths in iterations under a batch schedule: the samples those iterations consume from
    // the start. (Megatron multiplies them by --global-batch-size, which is micro-batch x dp
    // there, and would decay the rate over a fraction of the iterations asked for.)
    LrScheduleConfig& l = cfg_.lr;
    l.sample_based = true;
    l.decay_samples = batches_.samples_after(0, l.decay_iters);
    l.warmup_samples = batches_.samples_after(0, l.warmup_iters);
  }
  resolve_weight_decay(&cfg_.lr, cfg_.adam.weight_decay);
  cfg_.lr.wd_incr_samples =
      cfg_.train_samples >= 0 && cfg_.lr.sample_based
          ? static_cast<double>(cfg_.train_samples)
          : static_cast<double>(batches_.samples_after(0, cfg_.train_iters));
  const Mesh& mesh = groups.mesh();
  StageOptions so;
  so.dtype = cfg_.model.bf16 ? at::kBFloat16 : at::kFloat;
  so.device = c10::Device(cfg_.device == "cuda" ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
  so.first_stage_layers = cfg_.first_stage_layers;
  so.last_stage_layers = cfg_.last_stage_layers;
  so.overlap_param_gather = cfg_.overlap_param_gather;
  so.overlap_grad_reduce = cfg_.overlap_grad_reduce;
  stage_ = std::make_unique<PipelineStage>(cfg_.model, groups, so);
  stage_->init_parameters(cfg_.seed);
  std::vector<FsdpUnit*> units;
  for (auto& u : stage_->units()) units.push_back(u.get());
  cfg_.adam.decoupled_lr = cfg_.lr.decoupled_lr != -1;  // the embedding and output's own group
  optimizer_ = std::make_unique<ShardedAdamW>(units, cfg_.adam);
  if (cfg_.cuda_graph_impl == "local") graphed_ = std::make_unique<GraphedMicrobatches>();
  // The first gradient write of a step overwrites instead of adding into zeros (no zeroing
  // pass; the weight-gradient GEMMs run with beta 0). Not with graphs: their replays repeat
  // the captured writes, whichever microbatch they replay.
  stage_->set_lazy_grad_zeroing(!graphed_);
  dp_rank_ = mesh.group_rank("dp_cp", groups.rank());
  if (!cfg_.save.empty() && !cfg_.skip_train) check_save_space();
  if (cfg_.async_save) {  // pin the snapshot buffer now, not as a stall at the first save
    async_saver_ = std::make_unique<AsyncCheckpointSaver>(groups_);
    async_saver_->reserve(*stage_, *optimizer_);
  }
  if (!cfg_.load.empty()) {
    LoadRequest req;
    req.dir = cfg_.load;
    req.step = cfg_.ckpt_step;
    req.strictness = ckpt_parse_strictness(cfg_.strictness);
    req.layout = layout_to_json(mesh, cfg_);
    req.finetune = cfg_.finetune;
    req.no_load_optim = cfg_.no_load_optim;
    req.no_load_rng = cfg_.no_load_rng;
    req.check_metadata = [this](const nlohmann::json& meta) {
      check_checkpoint_model(meta);
      if (cfg_.finetune || cfg_.no_load_optim) return;  // the schedule starts afresh
      const std::string warning = resume_lr_schedule(
          meta, {cfg_.override_opt_param_scheduler, cfg_.use_checkpoint_opt_param_scheduler},
          cfg_.load, &cfg_.lr);
      if (!warning.empty() && groups_.rank() == 0 && !cfg_.quiet)
        fmt::print(stderr, "weft train: warning: {}\n", warning);
    };
    nlohmann::json meta = ckpt_load(req, *stage_, *optimizer_, groups);
    if (meta.is_null() && cfg_.finetune)
      fail_usage("--finetune: --load {} holds no checkpoint (no tracker file)", cfg_.load);
    if (!meta.is_null() && cfg_.finetune) {
      check_tokenizer(meta);  // weights only: iteration, samples and counters start at 0
      if (groups.rank() == 0 && !cfg_.quiet)
        fmt::print("weft train: --finetune: loaded the model weights of {} (iteration {}); "
                   "starting at iteration 0 with a fresh optimizer\n", cfg_.load,
                   meta.value("iteration", 0));
    } else if (!meta.is_null()) {
      check_tokenizer(meta);
      if (!cfg_.skip_train) warn_if_other_data(meta);  // evaluating other data is the point
      iteration_ = meta.value("iteration", 0);
      consumed_samples_ = meta.value("consumed_samples", int64_t{0});
      consumed_valid_samples_ = meta.value(
          "consumed_valid_samples", evaluations_samples(cfg_, cfg_.evaluations_through(iteration_)));
      // WEFT_FAULT=train.reset_consumed_valid:<rank>:<iteration>:error plants a broken restore of
      // the valid stream on that rank (tests/app/verify_resume.sh).
      if (fault_error("train.reset_consumed_valid", groups.rank(), iteration_))
        consumed_valid_samples_ = 0;
      if (!cfg_.no_load_optim)  // the schedule continues from the checkpoint's samples
        scheduler_samples_ = checkpoint_scheduler_samples(meta, optimizer_->steps());
      skipped_iters_ = meta.value("skipped_iterations", 0);
      nan_iters_ = meta.value("nan_iterations", 0);
      last_saved_ = iteration_;
      if (groups.rank() == 0 && !cfg_.quiet)
        fmt::print("weft train: loaded {} at iteration {} ({} consumed samples){}\n", cfg_.load,
                   iteration_, consumed_samples_,
                   cfg_.no_load_optim ? "; --no-load-optim: a fresh optimizer" : "");
    }
  }
  // The batches the steps of this run will use, from where it starts (a checkpoint's samples,
  // or 0), on every rank alike. Earlier entries are not checked: a run may be resumed on more
  // ranks at a change of the batch.
  if (batches_.from_flag() && !cfg_.skip_train)
    batches_.check_reachable(consumed_samples_, cfg_.train_iters - iteration_,
                             cfg_.micro_batch_size, mesh.dp());
}

int Trainer::microbatches_at(int64_t consumed) const {
  return batches_.batch_at(consumed) / (cfg_.micro_batch_size * groups_.mesh().dp());
}

void Trainer::check_save_space() const {
  // [bytes, free]: every rank's bytes, rank 0's free space; summed, so that every rank takes
  // the same decision from the same numbers.
  constexpr int64_t kMetadataPerRank = int64_t{1} << 20;  // safetensors header, metadata share
  at::Tensor v = at::zeros({2}, at::kLong);
  v[0] = ckpt_bytes_on_rank(*stage_, *optimizer_) + kMetadataPerRank;
  if (groups_.rank() == 0) v[1] = free_bytes(cfg_.save);
  groups_.control().all_reduce(v, ReduceOp::kSum);
  const int64_t need = v[0].item<int64_t>(), free = v[1].item<int64_t>();
  if (free >= 0 && free < need)
    fail_usage("--save {}: one checkpoint needs {:.3f} GB (all ranks' shards) but only {:.3f} GB "
               "are free there", cfg_.save, need / 1e9, free / 1e9);
}

void Trainer::fail_non_finite(const IterationStats& s) const {
  // The global index (model order) of each parameter; the lowest non-finite one over all ranks
  // wins, found as a max of (count - index) so that "none" (0) loses.
  const std::vector<ParamSpec> specs = all_param_specs(cfg_.model);
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < specs.size(); ++i) index.emplace(specs[i].name, static_cast<int64_t>(i));
  const int64_t n = static_cast<int64_t>(specs.size());
  int64_t best = 0;
  for (auto& u : stage_->units()) {
    const at::Tensor g = grad_shard(*u);
    for (int i = 0; i < u->num_params(); ++i) {
      const ShardSegment& seg = u->segment(i);
      if (seg.valid_rows == 0) continue;
      auto it = index.find(u->spec(i).name);
      if (it == index.end() || n - it->second <= best) continue;
      if (!at::isfinite(g.narrow(0, seg.offset, seg.valid_numel())).all().item<bool>())
        best = n - it->second;
    }
  }
  at::Tensor v = at::tensor({best}, at::kLong);
  groups_.control().all_reduce(v, ReduceOp::kMax);
  best = v.item<int64_t>();
  const std::string loss = fmt::format("lm loss {}, load-balancing loss {}, mtp loss {}, z-loss {}",
                                       s.lm_loss, s.aux_loss, s.mtp_loss, s.z_loss);
  if (best == 0)
    fail("--check-for-nan-in-loss-and-grad: iteration {}: the loss is not finite ({}) while every "
         "gradient is finite; stopped without saving", s.iteration, loss);
  fail("--check-for-nan-in-loss-and-grad: iteration {}: the gradient of {} is not finite (the "
       "first such parameter in model order; grad norm {}, {}); stopped without saving",
       s.iteration, specs[static_cast<size_t>(n - best)].name, s.grad_norm, loss);
}

void Trainer::save() {
  const Mesh& mesh = groups_.mesh();
  SaveRequest req;
  req.dir = cfg_.save;
  req.iteration = iteration_;
  nlohmann::json& m = req.meta;
  m["config"] = train_config_to_json(cfg_);
  m["layout"] = layout_to_json(mesh, cfg_);
  m["consumed_samples"] = consumed_samples_;
  m["consumed_tokens"] = consumed_samples_ * cfg_.model.seq_length;
  m["consumed_valid_samples"] = consumed_valid_samples_;
  m["skipped_iterations"] = skipped_iters_;
  m["nan_iterations"] = nan_iters_;
  m["lr_scheduler"] = {{"lr", cfg_.lr.lr}, {"min_lr", cfg_.lr.min_lr},
                       {"warmup_iters", cfg_.lr.warmup_iters},
                       {"warmup_init", cfg_.lr.warmup_init},
                       {"decay_iters", cfg_.lr.decay_iters}, {"style", cfg_.lr.style},
                       {"warmup_fraction", cfg_.lr.warmup_fraction},
                       {"sample_based", cfg_.lr.sample_based},
                       {"warmup_samples", cfg_.lr.warmup_samples},
                       {"decay_samples", cfg_.lr.decay_samples},
                       {"global_batch", cfg_.lr.global_batch},
                       {"start_wd", cfg_.lr.start_wd}, {"end_wd", cfg_.lr.end_wd},
                       {"wd_incr_style", cfg_.lr.wd_style},
                       {"decoupled_lr", cfg_.lr.decoupled_lr},
                       {"decoupled_min_lr", cfg_.lr.decoupled_min_lr},
                       {"num_steps", scheduler_samples_},
                       {"iteration", iteration_}};
  // The weight decay's increment length only where it increases (a constant one has none to
  // compare; a checkpoint saved again at once by a shorter run stays the same bytes).
  if (cfg_.lr.wd_style != "constant") m["lr_scheduler"]["wd_incr_steps"] = cfg_.lr.wd_incr_samples;
  m["data"] = data_->identity();
  m["data"]["consumed_samples"] = consumed_samples_;
  if (!cfg_.tokenizer_identity.is_null()) m["tokenizer"] = cfg_.tokenizer_identity;
  nlohmann::json groups = nlohmann::json::object();
  for (const FsdpUnit* u : optimizer_->units())
    for (int i = 0; i < u->num_params(); ++i) {
      const std::string& n = u->spec(i).name;
      const ParamGroupSettings& g = optimizer_->group_of(n);
      groups[n] = {{"group", optimizer_->group_name_of(n)}, {"weight_decay", g.weight_decay},
                   {"beta1", g.beta1}, {"beta2", g.beta2}, {"eps", g.eps}};
    }
  m["optimizer"] = {{"steps", optimizer_->steps()}};
  req.local_param_groups = groups;  // merged over all stages by ckpt_save
  if (cfg_.async_save) {
    wait_for_save();  // a second save waits for the first
    if (!async_saver_) async_saver_ = std::make_unique<AsyncCheckpointSaver>(groups_);
  }
  try {
    if (async_saver_) async_saver_->start(req, *stage_, *optimizer_);
    else ckpt_save(req, *stage_, *optimizer_, groups_);
  } catch (const Error& e) {
    on_save_failure(e, iteration_);
    return;
  }
  last_saved_ = iteration_;
  if (groups_.rank() == 0 && !cfg_.quiet && !async_saver_)
    fmt::print("weft train: saved checkpoint {} at iteration {}\n", cfg_.save, iteration_);
}

void Trainer::wait_for_save() { finish_save(true); }

void Trainer::finish_save(bool wait) {
  if (!async_saver_ || !async_saver_->pending()) return;
  const int pending = async_saver_->pending_iteration();
  int committed = -1;
  try {
    committed = wait ? async_saver_->finish() : async_saver_->poll();
  } catch (const Error& e) {
    on_save_failure(e, pending);
    return;
  }
  if (committed >= 0 && groups_.rank() == 0 && !cfg_.quiet)
    fmt::print("weft train: saved checkpoint {} at iteration {}\n", cfg_.save, committed);
}

void Trainer::on_save_failure(const std::exception& e, int iteration) {
  if (cfg_.exit_on_save_failure) throw;
  if (last_saved_ == iteration) last_saved_ = -1;  // the end of training saves it again
  if (groups_.rank() == 0)
    fmt::print(stderr, "weft train: warning: the checkpoint of iteration {} was not saved; "
               "training goes on (--no-exit-on-save-failure): {}\n", iteration, e.what());
}

Trainer::~Trainer() = default;

bool Trainer::cuda_graph_captured() const { return graphed_ && graphed_->captured(); }

Microbatch Trainer::microbatch(int m) const {
  if (prefetched_for_ == consumed_samples_ && m < static_cast<int>(prefetched_.size()))
    return prefetched_[m];
  return fetch_microbatch(consumed_samples_, m);
}

Microbatch Trainer::fetch_microbatch(int64_t consumed, int m) const {
  const int64_t batch = batches_.batch_at(consumed);
  const int64_t per_rank = batch / groups_.mesh().dp();  // its microbatches x micro-batch
  const int64_t first = consumed + dp_rank_ * per_rank + static_cast<int64_t>(m) * cfg_.micro_batch_size;
  Microbatch b;
  if (!stage_->is_first() && !stage_->is_last()) {  // a middle stage: no data, its LossOptions
    add_loss_mask(&b, DataSplit::kTrain, consumed, batch);
    return b;
  }
  data_->fetch(DataSplit::kTrain, first, cfg_.micro_batch_size, stage_->options().device,
               &b.tokens, &b.labels);
  add_loss_mask(&b, DataSplit::kTrain, consumed, batch);
  return b;
}

void Trainer::add_loss_mask(Microbatch* b, DataSplit split, int64_t first, int64_t count) const {
  b->loss.per_token = cfg_.calculate_per_token_loss;
  const int64_t pad = cfg_.pad_token;
  if (!cfg_.eod_mask_loss && pad < 0) return;
  // A middle stage (no tokens) needs the step's count only for the per-token aux weight.
  if (!b->tokens.defined() && !cfg_.calculate_per_token_loss) return;
  const auto span = std::make_tuple(split, first, count);
  if (span != log_scale_span_) {
    const LossPositions n = data_->loss_positions(split, first, count,
                                                  cfg_.eod_mask_loss ? cfg_.eod_token : -1, pad);
    log_scale_ = 1.0 / static_cast<double>(std::max<int64_t>(n.unmasked, 1));
    // Only the pad: a span without it in any token or label runs unmasked (the same loss).
    span_masked_ = cfg_.eod_mask_loss || n.pad_seen;
    log_scale_span_ = span;
  }
  if (!span_masked_) return;
  if (b->tokens.defined()) {
    b->loss.mask =
        loss_keep(b->tokens, b->labels, cfg_.eod_mask_loss ? cfg_.eod_token : -1, pad)
            .to(at::kFloat);
    if (pad >= 0) {
      // Megatron's GPTDataset: pad tokens and labels become id 0 (the embedding's, and the MTP
      // depths' inputs), after the mask above left the pad labels out of the loss.
      b->tokens = b->tokens.masked_fill(b->tokens.eq(pad), 0);
      b->labels = b->labels.masked_fill(b->labels.eq(pad), 0);
    }
  }
  b->loss.log_scale = log_scale_;
}

void Trainer::prefetch_next_step(int it) {
  prefetched_.clear();
  prefetched_for_ = -1;
  if (it >= cfg_.train_iters) return;  // the training split holds train_iters batches
  if (!stage_->is_first() && !stage_->is_last()) return;  // middle stages read no batch
  const int64_t next = consumed_samples_ + batches_.batch_at(consumed_samples_);
  try {
    for (int m = 0, n = microbatches_at(next); m < n; ++m)
      prefetched_.push_back(fetch_microbatch(next, m));
  } catch (const std::exception&) {
    // A bad batch (e.g. a token id outside the vocabulary) is the next step's error, raised by
    // its own fetch: this step still logs, saves and exits as it would have.
    prefetched_.clear();
    return;
  }
  prefetched_for_ = next;
}

void Trainer::dump_first_batch() const {
  // Samples [consumed, consumed + global batch): the batch the next train_step reads, in
  // sample order (the dp ranks' microbatches are consecutive ranges of it).
  at::Tensor tokens, labels;
  data_->fetch(DataSplit::kTrain, consumed_samples_, batches_.batch_at(consumed_samples_),
               c10::Device(c10::kCPU), &tokens, &labels);
  const at::Tensor both = at::stack({tokens, labels}).to(at::kLong).contiguous();
  std::string header = fmt::format("{{'descr': '<i8', 'fortran_order': False, 'shape': ({}, {}, {}), }}",
                                   both.size(0), both.size(1), both.size(2));
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  FILE* f = std::fopen(cfg_.dump_first_batch.c_str(), "wb");
  if (!f) fail_usage("--dump-first-batch {}: cannot open for writing", cfg_.dump_first_batch);
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t hlen = static_cast<uint16_t>(header.size());  // little-endian host
  const size_t bytes = static_cast<size_t>(both.numel()) * sizeof(int64_t);
  const bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(&hlen, 2, 1, f) == 1 &&
                  std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
                  std::fwrite(both.data_ptr(), 1, bytes, f) == bytes;
  if (std::fclose(f) != 0 || !ok) fail("--dump-first-batch {}: write failed", cfg_.dump_first_batch);
}

void Trainer::check_checkpoint_model(const nlohmann::json& meta) const {
  const nlohmann::json* model = nullptr;
  if (auto c = meta.find("config"); c != meta.end() && c->is_object())
    if (auto m = c->find("model"); m != c->end()) model = &*m;
  if (!model) return;  // no recorded config: the tensor names and shapes are all there is
  std::vector<std::string> rope;
  std::vector<std::string> diff = model_mismatches(cfg_.model, model_config_from_json(*model), &rope);
  if (!rope.empty() && cfg_.override_checkpoint_rope) {
    if (groups_.rank() == 0 && !cfg_.quiet)
      fmt::print("weft train: warning: --override-checkpoint-rope: the checkpoint {} was trained "
                 "with other RoPE settings: {}\n", cfg_.load, fmt::join(rope, ", "));
  } else {
    diff.insert(diff.end(), rope.begin(), rope.end());
  }
  if (diff.empty()) return;
  fail_usage("--load {}: this run's model differs from the checkpoint's, which would load into "
             "another function: {}; give the checkpoint's values{}",
             cfg_.load, fmt::join(diff, ", "),
             rope.empty() || cfg_.override_checkpoint_rope
                 ? ""
                 : " (or --override-checkpoint-rope to change the RoPE on purpose)");
}

void Trainer::check_tokenizer(const nlohmann::json& meta) const {
  const nlohmann::json saved = meta.value("tokenizer", nlohmann::json());
  const nlohmann::json& mine = cfg_.tokenizer_identity;
  if (saved.is_null() || mine.is_null() || same_tokenizer(saved, mine)) return;
  if (cfg_.override_tokenizer) {
    if (groups_.rank() == 0 && !cfg_.quiet)
      fmt::print("weft train: warning: --override-tokenizer: the checkpoint was trained with "
                 "tokenizer {}, this run uses {}\n", saved.dump(), mine.dump());
    return;
  }
  // The same tokenizer read another way: HuggingFaceTokenizer's template specials, whose
  // default changed (Megatron's since February 2026).
  nlohmann::json a = saved, b = mine;
  a.erase("include_special_tokens");
  b.erase("include_special_tokens");
  const bool saved_specials = saved.value("include_special_tokens", false);
  const std::string hint =
      !same_tokenizer(a, b) ? ""
      : saved_specials      ? " (the same tokenizer; the checkpoint's run added the template's "
                              "special tokens: drop --tokenizer-hf-no-include-special-tokens)"
                            : " (the same tokenizer; the checkpoint's run read texts without the "
                              "template's special tokens, weft's default before: add "
                              "--tokenizer-hf-no-include-special-tokens)";
  fail_usage("--tokenizer-type/--tokenizer-model: {} differs from the tokenizer the checkpoint {} "
             "was trained with ({}){}; pass --override-tokenizer to load it anyway",
             mine.dump(), cfg_.load, saved.dump(), hint);
}

void Trainer::warn_if_other_data(const nlohmann::json& meta) const {
  // The files are compared by size and hash, not by path (data moved or named relative).
  // Only the training stream counts: per-split paths' "valid" and "test" sets may change.
  auto without_paths = [](nlohmann::json d) {
    d.erase("consumed_samples");
    d.erase("valid");
    d.erase("test");
    if (d.contains("blend") && d["blend"].is_array())
      for (auto& b : d["blend"]) b.erase("prefix");
    return d;
  };
  const nlohmann::json saved = without_paths(meta.value("data", nlohmann::json::object()));
  if (groups_.rank() == 0 && !cfg_.quiet && !saved.empty() &&
      saved != without_paths(data_->identity()))
    fmt::print(stderr, "weft train: warning: --load {}: the checkpoint was trained on other data "
               "({}); this run reads {} from sample {} on\n", cfg_.load, saved.dump(),
               data_->identity().dump(), meta.value("consumed_samples", int64_t{0}));
}

double Trainer::evaluate(DataSplit split, int64_t first_sample) {
  WEFT_CHECK(split == DataSplit::kTest ? data_->has_test() : data_->has_valid(),
             "evaluate() without that split (--eval-iters/--eval-interval, --split)");
  if (split == DataSplit::kValid && cfg_.full_validation) return evaluate_full_sets(nullptr);
  at::NoGradGuard no_grad;
  // --eval-global-batch-size samples per evaluation iteration in microbatches of
  // --eval-micro-batch-size (defaults: the training's; micro-batch x dp under a
  // --step-batch-size-schedule, as Megatron's eval batch).
  const int gbs = cfg_.eval_global_batch(), mbs = cfg_.eval_micro_batch();
  const int microbatches = gbs / (mbs * groups_.mesh().dp());
  const int64_t per_rank = static_cast<int64_t>(mbs) * microbatches;
  const double loss_scale =
      1.0 / (static_cast<double>(gbs) * cfg_.model.seq_length * cfg_.eval_iters);
  const c10::Device dev = stage_->options().device;
  at::Tensor sum = at::zeros_like(stage_->losses());  // [lm, aux, mtp, z]
  for (int k = 0; k < cfg_.eval_iters; ++k) {
    auto batch = [&](int m) {
      const int64_t first = first_sample + static_cast<int64_t>(k) * gbs + dp_rank_ * per_rank +
                            static_cast<int64_t>(m) * mbs;
      Microbatch b;
      if (stage_->is_first() || stage_->is_last())
        data_->fetch(split, first, mbs, dev, &b.tokens, &b.labels);
      add_loss_mask(&b, split, first_sample, static_cast<int64_t>(gbs) * cfg_.eval_iters);
      return b;
    };
    sum.add_(run_forward_only(*stage_, *groups_.get("pp"), microbatches, mbs, batch, loss_scale));
  }
  groups_.world().all_reduce(sum, ReduceOp::kSum);
  return sum[0].item<double>();
}

double Trainer::evaluate_full_sets(std::vector<double>* per_set) {
  double sum = 0;
  int64_t positions = 0;
  for (int set = 0; set < data_->full_valid_sets(); ++set) {
    const auto [loss, n] = evaluate_full(set);
    if (per_set) per_set->push_back(loss);
    sum += loss * static_cast<double>(n);
    positions += n;
  }
  return sum / static_cast<double>(std::max<int64_t>(positions, 1));
}

std::pair<double, int64_t> Trainer::evaluate_full(int set) {
  at::NoGradGuard no_grad;
  const int64_t n = data_->full_valid_samples(set);
  const int gbs = cfg_.eval_global_batch(), mbs = cfg_.eval_micro_batch();
  const int microbatches = gbs / (mbs * groups_.mesh().dp());
  const int64_t per_rank = static_cast<int64_t>(mbs) * microbatches;
  const int64_t eod = cfg_.eod_mask_loss ? cfg_.eod_token : -1, pad = cfg_.pad_token;
  // The positions the loss averages, counted on the host from every sample (every rank alike),
  // once per set: they depend on the set and the run's eod and pad only.
  if (full_positions_.empty()) full_positions_.assign(data_->full_valid_sets(), -1);
  int64_t& positions = full_positions_[set];
  if (positions < 0) positions = data_->loss_positions(DataSplit::kValid, 0, n, eod, pad, set).unmasked;
  const double log_scale = 1.0 / static_cast<double>(std::max<int64_t>(positions, 1));
  const c10::Device dev = stage_->options().device;
  at::Tensor sum = at::zeros_like(stage_->losses());  // [lm, aux, mtp, z]
  for (int64_t k = 0, rounds = (n + gbs - 1) / gbs; k < rounds; ++k) {
    auto batch = [&](int m) {
      const int64_t first = k * gbs + dp_rank_ * per_rank + static_cast<int64_t>(m) * mbs;
      const int real = static_cast<int>(std::clamp<int64_t>(n - first, 0, mbs));
      Microbatch b;
      b.loss.per_token = cfg_.calculate_per_token_loss;
      b.loss.log_scale = log_scale;
      if (!stage_->is_first() && !stage_->is_last()) return b;
      at::Tensor tokens, labels;
      if (real > 0) data_->fetch(DataSplit::kValid, first, real, dev, &tokens, &labels, set);
      if (real < mbs) {  // rows past the last sample: it again, left out of the loss below
        at::Tensor t, l;
        data_->fetch(DataSplit::kValid, n - 1, 1, dev, &t, &l, set);
        t = t.expand({mbs - real, -1});
        l = l.expand({mbs - real, -1});
        tokens = real > 0 ? at::cat({tokens, t}) : t.contiguous();
        labels = real > 0 ? at::cat({labels, l}) : l.contiguous();
      }
      at::Tensor keep = loss_keep(tokens, labels, eod, pad);
      if (real < mbs) keep.narrow(0, real, mbs - real).fill_(false);
      b.loss.mask = keep.to(at::kFloat);
      if (pad >= 0) {  // as add_loss_mask: pad ids reach the model as 0
        tokens = tokens.masked_fill(tokens.eq(pad), 0);
        labels = labels.masked_fill(labels.eq(pad), 0);
      }
      b.tokens = tokens;
      b.labels = labels;
      return b;
    };
    sum.add_(run_forward_only(*stage_, *groups_.get("pp"), microbatches, mbs, batch, log_scale));
  }
  groups_.world().all_reduce(sum, ReduceOp::kSum);
  return {sum[0].item<double>(), positions};
}

IterationStats Trainer::train_step() {
  const auto t0 = std::chrono::steady_clock::now();
  const int it = iteration_ + 1;
  // The rate of the updates made so far (lr_schedule.h: Megatron's scheduler, which skipped
  // iterations do not advance); the log shows the rate after this iteration's update.
  // The weight decay and the decoupled rate follow the same position.
  const double samples = static_cast<double>(scheduler_samples_);
  const double lr = lr_at(cfg_.lr, samples);
  optimizer_->set_weight_decay(wd_at(cfg_.lr, samples));
  if (cfg_.lr.decoupled_lr != -1)
    optimizer_->set_group_lr("decoupled", decoupled_lr_at(cfg_.lr, samples));
  // Fault injection (core/fault.h): a usage error on one rank only, after collectives started
  // (tests that the command aborts the job instead of leaving the peers waiting).
  if (fault_error("train.usage_error", groups_.rank(), it))
    fail_usage("WEFT_FAULT train.usage_error: injected on this rank only, at iteration {}", it);
  optimizer_->zero_grad();

  const int global_batch = batches_.batch_at(consumed_samples_);
  const int num_microbatches = microbatches_at(consumed_samples_);
  const double loss_scale = 1.0 / (static_cast<double>(global_batch) * cfg_.model.seq_length);
  // --cuda-graph-impl local: eager for the warm-up steps of this process, then replayed.
  const auto batch = [this](int m) { return microbatch(m); };
  const at::Tensor losses =
      graphed_ && steps_run_ >= cfg_.cuda_graph_warmup_steps
          ? graphed_->run(*stage_, num_microbatches, batch, loss_scale)
          : run_1f1b(*stage_, *groups_.get("pp"), num_microbatches, cfg_.micro_batch_size,
                     batch, loss_scale);
  ++steps_run_;
  fault_point("train.after_backward", groups_.rank(), it);  // crash and hang tests

  all_reduce_stage_grads(*stage_, groups_);  // HSDP replicas, tied embedding
  // --moe-router-enable-expert-bias: Megatron updates the biases here too (finalize_model_grads,
  // before the optimizer), also in a step that is then skipped.
  stage_->update_router_biases();

  // Fault injection for the NaN tests (core/fault.h), after every gradient reduction:
  // WEFT_FAULT=train.nan_grad:<rank>:<it>:error plants a NaN in this rank's gradient of the
  // last parameter it holds rows of; train.nan_loss:<rank>:<it>:error makes its loss NaN.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (fault_error("train.nan_grad", groups_.rank(), it))
    for (auto u = stage_->units().rbegin(); u != stage_->units().rend(); ++u) {
      if (!(*u)->main_replica() || stage_->is_embedding_copy(u->get())) continue;
      int i = (*u)->num_params() - 1;
      while (i >= 0 && (*u)->segment(i).valid_rows == 0) --i;
      if (i < 0) continue;
      grad_shard(**u).narrow(0, (*u)->segment(i).offset, 1).fill_(nan);
      break;
    }
  if (fault_error("train.nan_loss", groups_.rank(), it)) losses[0].fill_(nan);

  // One world all-reduce carries the losses [lm, aux, mtp, z] and the squared gradient norm
  // (red[4]); it runs on the compute device so that the NCCL backend can take it.
  const at::Tensor sumsq = local_grad_sumsq(*stage_);
  at::Tensor red = at::cat({losses.to(sumsq.options()), sumsq.reshape({1})});
  groups_.world().all_reduce(red, ReduceOp::kSum);
  // Queued before the optimizer: the host below waits for this copy, not for the update.
  HostCopy red_on_host(red);
  // Where the fused CUDA step applies, the skip decision and the clipping multiplier stay on
  // the device and the step is queued before the host reads the losses: the GPU goes on from
  // the norm into the optimizer instead of idling while the host decides. The arithmetic is
  // the host's (float64, true division), so both paths update bitwise alike.
  bool queued = false;
  if (optimizer_->can_step_on_device()) {
    const at::Tensor found_inf = at::isfinite(red).all().logical_not().to(at::kFloat);
    at::Tensor scale;  // undefined: no clipping
    if (cfg_.clip_grad > 0) scale = clip_grad_scale(red[4], cfg_.clip_grad);
    queued = optimizer_->step_on_device(lr, scale, found_inf);
  }
  prefetch_next_step(it);  // the host prepares the next batch while the device works
  red = red_on_host.wait();
  IterationStats s;
  s.iteration = it;
  s.lm_loss = red[0].item<double>();
  s.aux_loss = red[1].item<double>();
  s.mtp_loss = red[2].item<double>();
  s.z_loss = red[3].item<double>();
  s.grad_norm = std::sqrt(red[4].item<double>());

  if (!std::isfinite(s.grad_norm) || !std::isfinite(s.lm_loss) || !std::isfinite(s.aux_loss) ||
      !std::isfinite(s.mtp_loss) || !std::isfinite(s.z_loss)) {
    if (queued) optimizer_->uncount_step();  // the device skipped it
    if (cfg_.check_for_nan) fail_non_finite(s);
    s.skipped = true;
    ++skipped_iters_;
    ++nan_iters_;
  } else if (!queued) {
    optimizer_->step(lr, cfg_.clip_grad > 0 ? clip_multiplier(s.grad_norm, cfg_.clip_grad) : 1.0);
  }
  // No device synchronisation here: the host logs, and queues the next step's first kernels,
  // while the device still runs this step's optimizer (the losses came back by an event of
  // their own), so the device does not idle between steps. Everything after (the next step, a
  // save's snapshot copies, evaluation) is queued on the same stream and so runs after the
  // update. The step time below is the host's; since every step waits for its own losses, in
  // the steady state it equals the device's time per step.
  if (!s.skipped) scheduler_samples_ += global_batch;  // the update was made
  s.lr = lr_at(cfg_.lr, static_cast<double>(scheduler_samples_));
  iteration_ = it;
  consumed_samples_ += global_batch;
  s.consumed_samples = consumed_samples_;
  s.global_batch = global_batch;
  s.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  s.tokens_per_sec = static_cast<double>(global_batch) * cfg_.model.seq_length / (s.ms / 1000.0);
  return s;
}

std::string Trainer::summary() const {
  const Mesh& mesh = groups_.mesh();
  const int r = groups_.rank();
  std::string out = fmt::format(
      "weft train: world {} order {} | pp {} dp {} (fsdp shard {} x replicate {}) | "
      "{} microbatches of {} per step\n",
      mesh.world_size(), mesh.order(), mesh.pp(), mesh.dp(), mesh.dp() / mesh.dp_outer(),
      mesh.dp_outer(), microbatches_at(consumed_samples_), cfg_.micro_batch_size);
  if (batches_.from_flag()) {
    std::vector<std::string> steps;
    for (const auto& [threshold, batch] : batches_.entries())
      steps.push_back(fmt::format("{} from sample {} ({} tokens)", batch, threshold,
                                  threshold * cfg_.model.seq_length));
    out += fmt::format("  --step-batch-size-schedule: global batch {}\n", fmt::join(steps, ", "));
  }
  std::vector<std::string> kinds = {"pp", "dp", "fsdp_shard", "fsdp_replicate", "embedding"};
  if (cfg_.model.moe())
    for (const char* k : {"ep", "edp", "expert_fsdp_shard", "expert_fsdp_replicate"})
      kinds.push_back(k);
  for (const std::string& k : kinds)
    if (mesh.has_group(k, r)) out += fmt::format("  rank {} {:<15} {}\n", r, k, fmt::join(mesh.group_of(k, r), ","));
  int64_t local_params = 0;
  for (auto& u : stage_->units())
    for (int i = 0; i < u->num_params(); ++i) local_params += u->segment(i).valid_numel();
  int64_t total = 0;
  for (const ParamSpec& p : all_param_specs(cfg_.model)) {
    int64_t n = 1;
    for (auto d : p.shape) n *= d;
    total += n;
  }
  const StateBytes dense = state_bytes(false), experts = state_bytes(true);
  out += fmt::format(
      "  parameters: {} in the model; this rank holds {} (stage {}: layers {}..{})\n"
      "  bytes on this rank: weights {} | gradients {} | optimizer state {}\n",
      total, local_params, stage_->stage(), stage_->first_layer(),
      stage_->first_layer() + stage_->num_layers() - 1, dense.weights + experts.weights,
      dense.grads + experts.grads, dense.optimizer + experts.optimizer);
  if (cfg_.model.moe())
    out += fmt::format(
        "  dense state: weights {} | gradients {} | optimizer {}   (fsdp shard {})\n"
        "  expert state: weights {} | gradients {} | optimizer {}   (ep {}, expert fsdp shard "
        "{}, {} experts per rank)\n",
        dense.weights, dense.grads, dense.optimizer, groups_.get("fsdp_shard")->size(),
        experts.weights, experts.grads, experts.optimizer, mesh.ep(),
        groups_.get("expert_fsdp_shard")->size(), cfg_.model.num_experts / mesh.ep());
  return out;
}

Trainer::StateBytes Trainer::state_bytes(bool experts) const {
  StateBytes b;
  const auto& units = optimizer_->units();
  for (size_t k = 0; k < units.size(); ++k) {
    if (stage_->is_expert_unit(units[k]) != experts) continue;
    const FsdpUnit& u = *units[k];
    // With fp32 compute the weight shard is the master itself: counted once, as optimizer state.
    const UnitOptimState& st = optimizer_->state(k);
    if (!u.param_shard().is_same(st.master))
      b.weights += u.param_shard().numel() * u.param_shard().element_size();
    b.grads += u.grad_target().numel() * u.grad_target().element_size();
    b.optimizer += optimizer_->unit_state_bytes(k);
  }
  return b;
}

// Megatron's evaluate_and_print_results. The test split's loss goes to the console and the
// JSONL (test_lm_loss) but not to TensorBoard, where Megatron writes it under the validation
// tags at the same step as the last validation loss.
void Trainer::report_validation(const std::string& when, FILE* jsonl, DataSplit split) {
  const bool test = split == DataSplit::kTest;
  if (!test && cfg_.multiple_validation_sets) {
    // Megatron's: one block per set, "validation-NAME loss at ...".
    std::vector<double> losses;
    last_valid_loss_ = evaluate_full_sets(&losses);
    for (size_t set = 0; set < losses.size(); ++set) {
      const std::string name = set < cfg_.validation_set_names.size()
                                   ? cfg_.validation_set_names[set]
                                   : std::to_string(set);
      validations_.push_back({iteration_, false, name, losses[set]});
      print_validation(when, jsonl, losses[set], false, name);
    }
    return;
  }
  const double loss = evaluate(split, test || cfg_.skip_train ? 0 : consumed_valid_samples_);
  if (!test) last_valid_loss_ = loss;
  validations_.push_back({iteration_, test, "", loss});
  print_validation(when, jsonl, loss, test, "");
}

void Trainer::print_validation(const std::string& when, FILE* jsonl, double loss, bool test,
                               const std::string& set) const {
  const double ppl = std::exp(std::min(20.0, loss));  // as Megatron: capped at exp(20)
  if (groups_.rank() != 0) return;
  const std::string suffix = set.empty() ? "" : "-" + set;
  if (log_ && !test && !cfg_.skip_train)
    log_->tensorboard_validation(iteration_, consumed_samples_, loss, ppl, suffix);
  if (!cfg_.quiet) {
    const std::string line = fmt::format(" validation{} loss at {} | lm loss value: {:.6E} | lm "
                                         "loss PPL: {:.6E} | ", suffix, when, loss, ppl);
    const std::string rule(line.size() + 1, '-');
    fmt::print("{}\n{}\n{}\n", rule, line, rule);
    std::fflush(stdout);
  }
  if (jsonl) {
    std::fputs(TrainLog::jsonl_validation_line(iteration_, loss, ppl, test, set).c_str(), jsonl);
    std::fflush(jsonl);
  }
}

std::vector<IterationStats> Trainer::train() {
  const bool rank0 = groups_.rank() == 0;
  FILE* jsonl = nullptr;
  if (!cfg_.log_jsonl.empty()) {
    // Rank 0 writes the log; every rank learns whether it could open it.
    at::Tensor ok = at::ones({1}, at::kInt);
    if (rank0) {
      std::error_code ec;
      const auto parent = std::filesystem::path(cfg_.log_jsonl).parent_path();
      if (!parent.empty()) std::filesystem::create_directories(parent, ec);
      jsonl = std::fopen(cfg_.log_jsonl.c_str(), "a");
      if (!jsonl) ok.fill_(0);
    }
    groups_.control().all_reduce(ok, ReduceOp::kSum);
    if (ok.item<int>() < groups_.control().size())
      fail_usage("--log-jsonl {}: cannot open for appending", cfg_.log_jsonl);
  }
  {
    // Rank 0 writes the TensorBoard file (--tensorboard-dir); every rank learns whether it could.
    at::Tensor ok = at::ones({1}, at::kInt);
    std::string why;
    try {
      log_ = std::make_unique<TrainLog>(cfg_, groups_.mesh().world_size(), rank0);
    } catch (const UsageError& e) {
      why = e.what();
      ok.fill_(0);
    }
    const bool agree = !cfg_.tensorboard_dir.empty();  // only then can rank 0 fail here
    if (agree) groups_.control().all_reduce(ok, ReduceOp::kSum);
    if (ok.item<int>() < (agree ? groups_.control().size() : 1))
      fail_usage("{}", why.empty() ? "--tensorboard-dir: rank 0 cannot write its event file" : why);
  }
  if (rank0 && !cfg_.quiet) fmt::print("{}", summary());
  if (rank0 && !cfg_.dump_first_batch.empty()) dump_first_batch();
  g_exit_signal = 0;
  auto old_term = std::signal(SIGTERM, on_exit_signal);
  auto old_int = std::signal(SIGINT, on_exit_signal);
  // Restores the handlers and closes the log also when an iteration throws
  // (--check-for-nan-in-loss-and-grad, --max-skipped-iterations, a failed save).
  struct Cleanup {
    FILE* jsonl;
    void (*term)(int);
    void (*intr)(int);
    ~Cleanup() {
      std::signal(SIGTERM, term);
      std::signal(SIGINT, intr);
      if (jsonl) std::fclose(jsonl);
    }
  } cleanup{jsonl, old_term, old_int};
  std::vector<IterationStats> all;
  IterationProfiler profiler(cfg_.profile, groups_.rank());
  bool exiting = false;
  const int first_iteration = iteration_ + 1;  // of this run (a resumed one starts later)
  if (cfg_.skip_train) {  // Megatron's: the valid and test splits from their first samples
    if (rank0 && !cfg_.quiet) fmt::print("weft train: skipping training (--skip-train is on)\n");
    if (data_->has_valid())
      report_validation(fmt::format("iteration {} on validation set", iteration_), jsonl);
    if (data_->has_test())
      report_validation(fmt::format("iteration {} on test set", iteration_), jsonl,
                        DataSplit::kTest);
    return all;
  }
  while (iteration_ < cfg_.train_iters && !exiting) {
    profiler.before_iteration(iteration_ + 1);
    IterationStats s = train_step();
    all.push_back(s);
    log_->record(s);
    const std::string trace = profiler.after_iteration(s.iteration);
    if (!trace.empty() && !cfg_.quiet)
      fmt::print("weft train: rank {} wrote the profile of iterations {}..{} to {}\n",
                 groups_.rank(), cfg_.profile.step_start + 1, s.iteration, trace);
    if (rank0 && !cfg_.quiet) {
      const std::string line = log_->console_line(s, s.iteration == first_iteration,
                                                  device_peak_memory_mb(stage_->options().device));
      if (!line.empty()) {
        std::fputs(line.c_str(), stdout);
        std::fflush(stdout);
      }
    }
    if (jsonl) {
      std::fputs(log_->jsonl_line(s).c_str(), jsonl);
      std::fflush(jsonl);
    }
    if (rank0)
      log_->tensorboard_iteration(s, skipped_iters_, nan_iters_,
                                  device_peak_memory_mb(stage_->options().device));
    consecutive_skipped_ = s.skipped ? consecutive_skipped_ + 1 : 0;
    if (cfg_.max_skipped_iterations > 0 && consecutive_skipped_ >= cfg_.max_skipped_iterations)
      fail("--max-skipped-iterations {}: iterations {}..{} were all skipped (non-finite loss or "
           "gradients); stopped without saving a checkpoint", cfg_.max_skipped_iterations,
           s.iteration - consecutive_skipped_ + 1, s.iteration);
    if (data_->has_valid() && cfg_.evaluates_at(iteration_)) {
      report_validation(fmt::format("iteration {}", iteration_), jsonl);
      if (!cfg_.full_validation) consumed_valid_samples_ += evaluations_samples(cfg_, 1);
    }
    finish_save(false);  // commits a pending --async-save once every rank has written it
    if (!cfg_.save.empty() && cfg_.save_interval > 0 && iteration_ % cfg_.save_interval == 0)
      save();
    // As Megatron: a checkpoint before the first step of a new batch size (the restart point
    // of a run that is rescaled there).
    if (!cfg_.save.empty() && last_saved_ != iteration_ && iteration_ < cfg_.train_iters &&
        batches_.batch_at(consumed_samples_) != s.global_batch) {
      if (rank0 && !cfg_.quiet)
        fmt::print("weft train: the global batch changes from {} to {} after iteration {}: "
                   "saving a checkpoint\n", s.global_batch, batches_.batch_at(consumed_samples_),
                   iteration_);
      save();
    }
    // Every rank takes the same exit decision: one all-reduce of the local reasons.
    const double minutes =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - kProcessStart).count() /
        60.0;
    at::Tensor why = at::tensor(
        std::vector<double>{exit_signal_received() ? 1.0 : 0.0,
                            cfg_.exit_duration_mins > 0 && minutes >= cfg_.exit_duration_mins ? 1.0 : 0.0,
                            cfg_.exit_interval > 0 && iteration_ % cfg_.exit_interval == 0 ? 1.0 : 0.0},
        at::kDouble);
    groups_.control().all_reduce(why, ReduceOp::kMax);
    if (why.sum().item<double>() > 0) {
      exiting = true;
      if (rank0 && !cfg_.quiet)
        fmt::print("weft train: exiting after iteration {} ({})\n", iteration_,
                   why[0].item<double>() > 0 ? "signal" : why[1].item<double>() > 0
                                                              ? "--exit-duration-in-mins"
                                                              : "--exit-interval");
    }
  }
  // The checkpoint first (Megatron's order): a job stopped by a signal has a grace period, and
  // an evaluation before the save could use it up and lose the checkpoint. An exit condition
  // (signal, --exit-interval, --exit-duration-in-mins) ends without the final evaluation, as in
  // Megatron; the end of --train-iters evaluates after saving.
  if (!cfg_.save.empty() && last_saved_ != iteration_ && iteration_ > 0) save();
  wait_for_save();  // every exit path finishes the pending --async-save
  if (!exiting && data_->has_valid() && iteration_ > 0 && !cfg_.evaluates_at(iteration_))
    report_validation(fmt::format("iteration {} on validation set", iteration_), jsonl);
  if (!exiting && data_->has_test() && iteration_ > 0)
    report_validation(fmt::format("iteration {} on test set", iteration_), jsonl, DataSplit::kTest);
  return all;
}

}  // namespace weft
