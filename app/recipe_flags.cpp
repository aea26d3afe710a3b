// Megatron's architecture-describing flags (see recipe_flags.h).
#include "recipe_flags.h"

#include <CLI/CLI.hpp>
#include <utility>

#include "weft/core/error.h"

namespace weft {

void add_recipe_flags(CLI::App* c, RecipeFlags* r) {
  const char* group = "Megatron recipe flags (weft's architecture; other values refused)";
  auto opt = [&](const char* name, auto& v, const char* help) {
    c->add_option(name, v, help)
        ->capture_default_str()
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
        ->group(group);
  };
  opt("--normalization", r->normalization, "RMSNorm (weft's only normalization)");
  opt("--position-embedding-type", r->position_embedding_type,
      "rope | none (none: attention without positions, as Megatron's hybrid Mamba models)");
  opt("--attention-dropout", r->attention_dropout, "0 (weft trains without dropout)");
  opt("--hidden-dropout", r->hidden_dropout, "0 (weft trains without dropout)");
  opt("--max-position-embeddings", r->max_position_embeddings,
      "at least --seq-length (the rotary tables cover --seq-length)");
  opt("--transformer-impl", r->transformer_impl,
      "local | transformer_engine: both run weft's own layers");
  // Flags without a value that state what weft always does: accepted, nothing to store.
  for (auto [name, help] : {
           std::pair{"--swiglu", "the MLP is SwiGLU (weft's default; not with --squared-relu)"},
           {"--disable-bias-linear", "no linear biases (always; --add-qkv-bias adds the QKV one)"},
           {"--use-rotary-position-embeddings",
            "Megatron's older name of --position-embedding-type rope"},
           {"--use-distributed-optimizer",
            "optimizer state sharded over the data-parallel ranks (always in weft)"},
           {"--use-mcore-models", "accepted (weft has one model code)"},
           {"--use-flash-attn", "accepted: weft's attention is PyTorch's flash kernel on CUDA"}}) {
    const std::string description = help;  // CLI11 takes a const description (copied)
    c->add_flag(name, description)->group(group);
  }
}

void check_recipe_flags(const RecipeFlags& r, int seq_length) {
  if (r.normalization != "RMSNorm")
    fail_usage("--normalization {}: weft builds RMSNorm models only (Megatron's default is "
               "LayerNorm; give --normalization RMSNorm or leave the flag out)",
               r.normalization);
  if (r.position_embedding_type != "rope" && r.position_embedding_type != "none")
    fail_usage("--position-embedding-type {}: weft builds rotary positions (rope) or attention "
               "without positions (none, as Megatron's hybrid Mamba models); Megatron's default "
               "is learned_absolute: give rope or none, or leave the flag out for rope",
               r.position_embedding_type);
  if (r.attention_dropout != 0.0)
    fail_usage("--attention-dropout {}: weft trains without dropout; give 0 (Megatron's "
               "default is 0.1)",
               r.attention_dropout);
  if (r.hidden_dropout != 0.0)
    fail_usage("--hidden-dropout {}: weft trains without dropout; give 0 (Megatron's default "
               "is 0.1)",
               r.hidden_dropout);
  if (r.max_position_embeddings != -1 && r.max_position_embeddings < seq_length)
    fail_usage("--max-position-embeddings {} is smaller than --seq-length {}",
               r.max_position_embeddings, seq_length);
  if (r.transformer_impl != "local" && r.transformer_impl != "transformer_engine")
    fail_usage("--transformer-impl must be local or transformer_engine (got '{}')",
               r.transformer_impl);
}

}  // namespace weft
