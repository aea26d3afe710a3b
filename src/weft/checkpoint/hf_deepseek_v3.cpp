// DeepSeek-V3 <-> weft MLA models (see hf_deepseek_v3.h, docs/hf-interop.md). The key names and
// defaults are those of transformers' configuration_deepseek_v3.py; the tensor names those of
// the checkpoints on the hub (model.layers.*, one tensor per expert).
#include "weft/checkpoint/hf_deepseek_v3.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "weft/checkpoint/hf_json.h"
#include "weft/core/error.h"
#include "weft/model/transformer.h"

namespace weft {
namespace {

// Whether `c` rotates with YaRN frequencies other than plain RoPE's.
bool scaled(const ModelConfig& c) { return c.yarn() && c.rotary_scaling_factor > 1; }

// The index of the first MoE layer (the dense layers before it); num_layers for a dense model.
int first_moe_layer(const ModelConfig& c) {
  int k = 0;
  while (k < c.num_layers && !c.is_moe_layer(k)) ++k;
  return k;
}

// transformers' name of the weft tensor `suffix` of a layer under `q` ("model.layers.{L}."), or
// two names (gate, up) for a fused SwiGLU fc1.
std::vector<std::string> hf_names(const std::string& suffix, const std::string& q) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"input_layernorm.weight", "input_layernorm.weight"},
      {"self_attention.linear_q_proj.weight", "self_attn.q_proj.weight"},
      {"self_attention.linear_q_down_proj.weight", "self_attn.q_a_proj.weight"},
      {"self_attention.q_layernorm.weight", "self_attn.q_a_layernorm.weight"},
      {"self_attention.linear_q_up_proj.weight", "self_attn.q_b_proj.weight"},
      {"self_attention.linear_kv_down_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"self_attention.kv_layernorm.weight", "self_attn.kv_a_layernorm.weight"},
      {"self_attention.linear_kv_up_proj.weight", "self_attn.kv_b_proj.weight"},
      {"self_attention.linear_proj.weight", "self_attn.o_proj.weight"},
      {"pre_mlp_layernorm.weight", "post_attention_layernorm.weight"},
      {"mlp.linear_fc2.weight", "mlp.down_proj.weight"},
      {"mlp.router.weight", "mlp.gate.weight"},
      {"mlp.shared_experts.linear_fc2.weight", "mlp.shared_experts.down_proj.weight"},
  };
  for (const auto& [weft, hf] : kNames)
    if (suffix == weft) return {q + hf};
  if (suffix == "mlp.linear_fc1.weight")
    return {q + "mlp.gate_proj.weight", q + "mlp.up_proj.weight"};
  if (suffix == "mlp.shared_experts.linear_fc1.weight")
    return {q + "mlp.shared_experts.gate_proj.weight", q + "mlp.shared_experts.up_proj.weight"};
  const std::string experts = "mlp.experts.";
  if (suffix.rfind(experts, 0) == 0) {  // mlp.experts.{E}.linear_fc1/2.weight
    const size_t dot = suffix.find('.', experts.size());
    const std::string e = q + suffix.substr(0, dot + 1);  // model.layers.{L}.mlp.experts.{E}.
    const std::string rest = suffix.substr(dot + 1);
    if (rest == "linear_fc1.weight") return {e + "gate_proj.weight", e + "up_proj.weight"};
    if (rest == "linear_fc2.weight") return {e + "down_proj.weight"};
  }
  fail("hf export: no DeepSeek-V3 name for layer tensor '{}'", suffix);
}

// The RoPE of a config.json (rope_scaling where given, as transformers 5 prefers it, else
// rope_parameters; the base from rope_parameters, else rope_theta) as weft's MLA settings in
// `m`, transformers' YaRN rules turned into Megatron's: the tables' attention factor A (given,
// or mscale(f, mscale) / mscale(f, mscale_all_dim) where both are set, else mscale(f, 1)) and
// the softmax scale's mscale_all_dim.
void read_rope(const nlohmann::json& j, ModelConfig* m) {
  m->rotary_base = hf_get_or(j, "rope_theta", 10000.0);
  const nlohmann::json* rope = nullptr;
  const char* key = nullptr;
  for (const char* k : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object())
      fail_usage("hf import: config.json {} is not an object ({})", k, it->dump());
    if (rope == nullptr) {
      rope = &*it;
      key = k;
    }
  }
  m->rope_type = "rope";
  if (rope == nullptr) return;
  auto number = [&](const char* k) -> std::optional<double> {
    auto v = rope->find(k);
    if (v == rope->end() || v->is_null()) return std::nullopt;
    if (!v->is_number())
      fail_usage("hf import: config.json {}.{} has the wrong type ({})", key, k, v->dump());
    return v->get<double>();
  };
  if (auto p = j.find("rope_parameters"); p != j.end() && p->is_object())
    if (auto t = p->find("rope_theta"); t != p->end() && t->is_number())
      m->rotary_base = t->get<double>();
  std::string type = "default";
  for (const char* k : {"type", "rope_type"})
    if (auto v = rope->find(k); v != rope->end() && v->is_string()) type = v->get<std::string>();
  if (type == "default") return;
  if (type != "yarn")
    fail_usage("hf import: config.json {} has rope_type '{}'; weft's MLA has the default RoPE "
               "and YaRN (yarn)", key, type);
  const double original = number("original_max_position_embeddings").value_or(-1);
  if (original != ModelConfig::kYarnOriginalContext)
    fail_usage("hf import: config.json {}.original_max_position_embeddings is {}; weft's MLA YaRN "
               "(as Megatron's) fixes it to 4096", key,
               original < 0 ? std::string("missing") : fmt::format("{}", original));
  // transformers reads beta_fast and beta_slow with `or`: absent, null or 0 are 32 and 1.
  const double fast = number("beta_fast").value_or(0), slow = number("beta_slow").value_or(0);
  if ((fast != 0 && fast != ModelConfig::kYarnBetaFast) ||
      (slow != 0 && slow != ModelConfig::kYarnBetaSlow))
    fail_usage("hf import: config.json {}.beta_fast {} / beta_slow {}: weft's MLA YaRN (as "
               "Megatron's) fixes them to 32 and 1", key, fast, slow);
  if (auto t = rope->find("truncate"); t != rope->end() && !t->is_null() && *t != true)
    fail_usage("hf import: config.json {}.truncate is {}; weft's YaRN rounds the correction range "
               "to whole dims", key, t->dump());
  // transformers 5 takes factor as given (max_position_embeddings / original where absent);
  // 4.x replaced it by that ratio whenever original_max_position_embeddings was given. The hub's
  // configs (163840 / 4096 = 40) mean the same in both; others are read as transformers 5 does.
  const double ratio = hf_get_or(j, "max_position_embeddings", 4096) / original;
  std::optional<double> factor = number("factor");
  if (!factor) factor = ratio;
  if (*factor != ratio)
    std::fprintf(stderr, "weft: warning: hf import: config.json %s.factor %g differs from "
                 "max_position_embeddings / original_max_position_embeddings = %g, which "
                 "transformers 4 used instead; read as transformers 5 does (factor %g)\n",
                 key, *factor, ratio, *factor);
  if (!(*factor > 0) || !std::isfinite(*factor))
    fail_usage("hf import: config.json {}.factor {} must be a positive number", key, *factor);
  const double mscale = number("mscale").value_or(0), all = number("mscale_all_dim").value_or(0);
  const bool both = mscale != 0 && all != 0;
  const double derived = both ? yarn_mscale(*factor, mscale) / yarn_mscale(*factor, all)
                              : yarn_mscale(*factor, 1);
  const std::optional<double> given = number("attention_factor");
  const double a = given ? *given : derived;
  m->rotary_scaling_factor = *factor;
  m->mscale_all_dim = all;
  if (*factor <= 1) {  // no scaling: the frequencies, the tables and the softmax as plain RoPE's
    if (a != 1.0)
      fail_usage("hf import: config.json {}.attention_factor {} at factor {}: weft's YaRN has no "
                 "attention factor below factor 1", key, a, *factor);
    return;
  }
  m->rope_type = "yarn";
  // weft's mscale M with mscale(f, M) / mscale(f, all) = a: transformers' own where it used it
  // (so that a re-export writes the same number), 1 where it used mscale(f, 1) over 1, else
  // solved.
  if (both && a == derived) m->mscale = mscale;
  else if (all == 0 && a == yarn_mscale(*factor, 1)) m->mscale = 1.0;
  else m->mscale = (a * yarn_mscale(*factor, all) - 1.0) / (0.1 * std::log(*factor));
}

}  // namespace

void hf_read_deepseek_v3_router(const nlohmann::json& j, int groups, int topk_groups,
                                double default_scaling, ModelConfig* m) {
  if (groups != 1 && topk_groups != groups) {  // group-limited routing that limits
    if (topk_groups < 1 || m->moe_router_topk / topk_groups != 2)
      fail_usage("hf import: config.json n_group {} with topk_group {} and num_experts_per_tok "
                 "{}: transformers scores a group by its top 2 experts, weft (as Megatron) by "
                 "its top num_experts_per_tok / topk_group; they agree only when that is 2",
                 groups, topk_groups, m->moe_router_topk);
    m->moe_router_num_groups = groups;
    m->moe_router_group_topk = topk_groups;
  }
  const bool norm = hf_get_or(j, "norm_topk_prob", true);
  if (norm != (m->moe_router_topk > 1))
    fail_usage("hf import: config.json norm_topk_prob {} with num_experts_per_tok {}: weft "
               "normalises the top-k weights exactly when k > 1 (as Megatron)", norm,
               m->moe_router_topk);
  const double scaling = hf_get_or(j, "routed_scaling_factor", default_scaling);
  m->moe_router_topk_scaling_factor = scaling == 1.0 ? 0.0 : scaling;
}

bool hf_deepseek_v3_mtp_tensor(const std::string& name, int num_layers, int mtp_layers) {
  const std::string layers = "model.layers.";
  if (name.rfind(layers, 0) != 0) return false;
  const size_t dot = name.find('.', layers.size());
  const std::string index = name.substr(layers.size(), dot - layers.size());
  if (index.empty() || index.size() > 9 ||
      index.find_first_not_of("0123456789") != std::string::npos)
    return false;
  const int layer = std::stoi(index);
  return layer >= num_layers && layer < num_layers + mtp_layers;
}

void hf_deepseek_v3_check(const ModelConfig& c) {
  auto refuse = [](const std::string& what, const std::string& why) {
    fail_usage("hf export: {} has no DeepSeek-V3 equivalent ({})", what, why);
  };
  if (c.hybrid())
    refuse("--hybrid-layer-pattern", "DeepSeek-V3's layers are attention and an MLP or MoE");
  if (!c.qk_layernorm)
    refuse("--multi-latent-attention without --qk-layernorm",
           "DeepSeek-V3 always normalises its latents: q_a_layernorm, kv_a_layernorm");
  if (c.norm_epsilon != 1e-6)
    refuse(fmt::format("--norm-epsilon {}", c.norm_epsilon),
           "transformers' latent norms take 1e-6 whatever rms_norm_eps says, and weft has one "
           "epsilon");
  if (c.squared_relu) refuse("--squared-relu", "its MLPs and experts are SwiGLU");
  if (scaled(c) && c.rotary_scaling_factor * ModelConfig::kYarnOriginalContext !=
                       std::floor(c.rotary_scaling_factor * ModelConfig::kYarnOriginalContext))
    refuse(fmt::format("--rotary-scaling-factor {}", c.rotary_scaling_factor),
           "its max_position_embeddings, factor x 4096 (from which transformers 4 computes the "
           "factor), must be a whole number");
  if (!c.yarn() && c.rotary_scaling_factor > 1 && c.mscale_all_dim != 0)
    refuse("--rope-type rope with --rotary-scaling-factor and --mscale-all-dim",
           "transformers scales the softmax by mscale_all_dim only with rope_type yarn");
  if (!c.moe()) return;
  if (c.moe_router_score_function != "sigmoid")
    refuse("--moe-router-score-function " + c.moe_router_score_function,
           "its router is a sigmoid");
  const int fe = c.expert_ffn(), shared = c.moe_shared_expert_intermediate_size;
  if (shared <= 0 || shared % fe != 0)
    refuse(fmt::format("--moe-shared-expert-intermediate-size {}", shared),
           fmt::format("its MoE layers have n_shared_experts >= 1 shared experts of "
                       "moe_intermediate_size {}: a multiple of it", fe));
  const int k = first_moe_layer(c);
  for (int l = k; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l))
      refuse(fmt::format("--moe-layer-freq making layer {} dense after MoE layer {}", l, k),
             "its dense layers are the first first_k_dense_replace");
  if (c.moe_drops_tokens())
    refuse("--moe-expert-capacity-factor", "transformers' DeepSeek-V3 drops no tokens");
  const bool grouped =
      c.moe_router_group_topk > 0 && c.moe_router_group_topk < c.moe_router_num_groups;
  if (grouped && c.moe_router_topk / c.moe_router_group_topk != 2)
    refuse(fmt::format("--moe-router-group-topk {} with --moe-router-topk {}",
                       c.moe_router_group_topk, c.moe_router_topk),
           fmt::format("weft scores a group by its top {}, transformers by its top 2",
                       c.moe_router_topk / c.moe_router_group_topk));
  const int per_group = c.num_experts / (grouped ? c.moe_router_num_groups : 1);
  if (per_group < 2)
    refuse(fmt::format("{} expert(s) per group", per_group),
           "transformers scores each group by its top 2 experts");
}

std::vector<HfTensorMap> hf_deepseek_v3_tensor_maps(const ModelConfig& c) {
  hf_deepseek_v3_check(c);
  const int64_t h = c.hidden_size;
  std::vector<HfTensorMap> out;
  auto add = [&](const ParamSpec& s, const std::vector<std::string>& hf) {
    if (hf.size() == 1) {
      out.push_back({s.name, s.shape, HfSplit::kNone, hf, {s.shape}});
    } else {  // SwiGLU's fc1: gate rows, then up rows
      const int64_t f = s.shape[0] / 2;
      out.push_back({s.name, s.shape, HfSplit::kGateUp, hf, {{f, h}, {f, h}}});
    }
  };
  add(embedding_param_spec(c), {"model.embed_tokens.weight"});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l), q = fmt::format("model.layers.{}.", l);
    std::vector<ParamSpec> specs = layer_param_specs(c, l);
    if (c.is_moe_layer(l)) {
      for (ParamSpec& s : expert_param_specs(c, p, 0, c.num_experts)) specs.push_back(s);
      // Always written (zeros without --moe-router-enable-expert-bias: hf_export), float32 as
      // transformers keeps it.
      out.push_back({router_bias_name(p), {c.num_experts}, HfSplit::kNone,
                     {q + "mlp.gate.e_score_correction_bias"}, {{c.num_experts}}});
      out.back().float32 = true;
    }
    for (const ParamSpec& s : specs) add(s, hf_names(s.name.substr(p.size()), q));
  }
  add(final_norm_param_spec(c), {"model.norm.weight"});
  if (!c.tied()) add(output_param_spec(c), {"lm_head.weight"});
  return out;
}

nlohmann::json hf_deepseek_v3_config(const ModelConfig& c) {
  hf_deepseek_v3_check(c);
  const bool moe = c.moe();
  const bool grouped = moe && c.moe_router_group_topk > 0 &&
                       c.moe_router_group_topk < c.moe_router_num_groups;
  nlohmann::json rope = {{"rope_type", "default"}, {"rope_theta", c.rotary_base}};
  nlohmann::json scaling = nullptr;
  if (scaled(c)) {
    // The attention factor explicitly: transformers derives it from mscale and mscale_all_dim
    // only where both are non-zero, Megatron (and weft) always.
    scaling = {{"rope_type", "yarn"},
               {"factor", c.rotary_scaling_factor},
               {"mscale", c.mscale},
               {"mscale_all_dim", c.mscale_all_dim},
               {"attention_factor", yarn_attention_factor(c)},
               {"original_max_position_embeddings",
                static_cast<int64_t>(ModelConfig::kYarnOriginalContext)},
               {"beta_fast", ModelConfig::kYarnBetaFast},
               {"beta_slow", ModelConfig::kYarnBetaSlow}};
    rope = scaling;
    rope["rope_theta"] = c.rotary_base;
  }
  return {
      {"architectures", {"DeepseekV3ForCausalLM"}},
      {"model_type", "deepseek_v3"},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.ffn_hidden_size},
      {"moe_intermediate_size", moe ? c.expert_ffn() : c.ffn_hidden_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_attention_heads},
      {"q_lora_rank", c.q_lora_rank > 0 ? nlohmann::json(c.q_lora_rank) : nlohmann::json()},
      {"kv_lora_rank", c.kv_lora_rank},
      {"qk_nope_head_dim", c.qk_head_dim},
      {"qk_rope_head_dim", c.qk_pos_emb_head_dim},
      {"v_head_dim", c.v_head_dim},
      {"head_dim", c.qk_pos_emb_head_dim},
      {"n_routed_experts", moe ? c.num_experts : 1},
      {"num_experts_per_tok", moe ? c.moe_router_topk : 1},
      {"n_shared_experts", moe ? c.moe_shared_expert_intermediate_size / c.expert_ffn() : 1},
      {"first_k_dense_replace", first_moe_layer(c)},
      {"n_group", grouped ? c.moe_router_num_groups : 1},
      {"topk_group", grouped ? c.moe_router_group_topk : 1},
      {"norm_topk_prob", moe && c.moe_router_topk > 1},  // weft normalises iff k > 1
      {"routed_scaling_factor",
       moe && c.moe_router_topk_scaling_factor > 0 ? c.moe_router_topk_scaling_factor : 1.0},
      {"hidden_act", "silu"},
      {"rms_norm_eps", c.norm_epsilon},
      {"rope_theta", c.rotary_base},
      {"rope_parameters", rope},
      {"rope_scaling", scaling},
      {"rope_interleave", true},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"vocab_size", c.vocab_size},
      // With YaRN, factor x the original context: transformers 4 computed the factor from it.
      {"max_position_embeddings",
       scaled(c) ? static_cast<int64_t>(c.rotary_scaling_factor * ModelConfig::kYarnOriginalContext)
                 : int64_t{c.seq_length}},
      {"tie_word_embeddings", c.tied()},
      {"initializer_range", c.init_method_std},
      {"num_nextn_predict_layers", 0},
      {"use_cache", true},
  };
}

ModelConfig hf_deepseek_v3_model_config(const nlohmann::json& j) {
  ModelConfig m;
  m.multi_latent_attention = true;
  m.qk_layernorm = true;  // q_a_layernorm and kv_a_layernorm
  hf_get(j, "hidden_size", &m.hidden_size, true);
  hf_get(j, "num_hidden_layers", &m.num_layers, true);
  hf_get(j, "num_attention_heads", &m.num_attention_heads, true);
  hf_get(j, "vocab_size", &m.vocab_size, true);
  m.num_query_groups = m.num_attention_heads;
  const int kv = hf_get_or(j, "num_key_value_heads", m.num_attention_heads);
  if (kv != m.num_attention_heads)
    fail_usage("hf import: config.json num_key_value_heads {} differs from num_attention_heads "
               "{}; DeepSeek-V3's kv_b_proj makes a key and a value per attention head", kv,
               m.num_attention_heads);
  // transformers' defaults where a key is absent (configuration_deepseek_v3.py); q_lora_rank
  // null is a query projected from the hidden state.
  const bool no_q_latent = j.contains("q_lora_rank") && j["q_lora_rank"].is_null();
  m.q_lora_rank = no_q_latent ? 0 : hf_get_or(j, "q_lora_rank", 1536);
  if (!no_q_latent && m.q_lora_rank < 1)
    fail_usage("hf import: config.json q_lora_rank {} must be positive or null", m.q_lora_rank);
  m.kv_lora_rank = hf_get_or(j, "kv_lora_rank", 512);
  m.qk_head_dim = hf_get_or(j, "qk_nope_head_dim", 128);
  m.qk_pos_emb_head_dim = hf_get_or(j, "qk_rope_head_dim", 64);
  m.v_head_dim = hf_get_or(j, "v_head_dim", 128);
  m.norm_epsilon = hf_get_or(j, "rms_norm_eps", 1e-6);
  if (m.norm_epsilon != 1e-6)
    fail_usage("hf import: config.json rms_norm_eps is {}; transformers' DeepSeek-V3 latent norms "
               "take 1e-6 whatever it says, and weft has one epsilon", m.norm_epsilon);
  m.ffn_hidden_size = hf_get_or(j, "intermediate_size", 18432);
  const std::string act = hf_get_or(j, "hidden_act", std::string("silu"));
  if (act != "silu")
    fail_usage("hf import: config.json hidden_act is '{}'; weft's MLP is SwiGLU (silu)", act);
  hf_refuse_unless(j, "rope_interleave", true,
                   "weft's MLA rotates DeepSeek's interleaved channel pairs (Megatron's)");
  hf_refuse_unless(j, "attention_bias", false, "weft's MLA projections have no biases");
  hf_refuse_unless(j, "attention_dropout", 0.0, "weft has no attention dropout");
  hf_refuse_unless(j, "quantization_config", nullptr, "weft imports unquantised weights only");
  read_rope(j, &m);
  m.untie_embeddings_and_output_weights = !hf_get_or(j, "tie_word_embeddings", false);
  m.seq_length = hf_get_or(j, "max_position_embeddings", 4096);
  hf_get(j, "initializer_range", &m.init_method_std, false);
  const int dense = hf_get_or(j, "first_k_dense_replace", 3);
  if (dense < 0)
    fail_usage("hf import: config.json first_k_dense_replace {} must be >= 0", dense);
  if (dense < m.num_layers) {
    m.num_experts = hf_get_or(j, "n_routed_experts", 256);
    if (m.num_experts < 1)
      fail_usage("hf import: config.json n_routed_experts {} must be >= 1", m.num_experts);
    m.moe_router_topk = hf_get_or(j, "num_experts_per_tok", 8);
    m.moe_ffn_hidden_size = hf_get_or(j, "moe_intermediate_size", 2048);
    const int shared = hf_get_or(j, "n_shared_experts", 1);
    if (shared < 1)
      fail_usage("hf import: config.json n_shared_experts {} must be >= 1 (weft's MoE layers "
                 "without shared experts have no DeepSeek-V3 form)", shared);
    m.moe_shared_expert_intermediate_size = shared * m.moe_ffn_hidden_size;
    m.moe_router_score_function = "sigmoid";
    m.moe_router_dtype = "fp32";  // transformers' router GEMM is in float32
    m.moe_layer_pattern.clear();
    if (dense > 0)
      for (int l = 0; l < m.num_layers; ++l) m.moe_layer_pattern.push_back(l >= dense ? 1 : 0);
    const int groups = hf_get_or(j, "n_group", 8), topk_groups = hf_get_or(j, "topk_group", 4);
    if (groups < 1 || m.num_experts % groups != 0 || m.num_experts / groups < 2)
      fail_usage("hf import: config.json n_group {} must divide n_routed_experts {} into groups "
                 "of at least 2 (transformers scores a group by its top 2)", groups,
                 m.num_experts);
    if (topk_groups < 1 || topk_groups > groups)
      fail_usage("hf import: config.json topk_group {} must be in [1, n_group {}]", topk_groups,
                 groups);
    hf_read_deepseek_v3_router(j, groups, topk_groups, 2.5, &m);
  }
  try {
    check_model_config(m);
  } catch (const UsageError& e) {
    fail_usage("hf import: config.json describes a model weft rejects: {}", e.what());
  }
  return m;
}

}  // namespace weft
