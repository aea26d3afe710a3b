// The Llama-style decoder over ParamHandles (see transformer.h): parameter specs with global
// names, layout-independent initialisation, RoPE tables, the decoder layer, final norm,
// output layer and the language-model loss.
//
// Invariants: a parameter's initial value is a function of (seed, global name) only — each
// parameter draws from its own CPU generator seeded by a hash of the two (invariant 5); the
// model reads weights only through ops:: (so every use is counted and every gradient delivered
// through the ParamSource contract); fused weights follow the row orders documented in
// transformer.h.
#include "weft/model/transformer.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Reduction.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/nll_loss.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "weft/core/compat.h"
#include "weft/core/error.h"
#include "weft/core/hash.h"
#include "weft/model/fused.h"
#include "weft/model/mamba.h"
#include "weft/model/moe.h"
#include "weft/model/ops.h"
#include "weft/model/recompute.h"

namespace weft {
namespace {

// The generator seed of one parameter. ATen's CPU generator (mt19937) keeps only 32 bits of
// its seed, so both halves of the 64-bit hash are folded into the low half.
uint64_t param_generator_seed(uint64_t seed, const std::string& name) {
  const uint64_t h = splitmix64(splitmix64(seed) ^ fnv1a64(name));
  return (h ^ (h >> 32)) & 0xffffffffULL;
}

ParamSpec spec(std::string name, std::vector<int64_t> shape, InitKind init, bool decay) {
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.init = init;
  s.decay = decay;
  return s;
}

// Rotate-half RoPE on x [b, heads, s, hd] at positions [pos, pos + s); cos/sin [>= pos + s, rd]
// rotate the first rd channels (--rotary-percent), the others pass unchanged.
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& rope, int64_t pos) {
  const int64_t s = x.size(2), hd = x.size(3), rd = rope.cos.size(1), half = rd / 2;
  const at::Tensor cos = rope.cos.narrow(0, pos, s);
  const at::Tensor sin = rope.sin.narrow(0, pos, s);
  const at::Tensor xr = rd == hd ? x : x.narrow(-1, 0, rd);
  const at::Tensor rotated = at::cat({-xr.narrow(-1, half, half), xr.narrow(-1, 0, half)}, -1);
  const at::Tensor out = xr * cos + rotated * sin;
  return rd == hd ? out : at::cat({out, x.narrow(-1, rd, hd - rd)}, -1);
}

// --multi-latent-attention's sizes and what it cannot take. Megatron's MLA builds its own
// rotary embedding over the qk_pos_emb_head_dim channels from --rotary-base and the YaRN flags
// only; the other position flags would be ignored there, so they are refused here.
void check_mla_config(const ModelConfig& cfg) {
  auto positive = [](int v, const char* flag) {
    if (v <= 0) fail_usage("{} must be positive with --multi-latent-attention, got {}", flag, v);
  };
  if (cfg.q_lora_rank < 0)
    fail_usage("--q-lora-rank must be >= 0 (0: none) (got {})", cfg.q_lora_rank);
  if (cfg.hybrid())
    fail_usage("--multi-latent-attention with --hybrid-layer-pattern: weft's hybrid attention "
               "layers are grouped-query attention (Megatron's hybrid stack gives MLA a layer "
               "symbol of its own, which weft does not have)");
  positive(cfg.kv_lora_rank, "--kv-lora-rank");
  positive(cfg.qk_head_dim, "--qk-head-dim");
  positive(cfg.qk_pos_emb_head_dim, "--qk-pos-emb-head-dim");
  positive(cfg.v_head_dim, "--v-head-dim");
  if (cfg.qk_pos_emb_head_dim % 2 != 0)
    fail_usage("--qk-pos-emb-head-dim {} must be even (RoPE rotates pairs of channels)",
               cfg.qk_pos_emb_head_dim);
  if (!cfg.rope_type.empty() && cfg.rope_type != "rope" && cfg.rope_type != "yarn")
    fail_usage("--rope-type must be rope or yarn (got '{}')", cfg.rope_type);
  if (!cfg.rotary())
    fail_usage("--position-embedding-type {} with --multi-latent-attention: MLA always rotates "
               "its --qk-pos-emb-head-dim channels (use rope)", cfg.position_embedding_type);
  if (cfg.rotary_percent != 1.0)
    fail_usage("--rotary-percent {} with --multi-latent-attention: MLA rotates all of its "
               "--qk-pos-emb-head-dim channels", cfg.rotary_percent);
  if (cfg.use_rope_scaling)
    fail_usage("--use-rope-scaling with --multi-latent-attention: MLA's long-context scaling is "
               "YaRN (--rope-type yarn, --rotary-scaling-factor)");
  if (cfg.rotary_seq_len_interpolation_factor > 0)
    fail_usage("--rotary-seq-len-interpolation-factor with --multi-latent-attention: MLA's "
               "rotary embedding takes no position interpolation");
  if (cfg.add_qkv_bias)
    fail_usage("--add-qkv-bias with --multi-latent-attention: MLA's projections have no bias");
  if (!(cfg.rotary_scaling_factor > 0) || !std::isfinite(cfg.rotary_scaling_factor))
    fail_usage("--rotary-scaling-factor must be a finite positive number (got {})",
               cfg.rotary_scaling_factor);
  if (!std::isfinite(cfg.mscale) || !std::isfinite(cfg.mscale_all_dim))
    fail_usage("--mscale and --mscale-all-dim must be finite (got {} and {})", cfg.mscale,
               cfg.mscale_all_dim);
}

}  // namespace

double yarn_mscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

double yarn_attention_factor(const ModelConfig& cfg) {
  if (!cfg.yarn()) return 1.0;
  return yarn_mscale(cfg.rotary_scaling_factor, cfg.mscale) /
         yarn_mscale(cfg.rotary_scaling_factor, cfg.mscale_all_dim);
}

double attention_softmax_scale(const ModelConfig& cfg) {
  if (!cfg.mla()) return 0.0;
  const double m = yarn_mscale(cfg.rotary_scaling_factor, cfg.mscale_all_dim);
  return m == 1.0 ? 0.0 : m * m / std::sqrt(static_cast<double>(cfg.mla_q_head_dim()));
}

at::Tensor yarn_frequencies(const ModelConfig& cfg) {
  // Megatron's YarnRotaryEmbedding over d = qk_pos_emb_head_dim: the extrapolated frequencies
  // base^(-2i/d) and the interpolated ones (the same over the factor) mixed by a ramp over the
  // pair index i between the correction dims of beta_fast and beta_slow rotations in the
  // original context (floor and ceil, clamped to [0, d - 1]).
  const int64_t d = cfg.qk_pos_emb_head_dim;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor extra = at::pow(cfg.rotary_base, at::arange(0, d / 2, f64) * (-2.0 / d));
  const at::Tensor inter = extra / cfg.rotary_scaling_factor;
  auto correction_dim = [&](double rotations) {
    return d * std::log(ModelConfig::kYarnOriginalContext / (rotations * 2 * M_PI)) /
           (2 * std::log(cfg.rotary_base));
  };
  const double low = std::max(std::floor(correction_dim(ModelConfig::kYarnBetaFast)), 0.0);
  double high = std::min(std::ceil(correction_dim(ModelConfig::kYarnBetaSlow)),
                         static_cast<double>(d - 1));
  if (low == high) high += 0.001;
  const at::Tensor ramp = ((at::arange(d / 2, f64) - low) / (high - low)).clamp(0, 1);
  const at::Tensor keep = 1.0 - ramp;  // the share of the extrapolated frequency
  return inter * (1.0 - keep) + extra * keep;
}

void check_model_config(const ModelConfig& cfg) {
  auto positive = [](int v, const char* flag) {
    if (v <= 0) fail_usage("{} must be positive, got {}", flag, v);
  };
  positive(cfg.num_layers, "--num-layers");
  positive(cfg.hidden_size, "--hidden-size");
  positive(cfg.ffn_hidden_size, "--ffn-hidden-size");
  positive(cfg.num_attention_heads, "--num-attention-heads");
  positive(cfg.num_query_groups, "--num-query-groups");
  positive(cfg.seq_length, "--seq-length");
  positive(cfg.vocab_size, "--vocab-size");
  if (cfg.mla()) {
    check_mla_config(cfg);
  } else if (!cfg.rope_type.empty() && cfg.rope_type != "rope") {
    fail_usage("--rope-type {}: only --multi-latent-attention takes another rope type than rope "
               "(as Megatron asserts)", cfg.rope_type);
  }
  if (cfg.kv_channels != -1 && cfg.kv_channels <= 0)
    fail_usage("--kv-channels must be positive, or -1 for --hidden-size / --num-attention-heads "
               "(got {})", cfg.kv_channels);
  if (cfg.kv_channels == -1 && !cfg.mla() && cfg.hidden_size % cfg.num_attention_heads != 0) {
    fail_usage("--hidden-size ({}) must be a multiple of --num-attention-heads ({}), or give the "
               "head dim with --kv-channels", cfg.hidden_size, cfg.num_attention_heads);
  }
  if (!cfg.mla() && cfg.num_attention_heads % cfg.num_query_groups != 0) {
    fail_usage("--num-attention-heads ({}) must be a multiple of --num-query-groups ({})",
               cfg.num_attention_heads, cfg.num_query_groups);
  }
  if (!cfg.mla() && cfg.head_dim() % 2 != 0) {
    fail_usage("head dim ({} = {}) must be even for RoPE",
               cfg.kv_channels > 0 ? "--kv-channels" : "--hidden-size / --num-attention-heads",
               cfg.head_dim());
  }
  if (!(cfg.init_method_std > 0)) fail_usage("--init-method-std must be positive");
  if (!(cfg.rotary_base > 0)) fail_usage("--rotary-base must be positive");
  if (cfg.rotary_seq_len_interpolation_factor < 0)
    fail_usage("--rotary-seq-len-interpolation-factor must be >= 1 (got {})",
               cfg.rotary_seq_len_interpolation_factor);
  if (!(cfg.rotary_percent > 0 && cfg.rotary_percent <= 1))
    fail_usage("--rotary-percent must be in (0, 1] (got {})", cfg.rotary_percent);
  if (!cfg.mla() && (cfg.rotary_dim() < 2 || cfg.rotary_dim() % 2 != 0))
    fail_usage("--rotary-percent {} rotates int({} x {}) = {} channels of each head; that must be "
               "even and at least 2", cfg.rotary_percent, cfg.head_dim(), cfg.rotary_percent,
               cfg.rotary_dim());
  if (cfg.position_embedding_type != "rope" && cfg.position_embedding_type != "none")
    fail_usage("--position-embedding-type must be rope or none (got '{}')",
               cfg.position_embedding_type);
  if (cfg.use_rope_scaling && !(cfg.rope_scaling_factor >= 1 && std::isfinite(cfg.rope_scaling_factor)))
    fail_usage("--rope-scaling-factor must be a finite number >= 1 (got {})", cfg.rope_scaling_factor);
  if (!(cfg.norm_epsilon >= 0)) fail_usage("--norm-epsilon must not be negative");
  check_moe_config(cfg);
}

void check_moe_config(const ModelConfig& cfg) {
  if (cfg.num_experts < 0) fail_usage("--num-experts must be >= 0 (got {})", cfg.num_experts);
  if (cfg.mtp_num_layers < 0)
    fail_usage("--mtp-num-layers must be >= 0 (got {})", cfg.mtp_num_layers);
  if (cfg.mtp_num_layers >= cfg.seq_length)
    fail_usage("--mtp-num-layers {} must be smaller than --seq-length {} (depth k predicts the "
               "token k+1 positions ahead)", cfg.mtp_num_layers, cfg.seq_length);
  if (!(cfg.mtp_loss_scaling_factor >= 0) || !std::isfinite(cfg.mtp_loss_scaling_factor))
    fail_usage("--mtp-loss-scaling-factor must be a finite number >= 0");
  if (cfg.hybrid() || !cfg.mtp_layer_symbols.empty()) {
    const std::string all = cfg.layer_symbols + cfg.mtp_layer_symbols;
    if (static_cast<int>(cfg.layer_symbols.size()) != cfg.num_layers)
      fail_usage("--hybrid-layer-pattern gives {} layers, --num-layers {}", cfg.layer_symbols.size(),
                 cfg.num_layers);
    if (all.find('E') != std::string::npos && cfg.num_experts == 0)
      fail_usage("--hybrid-layer-pattern has MoE layers (E) but --num-experts is 0");
    if (!cfg.moe_layer_pattern.empty())
      fail_usage("--moe-layer-freq and --hybrid-layer-pattern both place MoE layers; give only "
                 "the pattern");
    if (all.find('M') != std::string::npos) {
      auto positive = [](int v, const char* flag) {
        if (v <= 0) fail_usage("{} must be positive, got {}", flag, v);
      };
      positive(cfg.mamba_state_dim, "--mamba-state-dim");
      positive(cfg.mamba_head_dim, "--mamba-head-dim");
      positive(cfg.mamba_num_groups, "--mamba-num-groups");
      positive(cfg.mamba_chunk_size, "the SSD chunk size");
      if (cfg.mamba_num_heads == 0 || cfg.mamba_num_heads < -1)
        fail_usage("--mamba-num-heads must be positive (got {})", cfg.mamba_num_heads);
      if (cfg.mamba_num_heads < 0 && (2 * cfg.hidden_size) % cfg.mamba_head_dim != 0)
        fail_usage("2 * --hidden-size {} is not a multiple of --mamba-head-dim {} (the Mamba "
                   "heads are 2 * hidden / head dim; or set --mamba-num-heads)",
                   cfg.hidden_size, cfg.mamba_head_dim);
      if (cfg.mamba_heads() < 1 || cfg.mamba_heads() % cfg.mamba_num_groups != 0)
        fail_usage("the Mamba heads ({}) must be a positive multiple of --mamba-num-groups {}",
                   cfg.mamba_heads(), cfg.mamba_num_groups);
    }
  }
  if (!cfg.moe()) {
    if (!cfg.moe_layer_pattern.empty() &&
        std::find(cfg.moe_layer_pattern.begin(), cfg.moe_layer_pattern.end(), 1) !=
            cfg.moe_layer_pattern.end())
      fail_usage("--moe-layer-freq marks MoE layers but --num-experts is 0");
    return;
  }
  if (cfg.moe_router_topk < 1 || cfg.moe_router_topk > cfg.num_experts)
    fail_usage("--moe-router-topk {} must be between 1 and --num-experts {}", cfg.moe_router_topk,
               cfg.num_experts);
  if (cfg.moe_ffn_hidden_size == 0 || cfg.moe_ffn_hidden_size < -1)
    fail_usage("--moe-ffn-hidden-size must be positive (got {})", cfg.moe_ffn_hidden_size);
  if (cfg.moe_shared_expert_intermediate_size < 0)
    fail_usage("--moe-shared-expert-intermediate-size must be >= 0 (got {})",
               cfg.moe_shared_expert_intermediate_size);
  if (!(cfg.moe_aux_loss_coeff >= 0) || !std::isfinite(cfg.moe_aux_loss_coeff))
    fail_usage("--moe-aux-loss-coeff must be a finite number >= 0");
  if (!(cfg.moe_z_loss_coeff >= 0) || !std::isfinite(cfg.moe_z_loss_coeff))
    fail_usage("--moe-z-loss-coeff must be a finite number >= 0 (got {})", cfg.moe_z_loss_coeff);
  if (cfg.moe_router_score_function != "softmax" && cfg.moe_router_score_function != "sigmoid")
    fail_usage("--moe-router-score-function must be softmax or sigmoid (got '{}')",
               cfg.moe_router_score_function);
  if (cfg.moe_router_num_groups < 0 || cfg.moe_router_group_topk < 0)
    fail_usage("--moe-router-num-groups and --moe-router-group-topk must be >= 0 (got {}, {})",
               cfg.moe_router_num_groups, cfg.moe_router_group_topk);
  if (cfg.moe_router_group_topk > 0) {  // Megatron's TransformerConfig checks, and k / g >= 1
    const int G = cfg.moe_router_num_groups, g = cfg.moe_router_group_topk;
    if (G == 0)
      fail_usage("--moe-router-group-topk {} needs --moe-router-num-groups", g);
    if (cfg.num_experts % G != 0)
      fail_usage("--moe-router-num-groups {} must divide --num-experts {}", G, cfg.num_experts);
    if (g > G)
      fail_usage("--moe-router-group-topk {} is more than --moe-router-num-groups {}", g, G);
    if (cfg.moe_router_topk < g)
      fail_usage("--moe-router-group-topk {} is more than --moe-router-topk {}: a group is scored "
                 "by its top (topk / group-topk) experts", g, cfg.moe_router_topk);
    if (cfg.moe_router_topk / g > cfg.num_experts / G)
      fail_usage("--moe-router-topk {} / --moe-router-group-topk {} is more than a group's {} "
                 "experts: a group is scored by its top (topk / group-topk)", cfg.moe_router_topk,
                 g, cfg.num_experts / G);
    if (g * (cfg.num_experts / G) < cfg.moe_router_topk)
      fail_usage("--moe-router-group-topk {} groups of {} experts hold fewer than "
                 "--moe-router-topk {} experts", g, cfg.num_experts / G, cfg.moe_router_topk);
  }
  if (!(cfg.moe_router_topk_scaling_factor >= 0) ||
      !std::isfinite(cfg.moe_router_topk_scaling_factor))
    fail_usage("--moe-router-topk-scaling-factor must be a finite number >= 0 (got {}; 0: none)",
               cfg.moe_router_topk_scaling_factor);
  if (!cfg.moe_router_dtype.empty() && cfg.moe_router_dtype != "fp32" &&
      cfg.moe_router_dtype != "fp64")
    fail_usage("--moe-router-dtype must be fp32 or fp64 (got '{}')", cfg.moe_router_dtype);
  if (cfg.moe_router_enable_expert_bias && cfg.moe_router_score_function != "sigmoid")
    fail_usage("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (got "
               "{}), as Megatron's aux-loss-free routing", cfg.moe_router_score_function);
  if (!(cfg.moe_router_bias_update_rate >= 0) || !std::isfinite(cfg.moe_router_bias_update_rate))
    fail_usage("--moe-router-bias-update-rate must be a finite number >= 0 (got {})",
               cfg.moe_router_bias_update_rate);
  if (cfg.moe_router_load_balancing_type != "aux_loss" &&
      cfg.moe_router_load_balancing_type != "seq_aux_loss" &&
      cfg.moe_router_load_balancing_type != "none")
    fail_usage("--moe-router-load-balancing-type must be aux_loss, seq_aux_loss or none (got "
               "'{}'; weft has no global_aux_loss or sinkhorn)",
               cfg.moe_router_load_balancing_type);
  if (!std::isfinite(cfg.moe_expert_capacity_factor))
    fail_usage("--moe-expert-capacity-factor must be a finite number (got {}; negative: no token "
               "dropping)", cfg.moe_expert_capacity_factor);
  if (cfg.moe_token_drop_policy != "probs" && cfg.moe_token_drop_policy != "position")
    fail_usage("--moe-token-drop-policy must be probs or position (got '{}')",
               cfg.moe_token_drop_policy);
  if (cfg.moe_apply_probs_on_input && cfg.moe_router_topk != 1)
    fail_usage("--moe-apply-probs-on-input needs --moe-router-topk 1 (got {}), as Megatron's",
               cfg.moe_router_topk);
  if (cfg.moe_pad_expert_input_to_capacity && cfg.moe_expert_capacity_factor < 0)
    fail_usage("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (as "
               "Megatron's)");
  if (!cfg.moe_layer_pattern.empty() &&
      static_cast<int>(cfg.moe_layer_pattern.size()) != cfg.num_layers)
    fail_usage("--moe-layer-freq gives {} layers, but --num-layers is {}",
               cfg.moe_layer_pattern.size(), cfg.num_layers);
}

ParamSpec embedding_param_spec(const ModelConfig& cfg) {
  ParamSpec s = spec("embedding.word_embeddings.weight", {cfg.vocab_size, cfg.hidden_size},
                     InitKind::kNormal, true);
  s.embedding_or_output = true;
  return s;
}

std::string layer_prefix(int layer) { return fmt::format("decoder.layers.{}.", layer); }

std::string mtp_layer_prefix(const ModelConfig& cfg, int k, int j) {
  if (!cfg.hybrid()) return fmt::format("mtp.layers.{}.transformer_layer.", k);
  return fmt::format("mtp.layers.{}.mtp_model_layer.layers.{}.", k, j);
}

std::vector<ParamSpec> block_param_specs(const ModelConfig& cfg, const std::string& p, char symbol,
                                         bool moe) {
  check_model_config(cfg);
  const int64_t h = cfg.hidden_size, nh = cfg.num_attention_heads, ng = cfg.num_query_groups;
  const int64_t hd = cfg.head_dim(), ffn = cfg.ffn_hidden_size;
  std::vector<ParamSpec> out;
  const bool attention = symbol == 'T' || symbol == '*';
  const bool mlp = (symbol == 'T' && !moe) || symbol == '-';
  const bool routed = (symbol == 'T' && moe) || symbol == 'E';
  WEFT_CHECK(attention || mlp || routed || symbol == 'M', "unknown layer symbol '{}'", symbol);
  if (attention && cfg.mla()) {
    const int64_t qr = cfg.q_lora_rank, kvr = cfg.kv_lora_rank;
    const std::string sa = p + "self_attention.";
    out.push_back(spec(p + "input_layernorm.weight", {h}, InitKind::kOnes, false));
    if (qr > 0) {
      out.push_back(spec(sa + "linear_q_down_proj.weight", {qr, h}, InitKind::kNormal, true));
      if (cfg.qk_layernorm)
        out.push_back(spec(sa + "q_layernorm.weight", {qr}, InitKind::kOnes, false));
      out.push_back(spec(sa + "linear_q_up_proj.weight", {nh * cfg.mla_q_head_dim(), qr},
                         InitKind::kNormal, true));
    } else {
      out.push_back(spec(sa + "linear_q_proj.weight", {nh * cfg.mla_q_head_dim(), h},
                         InitKind::kNormal, true));
    }
    out.push_back(spec(sa + "linear_kv_down_proj.weight", {kvr + cfg.qk_pos_emb_head_dim, h},
                       InitKind::kNormal, true));
    if (cfg.qk_layernorm)
      out.push_back(spec(sa + "kv_layernorm.weight", {kvr}, InitKind::kOnes, false));
    out.push_back(spec(sa + "linear_kv_up_proj.weight",
                       {nh * (cfg.qk_head_dim + cfg.v_head_dim), kvr}, InitKind::kNormal, true));
    out.push_back(spec(sa + "linear_proj.weight", {h, nh * cfg.v_head_dim},
                       InitKind::kScaledNormal, true));
  } else if (attention) {
    out.push_back(spec(p + "input_layernorm.weight", {h}, InitKind::kOnes, false));
    out.push_back(spec(p + "self_attention.linear_qkv.weight", {(nh + 2 * ng) * hd, h},
                       InitKind::kNormal, true));
    if (cfg.add_qkv_bias)  // zeros and no weight decay, as Megatron's biases
      out.push_back(spec(p + "self_attention.linear_qkv.bias", {(nh + 2 * ng) * hd},
                         InitKind::kZeros, false));
    if (cfg.qk_layernorm) {  // one weight over the head dim, shared by the heads
      out.push_back(spec(p + "self_attention.q_layernorm.weight", {hd}, InitKind::kOnes, false));
      out.push_back(spec(p + "self_attention.k_layernorm.weight", {hd}, InitKind::kOnes, false));
    }
    out.push_back(
        spec(p + "self_attention.linear_proj.weight", {h, nh * hd}, InitKind::kScaledNormal, true));
  }
  if (mlp || routed) out.push_back(spec(p + "pre_mlp_layernorm.weight", {h}, InitKind::kOnes, false));
  if (mlp) {
    out.push_back(spec(p + "mlp.linear_fc1.weight", {cfg.dense_mlp().fc1_rows(), h},
                       InitKind::kNormal, true));
    out.push_back(spec(p + "mlp.linear_fc2.weight", {h, ffn}, InitKind::kScaledNormal, true));
  }
  if (routed) {
    out.push_back(spec(p + "mlp.router.weight", {cfg.num_experts, h}, InitKind::kNormal, true));
    if (const int64_t sf = cfg.moe_shared_expert_intermediate_size; sf > 0) {
      out.push_back(spec(p + "mlp.shared_experts.linear_fc1.weight",
                         {cfg.shared_expert_mlp().fc1_rows(), h},
                         InitKind::kNormal, true));
      out.push_back(spec(p + "mlp.shared_experts.linear_fc2.weight", {h, sf},
                         InitKind::kScaledNormal, true));
    }
  }
  if (symbol == 'M') {
    const int64_t mh = cfg.mamba_heads(), di = mh * cfg.mamba_head_dim;
    const int64_t gs = static_cast<int64_t>(cfg.mamba_num_groups) * cfg.mamba_state_dim;
    const std::string m = p + "mixer.";
    out.push_back(spec(m + "in_proj.layer_norm_weight", {h}, InitKind::kOnes, false));
    out.push_back(spec(m + "in_proj.weight", {2 * di + 2 * gs + mh, h}, InitKind::kNormal, true));
    out.push_back(spec(m + "conv1d.weight", {di + 2 * gs, 1, 4}, InitKind::kConvUniform, true));
    out.push_back(spec(m + "conv1d.bias", {di + 2 * gs}, InitKind::kConvUniform, false));
    out.push_back(spec(m + "dt_bias", {mh}, InitKind::kDtBias, false));
    out.push_back(spec(m + "A_log", {mh}, InitKind::kALog, false));
    out.push_back(spec(m + "D", {mh}, InitKind::kOnes, false));
    out.push_back(spec(m + "norm.weight", {di}, InitKind::kOnes, false));
    out.push_back(spec(m + "out_proj.weight", {h, di}, InitKind::kScaledNormal, true));
  }
  return out;
}

std::vector<ParamSpec> block_param_specs(const ModelConfig& cfg, const std::string& p, bool moe) {
  return block_param_specs(cfg, p, 'T', moe);
}

std::vector<ParamSpec> layer_param_specs(const ModelConfig& cfg, int layer) {
  WEFT_CHECK(layer >= 0 && layer < cfg.num_layers, "layer {} outside [0, {})", layer,
             cfg.num_layers);
  return block_param_specs(cfg, layer_prefix(layer), cfg.layer_symbol(layer),
                           cfg.is_moe_layer(layer));
}

std::vector<ParamSpec> expert_param_specs(const ModelConfig& cfg, const std::string& p, int first,
                                          int count) {
  WEFT_CHECK(first >= 0 && count >= 0 && first + count <= cfg.num_experts,
             "experts {}..{} outside [0, {})", first, first + count, cfg.num_experts);
  const int64_t h = cfg.hidden_size, f = cfg.expert_ffn();
  std::vector<ParamSpec> out;
  for (int e = first; e < first + count; ++e)
    out.push_back(spec(fmt::format("{}mlp.experts.{}.linear_fc1.weight", p, e),
                       {cfg.expert_mlp().fc1_rows(), h},
                       InitKind::kNormal, true));
  for (int e = first; e < first + count; ++e)
    out.push_back(spec(fmt::format("{}mlp.experts.{}.linear_fc2.weight", p, e), {h, f},
                       InitKind::kScaledNormal, true));
  return out;
}

std::vector<ParamSpec> mtp_param_specs(const ModelConfig& cfg, int k) {
  WEFT_CHECK(k >= 0 && k < cfg.mtp_num_layers, "MTP depth {} outside [0, {})", k,
             cfg.mtp_num_layers);
  const int64_t h = cfg.hidden_size;
  const std::string p = fmt::format("mtp.layers.{}.", k);
  std::vector<ParamSpec> out = {
      spec(p + "enorm.weight", {h}, InitKind::kOnes, false),
      spec(p + "hnorm.weight", {h}, InitKind::kOnes, false),
      spec(p + "eh_proj.weight", {h, 2 * h}, InitKind::kNormal, true),
      spec(p + "final_layernorm.weight", {h}, InitKind::kOnes, false),
  };
  const std::string symbols = cfg.mtp_symbols();
  for (size_t j = 0; j < symbols.size(); ++j)
    for (auto& s : block_param_specs(cfg, mtp_layer_prefix(cfg, k, static_cast<int>(j)),
                                     symbols[j], cfg.mtp_layer_is_moe(j)))
      out.push_back(std::move(s));
  return out;
}

std::string router_bias_name(const std::string& layer_prefix) {
  return layer_prefix + "mlp.router.expert_bias";
}

std::vector<ParamSpec> router_bias_specs(const ModelConfig& cfg) {
  std::vector<ParamSpec> out;
  if (!cfg.moe() || !cfg.moe_router_enable_expert_bias) return out;
  auto add = [&](const std::string& prefix) {
    out.push_back(spec(router_bias_name(prefix), {cfg.num_experts}, InitKind::kZeros, false));
  };
  for (int l = 0; l < cfg.num_layers; ++l)
    if (cfg.is_moe_layer(l)) add(layer_prefix(l));
  const std::string symbols = cfg.mtp_symbols();
  for (int k = 0; k < cfg.mtp_num_layers; ++k)
    for (size_t j = 0; j < symbols.size(); ++j)
      if (cfg.mtp_layer_is_moe(j)) add(mtp_layer_prefix(cfg, k, static_cast<int>(j)));
  return out;
}

std::vector<ParamSpec> all_param_specs(const ModelConfig& cfg) {
  std::vector<ParamSpec> out = {embedding_param_spec(cfg)};
  auto append = [&](std::vector<ParamSpec> v) {
    for (auto& s : v) out.push_back(std::move(s));
  };
  for (int l = 0; l < cfg.num_layers; ++l) {
    append(layer_param_specs(cfg, l));
    if (cfg.is_moe_layer(l)) append(expert_param_specs(cfg, layer_prefix(l), 0, cfg.num_experts));
  }
  out.push_back(final_norm_param_spec(cfg));
  if (!cfg.tied()) out.push_back(output_param_spec(cfg));
  for (int k = 0; k < cfg.mtp_num_layers; ++k) {
    append(mtp_param_specs(cfg, k));
    const std::string symbols = cfg.mtp_symbols();
    for (size_t j = 0; j < symbols.size(); ++j)
      if (cfg.mtp_layer_is_moe(j))
        append(expert_param_specs(cfg, mtp_layer_prefix(cfg, k, static_cast<int>(j)), 0,
                                  cfg.num_experts));
  }
  return out;
}

LayerHandles layer_handles(ParamSource* src, int first, const std::vector<ParamSpec>& specs,
                           const std::string& prefix, MoeExperts* experts) {
  LayerHandles h;
  const std::pair<const char*, ParamHandle*> slots[] = {
      {"input_layernorm.weight", &h.input_layernorm},
      {"self_attention.linear_qkv.weight", &h.linear_qkv},
      {"self_attention.linear_qkv.bias", &h.linear_qkv_bias},
      {"self_attention.q_layernorm.weight", &h.q_layernorm},
      {"self_attention.k_layernorm.weight", &h.k_layernorm},
      {"self_attention.linear_proj.weight", &h.linear_proj},
      {"self_attention.linear_q_proj.weight", &h.linear_q_proj},
      {"self_attention.linear_q_down_proj.weight", &h.linear_q_down_proj},
      {"self_attention.linear_q_up_proj.weight", &h.linear_q_up_proj},
      {"self_attention.linear_kv_down_proj.weight", &h.linear_kv_down_proj},
      {"self_attention.kv_layernorm.weight", &h.kv_layernorm},
      {"self_attention.linear_kv_up_proj.weight", &h.linear_kv_up_proj},
      {"pre_mlp_layernorm.weight", &h.pre_mlp_layernorm},
      {"mlp.linear_fc1.weight", &h.linear_fc1},
      {"mlp.linear_fc2.weight", &h.linear_fc2},
      {"mlp.router.weight", &h.router},
      {"mlp.shared_experts.linear_fc1.weight", &h.shared_fc1},
      {"mlp.shared_experts.linear_fc2.weight", &h.shared_fc2},
      {"mixer.in_proj.layer_norm_weight", &h.mamba.in_proj_norm},
      {"mixer.in_proj.weight", &h.mamba.in_proj},
      {"mixer.conv1d.weight", &h.mamba.conv_weight},
      {"mixer.conv1d.bias", &h.mamba.conv_bias},
      {"mixer.dt_bias", &h.mamba.dt_bias},
      {"mixer.A_log", &h.mamba.A_log},
      {"mixer.D", &h.mamba.D},
      {"mixer.norm.weight", &h.mamba.norm},
      {"mixer.out_proj.weight", &h.mamba.out_proj},
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& n = specs[i].name;
    if (n.compare(0, prefix.size(), prefix) != 0) continue;
    for (const auto& [suffix, slot] : slots)
      if (n.compare(prefix.size(), std::string::npos, suffix) == 0)
        *slot = ParamHandle{src, first + static_cast<int>(i)};
  }
  if (h.router.source) {
    WEFT_CHECK(experts != nullptr, "MoE layer {} needs its experts", prefix);
    h.experts = experts;
  }
  return h;
}

LayerHandles layer_handles(ParamSource* src, int first, const ModelConfig& cfg, bool moe,
                           MoeExperts* experts) {
  return layer_handles(src, first, block_param_specs(cfg, "", moe), "", experts);
}

MtpHandles mtp_handles(ParamSource* src, int first, const ModelConfig& cfg, int k,
                       const std::vector<MoeExperts*>& experts) {
  const std::vector<ParamSpec> specs = mtp_param_specs(cfg, k);
  MtpHandles h;
  h.enorm = ParamHandle{src, first};
  h.hnorm = ParamHandle{src, first + 1};
  h.eh_proj = ParamHandle{src, first + 2};
  h.final_layernorm = ParamHandle{src, first + 3};
  const std::string symbols = cfg.mtp_symbols();
  for (size_t j = 0; j < symbols.size(); ++j)
    h.layers.push_back(layer_handles(src, first, specs,
                                     mtp_layer_prefix(cfg, k, static_cast<int>(j)),
                                     j < experts.size() ? experts[j] : nullptr));
  return h;
}

ParamSpec final_norm_param_spec(const ModelConfig& cfg) {
  return spec("decoder.final_layernorm.weight", {cfg.hidden_size}, InitKind::kOnes, false);
}

ParamSpec output_param_spec(const ModelConfig& cfg) {
  ParamSpec s =
      spec("output_layer.weight", {cfg.vocab_size, cfg.hidden_size}, InitKind::kNormal, true);
  s.embedding_or_output = true;
  return s;
}

at::Tensor init_param(const ParamSpec& spec, const ModelConfig& cfg, uint64_t seed) {
  at::Tensor t = at::empty(spec.shape, at::TensorOptions().dtype(at::kFloat));
  if (spec.init == InitKind::kOnes) return t.fill_(1.0);
  if (spec.init == InitKind::kZeros) return t.zero_();
  at::Generator gen = compat::make_cpu_generator(param_generator_seed(seed, spec.name));
  switch (spec.init) {
    case InitKind::kConvUniform:  // PyTorch's Conv1d default: U(+-1/sqrt(taps)), 4 taps
      return t.uniform_(-0.5, 0.5, gen);
    case InitKind::kALog:  // A ~ U[1, 16], stored as log(A) (Megatron's A_init_range)
      return t.uniform_(1.0, 16.0, gen).log_();
    case InitKind::kDtBias: {  // dt log-uniform in [1e-3, 1e-1], floored at 1e-4, inverse softplus
      const double lo = std::log(1e-3), hi = std::log(1e-1);
      at::Tensor dt = t.uniform_(0.0, 1.0, gen).mul_(hi - lo).add_(lo).exp_().clamp_min_(1e-4);
      return dt + at::log(-at::expm1(-dt));
    }
    default:
      break;
  }
  double std = cfg.init_method_std;
  // Projections into the residual: Megatron divides by sqrt(2 L), by sqrt(L) in hybrid models
  // (each symbol is its own layer there).
  if (spec.init == InitKind::kScaledNormal)
    std /= std::sqrt((cfg.hybrid() ? 1.0 : 2.0) * cfg.num_layers);
  t.normal_(0.0, std, gen);
  return t;
}

at::Tensor llama3_scaled_frequencies(const at::Tensor& inv_freq, double factor) {
  // Wavelength in positions of each frequency; long ones (past the original context over the
  // low-frequency factor) are slowed by `factor`, short ones (under the context over the
  // high-frequency factor) kept, and between the two the frequency is interpolated linearly in
  // context / wavelength between inv_freq / factor and inv_freq.
  constexpr double ctx = ModelConfig::kRopeOriginalContext;
  constexpr double lo = ModelConfig::kRopeLowFreqFactor, hi = ModelConfig::kRopeHighFreqFactor;
  const at::Tensor wavelen = (2.0 * M_PI) / inv_freq;
  const at::Tensor smooth = (ctx / wavelen - lo) / (hi - lo);
  const at::Tensor between = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq;
  return at::where(wavelen > ctx / lo, inv_freq / factor,
                   at::where(wavelen < ctx / hi, inv_freq, between));
}

RotaryTables make_rotary_tables(const ModelConfig& cfg, c10::Device device, c10::ScalarType dtype) {
  check_model_config(cfg);
  // Angles in float64 on the CPU, then cast: the tables are exact to the target dtype.
  const int64_t rd = cfg.rotary_dim();  // the head dim unless --rotary-percent < 1
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor exponent = at::arange(0, rd / 2, f64) * (-2.0 / static_cast<double>(rd));
  at::Tensor inv_freq = at::pow(cfg.rotary_base, exponent);                        // base^(-2i/rd)
  if (cfg.use_rope_scaling) inv_freq = llama3_scaled_frequencies(inv_freq, cfg.rope_scaling_factor);
  if (cfg.yarn()) inv_freq = yarn_frequencies(cfg);
  at::Tensor positions = at::arange(cfg.seq_length, f64);
  if (cfg.rotary_seq_len_interpolation_factor > 0)  // Megatron's seq *= 1 / factor
    positions = positions * (1.0 / cfg.rotary_seq_len_interpolation_factor);
  const at::Tensor angles = at::outer(positions, inv_freq);  // [s, rd/2]
  const at::Tensor full = at::cat({angles, angles}, -1);                           // [s, rd]
  // YaRN's attention factor scales cos and sin (so both q and k), as Megatron's.
  const double m = yarn_attention_factor(cfg);
  RotaryTables t;
  t.cos = (m == 1.0 ? full.cos() : full.cos() * m).to(device, dtype);
  t.sin = (m == 1.0 ? full.sin() : full.sin() * m).to(device, dtype);
  return t;
}

at::Tensor embed_tokens(const at::Tensor& tokens, ParamHandle word_embeddings) {
  WEFT_CHECK(tokens.dim() == 2, "embed_tokens: tokens must be [b, s], got {} dims", tokens.dim());
  return ops::embedding(tokens, word_embeddings);
}

at::Tensor mlp_activation(const at::Tensor& a, const MlpSpec& mlp) {
  if (mlp.squared_relu) return at::relu(a).square();
  if (fused::usable(a) && a.numel() > 0) return fused::swiglu(a);
  return at::silu(a.narrow(-1, 0, mlp.ffn)) * a.narrow(-1, mlp.ffn, mlp.ffn);
}

at::Tensor mlp(const at::Tensor& x, ParamHandle fc1, ParamHandle fc2, const MlpSpec& spec) {
  return ops::linear(mlp_activation(ops::linear(x, fc1), spec), fc2);
}

at::Tensor recomputed_mlp(const at::Tensor& x, ParamHandle fc1, ParamHandle fc2,
                          const MlpSpec& spec) {
  return recomputed([fc1, fc2, spec](const std::vector<at::Tensor>& in, bool) {
    return std::vector<at::Tensor>{mlp(in[0], fc1, fc2, spec)};
  }, {x})[0];
}

namespace {

// MLA's RoPE on x [b, s, heads, d] at positions [pos, pos + s): the channels de-interleaved
// (even ones first, then odd ones: DeepSeek's pairs (2i, 2i + 1) become (i, i + d/2)), then
// rotate-half. The result stays in that order, for q and k alike, so q.k is the pairs' rotation.
at::Tensor mla_rope(const at::Tensor& x, const RotaryTables& rope, int64_t pos) {
  const int64_t d = x.size(3);
  const at::Tensor halves = at::cat({x.slice(3, 0, d, 2), x.slice(3, 1, d, 2)}, 3);
  return apply_rotary(halves.transpose(1, 2), rope, pos).transpose(1, 2);
}

// attention_qkv of multi-latent attention, from xn = input_layernorm(x): q [b, nh, s, dn + dr],
// k the same, v [b, nh, s, dv] (transformer.h documents the weights' rows).
AttentionQkv mla_qkv(const at::Tensor& xn, const LayerHandles& w, const RotaryTables& rope,
                     const ModelConfig& cfg, int64_t pos) {
  const int64_t nh = cfg.num_attention_heads, dn = cfg.qk_head_dim;
  const int64_t dr = cfg.qk_pos_emb_head_dim, dv = cfg.v_head_dim, kvr = cfg.kv_lora_rank;
  const int64_t b = xn.size(0), s = xn.size(1);
  auto norm = [&](const at::Tensor& t, ParamHandle weight) {  // the latents' --qk-layernorm
    return weight.source ? ops::rms_norm(t.contiguous(), weight, cfg.norm_epsilon) : t;
  };
  at::Tensor q;
  if (w.linear_q_proj.source) {
    q = ops::linear(xn, w.linear_q_proj);
  } else {
    q = ops::linear(norm(ops::linear(xn, w.linear_q_down_proj), w.q_layernorm), w.linear_q_up_proj);
  }
  q = q.view({b, s, nh, dn + dr});
  const at::Tensor down = ops::linear(xn, w.linear_kv_down_proj);  // [b, s, kvr + dr]
  const at::Tensor kv = ops::linear(norm(down.narrow(2, 0, kvr), w.kv_layernorm),
                                    w.linear_kv_up_proj)
                            .view({b, s, nh, dn + dv});
  const at::Tensor q_pe = mla_rope(q.narrow(3, dn, dr), rope, pos);
  const at::Tensor k_pe = mla_rope(down.narrow(2, kvr, dr).unsqueeze(2), rope, pos);  // one head
  AttentionQkv out;
  out.q = at::cat({q.narrow(3, 0, dn), q_pe}, 3).transpose(1, 2);
  out.k = at::cat({kv.narrow(3, 0, dn), k_pe.expand({b, s, nh, dr})}, 3).transpose(1, 2);
  out.v = kv.narrow(3, dn, dv).contiguous().transpose(1, 2);
  return out;
}

// attention_qkv from xn = input_layernorm(x).
AttentionQkv attention_qkv_normed(const at::Tensor& xn, const LayerHandles& w,
                                  const RotaryTables& rope, const ModelConfig& cfg, int64_t pos) {
  const int64_t b = xn.size(0), s = xn.size(1);
  WEFT_CHECK(rope.cos.defined() && pos >= 0 && pos + s <= rope.cos.size(0) &&
                 rope.cos.size(1) == cfg.rotary_dim(),
             "decoder_layer: positions [{}, {}) need rotary tables of at least [{}, {}]", pos,
             pos + s, pos + s, cfg.rotary_dim());
  if (cfg.mla()) return mla_qkv(xn, w, rope, cfg, pos);
  const int64_t nh = cfg.num_attention_heads, ng = cfg.num_query_groups;
  const int64_t hd = cfg.head_dim(), r = nh / ng;
  // Fused rows per group g: r query heads, then g's key head, then its value head.
  at::Tensor projected = ops::linear(xn, w.linear_qkv);
  if (w.linear_qkv_bias.source) projected = ops::add_bias(projected, w.linear_qkv_bias);
  const at::Tensor qkv = projected.view({b, s, ng, r + 2, hd});
  AttentionQkv out;
  // The fused kernel rotates whole heads; --rotary-percent < 1 takes the ATen rotation.
  const bool fused_rope = cfg.rotary() && cfg.rotary_dim() == hd && fused::usable(qkv) &&
                          rope.cos.scalar_type() == qkv.scalar_type();
  at::Tensor rope_in = qkv;  // what the fused kernel rotates
  at::Tensor q, k;           // [b, s, heads, hd], for the unfused rotation
  if (cfg.qk_layernorm) {
    // --qk-layernorm: each query and key head normalised over the head dim, then rotated; on
    // the fused path the normed heads are laid out as a QKV again (one copy) for its kernel.
    q = ops::rms_norm(qkv.narrow(3, 0, r).reshape({b, s, nh, hd}), w.q_layernorm, cfg.norm_epsilon);
    k = ops::rms_norm(qkv.select(3, r), w.k_layernorm, cfg.norm_epsilon);
    if (fused_rope)
      rope_in = at::cat({q.view({b, s, ng, r, hd}), k.unsqueeze(3), qkv.narrow(3, r + 1, 1)}, 3);
  }
  if (fused_rope) {
    // One kernel: rotated q and k and a copy of v, each [b, s, heads, hd] contiguous.
    auto [qr, kr, vr] =
        fused::rope_qkv(rope_in, rope.cos.narrow(0, pos, s), rope.sin.narrow(0, pos, s));
    out.q = qr.transpose(1, 2);
    out.k = kr.transpose(1, 2);
    out.v = vr.transpose(1, 2);
  } else {
    if (!q.defined()) {
      q = qkv.narrow(3, 0, r).reshape({b, s, nh, hd});
      k = qkv.select(3, r);
    }
    // --position-embedding-type none: q and k as projected (and normed).
    out.q = cfg.rotary() ? apply_rotary(q.transpose(1, 2), rope, pos) : q.transpose(1, 2);
    out.k = cfg.rotary() ? apply_rotary(k.transpose(1, 2), rope, pos) : k.transpose(1, 2);
    out.v = qkv.select(3, r + 1).transpose(1, 2);
  }
  return out;
}

// linear_proj(attn), attn [b, nh, s, dv] the attention's output per head (dv: the head dim, or
// MLA's --v-head-dim).
at::Tensor attention_projection(const at::Tensor& attn, const LayerHandles& w,
                                const ModelConfig& cfg) {
  const int64_t nh = cfg.num_attention_heads, dv = attn.size(3);
  return ops::linear(attn.transpose(1, 2).reshape({attn.size(0), attn.size(2), nh * dv}),
                     w.linear_proj);
}

// mlp(xn), xn = pre_mlp_layernorm(x): the dense MLP (SwiGLU or squared ReLU, MlpSpec) or MoE,
// recomputed in the backward where --recompute-modules names mlp or moe.
at::Tensor mlp_output(const at::Tensor& xn, const LayerHandles& w, const ModelConfig& cfg,
                      at::Tensor* aux_loss) {
  if (w.experts && cfg.recompute.moe) {
    // The running aux loss goes through the piece, so that it sums in the same order.
    auto out = recomputed(
        [w, cfg, with_aux = aux_loss != nullptr](const std::vector<at::Tensor>& in, bool) {
          at::Tensor aux = in[1];
          at::Tensor y = moe_mlp(in[0], w.router, w.shared_fc1, w.shared_fc2, *w.experts, cfg,
                                 with_aux ? &aux : nullptr, w.router_bias);
          return std::vector<at::Tensor>{y, aux};
        },
        {xn, aux_loss ? *aux_loss : at::Tensor()});
    if (aux_loss) *aux_loss = out[1];
    return out[0];
  }
  if (w.experts)
    return moe_mlp(xn, w.router, w.shared_fc1, w.shared_fc2, *w.experts, cfg, aux_loss,
                   w.router_bias);
  return cfg.recompute.mlp ? recomputed_mlp(xn, w.linear_fc1, w.linear_fc2, cfg.dense_mlp())
                           : mlp(xn, w.linear_fc1, w.linear_fc2, cfg.dense_mlp());
}

// The attention of q, k, v (grouped-query, causal), recomputed in the backward where
// --recompute-modules names core_attn.
at::Tensor core_attention(const AttentionQkv& a, const ModelConfig& cfg) {
  const double scale = attention_softmax_scale(cfg);
  if (!cfg.recompute.core_attn) return compat::causal_attention_gqa(a.q, a.k, a.v, scale);
  return recomputed(
      [scale](const std::vector<at::Tensor>& in, bool) {
        return std::vector<at::Tensor>{compat::causal_attention_gqa(in[0], in[1], in[2], scale)};
      },
      {a.q, a.k, a.v})[0];
}

}  // namespace

AttentionQkv attention_qkv(const at::Tensor& x, const LayerHandles& w, const RotaryTables& rope,
                           const ModelConfig& cfg, int64_t pos) {
  return attention_qkv_normed(ops::rms_norm(x, w.input_layernorm, cfg.norm_epsilon), w, rope, cfg,
                              pos);
}

at::Tensor attention_residual(const at::Tensor& x, const at::Tensor& attn, const LayerHandles& w,
                              const ModelConfig& cfg) {
  return x + attention_projection(attn, w, cfg);
}

at::Tensor mlp_block(const at::Tensor& x, const LayerHandles& w, const ModelConfig& cfg,
                     at::Tensor* aux_loss) {
  if (!w.pre_mlp_layernorm.source) return x;
  return x + mlp_output(ops::rms_norm(x, w.pre_mlp_layernorm, cfg.norm_epsilon), w, cfg, aux_loss);
}

at::Tensor Residual::hidden() const { return delta.defined() ? x + delta : x; }

at::Tensor norm_residual(Residual& in, ParamHandle weight, double eps) {
  if (!in.delta.defined()) return ops::rms_norm(in.x, weight, eps);
  auto [sum, xn] = ops::add_rms_norm(in.x, in.delta, weight, eps);
  in = Residual{std::move(sum), {}};
  return xn;
}

Residual decoder_layer(Residual in, const LayerHandles& w, const RotaryTables& rope,
                       const ModelConfig& cfg, at::Tensor* aux_loss) {
  const int64_t h = cfg.hidden_size;
  WEFT_CHECK(in.x.dim() == 3 && in.x.size(2) == h, "decoder_layer: input must be [b, s, {}]", h);
  if (!w.has_attention() || !w.pre_mlp_layernorm.source || w.mamba.in_proj.source) {
    at::Tensor hidden = in.hidden();
    if (w.has_attention()) {  // x + attention(input_layernorm(x))
      const AttentionQkv a = attention_qkv(hidden, w, rope, cfg, 0);
      hidden = attention_residual(hidden, core_attention(a, cfg), w, cfg);
    }
    if (w.mamba.in_proj.source) hidden = hidden + mamba_mixer(hidden, w.mamba, cfg);
    return Residual{mlp_block(hidden, w, cfg, aux_loss), {}};
  }
  // Attention and MLP: each residual add runs inside the norm that reads its sum.
  const AttentionQkv a =
      attention_qkv_normed(norm_residual(in, w.input_layernorm, cfg.norm_epsilon), w, rope, cfg, 0);
  const at::Tensor proj =
      attention_projection(core_attention(a, cfg), w, cfg);
  auto [sum, xn] = ops::add_rms_norm(in.x, proj, w.pre_mlp_layernorm, cfg.norm_epsilon);
  return Residual{std::move(sum), mlp_output(xn, w, cfg, aux_loss)};
}

at::Tensor decoder_layer(const at::Tensor& x, const LayerHandles& w, const RotaryTables& rope,
                         const ModelConfig& cfg, at::Tensor* aux_loss) {
  return decoder_layer(Residual{x, {}}, w, rope, cfg, aux_loss).hidden();
}

at::Tensor mtp_layer(const at::Tensor& h_prev, const at::Tensor& emb, const MtpHandles& w,
                     const RotaryTables& rope, const ModelConfig& cfg, at::Tensor* aux_loss) {
  const at::Tensor e = ops::rms_norm(emb, w.enorm, cfg.norm_epsilon);
  const at::Tensor h = ops::rms_norm(h_prev, w.hnorm, cfg.norm_epsilon);
  at::Tensor x = ops::linear(at::cat({e, h}, -1), w.eh_proj);
  for (const LayerHandles& layer : w.layers) x = decoder_layer(x, layer, rope, cfg, aux_loss);
  return ops::rms_norm(x, w.final_layernorm, cfg.norm_epsilon);
}

at::Tensor mtp_input_tokens(const at::Tensor& labels, int k) {
  const int64_t s = labels.size(1);
  WEFT_CHECK(k >= 1 && k < s, "MTP depth {} needs a sequence longer than {}", k, s);
  return at::cat({labels.narrow(1, k - 1, s - k), at::zeros({labels.size(0), k}, labels.options())},
                 1);
}

at::Tensor final_norm(const at::Tensor& x, ParamHandle weight, const ModelConfig& cfg) {
  return ops::rms_norm(x, weight, cfg.norm_epsilon);
}

at::Tensor final_norm(Residual& x, ParamHandle weight, const ModelConfig& cfg) {
  return norm_residual(x, weight, cfg.norm_epsilon);
}

at::Tensor output_logits(const at::Tensor& x, ParamHandle output_weight) {
  return ops::linear(x, output_weight);
}

at::Tensor lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels) {
  WEFT_CHECK(labels.scalar_type() == at::kLong, "lm_loss_sum: labels must be int64");
  WEFT_CHECK(logits.dim() == labels.dim() + 1 && logits.numel() / logits.size(-1) == labels.numel(),
             "lm_loss_sum: logits [..., V] and labels [...] disagree in shape");
  const int64_t vocab = logits.size(-1);
  if (fused::usable(logits) && labels.device() == logits.device())
    return fused::cross_entropy_sum(logits.reshape({-1, vocab}), labels.reshape({-1}));
  const at::Tensor logp =
      at::log_softmax(logits.reshape({-1, vocab}), -1, ops::accum_dtype(logits.scalar_type()));
  return at::nll_loss(logp, labels.reshape({-1}), {}, at::Reduction::Sum);
}

}  // namespace weft
