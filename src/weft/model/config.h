// The model's hyper-parameters (Megatron flag names in comments).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

// One MLP's shape and activation: SwiGLU (fc1 [2 ffn, h], rows [0, ffn) the gate through SiLU,
// [ffn, 2 ffn) the up projection; Megatron's --swiglu) or, with --squared-relu, fc1 [ffn, h]
// and relu(x)^2 (Megatron's squared_relu, Nemotron-H's MLP and experts). fc2 is [h, ffn].
struct MlpSpec {
  int64_t ffn = 0;
  bool squared_relu = false;
  int64_t fc1_rows() const { return squared_relu ? ffn : 2 * ffn; }
};

// What is recomputed. granularity "full": the decoder's layers of each pipeline stage, in chunks
// (method "uniform": every recompute_num_layers consecutive layers of the stage are one chunk,
// the last one possibly shorter; "block": the stage's first recompute_num_layers layers, each on
// its own, and no other), and with uniform every MTP depth (as Megatron, which then needs
// recompute_num_layers 1; block leaves the depths); "selective": the modules named, in every
// layer. Not part of the model: checkpoints neither store nor compare it (model/recompute.h).
struct RecomputeConfig {
  std::string granularity;  // "", "full" or "selective"
  std::string method;       // full: "uniform" | "block"
  int num_layers = 0;       // full: layers per chunk (uniform) or per stage (block)
  // selective (Megatron's --recompute-modules; default core_attn):
  bool core_attn = false;       // the attention between the rotary q, k, v and its output
  bool mlp = false;             // the dense MLP (fc1, activation, fc2)
  bool moe = false;             // the MoE layer (router, experts, shared experts)
  bool shared_experts = false;  // the MoE layer's shared experts
  bool full() const { return granularity == "full"; }
  bool selective() const { return granularity == "selective"; }
  // Whether the MTP depths are recomputed: with the uniform method only, as Megatron.
  bool mtp_depths() const { return full() && method == "uniform"; }
};

struct ModelConfig {
  int num_layers = 4;            // --num-layers
  int hidden_size = 64;          // --hidden-size
  int ffn_hidden_size = 172;     // --ffn-hidden-size (SwiGLU: fc1 has 2x rows)
  // --squared-relu: every MLP (dense, experts, shared experts) is fc2(relu(fc1 x)^2) without a
  // gate; otherwise SwiGLU (MlpSpec).
  bool squared_relu = false;
  int num_attention_heads = 4;   // --num-attention-heads
  int num_query_groups = 2;      // --num-query-groups (GQA); equal to heads for MHA
  int kv_channels = -1;          // --kv-channels: the head dim (-1: hidden / heads)
  bool qk_layernorm = false;     // --qk-layernorm: RMSNorm of each query and key head before RoPE
  // --add-qkv-bias (Megatron's flag): a bias on the fused QKV projection only
  // (self_attention.linear_qkv.bias, rows as the weight's; Qwen2's q/k/v biases). weft's other
  // linear layers have none.
  bool add_qkv_bias = false;
  int seq_length = 32;           // --seq-length
  int vocab_size = 128;          // --vocab-size
  double init_method_std = 0.02; // --init-method-std
  double rotary_base = 10000.0;  // --rotary-base
  // --rotary-percent (Megatron's flag and default): the share of each head's channels rotated,
  // the first rotary_dim() = int(head dim * percent); the rest pass unrotated. Frequencies are
  // base^(-2i / rotary_dim()).
  double rotary_percent = 1.0;
  // Llama 3.x RoPE scaling (--use-rope-scaling, --rope-scaling-factor; Megatron's flags and
  // default): the frequencies whose wavelength exceeds kRopeOriginalContext / kRopeLowFreqFactor
  // positions are divided by the factor, those below kRopeOriginalContext / kRopeHighFreqFactor
  // are kept, and the band between is interpolated (make_rotary_tables).
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0;
  // --rotary-seq-len-interpolation-factor (Megatron's; 0: not given): linear position
  // interpolation, position t rotates as t / factor (make_rotary_tables).
  int rotary_seq_len_interpolation_factor = 0;
  static constexpr double kRopeLowFreqFactor = 1.0;
  static constexpr double kRopeHighFreqFactor = 4.0;
  static constexpr double kRopeOriginalContext = 8192.0;
  double norm_epsilon = 1e-5;    // --norm-epsilon
  // --position-embedding-type: rope (rotary q and k) or none (attention without positions, as
  // the attention layers of Megatron's hybrid Mamba models, whose Mamba layers carry the order).
  std::string position_embedding_type = "rope";
  bool rotary() const { return position_embedding_type == "rope"; }
  int rotary_dim() const {  // the rotated channels per head (all of them without rope)
    if (multi_latent_attention) return qk_pos_emb_head_dim;
    return rotary() ? static_cast<int>(head_dim() * rotary_percent) : head_dim();
  }
  // Multi-latent attention (--multi-latent-attention; DeepSeek-V2/V3's, Megatron's MLASelfAttention
  // with its flags and defaults; model/transformer.h documents the weights). Queries come from
  // the hidden state (q_lora_rank 0, Megatron's None) or through a rank-q_lora_rank latent; keys
  // and values from one rank-kv_lora_rank latent. Each head's query and key are qk_head_dim
  // channels without position plus qk_pos_emb_head_dim rotated ones (the key's shared by the
  // heads), its value v_head_dim channels. --num-query-groups and --kv-channels are not used.
  bool multi_latent_attention = false;
  int q_lora_rank = 0;             // --q-lora-rank (0: none)
  int kv_lora_rank = 32;           // --kv-lora-rank
  int qk_head_dim = 128;           // --qk-head-dim
  int qk_pos_emb_head_dim = 64;    // --qk-pos-emb-head-dim
  int v_head_dim = 128;            // --v-head-dim
  // --rope-type: "rope" or "yarn" (empty: Megatron's default, yarn with MLA). YaRN's frequencies
  // (make_rotary_tables) with --rotary-scaling-factor, --mscale, --mscale-all-dim and MLA's fixed
  // original context 4096, beta_fast 32 and beta_slow 1; at factor 1 YaRN is plain RoPE.
  std::string rope_type;
  double rotary_scaling_factor = 1.0;  // --rotary-scaling-factor
  double mscale = 1.0;                 // --mscale
  double mscale_all_dim = 0.0;         // --mscale-all-dim
  static constexpr double kYarnOriginalContext = 4096.0;
  static constexpr double kYarnBetaFast = 32.0;
  static constexpr double kYarnBetaSlow = 1.0;
  bool mla() const { return multi_latent_attention; }
  bool yarn() const { return mla() && rope_type != "rope"; }
  int mla_q_head_dim() const { return qk_head_dim + qk_pos_emb_head_dim; }
  bool untie_embeddings_and_output_weights = false;  // --untie-embeddings-and-output-weights
  bool bf16 = false;             // --bf16: bf16 compute and weights; fp32 otherwise

  // Mixture of experts (model/moe.h). num_experts == 0: every layer is dense.
  int num_experts = 0;                     // --num-experts
  int moe_router_topk = 2;                 // --moe-router-topk
  int moe_ffn_hidden_size = -1;            // --moe-ffn-hidden-size (-1: --ffn-hidden-size)
  int moe_shared_expert_intermediate_size = 0;  // --moe-shared-expert-intermediate-size (0: none)
  double moe_aux_loss_coeff = 0.0;         // --moe-aux-loss-coeff
  // --moe-z-loss-coeff (0: none, Megatron's None): the router z-loss (ST-MoE's), the mean over
  // a layer's tokens of logsumexp(router logits)^2, weighted by it beside the aux loss.
  double moe_z_loss_coeff = 0.0;
  std::string moe_router_score_function = "softmax";      // --moe-router-score-function
  bool moe_router_pre_softmax = false;     // --moe-router-pre-softmax: top-k of the softmax
                                           // over all experts, not renormalised over the k
  double moe_router_topk_scaling_factor = 0;  // --moe-router-topk-scaling-factor (0: none)
  // Group-limited routing (DeepSeek-V3's): --moe-router-num-groups G splits the experts into G
  // contiguous groups, --moe-router-group-topk g keeps the g groups whose top (k / g) scores sum
  // highest, and the top k experts are chosen within those. 0: top k over all experts.
  int moe_router_num_groups = 0;
  int moe_router_group_topk = 0;
  std::string moe_router_load_balancing_type = "aux_loss";  // --moe-router-load-balancing-type
  // Aux-loss-free load balancing (--moe-router-enable-expert-bias, sigmoid router only): a
  // float32 bias per expert and MoE layer is added to the scores for the top-k choice (the
  // combine weights stay the scores'), and after each step's backward every bias moves by
  // --moe-router-bias-update-rate towards balance: + for experts that got fewer than the mean
  // of the step's (token, slot) pairs over all ranks of the stage, - for those that got more.
  bool moe_router_enable_expert_bias = false;
  // --moe-router-dtype fp32 | fp64 (empty: none): the router's GEMM in that dtype, input and
  // weight cast up (Megatron's router_gating_linear); otherwise in the compute dtype.
  std::string moe_router_dtype;
  double moe_router_bias_update_rate = 1e-3;
  // --moe-layer-freq resolved to one entry per decoder layer (1: MoE, 0: dense); empty means
  // every layer is MoE when num_experts > 0 (Megatron's default frequency 1).
  std::vector<int> moe_layer_pattern;
  bool moe_grouped_gemm = false;           // --moe-grouped-gemm: one grouped GEMM for all experts
  // Token dropping (Megatron's apply_router_token_dropping; model/moe.h): with
  // --moe-expert-capacity-factor F >= 0 each expert of a layer takes at most
  // ceil(T * k / E * F) of the (token, slot) pairs of the T tokens of one forward (a
  // micro-batch), chosen by --moe-token-drop-policy: probs (the highest combine weights) or
  // position (the earliest tokens in Megatron's [s, b] order). Negative: dropless (Megatron's
  // None). --moe-pad-expert-input-to-capacity changes no number here (padding rows weigh 0)
  // but the expert-bias counts, which then see min(capacity, T) pairs per expert, as Megatron's.
  double moe_expert_capacity_factor = -1;
  std::string moe_token_drop_policy = "probs";
  bool moe_pad_expert_input_to_capacity = false;
  // --moe-apply-probs-on-input (top 1 only, as Megatron; Llama 4's experts): the routing
  // probability scales the expert's input, y = expert(p x), instead of its output, p expert(x).
  bool moe_apply_probs_on_input = false;

  // Hybrid models (--hybrid-layer-pattern, see model/hybrid.h): one symbol per decoder layer,
  // M Mamba-2, * attention, - MLP, E MoE; empty: every layer is a transformer layer (attention
  // and an MLP or MoE). hybrid_stage_layers: layers per pipeline stage from the pattern's '|'
  // (empty without '|'); mtp_layer_symbols: one MTP depth's layers (hybrid models with MTP).
  std::string layer_symbols;
  std::vector<int> hybrid_stage_layers;
  std::string mtp_layer_symbols;
  // Mamba-2 mixer (model/mamba.h), Megatron's flags and defaults.
  int mamba_state_dim = 128;               // --mamba-state-dim
  int mamba_head_dim = 64;                 // --mamba-head-dim
  int mamba_num_groups = 8;                // --mamba-num-groups
  int mamba_num_heads = -1;                // --mamba-num-heads (-1: 2 * hidden / head dim)
  int mamba_chunk_size = 128;              // SSD chunk length (Megatron's fixed 128)

  // Multi-token prediction (model/mtp.h), DeepSeek-V3 style, on the last pipeline stage.
  int mtp_num_layers = 0;                  // --mtp-num-layers
  double mtp_loss_scaling_factor = 0.1;    // --mtp-loss-scaling-factor

  // Activation recomputation: changes what the backward keeps, never a value.
  RecomputeConfig recompute;

  int head_dim() const {
    return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads;
  }
  bool tied() const { return !untie_embeddings_and_output_weights; }
  bool moe() const { return num_experts > 0; }
  bool moe_drops_tokens() const { return moe() && moe_expert_capacity_factor >= 0; }
  int expert_ffn() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden_size; }
  MlpSpec dense_mlp() const { return {ffn_hidden_size, squared_relu}; }
  MlpSpec expert_mlp() const { return {expert_ffn(), squared_relu}; }
  MlpSpec shared_expert_mlp() const { return {moe_shared_expert_intermediate_size, squared_relu}; }
  bool hybrid() const { return !layer_symbols.empty(); }
  int mamba_heads() const {
    return mamba_num_heads > 0 ? mamba_num_heads : 2 * hidden_size / mamba_head_dim;
  }
  // The symbol of decoder layer `layer`: M, *, -, E (hybrid) or T (a transformer layer).
  char layer_symbol(int layer) const {
    return hybrid() ? layer_symbols.at(static_cast<size_t>(layer)) : 'T';
  }
  // Whether decoder layer `layer` (global number) has routed experts.
  bool is_moe_layer(int layer) const {
    if (!moe()) return false;
    if (hybrid()) return layer_symbol(layer) == 'E';
    if (moe_layer_pattern.empty()) return true;
    return layer >= 0 && layer < static_cast<int>(moe_layer_pattern.size()) &&
           moe_layer_pattern[layer] != 0;
  }
  // The layers of one MTP depth: their symbols (hybrid: the pattern after '/'; otherwise one
  // transformer layer of the last decoder layer's kind, as Megatron reuses that layer's spec).
  std::string mtp_symbols() const { return hybrid() ? mtp_layer_symbols : std::string("T"); }
  bool mtp_layer_is_moe(size_t j = 0) const {
    if (!moe()) return false;
    return hybrid() ? mtp_layer_symbols.at(j) == 'E' : is_moe_layer(num_layers - 1);
  }
  // MoE layers in the decoder and the MTP block (the aux-loss average runs over them).
  int num_moe_layers() const {
    int n = 0;
    for (int l = 0; l < num_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
    const std::string m = mtp_symbols();
    for (size_t j = 0; j < m.size(); ++j) n += mtp_layer_is_moe(j) ? mtp_num_layers : 0;
    return n;
  }
};

}  // namespace weft
