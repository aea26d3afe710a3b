// Numeric flag ranges (see validate_numbers.h). The ranges follow Megatron's meaning of each
// flag; the model and data layers check the structural relations between flags (divisibility,
// patterns) themselves.
#include "weft/train/validate_numbers.h"

#include <cmath>

#include "weft/core/error.h"
#include "weft/train/trainer.h"

namespace weft {
namespace {

// A finite value in [lo, hi] (or [lo, hi) with open_hi, (lo, hi] with open_lo).
void check_real(const char* flag, double v, double lo, double hi, bool open_lo = false,
                bool open_hi = false) {
  const bool ok = std::isfinite(v) && (open_lo ? v > lo : v >= lo) && (open_hi ? v < hi : v <= hi);
  if (ok) return;
  const char* l = open_lo ? "(" : "[";
  const char* r = open_hi ? ")" : "]";
  if (std::isinf(hi) && open_lo)
    fail_usage("{} must be a finite number > {} (got {})", flag, lo, v);
  if (std::isinf(hi)) fail_usage("{} must be a finite number >= {} (got {})", flag, lo, v);
  fail_usage("{} must be a finite number in {}{}, {}{} (got {})", flag, l, lo, hi, r, v);
}

void check_int(const char* flag, long long v, long long lo, const char* meaning = nullptr) {
  if (v >= lo) return;
  if (meaning) fail_usage("{} must be >= {} ({}) (got {})", flag, lo, meaning, v);
  fail_usage("{} must be >= {} (got {})", flag, lo, v);
}

constexpr double kInf = INFINITY;

}  // namespace

void validate_numeric_flags(const TrainConfig& c) {
  const ModelConfig& m = c.model;
  // Model.
  check_int("--num-layers", m.num_layers, 1);
  check_int("--hidden-size", m.hidden_size, 1);
  check_int("--ffn-hidden-size", m.ffn_hidden_size, 1);
  check_int("--num-attention-heads", m.num_attention_heads, 1);
  check_int("--num-query-groups", m.num_query_groups, 1);
  if (m.kv_channels != -1) check_int("--kv-channels", m.kv_channels, 1, "or -1: hidden / heads");
  check_int("--seq-length", m.seq_length, 1);
  check_int("--vocab-size", m.vocab_size, 2);
  check_real("--init-method-std", m.init_method_std, 0, kInf, true);
  check_real("--rotary-base", m.rotary_base, 0, kInf, true);
  check_real("--rotary-percent", m.rotary_percent, 0, 1, true);
  if (m.use_rope_scaling) check_real("--rope-scaling-factor", m.rope_scaling_factor, 1, kInf);
  if (m.rotary_seq_len_interpolation_factor != 0)
    check_int("--rotary-seq-len-interpolation-factor", m.rotary_seq_len_interpolation_factor, 1,
              "or not given");
  check_real("--norm-epsilon", m.norm_epsilon, 0, kInf, true);
  if (m.mla()) {
    check_int("--q-lora-rank", m.q_lora_rank, 0, "0: none");
    check_int("--kv-lora-rank", m.kv_lora_rank, 1);
    check_int("--qk-head-dim", m.qk_head_dim, 1);
    check_int("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim, 2);
    check_int("--v-head-dim", m.v_head_dim, 1);
    check_real("--rotary-scaling-factor", m.rotary_scaling_factor, 0, kInf, true);
  }
  check_int("--num-experts", m.num_experts, 0);
  check_int("--moe-router-topk", m.moe_router_topk, 1);
  if (m.moe_ffn_hidden_size != -1)
    check_int("--moe-ffn-hidden-size", m.moe_ffn_hidden_size, 1, "or -1: --ffn-hidden-size");
  check_int("--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size, 0);
  check_real("--moe-aux-loss-coeff", m.moe_aux_loss_coeff, 0, kInf);
  check_real("--moe-z-loss-coeff", m.moe_z_loss_coeff, 0, kInf);
  check_int("--mamba-state-dim", m.mamba_state_dim, 1);
  check_int("--mamba-head-dim", m.mamba_head_dim, 1);
  check_int("--mamba-num-groups", m.mamba_num_groups, 1);
  if (m.mamba_num_heads != -1)
    check_int("--mamba-num-heads", m.mamba_num_heads, 1, "or -1: 2 * hidden / head dim");
  check_int("--mtp-num-layers", m.mtp_num_layers, 0);
  check_real("--mtp-loss-scaling-factor", m.mtp_loss_scaling_factor, 0, kInf);
  // Batch, iterations, schedule, optimizer.
  check_int("--micro-batch-size", c.micro_batch_size, 1);
  check_int("--global-batch-size", c.global_batch_size, 1);
  check_int("--train-iters", c.train_iters, 0);
  check_real("--lr", c.lr.lr, 0, kInf);
  check_real("--min-lr", c.lr.min_lr, 0, kInf);
  if (c.lr.min_lr > c.lr.lr)
    fail_usage("--min-lr {} is larger than --lr {}", c.lr.min_lr, c.lr.lr);
  check_int("--lr-warmup-iters", c.lr.warmup_iters, 0);
  check_real("--lr-warmup-init", c.lr.warmup_init, 0, kInf);
  if (c.lr.decay_iters != -1)
    check_int("--lr-decay-iters", c.lr.decay_iters, 1, "or -1: --train-iters");  // Megatron: > 0
  check_real("--weight-decay", c.adam.weight_decay, 0, kInf);
  check_real("--adam-beta1", c.adam.beta1, 0, 1, false, true);
  check_real("--adam-beta2", c.adam.beta2, 0, 1, false, true);
  check_real("--adam-eps", c.adam.eps, 0, kInf, true);
  check_real("--clip-grad", c.clip_grad, 0, kInf);
  if (c.first_stage_layers != -1)
    check_int("--decoder-first-pipeline-num-layers", c.first_stage_layers, 1, "or -1: even split");
  if (c.last_stage_layers != -1)
    check_int("--decoder-last-pipeline-num-layers", c.last_stage_layers, 1, "or -1: even split");
  // Logging, checkpoints, exits, evaluation, profiling, failure policy.
  check_int("--log-interval", c.log_interval, 1);
  check_int("--save-interval", c.save_interval, 0);
  if (c.ckpt_step != -1) check_int("--ckpt-step", c.ckpt_step, 0, "or -1: the latest");
  check_int("--exit-interval", c.exit_interval, 0);
  check_real("--exit-duration-in-mins", c.exit_duration_mins, 0, kInf);
  check_int("--eval-interval", c.eval_interval, 0);
  check_int("--eval-iters", c.eval_iters, 0);
  if (c.profile.enabled) {
    check_int("--profile-step-start", c.profile.step_start, 0);
    check_int("--profile-step-end", c.profile.step_end, c.profile.step_start + 1,
              "--profile-step-start + 1: the profiled iterations are start+1..end");
  }
  check_int("--max-skipped-iterations", c.max_skipped_iterations, 0, "0: unlimited");
}

}  // namespace weft
