// Mixture-of-experts MLP (see moe.h): routing, the aux loss, the expert-sorted permutation, the
// grouped experts and the weighted combine.
//
// Invariants: the (token, slot) pairs are sorted by global expert with a stable sort, so rows of
// one expert keep token order; permutations go both ways as gathers (no scatter-add), and the
// combine reduces each token's k slots in slot order, so a step is bitwise repeatable on CPU and
// CUDA and independent of how the experts are spread over ranks (up to the summation order of
// weight gradients inside an expert).
#include "weft/model/moe.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/div.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sign.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cctype>
#include <cmath>
#include <numeric>
#include <string>
#include <limits>
#include <tuple>

#include "weft/core/error.h"
#include "weft/model/ops.h"
#include "weft/model/transformer.h"

namespace weft {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

struct PermuteRowsFn : Function<PermuteRowsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& perm,
                            const at::Tensor& inverse) {
    ctx->save_for_backward({inverse});
    return x.index_select(0, perm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor inverse = ctx->get_saved_variables()[0];
    return {grads[0].index_select(0, inverse), at::Tensor(), at::Tensor()};
  }
};

// --- --moe-layer-freq: a tiny parser for Python list expressions of 0/1 -----------------------

class PatternParser {
 public:
  explicit PatternParser(const std::string& s) : s_(s) {}
  std::vector<int> parse() {
    std::vector<int> v = sum();
    skip();
    if (pos_ != s_.size()) bad("unexpected '" + s_.substr(pos_, 1) + "'");
    return v;
  }

 private:
  [[noreturn]] void bad(const std::string& why) {
    fail_usage("--moe-layer-freq '{}': {} (give an int N or a list such as [0,1,1,1] or "
               "([1]*3+[0])*2)", s_, why);
  }
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  long integer() {
    skip();
    size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (start == pos_) bad("expected a number");
    if (pos_ - start > 6) bad("number too large");
    return std::stol(s_.substr(start, pos_ - start));
  }
  std::vector<int> sum() {
    std::vector<int> v = product();
    while (eat('+')) {
      std::vector<int> r = product();
      v.insert(v.end(), r.begin(), r.end());
    }
    return v;
  }
  std::vector<int> product() {
    std::vector<int> v = atom();
    while (eat('*')) {
      const long n = integer();
      if (v.size() * static_cast<size_t>(n) > 100000) bad("pattern too long");
      std::vector<int> r;
      for (long i = 0; i < n; ++i) r.insert(r.end(), v.begin(), v.end());
      v = std::move(r);
    }
    return v;
  }
  std::vector<int> atom() {
    if (eat('(')) {
      std::vector<int> v = sum();
      if (!eat(')')) bad("missing ')'");
      return v;
    }
    if (!eat('[')) bad("expected '[' or '('");
    std::vector<int> v;
    if (eat(']')) return v;
    do {
      const long x = integer();
      if (x != 0 && x != 1) bad("entries must be 0 (dense) or 1 (MoE)");
      v.push_back(static_cast<int>(x));
    } while (eat(','));
    if (!eat(']')) bad("missing ']'");
    return v;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<int> parse_moe_layer_freq(const std::string& value, int num_layers) {
  if (value.find('[') == std::string::npos) {
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != value.size() || n < 1)
      fail_usage("--moe-layer-freq must be a positive int or a list such as [0,1,1,1] (got '{}')",
                 value);
    std::vector<int> v(num_layers);
    for (int i = 0; i < num_layers; ++i) v[i] = i % n == 0 ? 1 : 0;
    return v;
  }
  std::vector<int> v = PatternParser(value).parse();
  if (static_cast<int>(v.size()) != num_layers)
    fail_usage("--moe-layer-freq {} has {} entries, but --num-layers is {} (one 0/1 per layer)",
               value, v.size(), num_layers);
  return v;
}

// Pairs routed to each of E experts, as int64 [E] on the experts' device. (at::bincount would
// read the maximum back to the host on CUDA: one synchronisation more per layer.)
static at::Tensor pairs_per_expert(const at::Tensor& experts, int64_t E) {
  const at::Tensor flat = experts.reshape({-1});
  return at::zeros({E}, flat.options()).scatter_add_(0, flat, at::ones_like(flat));
}

int64_t expert_capacity(int64_t tokens, const ModelConfig& cfg) {
  // Megatron's get_capacity(num_tokens = T * k): ceil((T * k / E) * F), in double as Python's.
  // Clamped at `tokens` (an expert takes at most one pair per token), so that a huge factor
  // cannot overflow the cast.
  const double pairs = static_cast<double>(tokens) * cfg.moe_router_topk;
  const double capacity = std::ceil(pairs / cfg.num_experts * cfg.moe_expert_capacity_factor);
  return capacity >= static_cast<double>(tokens) ? tokens : static_cast<int64_t>(capacity);
}

// [T * k] bool: whether pair t * k + slot is among the first `capacity` pairs of its expert, the
// pairs of an expert ranked by --moe-token-drop-policy: probs, the combine weight, highest first;
// position, the token's place in Megatron's order, whose hidden states are [s, b] (all first
// positions of the micro-batch, then all second ones, ...), where weft's rows are [b, s] (row
// t = i * s + pos). Equal weights keep that order too, so the choice is deterministic.
static at::Tensor kept_pairs(const MoeRouting& r, int64_t sequences, int64_t capacity,
                             const ModelConfig& cfg) {
  const int64_t T = r.experts.size(0), k = r.experts.size(1), b = sequences, s = T / b;
  const auto opts = r.experts.options();
  const at::Tensor t = at::arange(T, opts);
  const at::Tensor key = t.remainder(s) * b + at::div(t, s, "trunc");
  at::Tensor perm = std::get<1>(
      at::sort(key.unsqueeze(1).expand({T, k}).reshape({-1}), /*stable=*/true, 0, false));
  if (cfg.moe_token_drop_policy == "probs") {
    const at::Tensor p = r.probs.detach().reshape({-1}).index_select(0, perm);
    perm = perm.index_select(0, std::get<1>(at::sort(p, /*stable=*/true, 0, /*descending=*/true)));
  }
  const at::Tensor e = r.experts.reshape({-1}).index_select(0, perm);
  const at::Tensor by_expert = std::get<1>(at::sort(e, /*stable=*/true, 0, false));
  perm = perm.index_select(0, by_expert);
  const at::Tensor e_sorted = e.index_select(0, by_expert);
  const at::Tensor counts = pairs_per_expert(e_sorted, cfg.num_experts);
  const at::Tensor first = counts.cumsum(0) - counts;  // each expert's first sorted pair
  const at::Tensor rank = at::arange(T * k, opts) - first.index_select(0, e_sorted);
  at::Tensor kept = at::empty({T * k}, opts.dtype(at::kBool));
  kept.index_put_({perm}, rank.lt(capacity));
  return kept;
}

at::Tensor permute_rows(const at::Tensor& x, const at::Tensor& perm, const at::Tensor& inverse) {
  return PermuteRowsFn::apply(x, perm, inverse);
}

at::Tensor grouped_expert_mlp(const at::Tensor& rows, const std::vector<int64_t>& counts,
                              const std::vector<ParamHandle>& fc1,
                              const std::vector<ParamHandle>& fc2, const MlpSpec& spec,
                              bool grouped_gemm) {
  if (grouped_gemm && grouped_gemm_usable(rows, spec.ffn))
    return grouped_gemm_expert_mlp(rows, counts, fc1, fc2, spec);
  WEFT_CHECK(counts.size() == fc1.size() && fc1.size() == fc2.size(),
             "grouped_expert_mlp: {} counts for {} / {} experts", counts.size(), fc1.size(),
             fc2.size());
  WEFT_CHECK(std::accumulate(counts.begin(), counts.end(), int64_t{0}) == rows.size(0),
             "grouped_expert_mlp: counts sum to {}, rows {}",
             std::accumulate(counts.begin(), counts.end(), int64_t{0}), rows.size(0));
  std::vector<at::Tensor> outs;
  outs.reserve(counts.size());
  int64_t offset = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    // An expert without rows still runs on an empty slice: its weights are used once and get
    // a (zero) gradient, so every rank walks the same use/gradient protocol.
    outs.push_back(mlp(rows.narrow(0, offset, counts[e]), fc1[e], fc2[e], spec));
    offset += counts[e];
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

// The top k of `scores` per token ([T, E]), sorted, as Megatron's compute_topk: with group-limited
// routing only the experts of each token's --moe-router-group-topk best groups compete, a group
// scored by the sum of its top (k / group_topk) scores.
std::tuple<at::Tensor, at::Tensor> router_topk(const at::Tensor& scores, int64_t k,
                                               const ModelConfig& cfg) {
  if (cfg.moe_router_group_topk <= 0) return at::topk(scores, k, -1, /*largest=*/true, /*sorted=*/true);
  const int64_t T = scores.size(0), E = scores.size(1), G = cfg.moe_router_num_groups;
  const int64_t g = cfg.moe_router_group_topk;
  WEFT_CHECK(G >= 1 && E % G == 0 && g <= G && k >= g && g * (E / G) >= k,
             "router_topk: {} experts, {} groups, group top {}, top {}", E, G, g, k);
  const at::Tensor grouped = scores.view({T, G, E / G});
  const at::Tensor group_scores =
      std::get<0>(at::topk(grouped, k / g, -1, /*largest=*/true, /*sorted=*/false)).sum(-1);
  const at::Tensor chosen = std::get<1>(at::topk(group_scores, g, -1, true, /*sorted=*/false));
  const at::Tensor keep = at::zeros({T, G}, scores.options().dtype(at::kBool))
                              .scatter_(1, chosen, true)
                              .unsqueeze(-1)
                              .expand({T, G, E / G})
                              .reshape({T, E});
  return at::topk(scores.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity()),
                  k, -1, /*largest=*/true, /*sorted=*/true);
}

MoeRouting route_tokens(const at::Tensor& logits, const ModelConfig& cfg,
                        const at::Tensor& expert_bias, int64_t sequences) {
  const int64_t T = logits.size(0), E = logits.size(1), k = cfg.moe_router_topk;
  WEFT_CHECK(E == cfg.num_experts && k >= 1 && k <= E, "route_tokens: logits [{}, {}], topk {}",
             T, E, k);
  const at::Tensor z = logits.to(ops::accum_dtype(logits.scalar_type()));  // fp64 in references
  MoeRouting r;
  at::Tensor scores;  // over all experts, for the aux loss
  if (cfg.moe_router_score_function == "softmax" && cfg.moe_router_pre_softmax) {
    // --moe-router-pre-softmax: the top k of the softmax over all experts, kept as they are.
    scores = at::softmax(z, -1);
    auto [top, idx] = router_topk(scores, k, cfg);
    r.experts = idx;
    r.probs = top;
  } else if (cfg.moe_router_score_function == "softmax") {
    auto [top, idx] = router_topk(z, k, cfg);
    r.experts = idx;
    r.probs = at::softmax(top, -1);
    scores = at::softmax(z, -1);
  } else {
    WEFT_CHECK(cfg.moe_router_score_function == "sigmoid", "unknown score function '{}'",
               cfg.moe_router_score_function);
    const at::Tensor s = at::sigmoid(z);
    at::Tensor top, idx;
    if (expert_bias.defined()) {  // the biased scores choose; the scores weigh
      WEFT_CHECK(expert_bias.numel() == E, "route_tokens: expert bias of {} for {} experts",
                 expert_bias.numel(), E);
      idx = std::get<1>(router_topk(s + expert_bias.to(s.scalar_type()), k, cfg));
      top = s.gather(-1, idx);
    } else {
      std::tie(top, idx) = router_topk(s, k, cfg);
    }
    r.experts = idx;
    r.probs = k > 1 ? top / (top.sum(-1, /*keepdim=*/true) + 1e-20) : top;
    scores = s / (s.sum(-1, /*keepdim=*/true) + 1e-20);
  }
  if (cfg.moe_router_topk_scaling_factor > 0)
    r.probs = r.probs * cfg.moe_router_topk_scaling_factor;
  // The aux loss counts the top k of the scores over all experts, without the expert bias and
  // the group limit (Megatron's compute_routing_scores_for_aux_loss): the routing's own choices
  // when it has neither.
  const at::Tensor aux_experts = expert_bias.defined() || cfg.moe_router_group_topk > 0
                                     ? std::get<1>(at::topk(scores, k, -1, true, true))
                                     : r.experts;
  // seq_aux_loss: the loss of each sequence (T / sequences consecutive tokens), averaged.
  const int64_t groups = cfg.moe_router_load_balancing_type == "seq_aux_loss" ? sequences : 1;
  WEFT_CHECK(groups >= 1 && T % groups == 0, "route_tokens: {} tokens in {} sequences", T, groups);
  const int64_t S = T / groups;
  const at::Tensor chosen = aux_experts.reshape({groups, S * k});
  const at::Tensor per_expert = at::zeros({groups, E}, chosen.options())
                                    .scatter_add_(1, chosen, at::ones_like(chosen))
                                    .to(z.scalar_type());
  const double c = static_cast<double>(E) / (static_cast<double>(k) * S * S);
  r.aux_loss = (scores.view({groups, S, E}).sum(1) * per_expert).sum() * (c / groups);
  r.z_loss = cfg.moe_z_loss_coeff > 0 ? at::logsumexp(z, {-1}).square().mean()
                                      : at::zeros({}, z.options());
  return r;
}

RouterBias make_router_bias(const at::Tensor& bias) {
  WEFT_CHECK(bias.dim() == 1 && bias.scalar_type() == at::kFloat,
             "make_router_bias: a float32 [E] bias");
  return {bias, at::zeros(bias.sizes(), bias.options().dtype(at::kDouble))};
}

at::Tensor updated_expert_bias(const at::Tensor& pairs, const at::Tensor& bias, double rate) {
  WEFT_CHECK(pairs.sizes() == bias.sizes() && bias.scalar_type() == at::kFloat,
             "updated_expert_bias: pairs and float32 bias of one shape");
  const at::Tensor offset = pairs.sum(-1, /*keepdim=*/true) / pairs.size(-1) - pairs;
  return bias + at::sign(offset).to(at::kFloat).mul(rate);
}

at::Tensor moe_mlp(const at::Tensor& xn, ParamHandle router, ParamHandle shared_fc1,
                   ParamHandle shared_fc2, MoeExperts& experts, const ModelConfig& cfg,
                   at::Tensor* aux_loss, RouterBias* bias) {
  const int64_t h = xn.size(-1), k = cfg.moe_router_topk, E = cfg.num_experts;
  const at::Tensor x = xn.reshape({-1, h});
  const int64_t T = x.size(0);
  // --moe-router-dtype: the router's GEMM in float32/float64 where the compute dtype is narrower.
  const c10::ScalarType rt = cfg.moe_router_dtype == "fp64"   ? at::kDouble
                             : cfg.moe_router_dtype == "fp32" ? at::kFloat
                                                              : x.scalar_type();
  const at::Tensor logits = c10::elementSize(rt) > c10::elementSize(x.scalar_type())
                                ? ops::linear_in(x, router, rt)
                                : ops::linear(x, router);
  MoeRouting r = route_tokens(logits, cfg, bias ? bias->bias : at::Tensor(),
                              xn.dim() == 3 ? xn.size(0) : 1);
  if (aux_loss) {
    const at::Tensor losses = at::stack({r.aux_loss, r.z_loss});
    *aux_loss = aux_loss->defined() ? *aux_loss + losses : losses;
  }

  // Token dropping (--moe-expert-capacity-factor): a pair past its expert's capacity goes to
  // "expert E", after every real one, and runs nowhere: its output is 0, so it adds nothing to
  // its token and its weight gets a zero gradient (Megatron's probs * mask). A capacity of T or
  // more drops nothing (an expert gets at most one pair per token).
  at::Tensor expert_of_pair = r.experts.reshape({-1});
  int64_t padded = -1;  // --moe-pad-expert-input-to-capacity: every expert's count
  if (cfg.moe_drops_tokens()) {
    const int64_t capacity = expert_capacity(T, cfg);
    if (capacity < T)
      expert_of_pair = expert_of_pair.masked_fill(
          kept_pairs(r, xn.dim() == 3 ? xn.size(0) : 1, capacity, cfg).logical_not(), E);
    if (cfg.moe_pad_expert_input_to_capacity) padded = std::min(capacity, T);
  }
  // Pairs p = t*k + slot, stably sorted by expert: rows of one expert keep token order.
  const at::Tensor order = std::get<1>(at::sort(expert_of_pair, /*stable=*/true, 0, false));
  const at::Tensor inverse = at::empty_like(order);
  inverse.index_put_({order}, at::arange(T * k, order.options()));
  const at::Tensor pairs_t = pairs_per_expert(expert_of_pair, E + 1).narrow(0, 0, E);
  if (bias && at::GradMode::is_enabled()) {
    // Megatron counts the routing map after the drop; padded, that map is the capacity's.
    if (padded >= 0)
      bias->pairs.add_(static_cast<double>(padded));
    else
      bias->pairs.add_(pairs_t.to(bias->pairs.scalar_type()));
  }
  const at::Tensor counts_t = pairs_t.cpu();  // the one host sync
  std::vector<int64_t> counts(counts_t.data_ptr<int64_t>(), counts_t.data_ptr<int64_t>() + E);
  const int64_t routed = std::accumulate(counts.begin(), counts.end(), int64_t{0});

  // Each token repeated k times (backward: a sum over its slots), then sorted by expert. With
  // --moe-apply-probs-on-input (k = 1) each row is scaled by its weight first, the weight in the
  // compute dtype as the combine's (Megatron's probs), and the combine weighs by 1.
  at::Tensor pairs = x.unsqueeze(1).expand({T, k, h}).reshape({T * k, h});
  if (cfg.moe_apply_probs_on_input)
    pairs = pairs * r.probs.to(x.scalar_type()).reshape({T * k, 1});
  // The dropped pairs sort last: the experts run the first `routed` rows, the rest output 0.
  at::Tensor out_sorted =
      experts.run(permute_rows(pairs, order, inverse).narrow(0, 0, routed), counts);
  if (routed < T * k)
    out_sorted = at::cat({out_sorted, at::zeros({T * k - routed, h}, out_sorted.options())}, 0);
  const at::Tensor out_pairs = permute_rows(out_sorted, inverse, order).view({T, k, h});
  at::Tensor y = cfg.moe_apply_probs_on_input
                     ? out_pairs.sum(1)
                     : (out_pairs * r.probs.to(out_pairs.scalar_type()).unsqueeze(-1)).sum(1);
  // --recompute-modules shared_experts (inside a recomputed MoE layer it reruns with the layer).
  if (shared_fc1.source)
    y = y + (cfg.recompute.shared_experts && !cfg.recompute.moe
                 ? recomputed_mlp(x, shared_fc1, shared_fc2, cfg.shared_expert_mlp())
                 : mlp(x, shared_fc1, shared_fc2, cfg.shared_expert_mlp()));
  return y.view(xn.sizes());
}

}  // namespace weft
