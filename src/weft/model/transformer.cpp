// The Llama-style decoder over ParamHandles (see transformer.h): parameter specs with global
// names, layout-independent initialisation, RoPE tables, the decoder layer, final norm,
// output layer and the language-model loss.
//
// Invariants: a parameter's initial value is a function of (seed, global name) only — each
// parameter draws from its own CPU generator seeded by a hash of the two (invariant 5); the
// model reads weights only through ops:: (so every use is counted and every gradient delivered
// through the ParamSource contract); fused weights follow the row orders documented in
// transformer.h.
#include "weft/model/transformer.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Reduction.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/nll_loss.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/silu.h>
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "weft/core/compat.h"
#include "weft/core/error.h"
#include "weft/model/fused.h"
#include "weft/model/ops.h"

namespace weft {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// The generator seed of one parameter. ATen's CPU generator (mt19937) keeps only 32 bits of
// its seed, so both halves of the 64-bit hash are folded into the low half.
uint64_t param_generator_seed(uint64_t seed, const std::string& name) {
  const uint64_t h = splitmix64(splitmix64(seed) ^ fnv1a64(name));
  return (h ^ (h >> 32)) & 0xffffffffULL;
}

ParamSpec spec(std::string name, std::vector<int64_t> shape, InitKind init, bool decay) {
  ParamSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.init = init;
  s.decay = decay;
  return s;
}

// Rotate-half RoPE on x [b, heads, s, hd]; cos/sin [>= s, hd].
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& rope) {
  const int64_t s = x.size(2), half = x.size(3) / 2;
  const at::Tensor cos = rope.cos.narrow(0, 0, s);
  const at::Tensor sin = rope.sin.narrow(0, 0, s);
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace

void check_model_config(const ModelConfig& cfg) {
  auto positive = [](int v, const char* flag) {
    if (v <= 0) fail_usage("{} must be positive, got {}", flag, v);
  };
  positive(cfg.num_layers, "--num-layers");
  positive(cfg.hidden_size, "--hidden-size");
  positive(cfg.ffn_hidden_size, "--ffn-hidden-size");
  positive(cfg.num_attention_heads, "--num-attention-heads");
  positive(cfg.num_query_groups, "--num-query-groups");
  positive(cfg.seq_length, "--seq-length");
  positive(cfg.vocab_size, "--vocab-size");
  if (cfg.hidden_size % cfg.num_attention_heads != 0) {
    fail_usage("--hidden-size ({}) must be a multiple of --num-attention-heads ({})",
               cfg.hidden_size, cfg.num_attention_heads);
  }
  if (cfg.num_attention_heads % cfg.num_query_groups != 0) {
    fail_usage("--num-attention-heads ({}) must be a multiple of --num-query-groups ({})",
               cfg.num_attention_heads, cfg.num_query_groups);
  }
  if (cfg.head_dim() % 2 != 0) {
    fail_usage("head dim (--hidden-size / --num-attention-heads = {}) must be even for RoPE",
               cfg.head_dim());
  }
  if (!(cfg.init_method_std > 0)) fail_usage("--init-method-std must be positive");
  if (!(cfg.rotary_base > 0)) fail_usage("--rotary-base must be positive");
  if (!(cfg.norm_epsilon >= 0)) fail_usage("--norm-epsilon must not be negative");
}

ParamSpec embedding_param_spec(const ModelConfig& cfg) {
  return spec("embedding.word_embeddings.weight", {cfg.vocab_size, cfg.hidden_size},
              InitKind::kNormal, true);
}

std::vector<ParamSpec> layer_param_specs(const ModelConfig& cfg, int layer) {
  check_model_config(cfg);
  WEFT_CHECK(layer >= 0 && layer < cfg.num_layers, "layer {} outside [0, {})", layer,
             cfg.num_layers);
  const int64_t h = cfg.hidden_size, nh = cfg.num_attention_heads, ng = cfg.num_query_groups;
  const int64_t hd = cfg.head_dim(), ffn = cfg.ffn_hidden_size;
  const std::string p = fmt::format("decoder.layers.{}.", layer);
  return {
      spec(p + "input_layernorm.weight", {h}, InitKind::kOnes, false),
      spec(p + "self_attention.linear_qkv.weight", {(nh + 2 * ng) * hd, h}, InitKind::kNormal,
           true),
      spec(p + "self_attention.linear_proj.weight", {h, nh * hd}, InitKind::kScaledNormal, true),
      spec(p + "pre_mlp_layernorm.weight", {h}, InitKind::kOnes, false),
      spec(p + "mlp.linear_fc1.weight", {2 * ffn, h}, InitKind::kNormal, true),
      spec(p + "mlp.linear_fc2.weight", {h, ffn}, InitKind::kScaledNormal, true),
  };
}

ParamSpec final_norm_param_spec(const ModelConfig& cfg) {
  return spec("decoder.final_layernorm.weight", {cfg.hidden_size}, InitKind::kOnes, false);
}

ParamSpec output_param_spec(const ModelConfig& cfg) {
  return spec("output_layer.weight", {cfg.vocab_size, cfg.hidden_size}, InitKind::kNormal, true);
}

at::Tensor init_param(const ParamSpec& spec, const ModelConfig& cfg, uint64_t seed) {
  at::Tensor t = at::empty(spec.shape, at::TensorOptions().dtype(at::kFloat));
  if (spec.init == InitKind::kOnes) return t.fill_(1.0);
  double std = cfg.init_method_std;
  if (spec.init == InitKind::kScaledNormal) std /= std::sqrt(2.0 * cfg.num_layers);
  at::Generator gen = compat::make_cpu_generator(param_generator_seed(seed, spec.name));
  t.normal_(0.0, std, gen);
  return t;
}

RotaryTables make_rotary_tables(const ModelConfig& cfg, c10::Device device, c10::ScalarType dtype) {
  check_model_config(cfg);
  // Angles in float64 on the CPU, then cast: the tables are exact to the target dtype.
  const int64_t hd = cfg.head_dim();
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor exponent = at::arange(0, hd / 2, f64) * (-2.0 / static_cast<double>(hd));
  const at::Tensor inv_freq = at::pow(cfg.rotary_base, exponent);                  // base^(-2i/hd)
  const at::Tensor angles = at::outer(at::arange(cfg.seq_length, f64), inv_freq);  // [s, hd/2]
  const at::Tensor full = at::cat({angles, angles}, -1);                           // [s, hd]
  RotaryTables t;
  t.cos = full.cos().to(device, dtype);
  t.sin = full.sin().to(device, dtype);
  return t;
}

at::Tensor embed_tokens(const at::Tensor& tokens, ParamHandle word_embeddings) {
  WEFT_CHECK(tokens.dim() == 2, "embed_tokens: tokens must be [b, s], got {} dims", tokens.dim());
  return ops::embedding(tokens, word_embeddings);
}

at::Tensor decoder_layer(const at::Tensor& x, const LayerHandles& w, const RotaryTables& rope,
                         const ModelConfig& cfg) {
  const int64_t h = cfg.hidden_size, nh = cfg.num_attention_heads, ng = cfg.num_query_groups;
  const int64_t hd = cfg.head_dim(), ffn = cfg.ffn_hidden_size, r = nh / ng;
  WEFT_CHECK(x.dim() == 3 && x.size(2) == h, "decoder_layer: input must be [b, s, {}]", h);
  const int64_t b = x.size(0), s = x.size(1);
  WEFT_CHECK(rope.cos.defined() && s <= rope.cos.size(0) && rope.cos.size(1) == hd,
             "decoder_layer: sequence {} needs rotary tables of at least [{}, {}]", s, s, hd);

  // Attention. Fused rows per group g: r query heads, then g's key head, then its value head.
  const at::Tensor qkv =
      ops::linear(ops::rms_norm(x, w.input_layernorm, cfg.norm_epsilon), w.linear_qkv)
          .view({b, s, ng, r + 2, hd});
  at::Tensor q, k, v;  // [b, nh, s, hd], [b, ng, s, hd], [b, ng, s, hd]
  if (fused::usable(qkv) && rope.cos.scalar_type() == qkv.scalar_type()) {
    // One kernel: rotated q and k and a copy of v, each [b, s, heads, hd] contiguous.
    auto [qr, kr, vr] =
        fused::rope_qkv(qkv, rope.cos.narrow(0, 0, s), rope.sin.narrow(0, 0, s));
    q = qr.transpose(1, 2);
    k = kr.transpose(1, 2);
    v = vr.transpose(1, 2);
  } else {
    q = apply_rotary(qkv.narrow(3, 0, r).reshape({b, s, nh, hd}).transpose(1, 2), rope);
    k = apply_rotary(qkv.select(3, r).transpose(1, 2), rope);
    v = qkv.select(3, r + 1).transpose(1, 2);
  }
  const at::Tensor attn = compat::causal_attention_gqa(q, k, v)
                              .transpose(1, 2)
                              .reshape({b, s, nh * hd});
  const at::Tensor hidden = x + ops::linear(attn, w.linear_proj);

  // SwiGLU MLP: fc1 rows [0, ffn) are the gate, [ffn, 2*ffn) the up projection.
  const at::Tensor fc1 =
      ops::linear(ops::rms_norm(hidden, w.pre_mlp_layernorm, cfg.norm_epsilon), w.linear_fc1);
  const at::Tensor act = fused::usable(fc1)
                             ? fused::swiglu(fc1)
                             : at::silu(fc1.narrow(-1, 0, ffn)) * fc1.narrow(-1, ffn, ffn);
  return hidden + ops::linear(act, w.linear_fc2);
}

at::Tensor final_norm(const at::Tensor& x, ParamHandle weight, const ModelConfig& cfg) {
  return ops::rms_norm(x, weight, cfg.norm_epsilon);
}

at::Tensor output_logits(const at::Tensor& x, ParamHandle output_weight) {
  return ops::linear(x, output_weight);
}

at::Tensor lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels) {
  WEFT_CHECK(labels.scalar_type() == at::kLong, "lm_loss_sum: labels must be int64");
  WEFT_CHECK(logits.dim() == labels.dim() + 1 && logits.numel() / logits.size(-1) == labels.numel(),
             "lm_loss_sum: logits [..., V] and labels [...] disagree in shape");
  const int64_t vocab = logits.size(-1);
  if (fused::usable(logits) && labels.device() == logits.device())
    return fused::cross_entropy_sum(logits.reshape({-1, vocab}), labels.reshape({-1}));
  const at::Tensor logp =
      at::log_softmax(logits.reshape({-1, vocab}), -1, ops::accum_dtype(logits.scalar_type()));
  return at::nll_loss(logp, labels.reshape({-1}), {}, at::Reduction::Sum);
}

}  // namespace weft
