// Megatron's flags that describe the one architecture weft builds (RMSNorm, rotary positions,
// SwiGLU, no linear biases, no dropout, a sharded optimizer), so that a Megatron Llama-style
// command line runs unchanged: each is accepted where it states what weft does, and refused with
// a line naming the flag where it asks for something weft does not build (LayerNorm, learned
// positions, dropout). Without them weft builds the same model; Megatron's defaults for them
// (LayerNorm, learned absolute positions, GeLU, biases, dropout 0.1) describe another one.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace weft {

struct RecipeFlags {
  std::string normalization = "RMSNorm";        // --normalization
  std::string position_embedding_type = "rope";  // --position-embedding-type
  double attention_dropout = 0.0, hidden_dropout = 0.0;
  int max_position_embeddings = -1;             // -1: not given
  std::string transformer_impl = "local";       // --transformer-impl
  // The flags without a value (--swiglu, --disable-bias-linear, ...) state what weft always
  // does: accepted, nothing stored.
};

void add_recipe_flags(CLI::App* c, RecipeFlags* r);
// Throws UsageError naming the flag for a value weft does not build; seq_length is the run's
// --seq-length (Megatron requires --max-position-embeddings >= it).
void check_recipe_flags(const RecipeFlags& r, int seq_length);

}  // namespace weft
