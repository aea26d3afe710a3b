// The training plan (see plan.h). Shards follow FsdpUnit's arithmetic exactly; activations
// follow what weft's ops save for backward, tensor by tensor, in bytes per token of a
// microbatch (T = micro batch size * seq length tokens; B = compute dtype bytes, 2 for bf16,
// 4 for fp32; h hidden, nh/ng/hd heads/groups/head dim, f ffn, V vocab, s seq length):
//
//   RMSNorm      fused: its input (B h) + rstd (4)            ATen chain: x in fp32 (4 h) +
//                                                             x_hat (B h) + rstd (4), and
//                                                             x^2 (4 h) under libtorch 1.x
//   linear       its input, when that is not saved already (the norm's output, B h)
//   attention    fused RoPE's q, k, v copies (B (nh + 2 ng) hd) + the flash output (B nh hd) +
//                its logsumexp (4 nh) -- the output is also linear_proj's input
//                ATen chain, torch < 2 (Debian's CPU libtorch): q, k and v expanded to nh heads
//                (3 B nh hd), the float32 softmax (4 nh s) and its compute-dtype copy
//                (B nh s, bf16 only), the re-laid-out output (B h)
//   SwiGLU MLP   fc1 output (2 B f) + the activation (B f)    ATen chain: + silu(gate) (B f)
//   squared ReLU relu's output (B f, which square saves too) + the activation (B f)
//   MoE          router: softmax over experts (4 E) + top-k bookkeeping (k (4 + B) + 16 k
//                int64 permutations, 32 k with ep > 1); per routed copy (k per token): the
//                permuted input (B h), the expert's MLP as above (3 B fe, 4 B fe ATen, 2 B fe
//                squared ReLU), the un-permuted output (B h); shared experts: an MLP of fs
//   Mamba-2      (model/mamba.cpp and ssd.cpp, chunk Q = min(128, s), di = nh_m * p,
//                c = di + 2 g n, io = B, float32 = 4):
//                norm + in_proj input, dt before and after softplus (2 x 4 nh_m), what the
//                scan keeps for its backward: u (io di), B and C per group (2 io g n), C.B^T
//                (io g Q), cs (4 nh_m), and with s > Q the decayed u and the chunk states in
//                two layouts (io di + 2 io di n / Q); out_proj's input (B di). The ATen chains
//                of the conv (padded, pre- and post-SiLU in fp32: 12 c) and the gated norm (5 x
//                4 di, and its squares under libtorch 1.x), and in fp32 the in_proj output held
//                by the gate's and the conv's views (4 (di + 2 g n + nh_m) beyond the gate).
//                With the fused CUDA kernels instead of the conv and gated-norm chains: the
//                in_proj output B (2 di + 2 g n + nh_m) held by their views, xbc (4 c), y (4 di)
//                and rstd (4 g)
//   last stage   final norm + output input (B h) + logits (fused cross-entropy: B V + 4;
//                ATen: the float32 log-softmax, 4 V) + int64 labels; per MTP depth: its
//                tokens, enorm, hnorm (rstd only, fused), eh_proj's input (2 B h), its layers,
//                final norm, output input and logits again
//   first stage  int64 tokens (8)
//
// Activation recomputation (model/recompute.h): a recomputed full chunk keeps its input stream
// (B h) and, with the uniform method, an MTP depth its input embedding (B h), their activations
// joining the backward's working set while they rerun; selective modules keep their inputs
// instead of their insides, which join a layer's working set in its backward
// (core_attn: q, k, v -- on the ATen chain the projection they view and the rotated q and k --
// and linear_proj's input; mlp and moe: the norm's output only; shared_experts: nothing of the
// shared MLP).
//
// Peak = state + gathered weights + buffers + inflight * activations + the backward's working
// set (dlogits on the last stage: B V fused, 8 V for the ATen log-softmax backward; elsewhere a
// layer's gradients, B (3 f + 2 h) per token). 1F1B keeps min(pp - stage, microbatches)
// microbatches in flight on a stage.
#include "weft/train/plan.h"

#include <fmt/format.h>
#include <torch/version.h>

#include <algorithm>
#include <map>

#include "weft/core/error.h"
#include "weft/model/recompute.h"
#include "weft/model/transformer.h"
#include "weft/parallel/pipeline_stage.h"

namespace weft {
namespace {

int64_t numel(const ParamSpec& s) {
  int64_t n = 1;
  for (auto d : s.shape) n *= d;
  return n;
}

int64_t dtype_bytes(c10::ScalarType t) { return t == at::kBFloat16 ? 2 : 4; }

// One FSDP unit as this rank holds it: its parameters and the size of its shard group.
struct UnitShape {
  std::vector<ParamSpec> specs;
  int64_t D = 1;  // shard group size
  int64_t shard_numel() const {
    int64_t n = 0;
    for (const auto& s : specs) {
      const int64_t rows = s.shape.empty() ? 1 : s.shape[0];
      n += (rows + D - 1) / D * (numel(s) / std::max<int64_t>(rows, 1));
    }
    return n;
  }
};

// Activation bytes per token of one microbatch for one piece of the model (see the file comment).
struct ActModel {
  const ModelConfig& m;
  int64_t B;      // compute dtype bytes
  bool fused;     // weft's fused CUDA kernels (and torch >= 2 flash attention)
  bool flash;     // scaled_dot_product_attention saves O(s) per token (torch >= 2)
  int ep;

  int64_t norm() const {
    if (fused) return B * m.hidden_size + 4;
    // libtorch 1.x's mean(dim) keeps its input (x^2 in fp32) for backward; 2.x only its shape.
    return (TORCH_VERSION_MAJOR < 2 ? 8 : 4) * m.hidden_size + B * m.hidden_size + 4;
  }
  // An MLP's activations: SwiGLU keeps fc1's output [2f] and fc2's input [f] (unfused, also
  // silu's); squared ReLU (ATen) relu's output [f], which square also saves, and fc2's input.
  int64_t mlp_act(const MlpSpec& s) const {
    return s.squared_relu ? 2 * B * s.ffn : (fused ? 3 : 4) * B * s.ffn;
  }
  // An RMSNorm over n channels: its input's share (unfused ATen keeps x^2 too) and rstd.
  int64_t norm_over(int64_t n) const {
    if (fused) return B * n + 4;
    return (TORCH_VERSION_MAJOR < 2 ? 8 : 4) * n + B * n + 4;
  }
  // Multi-latent attention: the down projections' input, the query latent (--q-lora-rank, with
  // its norm), the key/value latent (a copy and its norm's output with --qk-layernorm, else the
  // down projection's output it views), and q, k (nh (dn + dr) each), v and the projection's
  // input (nh dv each) as in attention(); the rotations keep nothing (their tables need no
  // gradient). Measured within 2% on the CPU (tests/train/test_plan_activations.cpp).
  int64_t mla_attention() const {
    const int64_t h = m.hidden_size, nh = m.num_attention_heads, s = m.seq_length;
    const int64_t qr = m.q_lora_rank, kvr = m.kv_lora_rank, dr = m.qk_pos_emb_head_dim;
    const int64_t qk = B * nh * m.mla_q_head_dim(), v = B * nh * m.v_head_dim;
    int64_t a = norm() + B * h;
    if (qr > 0) a += m.qk_layernorm ? norm_over(qr) + B * qr : B * qr;
    a += m.qk_layernorm ? B * kvr + norm_over(kvr) : B * (kvr + dr);
    if (m.recompute.core_attn) return a + 2 * qk + 2 * v;
    if (flash) return a + 2 * qk + 2 * v + 4 * nh;
    return a + 2 * qk + 2 * v + 4 * nh * s + (B == 2 ? 2 * nh * s : 0);
  }
  int64_t attention() const {
    if (m.mla()) return mla_attention();
    const int64_t h = m.hidden_size, nh = m.num_attention_heads, ng = m.num_query_groups;
    const int64_t hd = m.head_dim(), s = m.seq_length;
    int64_t a = norm() + B * h;  // input_layernorm, linear_qkv's input
    if (m.recompute.core_attn)  // q, k and v (fused: the rotary kernel's copies; ATen: the
                                // projection they view and the rotated q and k), and
                                // linear_proj's input; the rest is recomputed
      a += B * (nh + 2 * ng) * hd + (!fused && m.rotary() ? B * (nh + ng) * hd : 0) +
           (flash ? B * nh * hd : B * h);
    else if (flash)
      a += B * (nh + 2 * ng) * hd + B * nh * hd + 4 * nh;
    else
      a += 3 * B * nh * hd + 4 * nh * s + (B == 2 ? 2 * nh * s : 0) + B * h;
    // --qk-layernorm: the projection's output stays alive beside the norms' inputs (q copied),
    // the normed heads laid out again for the rotary kernel, and the norms' rstd (an estimate,
    // not checked against a measured peak).
    if (m.qk_layernorm) a += B * (nh + 2 * ng) * hd + B * nh * hd + B * (nh + 2 * ng) * hd + 4 * (nh + ng);
    return a;
  }
  int64_t mlp(bool moe) const {
    const int64_t h = m.hidden_size;
    int64_t a = norm() + B * h;  // pre_mlp_layernorm, fc1's (or the router's) input
    // --recompute-modules mlp / moe: only that input is kept.
    if (!moe) return a + (m.recompute.mlp ? 0 : mlp_act(m.dense_mlp()));
    if (m.recompute.moe) return a;
    const int64_t k = m.moe_router_topk, E = m.num_experts;
    a += 4 * E + k * (4 + B) + 16 * k + (ep > 1 ? 16 * k : 0);
    a += k * (2 * B * h + mlp_act(m.expert_mlp()));
    if (m.moe_shared_expert_intermediate_size > 0 && !m.recompute.shared_experts)
      a += mlp_act(m.shared_expert_mlp());
    return a;
  }
  int64_t mamba() const {
    const int64_t h = m.hidden_size, H = m.mamba_heads(), P = m.mamba_head_dim;
    const int64_t G = m.mamba_num_groups, N = m.mamba_state_dim, di = H * P, c = di + 2 * G * N;
    const int64_t Q = std::min<int64_t>(m.mamba_chunk_size, m.seq_length), io = B;
    int64_t a = norm() + B * h + 8 * H + io * di + 2 * io * G * N + io * G * Q + 4 * H + B * di;
    if (fused)  // the projection (held by the conv's and the gated norm's views), xbc, y and
                // the norm's rstd (fused.h)
      a += B * (2 * di + 2 * G * N + H) + 4 * c + 4 * di + 4 * G;
    else
      a += 12 * c + (TORCH_VERSION_MAJOR < 2 ? 6 : 5) * 4 * di +
           (B == 4 ? 4 * (di + 2 * G * N + H) : 0);
    if (m.seq_length > Q) a += io * di + 2 * io * di * N / Q;
    return a;
  }
  // A decoder layer of symbol `sym` ('T' transformer, '*', '-', 'E', 'M').
  int64_t layer(char sym, bool moe) const {
    switch (sym) {
      case '*': return attention();
      case '-': return mlp(false);
      case 'E': return mlp(true);
      case 'M': return mamba();
      default: return attention() + mlp(moe);
    }
  }
  // Cross-entropy over V classes: saved part, and the backward's working set.
  int64_t logits() const { return fused ? B * m.vocab_size + 4 : 4 * m.vocab_size; }
  int64_t dlogits() const { return fused ? B * m.vocab_size : 8 * m.vocab_size; }
  // A layer's backward working set (its gradients), per token: fc1's output gradient and the
  // activation's (3 f for SwiGLU and the Mamba mixer's 2 H P, 2 f for squared ReLU).
  int64_t layer_backward(char sym, bool moe) const {
    const int64_t h = m.hidden_size;
    int64_t f = sym == 'M' ? 2 * m.mamba_heads() * m.mamba_head_dim : m.ffn_hidden_size;
    if (moe || sym == 'E') f = m.moe_router_topk * m.expert_ffn();
    const int64_t per_f = sym != 'M' && m.squared_relu ? 2 : 3;
    return B * (per_f * f + 2 * h);
  }
};

bool is_matmul_or_norm(const ParamSpec& s) {
  return s.shape.size() == 2 || s.name.find("layernorm") != std::string::npos ||
         s.name.find("layer_norm_weight") != std::string::npos;
}

// FLOPs per token of one decoder layer or MTP layer of symbol `sym` (see plan_flops_per_token).
double layer_flops(const ModelConfig& m, const std::string& prefix, char sym, bool moe) {
  double params = 0;
  for (const ParamSpec& s : block_param_specs(m, prefix, sym, moe))
    if (is_matmul_or_norm(s)) params += static_cast<double>(numel(s));
  if (moe)  // the top-k experts a token runs through
    for (const ParamSpec& s : expert_param_specs(m, prefix, 0, 1))
      params += static_cast<double>(m.moe_router_topk) * static_cast<double>(numel(s));
  double extra = 0;
  const double s = m.seq_length, h = m.hidden_size;
  if (sym == '*' || sym == 'T') extra += 6 * s * h;
  if (sym == 'M') {
    const double H = m.mamba_heads(), P = m.mamba_head_dim, N = m.mamba_state_dim;
    const double Q = std::min<double>(m.mamba_chunk_size, s);
    extra += 3 * H * (2 * Q * N + 2 * Q * P + 2 * P * N + 2 * P * N);
  }
  return 6 * params + extra;
}

}  // namespace

double plan_flops_per_token(const ModelConfig& m) {
  const double output = static_cast<double>(m.vocab_size) * m.hidden_size;
  double f = 6 * output;
  for (int l = 0; l < m.num_layers; ++l)
    f += layer_flops(m, layer_prefix(l), m.layer_symbol(l), m.is_moe_layer(l));
  const std::string sym = m.mtp_symbols();
  for (int k = 0; k < m.mtp_num_layers; ++k) {
    f += 6 * (2.0 * m.hidden_size * m.hidden_size + output);  // eh_proj and the shared output
    for (size_t j = 0; j < sym.size(); ++j)
      f += layer_flops(m, mtp_layer_prefix(m, k, static_cast<int>(j)), sym[j],
                       m.mtp_layer_is_moe(j));
  }
  return f;
}

TrainPlan make_train_plan(const TrainConfig& cfg, int world_size, double mfu, double peak_tflops,
                          bool fused) {
  validate_train_config(cfg, world_size);
  if (!(mfu > 0 && mfu <= 1)) fail_usage("--mfu must be in (0, 1] (got {})", mfu);
  if (!(peak_tflops > 0)) fail_usage("--peak-tflops must be > 0 (got {})", peak_tflops);
  LayoutConfig lc = cfg.layout;
  lc.world_size = world_size;
  const Mesh mesh(lc);
  const ModelConfig& m = cfg.model;
  const c10::ScalarType dtype = m.bf16 ? at::kBFloat16 : at::kFloat;
  const int64_t B = dtype_bytes(dtype);
  const int pp = mesh.pp();
  const std::vector<int> split =
      m.hybrid_stage_layers.empty()
          ? split_layers(m.num_layers, pp, cfg.first_stage_layers, cfg.last_stage_layers)
          : m.hybrid_stage_layers;
  const int64_t T = static_cast<int64_t>(cfg.micro_batch_size) * m.seq_length;
  const int64_t Te = static_cast<int64_t>(cfg.eval_micro_batch()) * m.seq_length;
  const bool evaluates = cfg.skip_train || (cfg.eval_interval > 0 &&
                                            (cfg.eval_iters > 0 || cfg.full_validation));
  const bool flash = fused || TORCH_VERSION_MAJOR >= 2;
  const ActModel act{m, B, fused, flash, mesh.ep()};
  // Without recomputation: what a selective module's rerun creates again in the backward, beside
  // its layer's working set.
  ModelConfig unrecomputed = m;
  unrecomputed.recompute = RecomputeConfig{};
  const ActModel plain{unrecomputed, B, fused, flash, mesh.ep()};
  const auto layer_bwd = [&](char sym, bool moe) {
    return act.layer_backward(sym, moe) +
           std::max<int64_t>(0, plain.layer(sym, moe) - act.layer(sym, moe));
  };

  TrainPlan plan;
  // Under a --step-batch-size-schedule: its largest batch, the step with the most microbatches.
  const int batch = train_batches(cfg).largest_batch();
  plan.microbatches = batch / (cfg.micro_batch_size * mesh.dp());
  plan.tokens_per_step = static_cast<int64_t>(batch) * m.seq_length;
  for (const ParamSpec& s : all_param_specs(m)) plan.total_params += numel(s);
  plan.checkpoint_bytes =
      plan.total_params * (B + 4 + dtype_bytes(cfg.adam.exp_avg_dtype) +
                           dtype_bytes(cfg.adam.exp_avg_sq_dtype));
  for (const ParamSpec& s : router_bias_specs(m)) plan.checkpoint_bytes += 4 * numel(s);
  plan.flops_per_token = plan_flops_per_token(m);
  plan.step_seconds = plan.flops_per_token * static_cast<double>(plan.tokens_per_step) /
                      (world_size * mfu * peak_tflops * 1e12);

  for (int r = 0; r < world_size; ++r) {
    RankPlan rp;
    rp.rank = r;
    const int stage = mesh.coord(r, "pp");
    rp.stage = stage;
    const int64_t D = static_cast<int64_t>(mesh.group_of("fsdp_shard", r).size());
    const int64_t De = mesh.has_group("expert_fsdp_shard", r)
                           ? static_cast<int64_t>(mesh.group_of("expert_fsdp_shard", r).size())
                           : D;
    const int ep = mesh.ep(), ep_rank = mesh.coord(r, "ep");
    const int local = m.moe() ? m.num_experts / ep : 0;
    int first_layer = 0;
    for (int s = 0; s < stage; ++s) first_layer += split[s];
    const bool first = stage == 0, last = stage == pp - 1;

    // Units in PipelineStage's construction order, and activations per token.
    std::vector<UnitShape> units;
    int64_t act_tok = 0, bwd_tok = 0, eval_tok = 0;
    auto add_experts = [&](const std::string& prefix) {
      units.push_back({expert_param_specs(m, prefix, ep_rank * local, local), De});
    };
    if (first) {
      units.push_back({{embedding_param_spec(m)}, D});
      act_tok += 8;  // int64 tokens
    }
    for (int l = first_layer; l < first_layer + split[stage]; ++l) {
      units.push_back({layer_param_specs(m, l), D});
      if (m.is_moe_layer(l)) add_experts(layer_prefix(l));
      eval_tok = std::max(eval_tok, plain.layer(m.layer_symbol(l), m.is_moe_layer(l)));
    }
    // --recompute-granularity full: a recomputed chunk keeps its input, the stream (with the
    // pending residual add done); its layers' activations exist only while the backward reruns
    // it, beside the layer's working set.
    for (const RecomputeChunk& c : recompute_chunks(split[stage], m.recompute)) {
      int64_t chunk = 0, chunk_bwd = 0;
      for (int l = first_layer + c.begin; l < first_layer + c.end; ++l) {
        chunk += act.layer(m.layer_symbol(l), m.is_moe_layer(l));
        chunk_bwd = std::max(chunk_bwd, layer_bwd(m.layer_symbol(l), m.is_moe_layer(l)));
      }
      if (!c.recompute) {
        act_tok += chunk;
        bwd_tok = std::max(bwd_tok, chunk_bwd);
        continue;
      }
      act_tok += B * m.hidden_size;
      bwd_tok = std::max(bwd_tok, chunk + chunk_bwd);
    }
    if (last) {
      units.push_back({{final_norm_param_spec(m)}, D});
      if (pp > 1 && (m.tied() || m.mtp_num_layers > 0)) units.push_back({{embedding_param_spec(m)}, D});
      if (!m.tied()) units.push_back({{output_param_spec(m)}, D});
      act_tok += act.norm() + B * m.hidden_size + act.logits() + 8;  // + int64 labels
      const std::string sym = m.mtp_symbols();
      for (int k = 0; k < m.mtp_num_layers; ++k) {
        units.push_back({mtp_param_specs(m, k), D});
        for (size_t j = 0; j < sym.size(); ++j)
          if (m.mtp_layer_is_moe(j)) add_experts(mtp_layer_prefix(m, k, static_cast<int>(j)));
        int64_t depth = act.norm() + (fused ? 4 : act.norm()) + 2 * B * m.hidden_size, depth_bwd = 0;
        for (size_t j = 0; j < sym.size(); ++j) {
          depth += act.layer(sym[j], m.mtp_layer_is_moe(j));
          depth_bwd = std::max(depth_bwd, layer_bwd(sym[j], m.mtp_layer_is_moe(j)));
        }
        depth += act.norm();  // its final norm
        // Full recomputation (uniform) keeps a depth's input embedding (its hidden input is the
        // previous output layer's input) and reruns the rest in the backward.
        if (m.recompute.mtp_depths()) {
          act_tok += B * m.hidden_size;
          bwd_tok = std::max(bwd_tok, depth + depth_bwd);
        } else {
          act_tok += depth;
          bwd_tok = std::max(bwd_tok, depth_bwd);
        }
        act_tok += 8 + B * m.hidden_size + act.logits();  // tokens, the output layer's input
      }
      bwd_tok = std::max(bwd_tok, act.dlogits());
      const std::string mtp = m.mtp_num_layers > 0 ? m.mtp_symbols() : "";
      for (size_t j = 0; j < mtp.size(); ++j)
        eval_tok = std::max(eval_tok, plain.layer(mtp[j], m.mtp_layer_is_moe(j)));
      eval_tok += act.norm() + B * m.hidden_size + act.logits() + 8;
    }
    if (first) eval_tok += 8;

    // State: exactly what FsdpUnit and ShardedAdamW allocate.
    int64_t max_full = 0, max_full_grad = 0, max_send = 0;
    const int64_t G = cfg.adam.grad_dtype == at::kBFloat16 ? 2 : 4;  // gradient bytes
    for (const UnitShape& u : units) {
      const int64_t S = u.shard_numel();
      rp.params += S;
      if (dtype != at::kFloat) rp.weights += S * B;
      rp.grads += S * G;
      rp.master += S * 4;
      rp.exp_avg += S * dtype_bytes(cfg.adam.exp_avg_dtype);
      rp.exp_avg_sq += S * dtype_bytes(cfg.adam.exp_avg_sq_dtype);
      if (u.D > 1) {
        max_full = std::max(max_full, u.D * S * B);
        int64_t full = 0;
        for (const auto& s : u.specs) full += numel(s);
        max_full_grad = std::max(max_full_grad, full * G);
        max_send = std::max(max_send, u.D * S * G + S * G);
      }
    }
    // The unit computing and the one prefetched are gathered at once; in backward a unit's
    // full-shape gradients (float32, bf16 with --grad-reduce-in-bf16), and two reduce-scatters
    // in flight (send buffer + result).
    rp.gathered = (cfg.overlap_param_gather ? 2 : 1) * max_full;
    rp.comm = max_full_grad + (cfg.overlap_grad_reduce ? 2 : 1) * max_send;
    if (pp > 1) rp.comm += 2 * T * m.hidden_size * B;  // activation recv + gradient recv
    if (ep > 1 && m.moe())  // rows arriving by all-to-all, forward and backward
      rp.comm += 2 * T * m.moe_router_topk * m.hidden_size * B;

    rp.act_per_microbatch = act_tok * T;
    rp.inflight = std::min(pp - stage, plan.microbatches);
    rp.activations = rp.act_per_microbatch * rp.inflight;
    rp.backward_transient = bwd_tok * T;
    rp.peak = rp.state() + rp.gathered + rp.comm + rp.activations + rp.backward_transient;
    if (evaluates) {
      rp.eval_peak = rp.state() + rp.gathered + eval_tok * Te;
      if (pp > 1) rp.eval_peak += 2 * Te * m.hidden_size * B;  // activation send and recv
      if (ep > 1 && m.moe()) rp.eval_peak += 2 * Te * m.moe_router_topk * m.hidden_size * B;
      rp.peak = std::max(rp.peak, rp.eval_peak);
    }
    plan.ranks.push_back(rp);
  }
  return plan;
}

namespace {

nlohmann::ordered_json rank_json(const RankPlan& r) {
  return {{"stage", r.stage},
          {"params", r.params},
          {"weights", r.weights},
          {"grads", r.grads},
          {"master", r.master},
          {"exp_avg", r.exp_avg},
          {"exp_avg_sq", r.exp_avg_sq},
          {"gathered_weights", r.gathered},
          {"comm_buffers", r.comm},
          {"activations_per_microbatch", r.act_per_microbatch},
          {"inflight_microbatches", r.inflight},
          {"activations", r.activations},
          {"backward_transient", r.backward_transient},
          {"evaluation_peak", r.eval_peak},
          {"peak", r.peak}};
}

std::string human(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

// "0-3,8" from sorted ranks.
std::string rank_list(const std::vector<int>& r) {
  std::string out;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? fmt::format("{}", r[i]) : fmt::format("{}-{}", r[i], r[j]);
    i = j + 1;
  }
  return out;
}

// Groups of ranks with identical plans, in order of their first rank.
std::vector<std::pair<std::vector<int>, const RankPlan*>> rank_groups(const TrainPlan& p) {
  std::map<std::string, size_t> index;
  std::vector<std::pair<std::vector<int>, const RankPlan*>> groups;
  for (const RankPlan& r : p.ranks) {
    const std::string key = rank_json(r).dump();
    auto [it, fresh] = index.emplace(key, groups.size());
    if (fresh) groups.push_back({{}, &r});
    groups[it->second].first.push_back(r.rank);
  }
  return groups;
}

}  // namespace

nlohmann::ordered_json train_plan_json(const TrainPlan& p) {
  nlohmann::ordered_json j;
  j["microbatches"] = p.microbatches;
  j["total_params"] = p.total_params;
  j["checkpoint_bytes"] = p.checkpoint_bytes;
  j["flops_per_token"] = p.flops_per_token;
  j["tokens_per_step"] = p.tokens_per_step;
  j["step_seconds"] = p.step_seconds;
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const auto& [ranks, r] : rank_groups(p)) {
    nlohmann::ordered_json g = rank_json(*r);
    g["ranks"] = ranks;
    groups.push_back(g);
  }
  j["rank_groups"] = groups;
  int64_t peak = 0;
  for (const RankPlan& r : p.ranks) peak = std::max(peak, r.peak);
  j["max_peak"] = peak;
  return j;
}

std::string train_plan_text(const TrainPlan& p, const TrainConfig& cfg, double mfu,
                            double peak_tflops) {
  const ModelConfig& m = cfg.model;
  const char* dt = m.bf16 ? "bf16" : "fp32";
  auto mdt = [](c10::ScalarType t) { return t == at::kBFloat16 ? "bf16" : "fp32"; };
  std::string out = fmt::format(
      "weft plan: {} parameters | {} microbatch(es) of {} x {} tokens per step and dp rank | "
      "{} compute, fp32 master, moments {}/{}{}\n",
      p.total_params, p.microbatches, cfg.micro_batch_size, m.seq_length, dt,
      mdt(cfg.adam.exp_avg_dtype), mdt(cfg.adam.exp_avg_sq_dtype),
      cfg.step_batch_size_schedule.empty()
          ? ""
          : " (the largest batch of --step-batch-size-schedule)");
  for (const auto& [ranks, r] : rank_groups(p)) {
    out += fmt::format("ranks {} (stage {}): {} parameters in shards\n", rank_list(ranks),
                       r->stage, r->params);
    auto line = [&](const char* what, int64_t b, const std::string& note = "") {
      out += fmt::format("  {:<26} {:>12}{}\n", what, human(b), note.empty() ? "" : "  " + note);
    };
    line("weights", r->weights,
         m.bf16 ? "bf16 shards" : "fp32: the master shard is the weight");
    line("gradients", r->grads,
         cfg.adam.grad_dtype == at::kBFloat16 ? "bf16 shards" : "fp32 shards");
    line("master weights", r->master, "fp32");
    line("Adam exp_avg", r->exp_avg, mdt(cfg.adam.exp_avg_dtype));
    line("Adam exp_avg_sq", r->exp_avg_sq, mdt(cfg.adam.exp_avg_sq_dtype));
    line("gathered weights", r->gathered, "FSDP all-gather: unit computing + prefetched");
    line("communication buffers", r->comm,
         "reduce-scatter, pipeline send/recv, expert all-to-all");
    line("activations", r->activations,
         fmt::format("{} microbatch(es) in flight x {}", r->inflight, human(r->act_per_microbatch)));
    line("backward working set", r->backward_transient);
    if (r->eval_peak > 0)
      line("evaluation peak", r->eval_peak,
           fmt::format("forward only, micro-batch {}{}", cfg.eval_micro_batch(),
                       r->eval_peak == r->peak ? ": the larger" : ""));
    line("estimated peak", r->peak);
  }
  out += fmt::format("checkpoint: {} (model {}, fp32 master, moments)\n", human(p.checkpoint_bytes), dt);
  const std::string step = p.step_seconds >= 1 ? fmt::format("{:.3g} s", p.step_seconds)
                                                : fmt::format("{:.3g} ms", p.step_seconds * 1e3);
  out += fmt::format(
      "compute: {:.4g} GFLOPs per token x {} tokens per step -> {} per step at MFU {} of {} "
      "TFLOP/s per GPU\n",
      p.flops_per_token / 1e9, p.tokens_per_step, step, mfu, peak_tflops);
  return out;
}

}  // namespace weft
