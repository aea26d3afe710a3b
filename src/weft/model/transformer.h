// The Llama-style decoder, written as functions over ParamHandles: token embedding, pre-norm
// layers (RMSNorm, RoPE, grouped-query causal attention, SwiGLU MLP), final norm, output layer,
// and the language-model loss. No parallelism here: callers (parallel/) decide which pieces run
// on which rank and where the weights come from.
//
// Row orders of fused weights (documented for conversion tools):
// - linear_qkv.weight [(nh + 2*ng) * hd, h]: Megatron's per-group interleave. For each query
//   group g in 0..ng-1, in order: the nh/ng query heads of g, then g's key head, then g's value
//   head; each head is hd consecutive rows.
// - linear_fc1.weight [2*ffn, h]: rows [0, ffn) are the gate (SiLU applied), rows [ffn, 2*ffn)
//   the up projection.
// RoPE rotates the two halves of each head (rotate-half, non-interleaved), as Megatron's default.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "weft/model/config.h"
#include "weft/model/param_source.h"

namespace weft {

// Rejects a config the model cannot run (heads not dividing hidden, groups not dividing heads,
// odd head_dim, non-positive sizes) with a UsageError naming the Megatron flag.
void check_model_config(const ModelConfig& cfg);

// Parameter declarations, with global names. `layer` is the global layer number.
ParamSpec embedding_param_spec(const ModelConfig& cfg);      // embedding.word_embeddings.weight
std::vector<ParamSpec> layer_param_specs(const ModelConfig& cfg, int layer);  // the 6 below
ParamSpec final_norm_param_spec(const ModelConfig& cfg);     // decoder.final_layernorm.weight
ParamSpec output_param_spec(const ModelConfig& cfg);         // output_layer.weight (untied only)

// The initial value of a parameter: float32, full shape, a function of (seed, spec.name) only
// (invariant 5), never of the layout or of the order in which parameters are created.
at::Tensor init_param(const ParamSpec& spec, const ModelConfig& cfg, uint64_t seed);

// Handles of one decoder layer, in layer_param_specs order.
struct LayerHandles {
  ParamHandle input_layernorm;    // decoder.layers.{L}.input_layernorm.weight        [h]
  ParamHandle linear_qkv;         // decoder.layers.{L}.self_attention.linear_qkv.weight
  ParamHandle linear_proj;        // decoder.layers.{L}.self_attention.linear_proj.weight [h, nh*hd]
  ParamHandle pre_mlp_layernorm;  // decoder.layers.{L}.pre_mlp_layernorm.weight      [h]
  ParamHandle linear_fc1;         // decoder.layers.{L}.mlp.linear_fc1.weight         [2*ffn, h]
  ParamHandle linear_fc2;         // decoder.layers.{L}.mlp.linear_fc2.weight         [h, ffn]
};

// cos/sin tables for positions [0, seq_length), shape [seq, head_dim], in `dtype` on `device`.
struct RotaryTables {
  at::Tensor cos, sin;
};
RotaryTables make_rotary_tables(const ModelConfig& cfg, c10::Device device, c10::ScalarType dtype);

// tokens [b, s] int64 -> [b, s, h] in the weight's dtype.
at::Tensor embed_tokens(const at::Tensor& tokens, ParamHandle word_embeddings);
// [b, s, h] -> [b, s, h]
at::Tensor decoder_layer(const at::Tensor& x, const LayerHandles& w, const RotaryTables& rope,
                         const ModelConfig& cfg);
at::Tensor final_norm(const at::Tensor& x, ParamHandle weight, const ModelConfig& cfg);
// [b, s, h] -> logits [b, s, V] (compute dtype)
at::Tensor output_logits(const at::Tensor& x, ParamHandle output_weight);
// Sum over all tokens of the cross-entropy, computed in float32; labels [b, s] int64.
at::Tensor lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace weft
