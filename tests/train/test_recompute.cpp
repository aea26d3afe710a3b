// Activation recomputation (--recompute-granularity full | selective, model/recompute.h) changes
// what the backward keeps, never a value: every recomputed run's losses (lm, aux, MTP), grad
// norms, gradient shards after each step and final expert biases equal the plain run's bit for
// bit, on the same layout. Covered: full uniform (chunks that divide the stage and one that does
// not) and block, selective core_attn / mlp / moe / shared_experts; the dense model in float32
// and bfloat16, the tiny MoE with 2 MTP depths and aux-loss-free expert biases (the rerun must
// route as the forward did), the hybrid Mamba-2 model; world 1, and on 8 ranks pp 2 x
// ep 2 x HSDP 2x2 with the gathers and reductions overlapped (FSDP shards, the experts'
// all-to-all rerun inside the backward). Also Megatron's flag checks (parse_recompute_flags).
#include <gtest/gtest.h>

#include <ATen/Functions.h>

#include <map>
#include <string>
#include <vector>

#include "support/expect_usage.h"
#include "support/job.h"
#include "support/tiny_config.h"
#include "weft/model/hybrid.h"
#include "weft/model/recompute.h"
#include "weft/parallel/grad_access.h"

namespace weft {
namespace {

struct Run {
  std::vector<IterationStats> stats;
  std::vector<std::vector<at::Tensor>> grads;  // per iteration, per unit: the gradient shard
  std::map<std::string, at::Tensor> biases;    // the routers' expert biases after the run
};

Run run(const TrainConfig& c, int world) {
  Run r;
  auto inspect = [&](Trainer& t, const ProcessGroups&) {
    std::vector<at::Tensor> g;
    for (auto& u : t.stage().units()) g.push_back(grad_shard(*u).cpu().clone());
    r.grads.push_back(std::move(g));
  };
  auto after = [&](Trainer& t, const ProcessGroups&) {
    for (const auto& [name, b] : t.stage().router_biases()) r.biases[name] = b->bias.cpu().clone();
  };
  r.stats = test::run_job(c, world, world == 1, inspect, nullptr, after);
  return r;
}

RecomputeConfig full(const char* method, int layers) {
  RecomputeConfig r;
  r.granularity = "full";
  r.method = method;
  r.num_layers = layers;
  return r;
}

RecomputeConfig selective(bool core_attn, bool mlp, bool moe, bool shared_experts) {
  RecomputeConfig r;
  r.granularity = "selective";
  r.core_attn = core_attn;
  r.mlp = mlp;
  r.moe = moe;
  r.shared_experts = shared_experts;
  return r;
}

void expect_same(const Run& got, const Run& ref, const std::string& what) {
  ASSERT_EQ(got.stats.size(), ref.stats.size()) << what;
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
  for (size_t i = 0; i < ref.stats.size(); ++i) {
    SCOPED_TRACE(what + ", iteration " + std::to_string(i + 1));
    EXPECT_EQ(got.stats[i].lm_loss, ref.stats[i].lm_loss);
    EXPECT_EQ(got.stats[i].aux_loss, ref.stats[i].aux_loss);
    EXPECT_EQ(got.stats[i].mtp_loss, ref.stats[i].mtp_loss);
    EXPECT_EQ(got.stats[i].z_loss, ref.stats[i].z_loss);
    EXPECT_EQ(got.stats[i].grad_norm, ref.stats[i].grad_norm);
    ASSERT_EQ(got.grads[i].size(), ref.grads[i].size());
    for (size_t u = 0; u < ref.grads[i].size(); ++u)
      EXPECT_TRUE(at::equal(got.grads[i][u], ref.grads[i][u])) << "gradient shard of unit " << u;
  }
  ASSERT_EQ(got.biases.size(), ref.biases.size()) << what;
  for (const auto& [name, b] : ref.biases)
    EXPECT_TRUE(at::equal(got.biases.at(name), b)) << what << ": expert bias " << name;
}

// Each recomputation of `c` against `c` without, on `world` ranks.
void check(TrainConfig c, int world, const std::vector<std::pair<std::string, RecomputeConfig>>& modes) {
  if (world > test::world_size()) GTEST_SKIP() << "needs " << world << " ranks";
  c.model.recompute = RecomputeConfig{};
  const int64_t before = recompute_reruns();
  const Run ref = run(c, world);
  EXPECT_EQ(recompute_reruns(), before) << "the plain run recomputed";
  if (test::world_rank() < world) {
    ASSERT_FALSE(ref.stats.empty());
    EXPECT_LT(ref.stats.back().lm_loss, ref.stats.front().lm_loss) << "the reference does not learn";
  }
  for (const auto& [name, r] : modes) {
    c.model.recompute = r;
    const int64_t before = recompute_reruns();
    const Run got = run(c, world);
    if (test::world_rank() >= world) continue;
    expect_same(got, ref, name);
    EXPECT_GT(recompute_reruns(), before) << name << ": nothing was recomputed";
  }
}

TrainConfig dense() {
  TrainConfig c = test::tiny_config({.num_layers = 6, .global_batch_size = 8, .train_iters = 3, .seed = 11});
  c.clip_grad = 1.0;
  return c;
}

// The tiny MoE (layers 1, 2, 4, 5 MoE, a shared expert, 2 MTP depths) with a sigmoid router and
// aux-loss-free expert biases beside the aux loss and the router z-loss.
TrainConfig moe() {
  TrainConfig c = dense();
  test::apply_tiny_moe({0, 1, 1, 0, 1, 1}, &c.model);
  c.model.moe_router_score_function = "sigmoid";
  c.model.moe_router_topk_scaling_factor = 2.5;
  c.model.moe_router_enable_expert_bias = true;
  c.model.moe_z_loss_coeff = 1e-2;
  return c;
}

TrainConfig hybrid() {
  TrainConfig c = dense();
  test::apply_tiny_moe({}, &c.model);
  ModelConfig& m = c.model;
  m.moe_layer_pattern.clear();
  m.mtp_num_layers = 0;  // the pattern's depths
  m.mamba_state_dim = 8;
  m.mamba_head_dim = 8;
  m.mamba_num_groups = 2;
  apply_hybrid_layer_pattern("M*ME-E/*M/*M", &m);
  return c;
}

TEST(Recompute, DenseWorld1) {
  check(dense(), 1,
        {{"full uniform 2", full("uniform", 2)},
         {"full uniform 4 (chunks of 4 and 2)", full("uniform", 4)},
         {"full block 2", full("block", 2)},
         {"full block 9 (every layer)", full("block", 9)},
         {"selective core_attn mlp", selective(true, true, false, false)}});
}

TEST(Recompute, DenseBf16World1) {
  TrainConfig c = dense();
  c.model.bf16 = true;
  check(c, 1, {{"full uniform 1", full("uniform", 1)}, {"selective core_attn", selective(true, false, false, false)}});
}

TEST(Recompute, MoeMtpExpertBiasWorld1) {
  check(moe(), 1,
        {{"full uniform 1", full("uniform", 1)},
         {"full block 3", full("block", 3)},
         {"selective moe", selective(false, false, true, false)},
         {"selective core_attn mlp shared_experts", selective(true, true, false, true)}});
}

TEST(Recompute, HybridWorld1) {
  check(hybrid(), 1,
        {{"full uniform 1", full("uniform", 1)},
         {"full block 2", full("block", 2)},
         {"selective core_attn mlp moe", selective(true, true, true, false)}});
}

TEST(Recompute, MoePp2Ep2Hsdp2x2) {
  TrainConfig c = moe();
  c.layout.pp = 2;
  c.layout.ep = 2;
  c.layout.dp_outer = 2;
  c.overlap_grad_reduce = c.overlap_param_gather = true;
  check(c, 8,
        {{"full uniform 1", full("uniform", 1)},
         {"full block 2", full("block", 2)},
         {"selective moe core_attn", selective(true, false, true, false)}});
}

TEST(Recompute, HybridPp2Dp4) {
  TrainConfig c = hybrid();
  c.layout.pp = 2;
  check(c, 8, {{"full uniform 1", full("uniform", 1)}, {"full block 2", full("block", 2)}});
}

// Megatron's checks, each naming its flag.
TEST(Recompute, FlagsAsMegatron) {
  RecomputeConfig r;
  parse_recompute_flags(true, "", "", 0, {}, false, &r);
  EXPECT_TRUE(r.selective() && r.core_attn && !r.mlp) << "--recompute-activations: core_attn";
  parse_recompute_flags(false, "full", "block", 3, {}, false, &r);
  EXPECT_TRUE(r.full() && r.method == "block" && r.num_layers == 3);
  parse_recompute_flags(false, "selective", "", 0, {"mlp", "shared_experts"}, true, &r);
  EXPECT_TRUE(r.mlp && r.shared_experts && r.moe && !r.core_attn)
      << "--moe-layer-recompute adds moe to the modules";
  parse_recompute_flags(false, "", "uniform", 2, {"mlp"}, false, &r);
  EXPECT_TRUE(r.granularity.empty() && !r.mlp) << "no granularity: nothing recomputed";
  // Each refused combination of (--recompute-activations, granularity, method, layers, modules,
  // --moe-layer-recompute), with the flag its message names.
  struct Refused {
    const char *granularity, *method;
    int layers;
    std::vector<std::string> modules;
    bool moe_layer;
    const char* needle;
  };
  for (const Refused& k : {Refused{"most", "", 0, {}, false, "--recompute-granularity"},
                           Refused{"full", "", 2, {}, false, "--recompute-method"},
                           Refused{"full", "uniform", 0, {}, false, "--recompute-num-layers"},
                           Refused{"selective", "block", 0, {}, false, "--recompute-method"},
                           Refused{"selective", "", 0, {"layernorm"}, false, "--recompute-modules layernorm"},
                           Refused{"selective", "", 0, {"attn"}, false, "--recompute-modules attn"},
                           Refused{"full", "uniform", 1, {}, true, "--moe-layer-recompute"}})
    test::expect_usage([&] {
      RecomputeConfig x;
      parse_recompute_flags(false, k.granularity, k.method, k.layers, k.modules, k.moe_layer, &x);
    }, k.needle);
}

// Megatron recomputes the MTP depths with the uniform method only as one layer each.
TEST(Recompute, MtpNeedsOneLayerChunks) {
  TrainConfig c = moe();
  c.model.recompute = full("uniform", 2);
  test::expect_usage([&] { validate_train_config(c, 1); }, "--recompute-num-layers 2 with --mtp-num-layers 2");
  c.model.recompute = full("block", 2);
  validate_train_config(c, 1);
  c.model.mtp_num_layers = 0;
  c.model.recompute = full("uniform", 2);
  validate_train_config(c, 1);
}

TEST(Recompute, Chunks) {
  auto chunks = recompute_chunks(5, full("uniform", 2));
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_TRUE(chunks[2].begin == 4 && chunks[2].end == 5 && chunks[2].recompute);
  chunks = recompute_chunks(5, full("block", 2));
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_TRUE(chunks[1].begin == 1 && chunks[1].end == 2 && chunks[1].recompute);
  EXPECT_TRUE(chunks[2].begin == 2 && chunks[2].end == 5 && !chunks[2].recompute);
  chunks = recompute_chunks(5, selective(true, false, false, false));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_FALSE(chunks[0].recompute);
}

}  // namespace
}  // namespace weft
