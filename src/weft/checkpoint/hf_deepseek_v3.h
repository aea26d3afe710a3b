// Hugging Face's DeepSeek-V3 (model_type "deepseek_v3", DeepseekV3ForCausalLM: DeepSeek-V3 and
// R1, Kimi K2, Moonlight) <-> weft's models with multi-latent attention, docs/hf-interop.md.
//
// The attention is weft's MLA with the latent norms (--qk-layernorm): q_proj, or q_a_proj,
// q_a_layernorm and q_b_proj; kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj and o_proj hold
// Megatron's linear_q_proj, linear_q_down_proj, q_layernorm, linear_q_up_proj,
// linear_kv_down_proj, kv_layernorm, linear_kv_up_proj and linear_proj row for row
// (rope_interleave true: transformers de-interleaves the rotated channels as Megatron's MLA).
// transformers' latent norms take epsilon 1e-6 whatever rms_norm_eps says; weft has one epsilon,
// so both sides need 1e-6. Layers before first_k_dense_replace are dense (intermediate_size),
// the others MoE: a float32 sigmoid router with e_score_correction_bias (weft's expert bias;
// zeros without --moe-router-enable-expert-bias), group-limited routing whose group score is the
// group's top 2 (weft's topk / group-topk must then be 2), norm_topk_prob (weft's sigmoid router
// normalises exactly when k > 1), routed_scaling_factor, and n_shared_experts shared experts of
// moe_intermediate_size as one MLP (weft's --moe-shared-expert-intermediate-size, a multiple of
// the expert width). RoPE: rope_type default, or yarn with its factor, mscale and mscale_all_dim
// (the softmax scale's), original context 4096, beta_fast 32 and beta_slow 1 (MLA's fixed YaRN
// settings in Megatron). MTP layers (the hub's layers past num_hidden_layers) have no layout in
// transformers: dropped on export, skipped on import, each with a warning. The files use the
// hub's per-expert names (mlp.experts.{e}.gate_proj/up_proj/down_proj), which transformers 5
// converts on load.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "weft/checkpoint/hf_config.h"
#include "weft/model/config.h"

namespace weft {

// Throws UsageError "hf export: ..." naming the flag where the MLA model `c` has no exact
// DeepSeek-V3 form.
void hf_deepseek_v3_check(const ModelConfig& c);
// The tensor names and shapes (the expert biases marked float32), in export order.
std::vector<HfTensorMap> hf_deepseek_v3_tensor_maps(const ModelConfig& c);
// config.json for `c` (without the dtype and special-token keys).
nlohmann::json hf_deepseek_v3_config(const ModelConfig& c);
// The ModelConfig of a deepseek_v3 config.json; refuses, naming the key, what weft cannot run.
ModelConfig hf_deepseek_v3_model_config(const nlohmann::json& j);
// The routing of transformers' DeepSeek-V3 router (NemotronH's too) into `m`, whose
// moe_router_topk is set: n_group `groups` with topk_group `topk_groups` as weft's group-limited
// routing where it limits (transformers' group score, a group's top 2, must be weft's top
// topk / topk_group), norm_topk_prob (weft normalises exactly when k > 1) and
// routed_scaling_factor (default `default_scaling`). Refusals name the key.
void hf_read_deepseek_v3_router(const nlohmann::json& j, int groups, int topk_groups,
                                double default_scaling, ModelConfig* m);
// Whether `name` is one of the hub's MTP tensors of a deepseek_v3 model of `num_layers` layers
// and `mtp_layers` (num_nextn_predict_layers) MTP layers: model.layers.{L}.* with L in
// [num_layers, num_layers + mtp_layers), which import skips.
bool hf_deepseek_v3_mtp_tensor(const std::string& name, int num_layers, int mtp_layers);

}  // namespace weft
