// Hugging Face's Qwen3-MoE (model_type "qwen3_moe", Qwen3MoeForCausalLM: Qwen3-30B-A3B,
// Qwen3-235B-A22B) <-> weft's MoE models with --qk-layernorm, docs/hf-interop.md.
//
// Qwen3-MoE's attention is Qwen3's (an RMSNorm of each query and key head before RoPE: weft's
// --qk-layernorm); its sparse layers route with a softmax over all experts, take the top k and
// renormalise them when norm_topk_prob is true (weft's default router, Megatron's) or keep the
// softmax values when false (--moe-router-pre-softmax); its experts are SwiGLU MLPs of
// moe_intermediate_size and there is no shared expert. A layer is dense (an MLP of
// intermediate_size, weft's --ffn-hidden-size) when it is in mlp_only_layers or (index + 1) is
// not a multiple of decoder_sparse_step, which is weft's --moe-layer-freq pattern. The files use
// the hub's per-expert names (mlp.experts.{e}.gate_proj/up_proj/down_proj, the router
// mlp.gate), which transformers 5 converts on load and restores on save.
#pragma once

#include <nlohmann/json.hpp>

#include "weft/model/config.h"

namespace weft {

// Throws UsageError "hf export: ..." naming the flag when the MoE model `c` (with
// --qk-layernorm) has no exact Qwen3-MoE form (a shared expert, the sigmoid router, expert
// biases, a top-k scaling factor, group-limited routing; q/k/v biases are refused before).
void hf_qwen3_moe_check(const ModelConfig& c);
// The Qwen3-MoE keys of config.json for `c` (experts, top k, widths, norm_topk_prob,
// decoder_sparse_step, mlp_only_layers, aux-loss coefficient), added to `j`.
void hf_qwen3_moe_config(const ModelConfig& c, nlohmann::json* j);
// Reads those keys of a qwen3_moe config.json into `m` (whose num_layers is set).
void hf_qwen3_moe_model_config(const nlohmann::json& j, ModelConfig* m);

}  // namespace weft
