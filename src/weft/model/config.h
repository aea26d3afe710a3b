// The model's hyper-parameters (Megatron flag names in comments).
#pragma once

#include <cstdint>

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

  int head_dim() const { return hidden_size / num_attention_heads; }
  bool tied() const { return !untie_embeddings_and_output_weights; }
};

}  // namespace weft
