// Model FLOPs per token (see flops.h): the per-layer terms of bench/gpu/mfu.py, summed over
// the decoder layers by their symbol and over the MTP depths.
#include "weft/train/flops.h"

#include <algorithm>
#include <cstdint>

#include "weft/core/error.h"

namespace weft {
namespace {

struct LayerCost {
  double params = 0;  // weights met by each token (6 FLOPs each per step)
  double extra = 0;   // FLOPs per token beyond 6 * params (attention scores, SSD)
};

// Multi-latent attention: the down and up projections met by every token, and the scores of
// (dn + dr)-channel queries and keys over dv-channel values, causal.
LayerCost mla_cost(const ModelConfig& m) {
  const double h = m.hidden_size, nh = m.num_attention_heads, qr = m.q_lora_rank;
  const double kvr = m.kv_lora_rank, qhd = m.mla_q_head_dim(), dv = m.v_head_dim;
  const double norms = m.qk_layernorm ? (qr > 0 ? qr : 0) + kvr : 0;
  const double q = qr > 0 ? h * qr + qr * nh * qhd : h * nh * qhd;
  return {h + q + h * (kvr + m.qk_pos_emb_head_dim) + kvr * nh * (m.qk_head_dim + dv) +
              nh * dv * h + norms,
          3.0 * m.seq_length * nh * (qhd + dv)};
}

LayerCost attention_cost(const ModelConfig& m) {
  if (m.mla()) return mla_cost(m);
  const double h = m.hidden_size, nh = m.num_attention_heads, ng = m.num_query_groups;
  const double hd = m.head_dim();
  return {h * (nh + 2 * ng) * hd + nh * hd * h + h + (m.qk_layernorm ? 2 * hd : 0),
          6.0 * m.seq_length * nh * hd};
}

// Weights of one MLP: fc1 (2f or f rows) and fc2 (f columns).
double mlp_params(const ModelConfig& m, const MlpSpec& s) {
  return static_cast<double>(m.hidden_size) * static_cast<double>(s.fc1_rows() + s.ffn);
}

LayerCost mlp_cost(const ModelConfig& m, bool moe) {
  const double h = m.hidden_size;
  if (!moe) return {mlp_params(m, m.dense_mlp()) + h, 0};
  return {m.moe_router_topk * mlp_params(m, m.expert_mlp()) + h * m.num_experts +
              mlp_params(m, m.shared_expert_mlp()) + h,
          0};
}

LayerCost mamba_cost(const ModelConfig& m) {
  const double h = m.hidden_size, H = m.mamba_heads(), P = m.mamba_head_dim;
  const double N = m.mamba_state_dim, G = m.mamba_num_groups, di = H * P;
  const double Q = std::min(m.mamba_chunk_size, m.seq_length);
  return {h * (2 * di + 2 * G * N + H) + di * h + h,
          3 * H * (2 * Q * N + 2 * Q * P + 2 * P * N + 2 * P * N)};
}

LayerCost layer_cost(const ModelConfig& m, char symbol, bool moe) {
  LayerCost a, b;
  switch (symbol) {
    case 'T': a = attention_cost(m), b = mlp_cost(m, moe); break;
    case '*': a = attention_cost(m); break;
    case '-': a = mlp_cost(m, false); break;
    case 'E': a = mlp_cost(m, true); break;
    case 'M': a = mamba_cost(m); break;
    default: fail("model_flops_per_token: unknown layer symbol '{}'", symbol);
  }
  return {a.params + b.params, a.extra + b.extra};
}

}  // namespace

double model_flops_per_token(const ModelConfig& m) {
  const double h = m.hidden_size, output = static_cast<double>(m.vocab_size) * h;
  double params = output, extra = 0;
  for (int l = 0; l < m.num_layers; ++l) {
    const LayerCost c = layer_cost(m, m.layer_symbol(l), m.is_moe_layer(l));
    params += c.params, extra += c.extra;
  }
  const std::string mtp = m.mtp_symbols();
  for (int k = 0; k < m.mtp_num_layers; ++k) {
    params += 2 * h * h + 3 * h + output;
    for (size_t j = 0; j < mtp.size(); ++j) {
      const LayerCost c = layer_cost(m, mtp[j], m.mtp_layer_is_moe(j));
      params += c.params, extra += c.extra;
    }
  }
  return 6 * params + extra;
}

double default_peak_flops(const std::string& device, bool bf16) {
  return device == "cuda" && bf16 ? 989e12 : 0.0;
}

}  // namespace weft
