// weft <-> Hugging Face names, shapes and config.json (see hf_config.h, docs/hf-interop.md).
//
// The tensor table is built from the model's shape alone (hf_tensor_maps), in the order
// Hugging Face checkpoints list tensors; export and import both walk it, so a name that one
// direction produces the other accepts. The QKV split views the fused weight as
// [groups, heads/groups + 2, head_dim, hidden] (the interleave attention_qkv reads) and selects
// along dim 1; the merge concatenates the same pieces back, so both are exact.
#include "weft/checkpoint/hf_config.h"

#include <ATen/Functions.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "weft/checkpoint/format.h"
#include "weft/checkpoint/hf_deepseek_v3.h"
#include "weft/checkpoint/hf_json.h"
#include "weft/checkpoint/hf_nemotron_h.h"
#include "weft/checkpoint/hf_qwen3_moe.h"
#include "weft/core/error.h"
#include "weft/model/transformer.h"

namespace weft {
namespace fs = std::filesystem;

std::string hf_model_type(const ModelConfig& c) {
  if (c.moe() && c.moe_apply_probs_on_input)
    fail_usage("hf export: --moe-apply-probs-on-input has no Hugging Face equivalent here "
               "(Mixtral, Qwen3-MoE, DeepSeek-V3 and NemotronH weigh each expert's output, not "
               "its input)");
  if (c.mla()) {  // DeepSeek-V3, where the model is one (hf_deepseek_v3.h)
    hf_deepseek_v3_check(c);
    return "deepseek_v3";
  }
  if (c.hybrid()) {  // NemotronH, where the model is one (hf_nemotron_h.h)
    hf_nemotron_h_check(c);
    return "nemotron_h";
  }
  if (!c.rotary())
    fail_usage("hf export: --position-embedding-type {}: Llama, Qwen3 and Mixtral rotate q and k",
               c.position_embedding_type);
  if (c.squared_relu)
    fail_usage("hf export: --squared-relu: the MLPs of Llama, Qwen3 and Mixtral are SwiGLU");
  if (c.rotary_seq_len_interpolation_factor > 0 && c.use_rope_scaling)
    fail_usage("hf export: --rotary-seq-len-interpolation-factor {} with --use-rope-scaling: a "
               "Hugging Face config has one rope_type (linear or llama3), not both",
               c.rotary_seq_len_interpolation_factor);
  if (c.rotary_percent != 1.0)
    fail_usage("hf export: --rotary-percent {}: Llama, Qwen3 and Mixtral rotate every channel of "
               "the head", c.rotary_percent);
  if (c.add_qkv_bias && c.qk_layernorm)
    fail_usage("hf export: --add-qkv-bias with --qk-layernorm has no Hugging Face equivalent "
               "(Qwen2 has the q/k/v biases without the norms, Qwen3 the norms without biases)");
  if (c.add_qkv_bias && c.moe())
    fail_usage("hf export: --add-qkv-bias in an MoE model has no Mixtral equivalent (Mixtral's "
               "attention has no biases)");
  if (c.add_qkv_bias) return "qwen2";  // Qwen2: Llama with biases on q_proj, k_proj, v_proj
  if (!c.moe()) return c.qk_layernorm ? "qwen3" : "llama";  // Qwen3: Llama with q/k norms
  if (c.qk_layernorm) {  // Qwen3's attention with experts: Qwen3-MoE (hf_qwen3_moe.h)
    hf_qwen3_moe_check(c);
    return "qwen3_moe";
  }
  if (c.moe_shared_expert_intermediate_size > 0)
    fail_usage("hf export: --moe-shared-expert-intermediate-size {} has no Mixtral equivalent "
               "(Mixtral has no shared expert)", c.moe_shared_expert_intermediate_size);
  if (c.moe_router_enable_expert_bias)
    fail_usage("hf export: --moe-router-enable-expert-bias has no Mixtral equivalent (Mixtral "
               "routes by its scores alone)");
  if (c.moe_router_score_function != "softmax")
    fail_usage("hf export: --moe-router-score-function {} has no Mixtral equivalent (Mixtral's "
               "router is a softmax)", c.moe_router_score_function);
  if (c.moe_router_pre_softmax)
    fail_usage("hf export: --moe-router-pre-softmax has no Mixtral equivalent (Mixtral "
               "renormalises the top-k probabilities)");
  if (c.moe_router_topk_scaling_factor > 0)
    fail_usage("hf export: --moe-router-topk-scaling-factor {} has no Mixtral equivalent",
               c.moe_router_topk_scaling_factor);
  if (c.moe_router_group_topk > 0)
    fail_usage("hf export: --moe-router-group-topk {} has no Mixtral equivalent (Mixtral routes "
               "over all experts)", c.moe_router_group_topk);
  for (int l = 0; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l))
      fail_usage("hf export: --moe-layer-freq makes layer {} dense; Mixtral has experts in every "
                 "layer", l);
  return "mixtral";
}

std::vector<HfTensorMap> hf_tensor_maps(const ModelConfig& c) {
  const std::string type = hf_model_type(c);
  if (type == "nemotron_h") return hf_nemotron_h_tensor_maps(c);
  if (type == "deepseek_v3") return hf_deepseek_v3_tensor_maps(c);
  const int64_t h = c.hidden_size, nh = c.num_attention_heads, ng = c.num_query_groups;
  const int64_t hd = c.head_dim(), f = c.ffn_hidden_size, fe = c.expert_ffn(), V = c.vocab_size;
  std::vector<HfTensorMap> out;
  auto one = [&](std::string weft, std::vector<int64_t> shape, std::string hf) {
    out.push_back({std::move(weft), shape, HfSplit::kNone, {std::move(hf)}, {shape}});
  };
  one("embedding.word_embeddings.weight", {V, h}, "model.embed_tokens.weight");
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("decoder.layers.{}.", l);
    const std::string q = fmt::format("model.layers.{}.", l);
    one(p + "input_layernorm.weight", {h}, q + "input_layernorm.weight");
    out.push_back({p + "self_attention.linear_qkv.weight",
                   {(nh + 2 * ng) * hd, h},
                   HfSplit::kQkv,
                   {q + "self_attn.q_proj.weight", q + "self_attn.k_proj.weight",
                    q + "self_attn.v_proj.weight"},
                   {{nh * hd, h}, {ng * hd, h}, {ng * hd, h}}});
    if (c.add_qkv_bias)  // Qwen2's q/k/v biases, in the weight's row order
      out.push_back({p + "self_attention.linear_qkv.bias",
                     {(nh + 2 * ng) * hd},
                     HfSplit::kQkv,
                     {q + "self_attn.q_proj.bias", q + "self_attn.k_proj.bias",
                      q + "self_attn.v_proj.bias"},
                     {{nh * hd}, {ng * hd}, {ng * hd}}});
    if (c.qk_layernorm) {
      one(p + "self_attention.q_layernorm.weight", {hd}, q + "self_attn.q_norm.weight");
      one(p + "self_attention.k_layernorm.weight", {hd}, q + "self_attn.k_norm.weight");
    }
    one(p + "self_attention.linear_proj.weight", {h, nh * hd}, q + "self_attn.o_proj.weight");
    one(p + "pre_mlp_layernorm.weight", {h}, q + "post_attention_layernorm.weight");
    // An MoE layer: the router, then each expert's gate/up (split) and down projections, under
    // the model's names: `block` holds the router `gate` and the `experts.{e}.` of each.
    auto moe = [&](const std::string& block, const char* gate, const char* up, const char* down) {
      one(p + "mlp.router.weight", {c.num_experts, h}, block + "gate.weight");
      for (int e = 0; e < c.num_experts; ++e) {
        const std::string x = fmt::format("{}mlp.experts.{}.", p, e);
        const std::string y = fmt::format("{}experts.{}.", block, e);
        out.push_back({x + "linear_fc1.weight", {2 * fe, h}, HfSplit::kGateUp,
                       {y + gate + ".weight", y + up + ".weight"}, {{fe, h}, {fe, h}}});
        one(x + "linear_fc2.weight", {h, fe}, y + down + ".weight");
      }
    };
    if (type == "mixtral") {
      moe(q + "block_sparse_moe.", "w1", "w3", "w2");
    } else if (type == "qwen3_moe" && c.is_moe_layer(l)) {
      moe(q + "mlp.", "gate_proj", "up_proj", "down_proj");
    } else {  // a dense MLP (Llama, Qwen, Qwen3-MoE's dense layers)
      out.push_back({p + "mlp.linear_fc1.weight", {2 * f, h}, HfSplit::kGateUp,
                     {q + "mlp.gate_proj.weight", q + "mlp.up_proj.weight"}, {{f, h}, {f, h}}});
      one(p + "mlp.linear_fc2.weight", {h, f}, q + "mlp.down_proj.weight");
    }
  }
  one("decoder.final_layernorm.weight", {h}, "model.norm.weight");
  if (!c.tied()) one("output_layer.weight", {V, h}, "lm_head.weight");
  return out;
}

std::vector<at::Tensor> hf_split(const HfTensorMap& m, const at::Tensor& w, const ModelConfig& c) {
  WEFT_CHECK(w.sizes().vec() == m.shape, "hf_split: {} has shape {}, expected {}", m.weft,
             fmt::join(w.sizes(), ","), fmt::join(m.shape, ","));
  switch (m.split) {
    case HfSplit::kNone:
      return {w.contiguous()};
    case HfSplit::kGateUp: {
      const int64_t f = m.shape[0] / 2;
      return {w.narrow(0, 0, f).contiguous(), w.narrow(0, f, f).contiguous()};
    }
    case HfSplit::kQkv: {  // the weight [rows, h] or the bias [rows] (h = 1)
      const int64_t ng = c.num_query_groups, r = c.num_attention_heads / ng, hd = c.head_dim();
      const int64_t h = m.shape.size() > 1 ? m.shape[1] : 1;
      const at::Tensor g = w.view({ng, r + 2, hd, h});
      return {g.narrow(1, 0, r).reshape(m.hf_shapes[0]).contiguous(),
              g.select(1, r).reshape(m.hf_shapes[1]).contiguous(),
              g.select(1, r + 1).reshape(m.hf_shapes[2]).contiguous()};
    }
  }
  fail("hf_split: unknown split");
}

at::Tensor hf_merge(const HfTensorMap& m, const std::vector<at::Tensor>& parts,
                    const ModelConfig& c) {
  WEFT_CHECK(parts.size() == m.hf.size(), "hf_merge: {} parts for {}", parts.size(), m.weft);
  switch (m.split) {
    case HfSplit::kNone:
      return parts[0].contiguous();
    case HfSplit::kGateUp:
      return at::cat({parts[0], parts[1]}, 0);
    case HfSplit::kQkv: {  // the weight [rows, h] or the bias [rows] (h = 1)
      const int64_t ng = c.num_query_groups, r = c.num_attention_heads / ng, hd = c.head_dim();
      const int64_t h = m.shape.size() > 1 ? m.shape[1] : 1;
      return at::cat({parts[0].reshape({ng, r, hd, h}), parts[1].reshape({ng, 1, hd, h}),
                      parts[2].reshape({ng, 1, hd, h})},
                     1)
          .reshape(m.shape);
    }
  }
  fail("hf_merge: unknown split");
}

nlohmann::json hf_config_from_model(const ModelConfig& c, const std::string& torch_dtype,
                                    const nlohmann::json& special_ids) {
  const std::string type = hf_model_type(c);
  if (type == "nemotron_h" || type == "deepseek_v3") {
    nlohmann::json j = type == "nemotron_h" ? hf_nemotron_h_config(c) : hf_deepseek_v3_config(c);
    j["torch_dtype"] = torch_dtype;
    j["dtype"] = torch_dtype;
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (special_ids.contains(k) && !special_ids[k].is_null()) j[k] = special_ids[k];
    return j;
  }
  nlohmann::json j = {
      {"architectures", {type == "llama"   ? "LlamaForCausalLM"
                         : type == "qwen2" ? "Qwen2ForCausalLM"
                         : type == "qwen3" ? "Qwen3ForCausalLM"
                         : type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                                               : "MixtralForCausalLM"}},
      {"model_type", type},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", type != "mixtral" ? c.ffn_hidden_size : c.expert_ffn()},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_query_groups},
      {"head_dim", c.head_dim()},
      {"rms_norm_eps", c.norm_epsilon},
      {"rope_theta", c.rotary_base},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rotary_base}}},
      {"rope_scaling", nullptr},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.seq_length},
      {"tie_word_embeddings", c.tied()},
      {"torch_dtype", torch_dtype},
      {"dtype", torch_dtype},
      {"hidden_act", "silu"},
      {"initializer_range", c.init_method_std},
      {"attention_dropout", 0.0},
      {"use_cache", true},
  };
  if (c.use_rope_scaling) {  // transformers 4 reads rope_scaling, 5 rope_parameters
    const nlohmann::json scaling = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling_factor},
        {"low_freq_factor", ModelConfig::kRopeLowFreqFactor},
        {"high_freq_factor", ModelConfig::kRopeHighFreqFactor},
        {"original_max_position_embeddings",  // an integer (transformers checks)
         static_cast<int64_t>(ModelConfig::kRopeOriginalContext)}};
    j["rope_scaling"] = scaling;
    j["rope_parameters"] = scaling;
    j["rope_parameters"]["rope_theta"] = c.rotary_base;
  } else if (c.rotary_seq_len_interpolation_factor > 0) {
    // Linear position interpolation: transformers' rope_type linear divides the inverse
    // frequencies by the factor, i.e. the positions, as --rotary-seq-len-interpolation-factor.
    const nlohmann::json scaling = {
        {"rope_type", "linear"},
        {"factor", static_cast<double>(c.rotary_seq_len_interpolation_factor)}};
    j["rope_scaling"] = scaling;
    j["rope_parameters"] = scaling;
    j["rope_parameters"]["rope_theta"] = c.rotary_base;
  }
  if (type == "llama") {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else if (type == "qwen2" || type == "qwen3") {
    // Qwen2's config has no attention_bias (its q/k/v biases come with the type); its head_dim
    // is read as Llama's attention reads it (getattr).
    if (type == "qwen3") j["attention_bias"] = false;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  } else if (type == "qwen3_moe") {
    hf_qwen3_moe_config(c, &j);
  } else {
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.moe_router_topk;
    j["router_aux_loss_coef"] = c.moe_aux_loss_coeff;
    j["output_router_logits"] = false;
    j["router_jitter_noise"] = 0.0;
    j["sliding_window"] = nullptr;
  }
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (special_ids.contains(k) && !special_ids[k].is_null()) j[k] = special_ids[k];
  return j;
}

namespace {

// One of config.json's RoPE descriptions: rope_scaling (transformers 4; null: none) or
// rope_parameters (transformers 5, with rope_theta inside). weft has the default RoPE, Llama 3's
// scaling with its fixed low/high-frequency factors and original context, and linear position
// interpolation by a whole factor (--rotary-seq-len-interpolation-factor, an integer as
// Megatron's); anything else is refused naming the key.
struct HfRope {
  bool given = false;
  bool llama3 = false;
  bool linear = false;
  double factor = 1.0;
  std::optional<double> theta;
  bool same_scaling(const HfRope& o) const {
    return llama3 == o.llama3 && linear == o.linear && factor == o.factor;
  }
};

HfRope hf_rope(const nlohmann::json& j, const char* key) {
  HfRope r;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return r;
  if (!it->is_object())
    fail_usage("hf import: config.json {} is not an object ({})", key, it->dump());
  r.given = true;
  auto number = [&](const char* k) -> std::optional<double> {
    auto v = it->find(k);
    if (v == it->end() || v->is_null()) return std::nullopt;
    if (!v->is_number())
      fail_usage("hf import: config.json {}.{} has the wrong type ({})", key, k, v->dump());
    return v->get<double>();
  };
  std::string type;
  for (const char* k : {"type", "rope_type"})  // "type" is the older spelling
    if (auto v = it->find(k); v != it->end() && !v->is_null()) {
      if (!v->is_string())
        fail_usage("hf import: config.json {}.{} has the wrong type ({})", key, k, v->dump());
      if (!type.empty() && type != v->get<std::string>())
        fail_usage("hf import: config.json {}.type '{}' and {}.rope_type '{}' disagree", key,
                   type, key, v->get<std::string>());
      type = v->get<std::string>();
    }
  if (type.empty()) type = "default";
  if (type != "default" && type != "llama3" && type != "linear")
    fail_usage("hf import: config.json {} has rope_type '{}'; weft has the default RoPE, Llama "
               "3's scaling (llama3) and linear position interpolation (linear)", key, type);
  r.llama3 = type == "llama3";
  r.linear = type == "linear";
  r.theta = number("rope_theta");
  const std::vector<std::string> allowed =
      r.llama3   ? std::vector<std::string>{"type", "rope_type", "rope_theta", "factor",
                                            "low_freq_factor", "high_freq_factor",
                                            "original_max_position_embeddings"}
      : r.linear ? std::vector<std::string>{"type", "rope_type", "rope_theta", "factor"}
                 : std::vector<std::string>{"type", "rope_type", "rope_theta"};
  for (const auto& [k, v] : it->items())
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end() && !v.is_null())
      fail_usage("hf import: config.json {}.{} is {}; weft's {} RoPE has no such setting", key, k,
                 v.dump(), type);
  if (r.linear) {
    const std::optional<double> factor = number("factor");
    if (!factor) fail_usage("hf import: config.json {}.factor is missing (rope_type linear)", key);
    if (!(*factor >= 1 && *factor <= (1 << 30) && *factor == std::floor(*factor)))
      fail_usage("hf import: config.json {}.factor is {}; weft's linear position interpolation "
                 "(--rotary-seq-len-interpolation-factor, an integer as Megatron's) needs a whole "
                 "factor >= 1", key, (*it)["factor"].dump());
    r.factor = *factor;
    r.linear = r.factor > 1;  // factor 1 is no interpolation: the default RoPE
    return r;
  }
  if (!r.llama3) return r;
  const std::optional<double> factor = number("factor");
  if (!factor) fail_usage("hf import: config.json {}.factor is missing (rope_type llama3)", key);
  if (!(*factor >= 1 && std::isfinite(*factor)))
    fail_usage("hf import: config.json {}.factor is {}; Llama 3's scaling needs a finite factor "
               ">= 1", key, (*it)["factor"].dump());
  r.factor = *factor;
  const std::pair<const char*, double> fixed[] = {
      {"low_freq_factor", ModelConfig::kRopeLowFreqFactor},
      {"high_freq_factor", ModelConfig::kRopeHighFreqFactor},
      {"original_max_position_embeddings", ModelConfig::kRopeOriginalContext}};
  for (const auto& [k, want] : fixed) {
    const std::optional<double> v = number(k);
    if (!v) fail_usage("hf import: config.json {}.{} is missing (rope_type llama3)", key, k);
    if (*v != want)
      fail_usage("hf import: config.json {}.{} is {}; weft's Llama 3 RoPE scaling (Megatron's "
                 "--use-rope-scaling) fixes it to {}", key, k, (*it)[k].dump(), want);
  }
  return r;
}

}  // namespace

int64_t hf_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

ModelConfig hf_model_config_from_json(const nlohmann::json& j) {
  if (!j.is_object()) fail_usage("hf import: config.json is not a JSON object");
  std::string type;
  hf_get(j, "model_type", &type, true);
  if (type == "nemotron_h") return hf_nemotron_h_model_config(j);
  if (type == "deepseek_v3") return hf_deepseek_v3_model_config(j);
  // Mistral (with no sliding window, refused below otherwise) is Llama's architecture under
  // Llama's tensor names; it imports as a dense model and exports as LlamaForCausalLM. Qwen2
  // is Llama with biases on q_proj, k_proj and v_proj (--add-qkv-bias); Qwen3 is Llama with an
  // RMSNorm of each query and key head (q_norm, k_norm: --qk-layernorm).
  if (type != "llama" && type != "mistral" && type != "qwen2" && type != "qwen3" &&
      type != "qwen3_moe" && type != "mixtral")
    fail_usage("hf import: config.json model_type '{}' is not supported (llama, mistral, qwen2, "
               "qwen3, qwen3_moe, mixtral, deepseek_v3 or nemotron_h)", type);
  const bool qwen = type == "qwen2" || type == "qwen3" || type == "qwen3_moe";
  ModelConfig m;
  m.qk_layernorm = type == "qwen3" || type == "qwen3_moe";
  m.add_qkv_bias = type == "qwen2";
  hf_get(j, "hidden_size", &m.hidden_size, true);
  int inter = 0;
  hf_get(j, "intermediate_size", &inter, true);
  hf_get(j, "num_hidden_layers", &m.num_layers, true);
  hf_get(j, "num_attention_heads", &m.num_attention_heads, true);
  hf_get(j, "vocab_size", &m.vocab_size, true);
  hf_get(j, "rms_norm_eps", &m.norm_epsilon, true);
  if (m.hidden_size < 1 || m.num_attention_heads < 1)
    fail_usage("hf import: config.json hidden_size {} and num_attention_heads {} must be "
               "positive", m.hidden_size, m.num_attention_heads);
  m.num_query_groups = m.num_attention_heads;
  // Qwen's defaults (Qwen3's head_dim 128, their own key/value heads) are not Llama's: required
  // there, unless null, which Qwen2's and Qwen3's configs read as one per head (Qwen3-MoE's does
  // not).
  const bool kv_null = j.contains("num_key_value_heads") && j["num_key_value_heads"].is_null() &&
                       (type == "qwen2" || type == "qwen3");
  hf_get(j, "num_key_value_heads", &m.num_query_groups, qwen && !kv_null);
  if (m.num_query_groups < 1 || m.num_attention_heads % m.num_query_groups)
    fail_usage("hf import: config.json num_key_value_heads {} does not divide num_attention_heads "
               "{}", m.num_query_groups, m.num_attention_heads);
  // head_dim (--kv-channels): default hidden_size / num_attention_heads, which must then divide.
  int head_dim = 0;
  if (hf_get(j, "head_dim", &head_dim, type == "qwen3")) {
    if (head_dim < 1) fail_usage("hf import: config.json head_dim {} must be positive", head_dim);
    if (int64_t{head_dim} * m.num_attention_heads != m.hidden_size) m.kv_channels = head_dim;
  } else if (m.hidden_size % m.num_attention_heads) {
    fail_usage("hf import: config.json hidden_size {} is not a multiple of num_attention_heads "
               "{} and there is no head_dim", m.hidden_size, m.num_attention_heads);
  }
  // RoPE: transformers 5 writes rope_parameters, earlier versions rope_theta + rope_scaling.
  m.rotary_base = type == "mixtral" ? 1e6 : 10000.0;
  hf_get(j, "rope_theta", &m.rotary_base, false);
  // Scaling: the default RoPE, Llama 3's (rope_type llama3) or linear interpolation (linear),
  // from either key; where both are given they must describe the same scaling.
  const HfRope from_scaling = hf_rope(j, "rope_scaling");
  const HfRope from_params = hf_rope(j, "rope_parameters");
  if (from_scaling.given && from_params.given && !from_scaling.same_scaling(from_params))
    fail_usage("hf import: config.json rope_scaling ({}) and rope_parameters ({}) describe "
               "different RoPE scalings", j["rope_scaling"].dump(), j["rope_parameters"].dump());
  const HfRope& rope = from_params.given ? from_params : from_scaling;
  m.use_rope_scaling = rope.llama3;
  if (rope.llama3) m.rope_scaling_factor = rope.factor;
  if (rope.linear) m.rotary_seq_len_interpolation_factor = static_cast<int>(rope.factor);
  if (from_params.theta) m.rotary_base = *from_params.theta;
  std::string act = "silu";
  hf_get(j, "hidden_act", &act, false);
  if (act != "silu")
    fail_usage("hf import: config.json hidden_act is '{}'; weft's MLP is SwiGLU (silu)", act);
  // Qwen2's q/k/v biases are fixed by its model_type (its config has no attention_bias);
  // Llama's and Qwen3's attention_bias would put a bias on o_proj too, which weft lacks.
  hf_refuse_unless(j, "attention_bias", false,
                   type == "qwen2" ? "Qwen2's biases are those of q/k/v (no such key)"
                                   : "weft's attention has biases on q/k/v only (Qwen2's)");
  hf_refuse_unless(j, "partial_rotary_factor", 1.0, "Llama, Qwen3 and Mixtral rotate every channel");
  hf_refuse_unless(j, "mlp_bias", false, "weft's MLP has no biases");
  hf_refuse_unless(j, "attention_dropout", 0.0, "weft has no attention dropout");
  if (qwen) {  // their sliding_window applies only with use_sliding_window
    hf_refuse_unless(j, "use_sliding_window", false, "weft's attention is full causal");
    if (auto lt = j.find("layer_types"); lt != j.end() && !lt->is_null()) {
      if (!lt->is_array())
        fail_usage("hf import: config.json layer_types is not a list ({})", lt->dump());
      for (const auto& t : *lt)
        if (t != "full_attention")
          fail_usage("hf import: config.json layer_types holds {}; weft's attention is full "
                     "causal (full_attention)", t.dump());
    }
  } else {
    hf_refuse_unless(j, "sliding_window", nullptr, "weft's attention is full causal");
  }
  if (type == "mistral" && !j.contains("sliding_window"))  // transformers' default is 4096
    fail_usage("hf import: config.json has no sliding_window; transformers' Mistral then uses a "
               "window of 4096, and weft's attention is full causal (set it to null if the "
               "model has none)");
  hf_refuse_unless(j, "quantization_config", nullptr, "weft imports unquantised weights only");
  hf_refuse_unless(j, "router_jitter_noise", 0.0, "weft's router has no jitter");
  bool tie = false;
  hf_get(j, "tie_word_embeddings", &tie, false);
  m.untie_embeddings_and_output_weights = !tie;
  m.seq_length = 2048;
  hf_get(j, "max_position_embeddings", &m.seq_length, false);
  hf_get(j, "initializer_range", &m.init_method_std, false);
  m.ffn_hidden_size = inter;
  if (type == "qwen3_moe") hf_qwen3_moe_model_config(j, &m);
  if (type == "mixtral") {
    hf_get(j, "num_local_experts", &m.num_experts, true);
    hf_get(j, "num_experts_per_tok", &m.moe_router_topk, true);
    m.moe_aux_loss_coeff = 0.001;
    hf_get(j, "router_aux_loss_coef", &m.moe_aux_loss_coeff, false);
    m.moe_ffn_hidden_size = inter;
    if (m.num_experts < 1)
      fail_usage("hf import: config.json num_local_experts {} must be >= 1", m.num_experts);
  }
  if (m.head_dim() % 2)
    fail_usage("hf import: config.json head size (head_dim, or hidden_size / "
               "num_attention_heads) {} is odd; RoPE needs it even", m.head_dim());
  try {
    check_model_config(m);
  } catch (const UsageError& e) {
    fail_usage("hf import: config.json describes a model weft rejects: {}", e.what());
  }
  return m;
}

nlohmann::json hf_special_ids(const nlohmann::json& j) {
  nlohmann::json ids = nlohmann::json::object();
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (j.contains(k) && !j[k].is_null()) ids[k] = j[k];
  return ids;
}

std::string hf_out_begin(const std::string& out) {
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec) || !fs::is_empty(out, ec))
      fail_usage("{} already exists and is not an empty directory; choose a new OUT", out);
  }
  fs::path parent = fs::path(out).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  std::string tmpl = out;
  while (tmpl.size() > 1 && tmpl.back() == '/') tmpl.pop_back();
  tmpl += ".tmp-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) fail_usage("{}: cannot create a temporary directory beside it", out);
  return buf.data();
}

void hf_out_commit(const std::string& tmp, const std::string& out) {
  if (Status s = ckpt_fsync_dir(tmp); !s) fail("{}", s.message());
  std::error_code ec;
  fs::rename(tmp, out, ec);
  if (ec) fail("{}: rename to {} failed: {}", tmp, out, ec.message());
  fs::path parent = fs::absolute(out).parent_path();
  if (Status s = ckpt_fsync_dir(parent.string()); !s) fail("{}", s.message());
}

void hf_write_text_file(const std::string& path, const std::string& text) {
  {
    std::ofstream f(path, std::ios::trunc);
    f << text;
    f.flush();
    if (!f) fail("{}: write failed", path);
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    fail("{}: fsync failed", path);
  }
  ::close(fd);
}

}  // namespace weft
