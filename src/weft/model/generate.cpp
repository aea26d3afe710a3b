// Incremental decoding and sampling (see generate.h).
//
// A forward call at position 0 is the training forward (causal attention over the call's own
// keys, the chunked SSD scan), and also leaves the caches: keys and values, the conv's last
// inputs, and the SSD state after the call, computed chunk by chunk as ssd_chunked's chunk end
// states are. A call at position p > 0 attends over the cached keys with an offset causal mask
// (query i sees keys 0 .. p + i) and runs the SSD recurrence one token at a time. Everything
// here runs without autograd.
#include "weft/model/generate.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "weft/core/compat.h"
#include "weft/core/error.h"
#include "weft/model/mamba.h"
#include "weft/model/moe.h"
#include "weft/model/ops.h"

namespace weft {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Rotary tables covering `positions` (at least the training seq_length; the same rows there).
RotaryTables rotary_for(const ModelConfig& cfg, int64_t positions, c10::Device device,
                        c10::ScalarType dtype) {
  ModelConfig c = cfg;
  c.seq_length = static_cast<int>(std::max<int64_t>(cfg.seq_length, positions));
  return make_rotary_tables(c, device, dtype);
}

// Attention of q [b, nh, n, hd] at positions [pos, pos + n) over k, v [b, ng, pos + n, hd]:
// query i sees keys 0 .. pos + i. Scores, mask and softmax in the accumulation dtype, the two
// matmuls in the compute dtype, scale 1/sqrt(hd) (or `scale` where positive), as the training
// attention. v's head dim may differ from q's (MLA).
at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t pos, double scale) {
  const int64_t b = q.size(0), nh = q.size(1), n = q.size(2), hd = q.size(3);
  const int64_t ng = k.size(1), len = k.size(2), r = nh / ng;
  auto expand = [&](const at::Tensor& t) {  // GQA: query head h reads group h / r
    const int64_t d = t.size(3);
    return r == 1 ? t : t.unsqueeze(2).expand({b, ng, r, len, d}).reshape({b, nh, len, d});
  };
  const auto acc = ops::accum_dtype(q.scalar_type());
  at::Tensor scores = at::matmul(q, expand(k).transpose(-2, -1)).to(acc) *
                      (scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(hd)));
  if (n > 1) {
    const auto idx = at::TensorOptions().dtype(at::kLong).device(q.device());
    const at::Tensor future =
        at::arange(len, idx).unsqueeze(0) > (at::arange(n, idx) + pos).unsqueeze(1);  // [n, len]
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  return at::matmul(at::softmax(scores, -1).to(v.scalar_type()), expand(v));
}

// [b, s, ng, ds] -> [b, s, nh, ds]: head h reads group h / (nh / ng).
at::Tensor per_head(const at::Tensor& t, int64_t nh) {
  const int64_t r = nh / t.size(2);
  return r == 1 ? t : t.repeat_interleave(r, 2);
}

// The SSD state after in's s steps from a zero state, chunk by chunk as ssd_chunked combines
// its chunk end states: S <- exp(sum of the chunk's a) S + sum_j exp(cs_last - cs_j) u_j B_j^T.
at::Tensor ssd_final_state(const MambaScanInputs& in, int64_t chunk) {
  const int64_t b = in.x.size(0), s = in.x.size(1), nh = in.x.size(2), hd = in.x.size(3);
  const at::Tensor Bh = per_head(in.B, nh);                       // [b, s, nh, ds]
  at::Tensor S = at::zeros({b, nh, hd, Bh.size(3)}, in.x.options());
  for (int64_t t0 = 0; t0 < s; t0 += chunk) {
    const int64_t q = std::min(chunk, s - t0);
    const at::Tensor dt = in.dt.narrow(1, t0, q);                  // [b, q, nh]
    const at::Tensor cs = (dt * in.A).cumsum(1);                   // [b, q, nh]
    const at::Tensor last = cs.narrow(1, q - 1, 1);                // [b, 1, nh]
    const at::Tensor u = in.x.narrow(1, t0, q) * (dt * (last - cs).exp()).unsqueeze(-1);
    const at::Tensor add = compat::matmul(u.permute({0, 2, 3, 1}),  // [b, nh, hd, q]
                                          Bh.narrow(1, t0, q).permute({0, 2, 1, 3}));  // [b, nh, q, ds]
    S = S * last.squeeze(1).exp().view({b, nh, 1, 1}) + add;
  }
  return S;
}

}  // namespace

// --- InferenceModel ----------------------------------------------------------------------------

InferenceModel::InferenceModel(const ModelConfig& cfg, const ValueFn& value, c10::Device device,
                               c10::ScalarType dtype)
    : cfg_(cfg), device_(device), dtype_(dtype), params_(std::make_unique<FullParams>()) {
  check_model_config(cfg_);
  // Generation is dropless, as Megatron's inference router: a capacity fitted to a training
  // micro-batch would drop tokens of a prompt or a decoding step by how they happen to be batched.
  cfg_.moe_expert_capacity_factor = -1;
  cfg_.moe_pad_expert_input_to_capacity = false;
  at::NoGradGuard no_grad;
  for (const ParamSpec& spec : all_param_specs(cfg_)) {
    if (starts_with(spec.name, "mtp.")) continue;  // the main head alone generates
    const at::Tensor v = value(spec);
    if (!v.defined())
      fail_usage("weight '{}' (shape [{}]) is missing", spec.name, fmt::join(spec.shape, ", "));
    if (v.sizes() != at::IntArrayRef(spec.shape))
      fail_usage("weight '{}' has shape [{}], the model expects [{}]", spec.name,
                 fmt::join(v.sizes(), ", "), fmt::join(spec.shape, ", "));
    params_->add(spec, v.to(device_, dtype_).contiguous());
  }
  FullParams& p = *params_;
  auto handle = [&](const std::string& name) { return p.handle(p.find(name)); };
  embedding_ = handle(embedding_param_spec(cfg_).name);
  final_norm_ = handle(final_norm_param_spec(cfg_).name);
  output_ = cfg_.tied() ? embedding_ : handle(output_param_spec(cfg_).name);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const std::string prefix = layer_prefix(l);
    MoeExperts* experts = nullptr;
    if (cfg_.is_moe_layer(l)) {
      std::vector<ParamHandle> fc1, fc2;
      const auto specs = expert_param_specs(cfg_, prefix, 0, cfg_.num_experts);
      for (int e = 0; e < cfg_.num_experts; ++e) {
        fc1.push_back(handle(specs[static_cast<size_t>(e)].name));
        fc2.push_back(handle(specs[static_cast<size_t>(cfg_.num_experts + e)].name));
      }
      experts_.push_back(std::make_unique<LocalExperts>(std::move(fc1), std::move(fc2),
                                                        cfg_.expert_mlp(), cfg_.moe_grouped_gemm));
      experts = experts_.back().get();
    }
    const std::vector<ParamSpec> specs = layer_param_specs(cfg_, l);
    layers_.push_back(layer_handles(&p, p.find(specs.front().name), specs, prefix, experts));
    if (cfg_.is_moe_layer(l) && cfg_.moe_router_enable_expert_bias) {
      // The router's expert bias chooses the experts as in training (no update here).
      const std::string name = router_bias_name(prefix);
      const at::Tensor v = value({name, {cfg_.num_experts}, InitKind::kZeros, false});
      if (!v.defined() || v.numel() != cfg_.num_experts)
        fail_usage("expert bias '{}' (float32 [{}]) is missing", name, cfg_.num_experts);
      biases_.push_back(std::make_unique<RouterBias>(
          make_router_bias(v.to(device_, at::kFloat).reshape({-1}).contiguous())));
      layers_.back().router_bias = biases_.back().get();
    }
  }
}

InferenceModel::~InferenceModel() = default;

at::Tensor InferenceModel::full_logits(const at::Tensor& tokens) const {
  at::NoGradGuard no_grad;
  const RotaryTables rope = rotary_for(cfg_, tokens.size(1), device_, dtype_);
  at::Tensor x = embed_tokens(tokens.to(device_), embedding_);
  for (const LayerHandles& w : layers_) x = decoder_layer(x, w, rope, cfg_);
  return output_logits(weft::final_norm(x, final_norm_, cfg_), output_);
}

// --- DecodeState -------------------------------------------------------------------------------

DecodeState::DecodeState(const InferenceModel& model, int64_t batch, int64_t capacity)
    : model_(model), batch_(batch), capacity_(capacity) {
  const ModelConfig& cfg = model.config();
  WEFT_CHECK(batch >= 1 && capacity >= 1, "DecodeState: batch {} and capacity {} must be >= 1",
             batch, capacity);
  rope_ = rotary_for(cfg, capacity, model.device(), model.dtype());
  const auto compute = at::TensorOptions().dtype(model.dtype()).device(model.device());
  const auto acc = compute.dtype(ops::accum_dtype(model.dtype()));
  for (const LayerHandles& w : model.layers()) {
    LayerCache c;
    if (w.has_attention() && cfg.mla()) {  // every head its own key and value
      c.k = at::zeros({batch, cfg.num_attention_heads, capacity, cfg.mla_q_head_dim()}, compute);
      c.v = at::zeros({batch, cfg.num_attention_heads, capacity, cfg.v_head_dim}, compute);
    } else if (w.has_attention()) {
      c.k = at::zeros({batch, cfg.num_query_groups, capacity, cfg.head_dim()}, compute);
      c.v = at::zeros_like(c.k);
    }
    if (w.mamba.in_proj.source) {
      const int64_t nh = cfg.mamba_heads();
      const int64_t channels = nh * cfg.mamba_head_dim + 2 * cfg.mamba_num_groups * cfg.mamba_state_dim;
      const int64_t kernel = 4;  // mixer.conv1d.weight [channels, 1, 4]
      c.conv = at::zeros({batch, kernel - 1, channels}, acc);
      c.ssm = at::zeros({batch, nh, cfg.mamba_head_dim, cfg.mamba_state_dim}, acc);
    }
    caches_.push_back(std::move(c));
  }
}

at::Tensor DecodeState::attention(const at::Tensor& x, const LayerHandles& w, LayerCache& c) {
  const ModelConfig& cfg = model_.config();
  const int64_t n = x.size(1), pos = length_;
  const AttentionQkv a = attention_qkv(x, w, rope_, cfg, pos);
  c.k.narrow(2, pos, n).copy_(a.k);
  c.v.narrow(2, pos, n).copy_(a.v);
  const double scale = attention_softmax_scale(cfg);
  const at::Tensor attn =
      pos == 0 ? compat::causal_attention_gqa(a.q, a.k, a.v, scale)  // the training attention
               : cached_attention(a.q, c.k.narrow(2, 0, pos + n), c.v.narrow(2, 0, pos + n), pos,
                                  scale);
  return attention_residual(x, attn, w, cfg);
}

at::Tensor DecodeState::mamba(const at::Tensor& x, const MambaHandles& w, LayerCache& c) {
  const ModelConfig& cfg = model_.config();
  const int64_t n = x.size(1), nh = cfg.mamba_heads();
  const auto acc = ops::accum_dtype(x.scalar_type());
  const MambaProjections p = mamba_in_proj(x, w, cfg);
  const at::Tensor conv_in = p.xbc.to(acc);
  const at::Tensor taps = ops::param_value(w.conv_weight).to(acc);
  const at::Tensor bias = ops::param_value(w.conv_bias).to(acc);
  const int64_t keep = c.conv.size(1);  // kernel - 1
  const at::Tensor with_past = at::cat({c.conv, conv_in}, 1);  // [b, keep + n, channels]
  const at::Tensor xbc =
      length_ == 0 ? at::silu(causal_conv1d(conv_in, taps, bias))  // the training conv
                   : at::silu(causal_conv1d(with_past, taps, bias).narrow(1, keep, n));
  c.conv = with_past.narrow(1, n, keep).clone();
  const MambaScanInputs in = mamba_scan_inputs(xbc, p.dt, w, cfg);
  at::Tensor y;
  if (length_ == 0) {  // the training scan, and its final state
    y = ssd_chunked(in.x, in.dt, in.A, in.B, in.C, cfg.mamba_chunk_size,
                    mamba_ssd_io_dtype(x.scalar_type()));
    c.ssm = ssd_final_state(in, cfg.mamba_chunk_size);
  } else {  // the recurrence, token by token
    const at::Tensor Bh = per_head(in.B, nh), Ch = per_head(in.C, nh);  // [b, n, nh, ds]
    std::vector<at::Tensor> ys;
    for (int64_t t = 0; t < n; ++t) {
      const at::Tensor dt = in.dt.select(1, t);                          // [b, nh]
      const at::Tensor decay = (dt * in.A).exp().unsqueeze(-1).unsqueeze(-1);
      const at::Tensor u = in.x.select(1, t) * dt.unsqueeze(-1);         // [b, nh, hd]
      c.ssm = c.ssm * decay + u.unsqueeze(-1) * Bh.select(1, t).unsqueeze(2);
      ys.push_back(compat::matmul(c.ssm, Ch.select(1, t).unsqueeze(-1)).squeeze(-1));
    }
    y = at::stack(ys, 1);  // [b, n, nh, hd]
  }
  y = y + in.x * in.D.view({nh, 1});
  return mamba_out_proj(y, p.z, w, cfg, x.scalar_type());
}

at::Tensor DecodeState::forward(const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  WEFT_CHECK(tokens.dim() == 2 && tokens.size(0) == batch_ && tokens.size(1) >= 1,
             "DecodeState::forward: tokens must be [{}, n >= 1]", batch_);
  const int64_t n = tokens.size(1);
  WEFT_CHECK(length_ + n <= capacity_, "DecodeState::forward: {} + {} tokens exceed the capacity {}",
             length_, n, capacity_);
  const ModelConfig& cfg = model_.config();
  at::Tensor x = embed_tokens(tokens.to(model_.device(), at::kLong), model_.embedding());
  for (size_t l = 0; l < caches_.size(); ++l) {
    const LayerHandles& w = model_.layers()[l];
    if (w.has_attention()) x = attention(x, w, caches_[l]);
    if (w.mamba.in_proj.source) x = x + mamba(x, w.mamba, caches_[l]);
    x = mlp_block(x, w, cfg);
  }
  length_ += n;
  return output_logits(final_norm(x, model_.final_norm(), cfg), model_.output());
}

// --- sampling ----------------------------------------------------------------------------------

void check_sampling_options(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    fail_usage("--temperature must be a finite number >= 0 (got {})", o.temperature);
  if (o.top_k < 0) fail_usage("--top-k must be >= 0 (got {}; 0 keeps every token)", o.top_k);
  if (!(o.top_p >= 0 && o.top_p <= 1))
    fail_usage("--top-p must be in [0, 1] (got {}; 0, Megatron's off, and 1 keep every token)",
               o.top_p);
}

int64_t sample_token(const at::Tensor& logits, const SamplingOptions& o, at::Generator& gen) {
  at::Tensor l = logits.detach().reshape({-1}).to(at::kCPU, at::kDouble);
  if (o.vocab_limit > 0 && o.vocab_limit < l.size(0)) l = l.narrow(0, 0, o.vocab_limit);
  const int64_t V = l.size(0);
  WEFT_CHECK(V >= 1, "sample_token: empty logits");
  if (o.temperature == 0) return l.argmax().item<int64_t>();
  // Most likely first; a stable sort keeps lower ids first among ties.
  auto [sorted, ids] = at::sort(l / o.temperature, /*stable=*/true, 0, /*descending=*/true);
  int64_t keep = o.top_k > 0 ? std::min(o.top_k, V) : V;
  at::Tensor probs = at::softmax(sorted.narrow(0, 0, keep), 0).contiguous();
  const double* p = probs.data_ptr<double>();
  if (o.top_p > 0 && o.top_p < 1) {
    double cum = 0;
    int64_t m = 0;
    while (m < keep) {
      cum += p[m++];
      if (cum >= o.top_p) break;
    }
    keep = m;
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += p[i];
  const double u = at::empty({1}, at::TensorOptions().dtype(at::kDouble)).uniform_(0.0, 1.0, gen)
                       .item<double>() * total;
  double cum = 0;
  int64_t pick = keep - 1;  // rounding: fall back to the last kept token
  for (int64_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (u < cum) {
      pick = i;
      break;
    }
  }
  return ids[pick].item<int64_t>();
}

// --- the generation loop -----------------------------------------------------------------------

GenerateResult generate(const InferenceModel& model, const std::vector<int64_t>& prompt,
                        const GenerateOptions& opt) {
  WEFT_CHECK(!prompt.empty(), "generate: the prompt is empty");
  WEFT_CHECK(opt.max_new_tokens >= 0, "generate: max_new_tokens {} < 0", opt.max_new_tokens);
  check_sampling_options(opt.sampling);
  using clock = std::chrono::steady_clock;
  GenerateResult r;
  if (opt.max_new_tokens == 0) return r;
  at::Generator gen = compat::make_cpu_generator(opt.seed);
  const int64_t n = static_cast<int64_t>(prompt.size());
  DecodeState state(model, 1, n + opt.max_new_tokens);
  const auto t0 = clock::now();
  const at::Tensor ids = at::tensor(prompt, at::TensorOptions().dtype(at::kLong)).view({1, n});
  at::Tensor logits = state.forward(ids);
  int64_t next = sample_token(logits[0][n - 1], opt.sampling, gen);  // synchronises the device
  r.tokens.push_back(next);
  const auto t1 = clock::now();
  while (static_cast<int64_t>(r.tokens.size()) < opt.max_new_tokens && next != opt.stop_token) {
    logits = state.forward(at::full({1, 1}, next, at::TensorOptions().dtype(at::kLong)));
    next = sample_token(logits[0][0], opt.sampling, gen);
    r.tokens.push_back(next);
  }
  const auto t2 = clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  return r;
}

}  // namespace weft
