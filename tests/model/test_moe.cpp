// The MoE MLP and the MTP layer against independent references written with plain libtorch
// autograd, in float64:
// - moe_mlp (softmax and sigmoid routing, top-1/top-2, shared experts) against a per-token loop
//   that picks the top-k by sorting each token's scores, runs each chosen expert on that token
//   alone, and computes the aux loss from its definition: outputs, aux loss and every gradient
//   (input, router, experts, shared experts) to 1e-10;
// - the ParamSource contract for experts: every expert is used once and gets its gradient once,
//   also an expert no token chose;
// - mtp_input_tokens against a roll of the token ids, and mtp_layer against its composition;
// - --moe-layer-freq parsing and its refusals.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "weft/core/error.h"
#include "weft/model/full_params.h"
#include "weft/model/moe.h"
#include "weft/model/transformer.h"

namespace weft {
namespace {

ModelConfig moe_config(int experts, int topk, int shared, const std::string& score,
                       bool pre_softmax = false, double scaling = 0, bool squared_relu = false) {
  ModelConfig c;
  c.num_layers = 1;
  c.hidden_size = 8;
  c.ffn_hidden_size = 12;
  c.num_attention_heads = 2;
  c.num_query_groups = 1;
  c.seq_length = 6;
  c.vocab_size = 16;
  c.num_experts = experts;
  c.moe_router_topk = topk;
  c.moe_ffn_hidden_size = 5;
  c.moe_shared_expert_intermediate_size = shared;
  c.moe_router_score_function = score;
  c.moe_router_pre_softmax = pre_softmax;
  c.moe_router_topk_scaling_factor = scaling;
  c.squared_relu = squared_relu;
  return c;
}

double rel_err(const torch::Tensor& got, const torch::Tensor& want) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-30);
  return (got.to(torch::kDouble) - want).abs().max().item<double>() / scale;
}

// One expert: SwiGLU (w1 [2f, h], gate rows first) or squared ReLU (w1 [f, h]).
torch::Tensor mlp_ref(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& w2,
                      bool squared_relu) {
  const int64_t f = w2.size(1);
  const torch::Tensor a = torch::matmul(x, w1.t());
  if (squared_relu) return torch::matmul(torch::where(a > 0, a * a, torch::zeros_like(a)), w2.t());
  return torch::matmul(torch::silu(a.narrow(-1, 0, f)) * a.narrow(-1, f, f), w2.t());
}

// The reference: one token at a time.
struct RefResult {
  torch::Tensor y, aux, z;  // z: the router z-loss, mean over tokens of log(sum exp(logits))^2
  std::vector<double> chosen;  // (token, slot) pairs per expert (after a drop: kept ones)
  int64_t dropped = 0;         // pairs past their expert's capacity
};
// `bias` (defined: the sigmoid router's expert bias, [E]) shifts the scores that choose the
// experts; the weights are the unshifted scores, and so are the aux loss's choices (Megatron's).
// The x rows are `sequences` sequences one after the other; --moe-router-load-balancing-type
// seq_aux_loss averages the aux loss of each over them.
RefResult reference_moe(const torch::Tensor& x, const torch::Tensor& router,
                        const std::vector<torch::Tensor>& w1, const std::vector<torch::Tensor>& w2,
                        const torch::Tensor& s1, const torch::Tensor& s2, const ModelConfig& cfg,
                        const torch::Tensor& bias = {}, int64_t sequences = 1) {
  const int64_t T = x.size(0), E = cfg.num_experts, k = cfg.moe_router_topk;
  const bool softmax = cfg.moe_router_score_function == "softmax";
  const bool seq = cfg.moe_router_load_balancing_type == "seq_aux_loss";
  const int64_t groups = seq ? sequences : 1, S = T / groups;  // tokens per aux group
  std::vector<torch::Tensor> ys;
  std::vector<double> chosen(E, 0.0);
  std::vector<std::vector<double>> aux_chosen(groups, std::vector<double>(E, 0.0));
  std::vector<torch::Tensor> prob_sum(groups, torch::zeros({E}, x.options()));
  torch::Tensor z = torch::zeros({}, x.options());
  std::vector<std::vector<int64_t>> token_experts;  // [T][k]
  std::vector<torch::Tensor> token_probs;           // [T] of [k]
  int64_t dropped = 0;
  for (int64_t t = 0; t < T; ++t) {
    const torch::Tensor logits = torch::matmul(router, x[t]);  // [E]
    z = z + torch::log(torch::exp(logits).sum()).pow(2) / static_cast<double>(T);
    const torch::Tensor score = softmax ? logits : torch::sigmoid(logits);
    // Experts by descending score; for the routing (not the aux loss) with the bias added and
    // only the experts of the best --moe-router-group-topk groups, a group valued by the sum of
    // its top k / group-topk scores. The pre-softmax router ranks (and groups) the softmax.
    const torch::Tensor prob = torch::softmax(logits, 0);
    auto ranked = [&](bool routing) {
      std::vector<int64_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::vector<double> sv(E);
      for (int64_t e = 0; e < E; ++e)
        sv[e] = (cfg.moe_router_pre_softmax ? prob[e] : score[e]).item<double>() +
                (routing && bias.defined() ? bias[e].item<double>() : 0.0);
      auto by_score = [&](int64_t a, int64_t b) { return sv[a] > sv[b]; };
      std::stable_sort(order.begin(), order.end(), by_score);
      if (!routing || cfg.moe_router_group_topk == 0) return order;
      const int64_t G = cfg.moe_router_num_groups, per = E / G, g = cfg.moe_router_group_topk;
      std::vector<double> group_value(G, 0.0);
      for (int64_t q = 0; q < G; ++q) {
        std::vector<double> in(sv.begin() + q * per, sv.begin() + (q + 1) * per);
        std::sort(in.rbegin(), in.rend());
        for (int64_t j = 0; j < k / g; ++j) group_value[q] += in[j];
      }
      std::vector<int64_t> groups_by_value(G);
      std::iota(groups_by_value.begin(), groups_by_value.end(), 0);
      std::stable_sort(groups_by_value.begin(), groups_by_value.end(),
                       [&](int64_t a, int64_t b) { return group_value[a] > group_value[b]; });
      std::vector<int64_t> kept;
      for (int64_t e : order)
        if (std::find(groups_by_value.begin(), groups_by_value.begin() + g, e / per) !=
            groups_by_value.begin() + g)
          kept.push_back(e);
      return kept;
    };
    const std::vector<int64_t> order = ranked(true), unbiased = ranked(false);
    for (int64_t j = 0; j < k; ++j) aux_chosen[t / S][unbiased[j]] += 1;
    std::vector<torch::Tensor> top;
    for (int64_t j = 0; j < k; ++j) top.push_back(score[order[j]]);
    torch::Tensor topv = torch::stack(top);
    torch::Tensor p;
    if (softmax && cfg.moe_router_pre_softmax) {  // the softmax over all E, not the k
      const torch::Tensor ex = torch::exp(logits - logits.max());
      const torch::Tensor all = ex / ex.sum();
      std::vector<torch::Tensor> chosen_p;
      for (int64_t j = 0; j < k; ++j) chosen_p.push_back(all[order[j]]);
      p = torch::stack(chosen_p);
    } else if (softmax) {
      p = torch::exp(topv - topv.max()) / torch::exp(topv - topv.max()).sum();
    } else {
      p = k > 1 ? topv / (topv.sum() + 1e-20) : topv;
    }
    if (cfg.moe_router_topk_scaling_factor > 0) p = p * cfg.moe_router_topk_scaling_factor;
    token_experts.push_back(std::vector<int64_t>(order.begin(), order.begin() + k));
    token_probs.push_back(p);
    const torch::Tensor all =
        softmax ? torch::softmax(logits, 0) : torch::sigmoid(logits) / (torch::sigmoid(logits).sum() + 1e-20);
    prob_sum[t / S] = prob_sum[t / S] + all;
  }
  // Token dropping, from Megatron's definition: capacity ceil(T k / E F); each expert keeps its
  // pairs with the highest weights (probs) or of the earliest tokens (position), tokens ordered
  // as Megatron's [s, b] rows: position first, then sequence.
  std::vector<std::vector<bool>> kept(T, std::vector<bool>(k, true));
  const int64_t per_seq = T / sequences;
  if (cfg.moe_expert_capacity_factor >= 0) {
    const auto capacity = static_cast<size_t>(
        std::ceil(static_cast<double>(T * k) / E * cfg.moe_expert_capacity_factor));
    for (int64_t e = 0; e < E; ++e) {
      struct Pair { double p; int64_t key, t, j; };
      std::vector<Pair> mine;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j)
          if (token_experts[t][j] == e)
            mine.push_back({token_probs[t][j].item<double>(),
                            (t % per_seq) * sequences + t / per_seq, t, j});
      const bool by_probs = cfg.moe_token_drop_policy == "probs";
      std::sort(mine.begin(), mine.end(), [&](const Pair& a, const Pair& b) {
        if (by_probs && a.p != b.p) return a.p > b.p;
        return a.key < b.key;
      });
      for (size_t i = capacity; i < mine.size(); ++i) kept[mine[i].t][mine[i].j] = false;
      if (cfg.moe_pad_expert_input_to_capacity)  // the padded map's count
        chosen[e] = static_cast<double>(std::min<int64_t>(capacity, T));
      else
        chosen[e] = static_cast<double>(std::min(capacity, mine.size()));
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    torch::Tensor y = torch::zeros({x.size(1)}, x.options());
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = token_experts[t][j];
      if (!kept[t][j]) {
        ++dropped;
        continue;
      }
      if (cfg.moe_expert_capacity_factor < 0) chosen[e] += 1;
      y = y + (cfg.moe_apply_probs_on_input  // the weight scales the input (top 1)
                   ? mlp_ref(token_probs[t][j] * x[t].unsqueeze(0), w1[e], w2[e], cfg.squared_relu)[0]
                   : token_probs[t][j] * mlp_ref(x[t].unsqueeze(0), w1[e], w2[e], cfg.squared_relu)[0]);
    }
    if (s1.defined()) y = y + mlp_ref(x[t].unsqueeze(0), s1, s2, cfg.squared_relu)[0];
    ys.push_back(y);
  }
  torch::Tensor aux = torch::zeros({}, x.options());
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t e = 0; e < E; ++e) aux = aux + prob_sum[g][e] * aux_chosen[g][e];
  aux = aux * (static_cast<double>(E) / (static_cast<double>(k) * S * S)) / groups;
  return {torch::stack(ys), aux, z, chosen, dropped};
}

struct Case {
  int experts, topk, shared;
  const char* score;
  bool pre_softmax = false;  // --moe-router-pre-softmax
  double scaling = 0;        // --moe-router-topk-scaling-factor
  bool squared_relu = false; // --squared-relu experts and shared expert
  bool expert_bias = false;  // --moe-router-enable-expert-bias (sigmoid)
  const char* balancing = "aux_loss";  // --moe-router-load-balancing-type
  int num_groups = 0, group_topk = 0;  // --moe-router-num-groups, --moe-router-group-topk
  double capacity = -1;                // --moe-expert-capacity-factor (negative: dropless)
  const char* drop_policy = "probs";   // --moe-token-drop-policy
  bool pad = false;                    // --moe-pad-expert-input-to-capacity
  bool probs_on_input = false;         // --moe-apply-probs-on-input (top 1)
};

TEST(Moe, MatchesPerTokenReference) {
  for (const Case& cs : {Case{4, 2, 0, "softmax"}, Case{4, 2, 6, "softmax"}, Case{5, 1, 0, "softmax"},
                         Case{4, 2, 6, "sigmoid"}, Case{6, 3, 0, "sigmoid"}, Case{3, 1, 4, "sigmoid"},
                         Case{4, 2, 0, "softmax", true}, Case{6, 3, 4, "softmax", true, 2.5},
                         Case{5, 1, 0, "softmax", true}, Case{6, 3, 0, "sigmoid", false, 2.5},
                         Case{4, 2, 6, "softmax", false, 0, true},
                         Case{6, 3, 4, "sigmoid", false, 2.5, true},
                         Case{6, 2, 0, "sigmoid", false, 0, false, true},
                         Case{6, 3, 4, "sigmoid", false, 2.5, true, true},
                         Case{4, 2, 0, "softmax", false, 0, false, false, "seq_aux_loss"},
                         Case{6, 3, 4, "sigmoid", false, 2.5, true, true, "seq_aux_loss"},
                         Case{8, 4, 0, "sigmoid", false, 0, false, false, "aux_loss", 4, 2},
                         Case{8, 2, 3, "softmax", false, 0, false, false, "aux_loss", 4, 1},
                         Case{6, 3, 0, "softmax", true, 0, false, false, "aux_loss", 2, 1},
                         Case{8, 4, 4, "sigmoid", false, 2.5, true, true, "seq_aux_loss", 4, 2},
                         // Token dropping: 10 tokens, capacity ceil(10 k / E F).
                         Case{4, 2, 0, "softmax", false, 0, false, false, "aux_loss", 0, 0, 0.5},
                         Case{4, 2, 6, "softmax", false, 0, false, false, "aux_loss", 0, 0, 0.7,
                              "position"},
                         Case{6, 3, 4, "sigmoid", false, 2.5, true, true, "seq_aux_loss", 0, 0,
                              0.6},
                         Case{6, 2, 0, "sigmoid", false, 0, false, true, "aux_loss", 0, 0, 0.8,
                              "position", true},
                         Case{5, 1, 0, "softmax", true, 0, false, false, "aux_loss", 0, 0, 1.0,
                              "probs", true},
                         Case{4, 2, 0, "softmax", false, 0, false, false, "aux_loss", 0, 0, 0.0},
                         Case{4, 2, 0, "softmax", false, 0, false, false, "aux_loss", 0, 0, 2.0},
                         // The weight on the expert's input (top 1).
                         Case{5, 1, 4, "softmax", true, 0, false, false, "aux_loss", 0, 0, -1,
                              "probs", false, true},
                         Case{4, 1, 0, "sigmoid", false, 2.5, true, true, "aux_loss", 0, 0, 0.8,
                              "probs", false, true}}) {
    SCOPED_TRACE(::testing::Message() << cs.experts << " experts top-" << cs.topk << " shared "
                                      << cs.shared << " " << cs.score << " pre-softmax "
                                      << cs.pre_softmax << " scaling " << cs.scaling
                                      << " squared relu " << cs.squared_relu << " expert bias "
                                      << cs.expert_bias << " " << cs.balancing << " groups "
                                      << cs.num_groups << " group top " << cs.group_topk
                                      << " capacity factor " << cs.capacity << " "
                                      << cs.drop_policy << " pad " << cs.pad
                                      << " probs on input " << cs.probs_on_input);
    ModelConfig cfg = moe_config(cs.experts, cs.topk, cs.shared, cs.score, cs.pre_softmax,
                                 cs.scaling, cs.squared_relu);
    cfg.moe_router_load_balancing_type = cs.balancing;
    cfg.moe_router_num_groups = cs.num_groups;
    cfg.moe_router_group_topk = cs.group_topk;
    cfg.moe_expert_capacity_factor = cs.capacity;
    cfg.moe_token_drop_policy = cs.drop_policy;
    cfg.moe_pad_expert_input_to_capacity = cs.pad;
    cfg.moe_apply_probs_on_input = cs.probs_on_input;
    // --moe-z-loss-coeff in every other case (the layer returns the unweighted z-loss, and 0
    // without the coefficient).
    const bool z_loss = cs.experts % 2 == 0;
    cfg.moe_z_loss_coeff = z_loss ? 1e-3 : 0;
    const auto opt = torch::TensorOptions().dtype(torch::kDouble);
    torch::manual_seed(3);
    const int64_t b = 2, s = 5, h = cfg.hidden_size;
    const torch::Tensor x0 = torch::randn({b, s, h}, opt);
    const torch::Tensor R = torch::randn({b, s, h}, opt);

    FullParams p;
    auto specs = block_param_specs(cfg, "l.", /*moe=*/true);
    auto experts = expert_param_specs(cfg, "l.", 0, cfg.num_experts);
    std::map<std::string, torch::Tensor> init;
    for (const auto* group : {&specs, &experts})
      for (const auto& sp : *group) {
        torch::Tensor v = init_param(sp, cfg, 9).to(torch::kDouble) * 10;  // spread the scores
        init[sp.name] = v;
        p.add(sp, v.clone());
      }
    const int base = static_cast<int>(specs.size());
    std::vector<ParamHandle> fc1, fc2;
    for (int e = 0; e < cfg.num_experts; ++e) {
      fc1.push_back(p.handle(base + e));
      fc2.push_back(p.handle(base + cfg.num_experts + e));
    }
    LocalExperts local(fc1, fc2, cfg.expert_mlp());
    const LayerHandles w = layer_handles(&p, 0, cfg, true, &local);
    // Biases of the size of the score gaps, so that they change choices.
    RouterBias bias{torch::linspace(0.4, -0.4, cfg.num_experts, torch::kFloat),
                    torch::zeros({cfg.num_experts}, torch::kDouble)};
    RouterBias* rb = cs.expert_bias ? &bias : nullptr;

    // weft
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor aux;
    torch::Tensor y = moe_mlp(x, w.router, w.shared_fc1, w.shared_fc2, local, cfg, &aux, rb);
    ASSERT_EQ(aux.numel(), 2);  // [aux, z]
    ((y * R).sum() + 3.0 * aux[0] + 5.0 * aux[1]).backward();

    // reference
    auto leaf = [&](const std::string& n) { return init.at(n).clone().requires_grad_(true); };
    torch::Tensor xr = x0.clone().reshape({-1, h}).requires_grad_(true);
    torch::Tensor router = leaf("l.mlp.router.weight");
    std::vector<torch::Tensor> w1, w2;
    for (int e = 0; e < cfg.num_experts; ++e) {
      w1.push_back(leaf(fmt::format("l.mlp.experts.{}.linear_fc1.weight", e)));
      w2.push_back(leaf(fmt::format("l.mlp.experts.{}.linear_fc2.weight", e)));
    }
    torch::Tensor s1, s2;
    if (cs.shared) {
      s1 = leaf("l.mlp.shared_experts.linear_fc1.weight");
      s2 = leaf("l.mlp.shared_experts.linear_fc2.weight");
    }
    RefResult ref = reference_moe(xr, router, w1, w2, s1, s2, cfg,
                                  rb ? bias.bias.to(torch::kDouble) : torch::Tensor(), b);
    if (cs.capacity >= 0) {  // the drop cases drop (and by policy), the large capacity none
      if (cs.capacity >= 2) {
        EXPECT_EQ(ref.dropped, 0);
      } else {
        EXPECT_GT(ref.dropped, 0);
        ModelConfig other = cfg;
        other.moe_token_drop_policy = cfg.moe_token_drop_policy == "probs" ? "position" : "probs";
        if (cs.capacity > 0) {
          EXPECT_GT(rel_err(reference_moe(xr.detach(), router.detach(), w1, w2, s1, s2, other,
                                          rb ? bias.bias.to(torch::kDouble) : torch::Tensor(), b)
                                .y,
                            ref.y.detach()),
                    1e-6);
        }
      }
    }
    if (cs.group_topk > 0) {  // the group limit changes choices here, so the case can fail
      ModelConfig plain = cfg;
      plain.moe_router_group_topk = 0;
      EXPECT_NE(ref.chosen, reference_moe(xr.detach(), router.detach(), w1, w2, s1, s2, plain,
                                          rb ? bias.bias.to(torch::kDouble) : torch::Tensor(), b)
                                .chosen);
    }
    if (rb) {  // the pairs of this grad-mode forward were counted; a no-grad one adds nothing
      {
        torch::NoGradGuard no_grad;
        moe_mlp(x0, w.router, w.shared_fc1, w.shared_fc2, local, cfg, nullptr, rb);
      }
      EXPECT_TRUE(torch::equal(bias.pairs, torch::tensor(ref.chosen, torch::kDouble)))
          << bias.pairs << " vs the reference's choices";
      // Without the bias the choices differ (the biases are large enough to matter); padded to
      // the capacity, every expert counts the same either way.
      if (!cs.pad) {
        EXPECT_FALSE(torch::equal(
            bias.pairs, torch::tensor(reference_moe(xr.detach(), router.detach(), w1, w2, s1, s2,
                                                    cfg).chosen, torch::kDouble)));
      }
    }
    ((ref.y * R.reshape({-1, h})).sum() + 3.0 * ref.aux + (z_loss ? 5.0 * ref.z : ref.z * 0))
        .backward();

    EXPECT_LT(rel_err(y.reshape({-1, h}), ref.y), 1e-10);
    EXPECT_LT(rel_err(aux[0], ref.aux), 1e-10);
    if (z_loss) {
      EXPECT_LT(rel_err(aux[1], ref.z), 1e-10);
      EXPECT_GT(ref.z.item<double>(), 1e-3);  // large enough to show in the router's gradient
    } else {
      EXPECT_EQ(aux[1].item<double>(), 0.0);
    }
    EXPECT_LT(rel_err(x.grad().reshape({-1, h}), xr.grad()), 1e-10);
    EXPECT_LT(rel_err(p.grad(w.router.index), router.grad()), 1e-10);
    for (int e = 0; e < cfg.num_experts; ++e) {
      // An expert no token chose has no reference gradient: it must get zeros.
      const torch::Tensor g1 = w1[e].grad().defined() ? w1[e].grad() : torch::zeros_like(w1[e]);
      const torch::Tensor g2 = w2[e].grad().defined() ? w2[e].grad() : torch::zeros_like(w2[e]);
      EXPECT_LT((p.grad(fc1[e].index).to(torch::kDouble) - g1).abs().max().item<double>(),
                1e-10 * std::max(1.0, g1.abs().max().item<double>()));
      EXPECT_LT((p.grad(fc2[e].index).to(torch::kDouble) - g2).abs().max().item<double>(),
                1e-10 * std::max(1.0, g2.abs().max().item<double>()));
    }
    if (cs.shared) {
      EXPECT_LT(rel_err(p.grad(w.shared_fc1.index), s1.grad()), 1e-10);
      EXPECT_LT(rel_err(p.grad(w.shared_fc2.index), s2.grad()), 1e-10);
    }
    for (int i = 0; i < p.size(); ++i) EXPECT_EQ(p.pending_uses(i), 0) << p.spec(i).name;
  }
}

// A token routed nowhere near an expert still leaves that expert with a use and a zero
// gradient: every expert walks the ParamSource protocol every step.
TEST(Moe, IdleExpertGetsZeroGradient) {
  ModelConfig cfg = moe_config(4, 1, 0, "softmax");
  FullParams p;
  auto specs = block_param_specs(cfg, "l.", true);
  for (const auto& sp : specs) p.add(sp, init_param(sp, cfg, 1).to(torch::kDouble));
  const int base = p.size();
  for (const auto& sp : expert_param_specs(cfg, "l.", 0, 4))
    p.add(sp, init_param(sp, cfg, 1).to(torch::kDouble));
  // Router rows: expert 2 always wins.
  torch::Tensor r = torch::zeros({4, cfg.hidden_size}, torch::kDouble);
  r[2].fill_(1.0);
  p.value(4).copy_(r);
  std::vector<ParamHandle> fc1, fc2;
  for (int e = 0; e < 4; ++e) {
    fc1.push_back(p.handle(base + e));
    fc2.push_back(p.handle(base + 4 + e));
  }
  LocalExperts local(fc1, fc2, cfg.expert_mlp());
  const LayerHandles w = layer_handles(&p, 0, cfg, true, &local);
  torch::Tensor x = torch::rand({1, 3, cfg.hidden_size}, torch::kDouble) + 0.5;
  moe_mlp(x, w.router, w.shared_fc1, w.shared_fc2, local, cfg, nullptr).sum().backward();
  for (int i = 0; i < p.size(); ++i) EXPECT_EQ(p.pending_uses(i), 0) << p.spec(i).name;
  EXPECT_EQ(p.grad(fc1[0].index).abs().sum().item<double>(), 0.0);
  EXPECT_GT(p.grad(fc1[2].index).abs().sum().item<double>(), 0.0);
}

// Megatron's aux-loss-free update: + rate below the mean of the pairs over experts, - above it,
// nothing at it, in float32.
TEST(Moe, ExpertBiasUpdate) {
  const torch::Tensor pairs =
      torch::tensor({3.0, 1.0, 0.0, 4.0, 2.0, 2.0, 2.0, 2.0}, torch::kDouble).view({2, 4});
  const torch::Tensor bias = torch::tensor({0.5f, 0.0f, -0.25f, 1.0f, 0.1f, 0.2f, 0.3f, 0.4f}).view({2, 4});
  const torch::Tensor got = updated_expert_bias(pairs, bias, 1e-3);
  const float r = 1e-3f;
  const torch::Tensor want =
      torch::tensor({0.5f - r, 0.0f + r, -0.25f + r, 1.0f - r, 0.1f, 0.2f, 0.3f, 0.4f}).view({2, 4});
  EXPECT_EQ(got.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(got, want)) << got;
}

TEST(Mtp, InputTokensAreTheRolledIds) {
  const torch::Tensor tokens = torch::arange(1, 2 * 9 + 1, torch::kLong).view({2, 9});
  const torch::Tensor labels = tokens.narrow(1, 1, 8);  // label t = token t+1
  for (int k = 1; k <= 3; ++k) {
    torch::Tensor want = torch::roll(tokens.narrow(1, 0, 8), -k, 1);
    want.narrow(1, 8 - k, k).fill_(0);
    EXPECT_TRUE(torch::equal(mtp_input_tokens(labels, k), want)) << "depth " << k;
  }
}

TEST(Mtp, LayerIsNormsConcatProjectionLayerNorm) {
  ModelConfig cfg = moe_config(0, 1, 0, "softmax");
  cfg.mtp_num_layers = 1;
  FullParams p;
  for (const auto& sp : mtp_param_specs(cfg, 0)) {
    torch::Tensor v = init_param(sp, cfg, 4).to(torch::kDouble);
    if (sp.init == InitKind::kOnes) v = v + torch::rand_like(v);  // norms that matter
    p.add(sp, v);
  }
  const MtpHandles w = mtp_handles(&p, 0, cfg, 0, {});
  const RotaryTables rope = make_rotary_tables(cfg, torch::kCPU, torch::kDouble);
  const torch::Tensor h = torch::randn({2, cfg.seq_length, cfg.hidden_size}, torch::kDouble);
  const torch::Tensor e = torch::randn({2, cfg.seq_length, cfg.hidden_size}, torch::kDouble);
  torch::NoGradGuard no_grad;
  auto norm = [&](const torch::Tensor& x, int i) {
    return x * torch::rsqrt(x.pow(2).mean(-1, true) + cfg.norm_epsilon) * p.value(i);
  };
  // enorm(emb) first, then hnorm(h), as Megatron concatenates them.
  const torch::Tensor x = torch::matmul(torch::cat({norm(e, 0), norm(h, 1)}, -1), p.value(2).t());
  ASSERT_EQ(w.layers.size(), 1u);
  const torch::Tensor want = norm(decoder_layer(x, w.layers[0], rope, cfg), 3);
  EXPECT_LT(rel_err(mtp_layer(h, e, w, rope, cfg, nullptr), want), 1e-12);
}

TEST(MoeLayerFreq, ParsesIntsAndLists) {
  EXPECT_EQ(parse_moe_layer_freq("1", 3), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("2", 5), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(parse_moe_layer_freq("[0,1,1,1]", 4), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("([1]*3+[0])*2", 8), (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(parse_moe_layer_freq(" [0]*1 + [1]*2 ", 3), (std::vector<int>{0, 1, 1}));
  EXPECT_THROW(parse_moe_layer_freq("[0,1]", 3), UsageError);
  EXPECT_THROW(parse_moe_layer_freq("[0,3,1]", 3), UsageError);
  EXPECT_THROW(parse_moe_layer_freq("0", 3), UsageError);
  EXPECT_THROW(parse_moe_layer_freq("two", 3), UsageError);
  EXPECT_THROW(parse_moe_layer_freq("[0,1", 2), UsageError);
}

}  // namespace
}  // namespace weft

namespace weft {
namespace {

// On CUDA with torch._grouped_mm: the grouped-GEMM experts equal the per-expert chain (bf16
// rounding apart), forward and every gradient, with an idle expert among them. Skips elsewhere.
TEST(Moe, GroupedGemmMatchesPerExpertChain) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  for (bool squared_relu : {false, true}) {
    SCOPED_TRACE(squared_relu ? "squared relu" : "swiglu");
    ModelConfig cfg = moe_config(4, 2, 0, "softmax", false, 0, squared_relu);
    cfg.hidden_size = 64;
    cfg.moe_ffn_hidden_size = 96;
    const auto opt = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
    const torch::Tensor rows0 = torch::randn({40, 64}, opt);
    if (!grouped_gemm_usable(rows0, cfg.expert_ffn())) GTEST_SKIP() << "no grouped GEMM here";
    const std::vector<int64_t> counts = {17, 0, 8, 15};
    FullParams p;
    std::vector<ParamHandle> fc1, fc2;
    for (const auto& sp : expert_param_specs(cfg, "l.", 0, 4))
      p.add(sp, init_param(sp, cfg, 2).to(opt) * 5);
    for (int e = 0; e < 4; ++e) {
      fc1.push_back(p.handle(e));
      fc2.push_back(p.handle(4 + e));
    }
    const torch::Tensor dy = torch::randn({40, 64}, opt);
    std::vector<torch::Tensor> outs, dxs, grads;
    for (bool grouped : {false, true}) {
      p.zero_grad();
      torch::Tensor rows = rows0.clone().requires_grad_(true);
      torch::Tensor y = grouped_expert_mlp(rows, counts, fc1, fc2, cfg.expert_mlp(), grouped);
      y.backward(dy);
      outs.push_back(y.to(torch::kFloat));
      dxs.push_back(rows.grad().to(torch::kFloat));
      std::vector<torch::Tensor> g;
      for (int i = 0; i < p.size(); ++i) g.push_back(p.grad(i).clone().reshape({-1}));
      grads.push_back(torch::cat(g));
      for (int i = 0; i < p.size(); ++i) EXPECT_EQ(p.pending_uses(i), 0);
    }
    auto close = [](const torch::Tensor& a, const torch::Tensor& b) {
      return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
    };
    EXPECT_LT(close(outs[1], outs[0]), 2e-2);
    EXPECT_LT(close(dxs[1], dxs[0]), 2e-2);
    EXPECT_LT(close(grads[1], grads[0]), 2e-2);
    EXPECT_GT(grads[1].abs().sum().item<double>(), 0.0);
  }
}

}  // namespace
}  // namespace weft
