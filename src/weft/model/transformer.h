// The Llama-style decoder, written as functions over ParamHandles: token embedding, pre-norm
// layers (RMSNorm, RoPE, grouped-query or multi-latent causal attention, SwiGLU or
// squared-ReLU MLP), final norm, output layer,
// and the language-model loss. No parallelism here: callers (parallel/) decide which pieces run
// on which rank and where the weights come from.
//
// Row orders of fused weights (documented for conversion tools):
// - linear_qkv.weight [(nh + 2*ng) * hd, h]: Megatron's per-group interleave. For each query
//   group g in 0..ng-1, in order: the nh/ng query heads of g, then g's key head, then g's value
//   head; each head is hd consecutive rows. linear_qkv.bias (--add-qkv-bias) [(nh + 2*ng) * hd]
//   has the same order.
// - linear_fc1.weight [2*ffn, h]: rows [0, ffn) are the gate (SiLU applied), rows [ffn, 2*ffn)
//   the up projection; with --squared-relu [ffn, h], no gate (MlpSpec).
// RoPE rotates the two halves of each head (rotate-half, non-interleaved), as Megatron's default.
//
// Multi-latent attention (--multi-latent-attention, Megatron's MLASelfAttention; nh heads, dn =
// --qk-head-dim, dr = --qk-pos-emb-head-dim, dv = --v-head-dim), under self_attention.:
// - linear_q_proj.weight [nh (dn + dr), h], or with --q-lora-rank r: linear_q_down_proj.weight
//   [r, h], q_layernorm.weight [r] (--qk-layernorm), linear_q_up_proj.weight [nh (dn + dr), r].
//   Rows per head: dn channels without position, then dr rotated ones.
// - linear_kv_down_proj.weight [kv_lora_rank + dr, h]: the latent, then one key head's dr rotated
//   channels, shared by every head; kv_layernorm.weight [kv_lora_rank] (--qk-layernorm) on the
//   latent; linear_kv_up_proj.weight [nh (dn + dv), kv_lora_rank], rows per head: dn key
//   channels, then dv value channels. linear_proj.weight [h, nh dv].
// The dr channels are DeepSeek's interleaved pairs (2i, 2i + 1): MLA's RoPE takes the even
// channels, then the odd ones, and rotates the halves, as Megatron's. Scale 1/sqrt(dn + dr), times
// YaRN's mscale(--rotary-scaling-factor, --mscale-all-dim)^2 (attention_softmax_scale).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "weft/model/config.h"
#include "weft/model/mamba.h"
#include "weft/model/param_source.h"

namespace weft {

// Rejects a config the model cannot run (heads not dividing hidden, groups not dividing heads,
// odd head_dim, non-positive sizes) with a UsageError naming the Megatron flag.
void check_model_config(const ModelConfig& cfg);
// The MoE and MTP part of it (experts, top-k, layer pattern, score function, MTP depth).
void check_moe_config(const ModelConfig& cfg);

// Parameter declarations, with global names. `layer` is the global layer number.
ParamSpec embedding_param_spec(const ModelConfig& cfg);      // embedding.word_embeddings.weight
// One layer's own parameters under `prefix` (e.g. "decoder.layers.3."). `symbol` is the layer's
// kind: 'T' a transformer layer (attention, then an MLP, or MoE when `moe`), or a hybrid
// model's '*' attention, '-' MLP, 'E' MoE, 'M' Mamba-2. Order (MLA: its weights in the order of
// the header comment in place of the QKV ones): input_layernorm,
// self_attention.linear_qkv (weight, then bias with --add-qkv-bias), the q/k layernorms
// (--qk-layernorm), self_attention.linear_proj; pre_mlp_layernorm, mlp.linear_fc1,
// mlp.linear_fc2 | mlp.router, mlp.shared_experts.linear_fc1/fc2 (with shared experts);
// mixer.{in_proj.layer_norm_weight, in_proj, conv1d.weight, conv1d.bias, dt_bias, A_log, D,
// norm, out_proj}. Routed experts' weights are declared apart (expert_param_specs): they are
// sharded over other groups.
std::vector<ParamSpec> block_param_specs(const ModelConfig& cfg, const std::string& prefix,
                                         char symbol, bool moe);
// A transformer layer ('T').
std::vector<ParamSpec> block_param_specs(const ModelConfig& cfg, const std::string& prefix,
                                         bool moe);
// block_param_specs of decoder layer `layer` (its symbol; MoE per cfg.is_moe_layer(layer)).
std::vector<ParamSpec> layer_param_specs(const ModelConfig& cfg, int layer);
// Routed experts first..first+count-1 (global indices) of the MoE layer under `prefix`: the
// mlp.experts.{E}.linear_fc1.weight [2*moe_ffn, h] of each, then the linear_fc2.weight
// [h, moe_ffn] of each.
std::vector<ParamSpec> expert_param_specs(const ModelConfig& cfg, const std::string& prefix,
                                          int first, int count);
ParamSpec final_norm_param_spec(const ModelConfig& cfg);     // decoder.final_layernorm.weight
ParamSpec output_param_spec(const ModelConfig& cfg);         // output_layer.weight (untied only)
// MTP depth k (0-based) under "mtp.layers.{k}.": enorm, hnorm, eh_proj [h, 2h],
// final_layernorm, then its layers (cfg.mtp_symbols()) under mtp_layer_prefix(cfg, k, j).
std::vector<ParamSpec> mtp_param_specs(const ModelConfig& cfg, int k);
std::string layer_prefix(int layer);  // "decoder.layers.{L}."
// Layer j of MTP depth k: "mtp.layers.{k}.transformer_layer." (one transformer layer), or in
// hybrid models "mtp.layers.{k}.mtp_model_layer.layers.{j}." (Megatron's names).
std::string mtp_layer_prefix(const ModelConfig& cfg, int k, int j);
// Every parameter of the model (all experts, MTP included), in a fixed order.
std::vector<ParamSpec> all_param_specs(const ModelConfig& cfg);
// The routers' expert biases (--moe-router-enable-expert-bias): "<layer prefix>mlp.router.
// expert_bias", float32 [E], one per MoE layer (decoder and MTP) in all_param_specs' order;
// empty without the flag. Buffers, not parameters: no gradient, no optimizer state.
std::vector<ParamSpec> router_bias_specs(const ModelConfig& cfg);
std::string router_bias_name(const std::string& layer_prefix);

// The initial value of a parameter: float32, full shape, a function of (seed, spec.name) only
// (invariant 5), never of the layout or of the order in which parameters are created.
at::Tensor init_param(const ParamSpec& spec, const ModelConfig& cfg, uint64_t seed);

class MoeExperts;
struct RouterBias;

// Handles of one layer; the parts a layer does not have stay unset.
struct LayerHandles {
  ParamHandle input_layernorm;    // input_layernorm.weight        [h]
  ParamHandle linear_qkv;         // self_attention.linear_qkv.weight
  ParamHandle linear_qkv_bias;    // self_attention.linear_qkv.bias [(nh+2ng)*hd] (--add-qkv-bias)
  ParamHandle linear_proj;        // self_attention.linear_proj.weight [h, nh*hd]
  ParamHandle q_layernorm;        // self_attention.q_layernorm.weight [hd] (--qk-layernorm)
  ParamHandle k_layernorm;        // self_attention.k_layernorm.weight [hd] (--qk-layernorm)
  // Multi-latent attention (header comment); q_layernorm is then the query latent's norm.
  ParamHandle linear_q_proj, linear_q_down_proj, linear_q_up_proj;
  ParamHandle linear_kv_down_proj, kv_layernorm, linear_kv_up_proj;
  ParamHandle pre_mlp_layernorm;  // pre_mlp_layernorm.weight      [h]
  ParamHandle linear_fc1;         // mlp.linear_fc1.weight [2*ffn, h]   (dense layers)
  ParamHandle linear_fc2;         // mlp.linear_fc2.weight [h, ffn]     (dense layers)
  ParamHandle router;             // mlp.router.weight [E, h]           (MoE layers)
  ParamHandle shared_fc1;         // mlp.shared_experts.linear_fc1.weight (MoE, optional)
  ParamHandle shared_fc2;         // mlp.shared_experts.linear_fc2.weight (MoE, optional)
  MambaHandles mamba;             // mixer.* (Mamba layers)
  MoeExperts* experts = nullptr;  // MoE layers: runs the routed experts; not owned
  RouterBias* router_bias = nullptr;  // MoE layers with --moe-router-enable-expert-bias; not owned
  // Whether the layer has self-attention (grouped-query or multi-latent).
  bool has_attention() const { return linear_qkv.source || linear_kv_down_proj.source; }
};
// Handles of the layer under `prefix` among `specs`, registered at indices first.. of `source`
// (specs[i] at first + i); matched by name.
LayerHandles layer_handles(ParamSource* source, int first, const std::vector<ParamSpec>& specs,
                           const std::string& prefix, MoeExperts* experts);
// A transformer layer's block_param_specs(cfg, "", moe) registered at first.. of `source`.
LayerHandles layer_handles(ParamSource* source, int first, const ModelConfig& cfg, bool moe,
                           MoeExperts* experts);

// Handles of one MTP depth: mtp_param_specs(cfg, k) registered at first.. of `source`;
// experts[j] runs layer j's routed experts (MoE layers).
struct MtpHandles {
  ParamHandle enorm, hnorm, eh_proj, final_layernorm;
  std::vector<LayerHandles> layers;
};
MtpHandles mtp_handles(ParamSource* source, int first, const ModelConfig& cfg, int k,
                       const std::vector<MoeExperts*>& experts);

// cos/sin tables for positions [0, seq_length), shape [seq, head_dim], in `dtype` on `device`.
// Row p is cos/sin of p * base^(-2i/hd) whatever seq_length: tables for a longer
// cfg.seq_length cover later positions (model/generate.h does so past seq_length).
struct RotaryTables {
  at::Tensor cos, sin;
};
// cos and sin of position * frequency, [seq_length, rotary_dim()] (each frequency twice,
// rotate-half form; the head dim unless --rotary-percent < 1, MLA's qk_pos_emb_head_dim),
// computed in float64 and cast to `dtype`; with --use-rope-scaling the frequencies are
// llama3_scaled_frequencies', with MLA's YaRN yarn_frequencies' and both tables times YaRN's
// mscale(factor, --mscale) / mscale(factor, --mscale-all-dim).
RotaryTables make_rotary_tables(const ModelConfig& cfg, c10::Device device, c10::ScalarType dtype);
// The attention's softmax scale: 0 for the default 1/sqrt(q's head dim); with MLA and YaRN's
// mscale-all-dim factor m != 1, m^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim) (Megatron's).
double attention_softmax_scale(const ModelConfig& cfg);
// YaRN's mscale (Megatron's and transformers' get_mscale): 0.1 mscale ln(factor) + 1 above
// factor 1, else 1.
double yarn_mscale(double factor, double mscale);
// The factor of the rotary tables: mscale(factor, --mscale) / mscale(factor, --mscale-all-dim)
// with MLA's YaRN, else 1.
double yarn_attention_factor(const ModelConfig& cfg);
// YaRN's frequencies (float64, one per rotated pair of MLA's qk_pos_emb_head_dim channels).
at::Tensor yarn_frequencies(const ModelConfig& cfg);
// Llama 3.x RoPE scaling of the frequencies inv_freq (float64, one per rotated pair) by `factor`,
// with ModelConfig's fixed low/high-frequency factors 1 and 4 and original context 8192.
at::Tensor llama3_scaled_frequencies(const at::Tensor& inv_freq, double factor);

// tokens [b, s] int64 -> [b, s, h] in the weight's dtype.
at::Tensor embed_tokens(const at::Tensor& tokens, ParamHandle word_embeddings);
// The MLP's activation of a = x fc1^T: silu(gate) * up (SwiGLU, a [.., 2 ffn], gate columns
// first) or relu(a)^2 (--squared-relu, a [.., ffn]).
at::Tensor mlp_activation(const at::Tensor& a, const MlpSpec& spec);
// fc2(mlp_activation(x fc1^T)): the dense MLP, a shared expert or one routed expert.
at::Tensor mlp(const at::Tensor& x, ParamHandle fc1, ParamHandle fc2, const MlpSpec& spec);
// The same, recomputed in the backward (model/recompute.h): --recompute-modules mlp and
// shared_experts.
at::Tensor recomputed_mlp(const at::Tensor& x, ParamHandle fc1, ParamHandle fc2,
                          const MlpSpec& spec);
// [b, s, h] -> [b, s, h]. An MoE layer (w.experts set) adds its unweighted aux loss into
// *aux_loss when given (see moe.h).
at::Tensor decoder_layer(const at::Tensor& x, const LayerHandles& w, const RotaryTables& rope,
                         const ModelConfig& cfg, at::Tensor* aux_loss = nullptr);
// The residual stream between layers with its last add left undone: the hidden state is
// x + delta (x alone while delta is undefined). The next op that normalises the hidden state
// does the add in its own kernel (ops::add_rms_norm), which saves a pass over the stream
// forward and the gradient's accumulation backward, with the bits of the separate add.
struct Residual {
  at::Tensor x, delta;
  at::Tensor hidden() const;  // x + delta
};
// rms_norm(in.hidden()) with the pending add done in the same op; `in` becomes {hidden}.
at::Tensor norm_residual(Residual& in, ParamHandle weight, double eps);
// decoder_layer on the stream: a layer of attention and MLP (no Mamba mixer) takes the pending
// add into its input norm and leaves its MLP's residual add pending in the result; any other
// layer adds first and returns {its output}. The same bits as decoder_layer(in.hidden()).
Residual decoder_layer(Residual in, const LayerHandles& w, const RotaryTables& rope,
                       const ModelConfig& cfg, at::Tensor* aux_loss = nullptr);
// decoder_layer's pieces, for callers that run attention over cached keys and values
// (model/generate.h). decoder_layer(x) is, for a layer with attention:
//   a = attention_qkv(x, .., 0); h = attention_residual(x, causal_attention_gqa(a.q, a.k, a.v))
// then h + mamba_mixer(h) for a Mamba layer, then mlp_block(h).
// q [b, nh, s, hd], k and v [b, ng, s, hd] of the layer's attention on x [b, s, h] (the
// input_layernorm is inside), q and k rotated for the absolute positions [pos, pos + s).
struct AttentionQkv {
  at::Tensor q, k, v;
};
AttentionQkv attention_qkv(const at::Tensor& x, const LayerHandles& w, const RotaryTables& rope,
                           const ModelConfig& cfg, int64_t pos = 0);
// x + linear_proj(attn), attn [b, nh, s, hd] the attention's output per head.
at::Tensor attention_residual(const at::Tensor& x, const at::Tensor& attn, const LayerHandles& w,
                              const ModelConfig& cfg);
// x + mlp(pre_mlp_layernorm(x)) with the layer's SwiGLU MLP or MoE (aux loss as in
// decoder_layer); x itself for a layer without an MLP.
at::Tensor mlp_block(const at::Tensor& x, const LayerHandles& w, const ModelConfig& cfg,
                     at::Tensor* aux_loss = nullptr);
// One MTP depth (Megatron's MultiTokenPredictionLayer): h_prev [b, s, h] is the previous
// depth's normalised output (the decoder's after final_layernorm for the first depth), emb
// [b, s, h] the embedding of the input tokens rolled left by this depth. Computes
// final_layernorm(layer(eh_proj([enorm(emb), hnorm(h_prev)]))): the input of the shared output
// layer and of the next depth.
at::Tensor mtp_layer(const at::Tensor& h_prev, const at::Tensor& emb, const MtpHandles& w,
                     const RotaryTables& rope, const ModelConfig& cfg, at::Tensor* aux_loss);
// The input tokens of MTP depth k >= 1 from the labels [b, s] (labels[t] = token t+1): token
// t+k at position t, 0 in the last k positions (Megatron rolls its input ids and fills 0).
at::Tensor mtp_input_tokens(const at::Tensor& labels, int k);
at::Tensor final_norm(const at::Tensor& x, ParamHandle weight, const ModelConfig& cfg);
// The same on the stream (norm_residual); `x` becomes {hidden}.
at::Tensor final_norm(Residual& x, ParamHandle weight, const ModelConfig& cfg);
// [b, s, h] -> logits [b, s, V] (compute dtype)
at::Tensor output_logits(const at::Tensor& x, ParamHandle output_weight);
// Sum over all tokens of the cross-entropy, computed in float32; labels [b, s] int64.
at::Tensor lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace weft
