// NemotronH <-> weft hybrid models (see hf_nemotron_h.h, docs/hf-interop.md). The key names and
// defaults are those of transformers' configuration_nemotron_h.py; the tensor names those of
// the checkpoints NVIDIA publishes (backbone.*, one tensor per expert).
#include "weft/checkpoint/hf_nemotron_h.h"

#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "weft/checkpoint/hf_deepseek_v3.h"
#include "weft/checkpoint/hf_json.h"
#include "weft/core/error.h"
#include "weft/model/hybrid.h"
#include "weft/model/transformer.h"

namespace weft {
namespace {

bool has(const ModelConfig& c, char symbol) {
  return c.layer_symbols.find(symbol) != std::string::npos;
}

// NemotronH's name of the weft tensor `suffix` of a layer under `q` ("backbone.layers.{L}.").
std::string hf_layer_name(const std::string& suffix, const std::string& q) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"input_layernorm.weight", "norm.weight"},
      {"pre_mlp_layernorm.weight", "norm.weight"},
      {"mixer.in_proj.layer_norm_weight", "norm.weight"},
      {"self_attention.linear_proj.weight", "mixer.o_proj.weight"},
      {"mlp.linear_fc1.weight", "mixer.up_proj.weight"},
      {"mlp.linear_fc2.weight", "mixer.down_proj.weight"},
      {"mlp.router.weight", "mixer.gate.weight"},
      {"mlp.router.expert_bias", "mixer.gate.e_score_correction_bias"},
      {"mlp.shared_experts.linear_fc1.weight", "mixer.shared_experts.up_proj.weight"},
      {"mlp.shared_experts.linear_fc2.weight", "mixer.shared_experts.down_proj.weight"},
  };
  for (const auto& [weft, hf] : kNames)
    if (suffix == weft) return q + hf;
  if (suffix.rfind("mixer.", 0) == 0) return q + suffix;  // the Mamba mixer's own names
  const std::string experts = "mlp.experts.";
  if (suffix.rfind(experts, 0) == 0) {  // mlp.experts.{X}.linear_fc1/2.weight
    const size_t dot = suffix.find('.', experts.size());
    const std::string x = suffix.substr(experts.size(), dot - experts.size());
    const std::string rest = suffix.substr(dot + 1);
    if (rest == "linear_fc1.weight") return q + "mixer.experts." + x + ".up_proj.weight";
    if (rest == "linear_fc2.weight") return q + "mixer.experts." + x + ".down_proj.weight";
  }
  fail("hf export: no NemotronH name for layer tensor '{}'", suffix);
}

char symbol_of_block_type(const std::string& t) {
  if (t == "mamba" || t == "linear_attention") return 'M';
  if (t == "attention" || t == "full_attention") return '*';
  if (t == "mlp") return '-';
  if (t == "moe") return 'E';
  fail_usage("hf import: config.json layers_block_type has '{}' (weft's hybrid layers are mamba, "
             "attention, mlp and moe)", t);
}

// The layer symbols: layers_block_type (or layer_types), else hybrid_override_pattern; both
// given must agree.
std::string hf_pattern(const nlohmann::json& j) {
  std::string from_types;
  bool types = false;
  for (const char* key : {"layers_block_type", "layer_types"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_array())
      fail_usage("hf import: config.json {} is not a list ({})", key, it->dump());
    std::string s;
    for (const auto& t : *it) {
      if (!t.is_string()) fail_usage("hf import: config.json {} holds {}", key, t.dump());
      s += symbol_of_block_type(t.get<std::string>());
    }
    if (types && s != from_types)
      fail_usage("hf import: config.json layers_block_type and layer_types disagree");
    from_types = s;
    types = true;
  }
  std::string pattern;
  const bool given = hf_get(j, "hybrid_override_pattern", &pattern, false);
  if (given)
    for (char ch : pattern)
      if (ch != 'M' && ch != '*' && ch != '-' && ch != 'E')
        fail_usage("hf import: config.json hybrid_override_pattern '{}' has '{}' (M, *, - and E "
                   "only)", pattern, ch);
  if (given && types && pattern != from_types)
    fail_usage("hf import: config.json hybrid_override_pattern '{}' and layers_block_type ('{}') "
               "disagree", pattern, from_types);
  if (!given && !types)
    fail_usage("hf import: config.json has neither hybrid_override_pattern nor layers_block_type");
  if ((types ? from_types : pattern).empty())
    fail_usage("hf import: config.json describes no layers (empty layers_block_type)");
  return types ? from_types : pattern;
}

}  // namespace

void hf_nemotron_h_check(const ModelConfig& c) {
  if (has(c, '*') && c.rotary())
    fail_usage("hf export: --position-embedding-type {}: NemotronH's attention layers have no "
               "positional encoding (give --position-embedding-type none)",
               c.position_embedding_type);
  if (has(c, '*') && c.qk_layernorm)
    fail_usage("hf export: --qk-layernorm: NemotronH's attention has no query/key norms");
  if (has(c, '*') && c.add_qkv_bias)
    fail_usage("hf export: --add-qkv-bias: NemotronH's attention has no biases");
  if ((has(c, '-') || has(c, 'E')) && !c.squared_relu)
    fail_usage("hf export: NemotronH's MLPs and experts are ungated squared ReLU; this model's "
               "are SwiGLU (train with --squared-relu)");
  if (has(c, 'M') && c.norm_epsilon != 1e-5)
    fail_usage("hf export: --norm-epsilon {}: NemotronH's Mamba gated norm takes "
               "layer_norm_epsilon too, and weft's (as Megatron's) is fixed at 1e-5",
               c.norm_epsilon);
  if (has(c, 'E') && c.moe_router_score_function != "sigmoid")
    fail_usage("hf export: --moe-router-score-function {}: NemotronH's router is a sigmoid",
               c.moe_router_score_function);
  if (has(c, 'E') && c.moe_shared_expert_intermediate_size <= 0)
    fail_usage("hf export: NemotronH's MoE layers always have a shared expert; "
               "--moe-shared-expert-intermediate-size is 0");
}

std::vector<HfTensorMap> hf_nemotron_h_tensor_maps(const ModelConfig& c) {
  hf_nemotron_h_check(c);
  const int64_t h = c.hidden_size, nh = c.num_attention_heads, ng = c.num_query_groups;
  const int64_t hd = c.head_dim();
  std::vector<HfTensorMap> out;
  auto one = [&](const ParamSpec& s, std::string hf) {
    out.push_back({s.name, s.shape, HfSplit::kNone, {std::move(hf)}, {s.shape}});
  };
  one(embedding_param_spec(c), "backbone.embeddings.weight");
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l), q = fmt::format("backbone.layers.{}.", l);
    std::vector<ParamSpec> specs = layer_param_specs(c, l);
    if (c.is_moe_layer(l)) {
      for (ParamSpec& s : expert_param_specs(c, p, 0, c.num_experts)) specs.push_back(s);
      // Always written (zeros without --moe-router-enable-expert-bias: hf_export): vLLM's
      // NemotronH requires the tensor; transformers keeps it in float32.
      out.push_back({router_bias_name(p), {c.num_experts}, HfSplit::kNone,
                     {q + "mixer.gate.e_score_correction_bias"}, {{c.num_experts}}});
      out.back().float32 = true;
    }
    for (const ParamSpec& s : specs) {
      const std::string suffix = s.name.substr(p.size());
      if (suffix == "self_attention.linear_qkv.weight") {
        out.push_back({s.name, s.shape, HfSplit::kQkv,
                       {q + "mixer.q_proj.weight", q + "mixer.k_proj.weight",
                        q + "mixer.v_proj.weight"},
                       {{nh * hd, h}, {ng * hd, h}, {ng * hd, h}}});
      } else {
        one(s, hf_layer_name(suffix, q));
      }
    }
  }
  one(final_norm_param_spec(c), "backbone.norm_f.weight");
  // A tied model's lm_head.weight is the embedding again (hf_export); import is always untied.
  if (!c.tied()) one(output_param_spec(c), "lm_head.weight");
  return out;
}

nlohmann::json hf_nemotron_h_config(const ModelConfig& c) {
  hf_nemotron_h_check(c);
  const int64_t di = static_cast<int64_t>(c.mamba_heads()) * c.mamba_head_dim;
  nlohmann::json j = {
      {"architectures", {"NemotronHForCausalLM"}},
      {"model_type", "nemotron_h"},
      // The pattern only: NVIDIA's remote code and vLLM make layers_block_type a read-only
      // property derived from it (and refuse the key); transformers derives it too.
      {"hybrid_override_pattern", c.layer_symbols},
      {"num_hidden_layers", c.num_layers},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.ffn_hidden_size},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_query_groups},
      {"head_dim", c.head_dim()},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"sliding_window", nullptr},
      {"mlp_hidden_act", "relu2"},
      {"mlp_bias", false},
      {"mamba_num_heads", c.mamba_heads()},
      {"mamba_head_dim", c.mamba_head_dim},
      {"ssm_state_size", c.mamba_state_dim},
      {"n_groups", c.mamba_num_groups},
      {"conv_kernel", 4},
      {"chunk_size", c.mamba_chunk_size},
      {"mamba_hidden_act", "silu"},
      {"use_conv_bias", true},
      {"use_bias", false},
      {"mamba_proj_bias", false},
      {"time_step_min", 0.001},
      {"time_step_max", 0.1},
      {"time_step_floor", 1e-4},
      {"layer_norm_epsilon", c.norm_epsilon},
      {"residual_in_fp32", false},
      {"rescale_prenorm_residual", true},
      {"hidden_dropout", 0.0},
      {"vocab_size", c.vocab_size},
      // transformers' NemotronH never ties (its lm_head is always its own weight): a tied weft
      // model writes lm_head.weight as a copy of the embedding, untied.
      {"tie_word_embeddings", false},
      {"max_position_embeddings", c.seq_length},
      {"initializer_range", c.init_method_std},
      {"num_nextn_predict_layers", 0},
      {"use_cache", true},
  };
  if (di % c.hidden_size == 0) j["expand"] = di / c.hidden_size;
  if (has(c, 'E')) {
    j["n_routed_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.moe_router_topk;
    j["moe_intermediate_size"] = c.expert_ffn();
    j["moe_shared_expert_intermediate_size"] = c.moe_shared_expert_intermediate_size;
    j["n_shared_experts"] = 1;
    // transformers' router (DeepSeek-V3's) scores a group by its top 2; weft's, as Megatron's, by
    // its top topk / group-topk: the same model exactly when that is 2.
    const bool grouped = c.moe_router_group_topk > 0 &&
                         c.moe_router_group_topk < c.moe_router_num_groups;
    if (grouped && c.moe_router_topk / c.moe_router_group_topk != 2)
      fail_usage("hf export: --moe-router-group-topk {} with --moe-router-topk {} scores a group "
                 "by its top {} experts; NemotronH's router scores it by its top 2",
                 c.moe_router_group_topk, c.moe_router_topk,
                 c.moe_router_topk / c.moe_router_group_topk);
    j["n_group"] = grouped ? c.moe_router_num_groups : 1;
    j["topk_group"] = grouped ? c.moe_router_group_topk : 1;
    j["norm_topk_prob"] = c.moe_router_topk > 1;  // weft normalises the top k iff k > 1
    j["routed_scaling_factor"] =
        c.moe_router_topk_scaling_factor > 0 ? c.moe_router_topk_scaling_factor : 1.0;
    j["moe_latent_size"] = nullptr;
  }
  return j;
}

ModelConfig hf_nemotron_h_model_config(const nlohmann::json& j) {
  ModelConfig m;
  apply_hybrid_layer_pattern(hf_pattern(j), &m);
  int layers = 0;
  if (hf_get(j, "num_hidden_layers", &layers, false) && layers != m.num_layers)
    std::fprintf(stderr, "weft: warning: hf import: config.json num_hidden_layers %d differs from "
                 "its %d layer types; the layer types define the model (as in transformers)\n",
                 layers, m.num_layers);
  hf_get(j, "hidden_size", &m.hidden_size, true);
  hf_get(j, "vocab_size", &m.vocab_size, true);
  // transformers' defaults where a key is absent (configuration_nemotron_h.py).
  m.num_attention_heads = hf_get_or(j, "num_attention_heads", 32);
  // transformers: an absent key is 8, None one per head.
  const bool kv_null = j.contains("num_key_value_heads") && j["num_key_value_heads"].is_null();
  m.num_query_groups = hf_get_or(j, "num_key_value_heads", kv_null ? m.num_attention_heads : 8);
  if (m.num_attention_heads < 1 || m.num_query_groups < 1 ||
      m.num_attention_heads % m.num_query_groups)
    fail_usage("hf import: config.json num_key_value_heads {} does not divide num_attention_heads "
               "{}", m.num_query_groups, m.num_attention_heads);
  int head_dim = 128, alias = 0;
  const bool given = hf_get(j, "head_dim", &head_dim, false);
  if (hf_get(j, "attention_head_dim", &alias, false)) {
    if (given && alias != head_dim)
      fail_usage("hf import: config.json head_dim {} and attention_head_dim {} disagree",
                 head_dim, alias);
    head_dim = alias;
  }
  if (head_dim < 2 || head_dim % 2)
    fail_usage("hf import: config.json head_dim {} must be a positive even number", head_dim);
  if (int64_t{head_dim} * m.num_attention_heads != m.hidden_size) m.kv_channels = head_dim;
  m.ffn_hidden_size = hf_get_or(j, "intermediate_size", 21504);
  m.position_embedding_type = "none";  // NemotronH's attention has no positional encoding
  m.squared_relu = true;
  const bool mlps = has(m, '-') || has(m, 'E');
  const std::string act = hf_get_or(j, "mlp_hidden_act", std::string("relu2"));
  if (mlps && act != "relu2")
    fail_usage("hf import: config.json mlp_hidden_act is '{}'; weft's ungated MLP is squared "
               "ReLU (relu2)", act);
  m.norm_epsilon = hf_get_or(j, "layer_norm_epsilon", 1e-5);
  if (has(m, 'M') && m.norm_epsilon != 1e-5)
    fail_usage("hf import: config.json layer_norm_epsilon is {}; NemotronH's Mamba gated norm "
               "takes it too, and weft's is fixed at 1e-5", m.norm_epsilon);
  for (const char* k : {"rms_norm_eps", "norm_eps"})
    hf_refuse_unless(j, k, m.norm_epsilon, "weft has one norm epsilon (layer_norm_epsilon)");
  // The Mamba mixer (n_groups' alias mamba_n_groups wins, as in transformers).
  m.mamba_num_heads = hf_get_or(j, "mamba_num_heads", 128);
  m.mamba_head_dim = hf_get_or(j, "mamba_head_dim", 64);
  m.mamba_state_dim = hf_get_or(j, "ssm_state_size", 128);
  m.mamba_num_groups = hf_get_or(j, "mamba_n_groups", hf_get_or(j, "n_groups", 8));
  const std::string mact = hf_get_or(j, "mamba_hidden_act", std::string("silu"));
  if (mact != "silu")
    fail_usage("hf import: config.json mamba_hidden_act is '{}'; weft's Mamba conv is followed "
               "by SiLU", mact);
  for (const char* k : {"conv_kernel", "mamba_d_conv"})
    hf_refuse_unless(j, k, 4, "weft's Mamba conv has 4 taps");
  for (const char* k : {"use_conv_bias", "mamba_conv_bias"})
    hf_refuse_unless(j, k, true, "weft's Mamba conv has a bias");
  for (const char* k : {"use_bias", "mlp_bias", "attention_bias", "mamba_proj_bias"})
    hf_refuse_unless(j, k, false, "weft's linear layers have no biases");
  // dt's clamp: (0, inf) is none. transformers 4 writes [0.0, Infinity] (read as 1e308, see
  // hf_import.cpp), transformers 5 [0.0, {"__float__": "Infinity"}], converters 1e20 or more.
  for (const char* k : {"time_step_limit", "mamba_dt_limit"}) {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) continue;
    auto upper_none = [](const nlohmann::json& v) {
      if (v.is_number()) return v.get<double>() >= 1e20;
      if (v.is_object() && v.contains("__float__")) return v["__float__"] == "Infinity";
      return v.is_string() && (v == "Infinity" || v == "inf");
    };
    const bool unclamped = it->is_array() && it->size() == 2 && (*it)[0].is_number() &&
                           (*it)[0].get<double>() <= 0 && upper_none((*it)[1]);
    if (!unclamped)
      fail_usage("hf import: config.json {} is {}; weft's Mamba dt is unclamped (0, inf), as "
                 "Megatron's", k, it->dump());
  }
  hf_refuse_unless(j, "attention_dropout", 0.0, "weft has no attention dropout");
  hf_refuse_unless(j, "sliding_window", nullptr, "weft's attention is full causal");
  hf_refuse_unless(j, "quantization_config", nullptr, "weft imports unquantised weights only");
  // transformers' NemotronH never ties, whatever tie_word_embeddings says: lm_head.weight is
  // always a weight of its own.
  m.untie_embeddings_and_output_weights = true;
  m.seq_length = hf_get_or(j, "max_position_embeddings", 4096);
  hf_get(j, "initializer_range", &m.init_method_std, false);
  if (has(m, 'E')) {
    m.num_experts = hf_get_or(j, "num_local_experts", hf_get_or(j, "n_routed_experts", 8));
    m.moe_router_topk = hf_get_or(j, "num_experts_per_tok", 2);
    m.moe_ffn_hidden_size = hf_get_or(j, "moe_intermediate_size", 7688);
    m.moe_shared_expert_intermediate_size =
        hf_get_or(j, "moe_shared_expert_intermediate_size", 7688);
    m.moe_router_score_function = "sigmoid";
    if (m.moe_shared_expert_intermediate_size < 1)
      fail_usage("hf import: config.json moe_shared_expert_intermediate_size is {}; NemotronH's "
                 "MoE layers have a shared expert", m.moe_shared_expert_intermediate_size);
    m.moe_router_dtype = "fp32";  // transformers' and vLLM's router GEMM is in float32
    hf_refuse_unless(j, "moe_latent_size", nullptr, "weft's experts have no latent projection");
    hf_read_deepseek_v3_router(j, hf_get_or(j, "n_group", 1), hf_get_or(j, "topk_group", 1), 1.0,
                               &m);
  }
  try {
    check_model_config(m);
  } catch (const UsageError& e) {
    fail_usage("hf import: config.json describes a model weft rejects: {}", e.what());
  }
  return m;
}

}  // namespace weft
