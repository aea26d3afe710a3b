// Qwen3-MoE config.json <-> weft's MoE settings (hf_qwen3_moe.h).
#include "weft/checkpoint/hf_qwen3_moe.h"

#include <fmt/format.h>

#include <cstdint>
#include <set>
#include <vector>

#include "weft/checkpoint/hf_json.h"
#include "weft/core/error.h"

namespace weft {

void hf_qwen3_moe_check(const ModelConfig& c) {
  auto refuse = [](const std::string& what, const char* why) {
    fail_usage("hf export: {} has no Qwen3-MoE equivalent ({})", what, why);
  };
  if (c.moe_shared_expert_intermediate_size > 0)
    refuse(fmt::format("--moe-shared-expert-intermediate-size {}",
                       c.moe_shared_expert_intermediate_size),
           "Qwen3-MoE has no shared expert");
  if (c.moe_router_score_function != "softmax")
    refuse("--moe-router-score-function " + c.moe_router_score_function,
           "Qwen3-MoE's router is a softmax");
  if (c.moe_router_enable_expert_bias)
    refuse("--moe-router-enable-expert-bias", "Qwen3-MoE routes by its scores alone");
  if (c.moe_router_topk_scaling_factor > 0)
    refuse(fmt::format("--moe-router-topk-scaling-factor {}", c.moe_router_topk_scaling_factor),
           "Qwen3-MoE does not scale the expert weights");
  if (c.moe_router_group_topk > 0)
    refuse(fmt::format("--moe-router-group-topk {}", c.moe_router_group_topk),
           "Qwen3-MoE routes over all experts");
}

void hf_qwen3_moe_config(const ModelConfig& c, nlohmann::json* j) {
  std::vector<int> dense;
  for (int l = 0; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l)) dense.push_back(l);
  nlohmann::json& o = *j;
  o["num_experts"] = c.num_experts;
  o["num_experts_per_tok"] = c.moe_router_topk;
  o["moe_intermediate_size"] = c.expert_ffn();
  o["intermediate_size"] = c.ffn_hidden_size;  // the dense layers' MLP
  o["norm_topk_prob"] = !c.moe_router_pre_softmax;
  o["decoder_sparse_step"] = 1;
  o["mlp_only_layers"] = dense;
  o["router_aux_loss_coef"] = c.moe_aux_loss_coeff;
  o["output_router_logits"] = false;
  o["attention_bias"] = false;
  o["use_sliding_window"] = false;
  o["sliding_window"] = nullptr;
}

void hf_qwen3_moe_model_config(const nlohmann::json& j, ModelConfig* m) {
  // transformers maps num_experts onto num_local_experts; the hub's files say num_experts.
  if (!hf_get(j, "num_experts", &m->num_experts, false))
    hf_get(j, "num_local_experts", &m->num_experts, true);
  if (m->num_experts < 1)
    fail_usage("hf import: config.json num_experts {} must be >= 1", m->num_experts);
  hf_get(j, "num_experts_per_tok", &m->moe_router_topk, true);
  hf_get(j, "moe_intermediate_size", &m->moe_ffn_hidden_size, true);
  // Qwen3MoeConfig's default is false: the top k keep their softmax over all experts.
  bool norm_topk = false;
  hf_get(j, "norm_topk_prob", &norm_topk, false);
  m->moe_router_pre_softmax = !norm_topk;
  if (norm_topk && m->moe_router_topk == 1)
    fail_usage("hf import: config.json num_experts_per_tok 1 with norm_topk_prob true weighs the "
               "one expert by 1 (the router gets no gradient); weft's softmax router, as "
               "Megatron's, takes top 1 only with --moe-router-pre-softmax (norm_topk_prob false)");
  m->moe_aux_loss_coeff = 0.001;
  hf_get(j, "router_aux_loss_coef", &m->moe_aux_loss_coeff, false);
  int step = 1;
  hf_get(j, "decoder_sparse_step", &step, false);
  if (step < 1)
    fail_usage("hf import: config.json decoder_sparse_step {} must be >= 1", step);
  std::set<int> dense;
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array())
      fail_usage("hf import: config.json mlp_only_layers is not a list ({})", it->dump());
    for (const auto& v : *it) {
      if (!v.is_number_integer())
        fail_usage("hf import: config.json mlp_only_layers holds {}, not a layer index", v.dump());
      // An index outside the layers selects nothing, as in transformers (read unnarrowed).
      const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX;
      const int64_t i = huge ? -1 : v.get<int64_t>();
      if (i >= 0 && i < m->num_layers) dense.insert(static_cast<int>(i));
    }
  }
  m->moe_layer_pattern.clear();
  bool mixed = false;
  for (int l = 0; l < m->num_layers; ++l) {
    const bool moe = !dense.count(l) && (l + 1) % step == 0;
    m->moe_layer_pattern.push_back(moe ? 1 : 0);
    mixed = mixed || !moe;
  }
  if (!mixed) m->moe_layer_pattern.clear();  // every layer MoE: Megatron's default frequency
}

}  // namespace weft
