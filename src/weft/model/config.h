// The model's hyper-parameters (Megatron flag names in comments).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

struct ModelConfig {
  int num_layers = 4;            // --num-layers
  int hidden_size = 64;          // --hidden-size
  int ffn_hidden_size = 172;     // --ffn-hidden-size (SwiGLU: fc1 has 2x rows)
  int num_attention_heads = 4;   // --num-attention-heads
  int num_query_groups = 2;      // --num-query-groups (GQA); equal to heads for MHA
  int seq_length = 32;           // --seq-length
  int vocab_size = 128;          // --vocab-size
  double init_method_std = 0.02; // --init-method-std
  double rotary_base = 10000.0;  // --rotary-base
  double norm_epsilon = 1e-5;    // --norm-epsilon
  bool untie_embeddings_and_output_weights = false;  // --untie-embeddings-and-output-weights
  bool bf16 = false;             // --bf16: bf16 compute and weights; fp32 otherwise

  // Mixture of experts (model/moe.h). num_experts == 0: every layer is dense.
  int num_experts = 0;                     // --num-experts
  int moe_router_topk = 2;                 // --moe-router-topk
  int moe_ffn_hidden_size = -1;            // --moe-ffn-hidden-size (-1: --ffn-hidden-size)
  int moe_shared_expert_intermediate_size = 0;  // --moe-shared-expert-intermediate-size (0: none)
  double moe_aux_loss_coeff = 0.0;         // --moe-aux-loss-coeff
  std::string moe_router_score_function = "softmax";      // --moe-router-score-function
  std::string moe_router_load_balancing_type = "aux_loss";  // --moe-router-load-balancing-type
  // --moe-layer-freq resolved to one entry per decoder layer (1: MoE, 0: dense); empty means
  // every layer is MoE when num_experts > 0 (Megatron's default frequency 1).
  std::vector<int> moe_layer_pattern;
  bool moe_grouped_gemm = false;           // --moe-grouped-gemm: one grouped GEMM for all experts

  // Multi-token prediction (model/mtp.h), DeepSeek-V3 style, on the last pipeline stage.
  int mtp_num_layers = 0;                  // --mtp-num-layers
  double mtp_loss_scaling_factor = 0.1;    // --mtp-loss-scaling-factor

  int head_dim() const { return hidden_size / num_attention_heads; }
  bool tied() const { return !untie_embeddings_and_output_weights; }
  bool moe() const { return num_experts > 0; }
  int expert_ffn() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden_size; }
  // Whether decoder layer `layer` (global number) is an MoE layer.
  bool is_moe_layer(int layer) const {
    if (!moe()) return false;
    if (moe_layer_pattern.empty()) return true;
    return layer >= 0 && layer < static_cast<int>(moe_layer_pattern.size()) &&
           moe_layer_pattern[layer] != 0;
  }
  // MTP layers take the kind of the last decoder layer (as Megatron reuses its spec).
  bool mtp_layer_is_moe() const { return is_moe_layer(num_layers - 1); }
  // MoE layers in the decoder and the MTP block (the aux-loss average runs over them).
  int num_moe_layers() const {
    int n = 0;
    for (int l = 0; l < num_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
    return n + (mtp_layer_is_moe() ? mtp_num_layers : 0);
  }
};

}  // namespace weft
