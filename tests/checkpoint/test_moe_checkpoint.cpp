// Checkpoints of mixture-of-experts models with expert parallelism and multi-token prediction,
// under 8 MPI ranks:
// - the reference scenario: pp 2 x ep 2, 8 layers mixing dense and MoE, MTP depth 2, tied
//   embeddings, bf16 compute with fp32 master weights; 3 iterations saving at 2 against 2
//   iterations (--exit-interval), restart, 1 more: the third iteration's lm, aux and MTP losses
//   and grad norm are bitwise equal, both runs' checkpoints are bitwise equal, and everything
//   saved is restored bitwise (load, save again at once, compare). Then again with bf16 moments
//   and --use-precision-aware-optimizer.
// - resharding: a pp 2 x ep 2 checkpoint continues at pp 1 x ep 4 (8 ranks) and on 1 rank; the
//   next iteration matches the uninterrupted run to 1e-6 relative in fp32.
// - expert keys carry global expert indices: ep 2 and ep 4 write the same key set.
#include <gtest/gtest.h>

#include <ATen/Functions.h>

#include <cmath>
#include <set>

#include "ckpt_diff.h"
#include "support/job.h"
#include "support/tiny_config.h"
#include "weft/checkpoint/checkpoint.h"
#include "weft/checkpoint/format.h"
#include "weft/comm/process_groups.h"
#include "weft/core/remove_tree.h"
#include "weft/model/hybrid.h"

namespace weft {
namespace {

using test::diff_checkpoints;
using test::run_job;

// The scenario's model: MoE transformer layers (moe), or the hybrid pattern of Mamba-2,
// attention, MLP and MoE layers with two MTP depths of an attention and an MoE layer (hybrid).
TrainConfig scenario_config(bool hybrid = false) {
  TrainConfig c =
      test::tiny_config({.num_layers = 8, .global_batch_size = 16, .train_iters = 3, .seed = 23});
  ModelConfig& m = c.model;
  test::apply_tiny_moe({0, 1, 1, 0, 1, 0, 1, 1}, &m);
  c.layout.pp = 2;
  c.layout.ep = 2;
  if (hybrid) {
    m.moe_layer_pattern.clear();
    m.mtp_num_layers = 0;
    m.mamba_state_dim = 8;
    m.mamba_head_dim = 8;
    m.mamba_num_groups = 2;  // 2 * 32 / 8 = 8 heads
    apply_hybrid_layer_pattern("M*ME|-ME*/*E/*E", &m);
  }
  return c;
}

const char* model_name(bool hybrid) { return hybrid ? "hybrid" : "moe"; }

void expect_bitwise(const IterationStats& a, const IterationStats& b) {
  EXPECT_EQ(a.iteration, b.iteration);
  EXPECT_EQ(a.lm_loss, b.lm_loss) << "lm loss not bitwise equal";
  EXPECT_EQ(a.aux_loss, b.aux_loss) << "aux loss not bitwise equal";
  EXPECT_EQ(a.mtp_loss, b.mtp_loss) << "MTP loss not bitwise equal";
  EXPECT_EQ(a.grad_norm, b.grad_norm) << "grad norm not bitwise equal";
}

// (hybrid model, bf16 moments with the precision-aware optimizer)
class MoeScenario : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

// The scenario on 8 ranks (pp 2 x ep 2), and the same model on one rank (the CUDA path runs
// both on one GPU).
TEST_P(MoeScenario, BitwiseRestartPp2Ep2Mtp2) {
  const auto [hybrid, bf16_state] = GetParam();
  struct Layout {
    int world, pp, ep;
  };
  for (const Layout l : {Layout{8, 2, 2}, Layout{1, 1, 1}}) {
    if (l.world > test::world_size()) continue;
    SCOPED_TRACE(::testing::Message() << "world " << l.world << " pp " << l.pp << " ep " << l.ep);
    const std::string dir = test::shared_temp_dir("moe-scenario");
    TrainConfig c = scenario_config(hybrid);
    c.layout.pp = l.pp;
    if (l.pp == 1) c.model.hybrid_stage_layers.clear();  // one stage: no '|' split
    c.layout.ep = l.ep;
    c.model.bf16 = true;
    if (bf16_state) {
      c.adam.exp_avg_dtype = at::kBFloat16;
      c.adam.exp_avg_sq_dtype = at::kBFloat16;
      c.adam.precision_aware = true;
    }
    TrainConfig a = c;  // uninterrupted, saving at 2 and at the end
    a.save = dir + "/a";
    a.save_interval = 2;
    auto sa = run_job(a, l.world);
    TrainConfig b1 = c;  // exits at 2
    b1.save = dir + "/b";
    b1.exit_interval = 2;
    auto sb1 = run_job(b1, l.world);
    TrainConfig b2 = c;  // resumes for the third
    b2.load = b2.save = dir + "/b";
    auto sb2 = run_job(b2, l.world);
    if (test::world_rank() < l.world) {
      ASSERT_EQ(sa.size(), 3u);
      ASSERT_EQ(sb1.size(), 2u);
      ASSERT_EQ(sb2.size(), 1u);
      expect_bitwise(sa[1], sb1[1]);
      expect_bitwise(sa[2], sb2[0]);
      EXPECT_GT(sa[2].aux_loss, 0);
      EXPECT_GT(sa[2].mtp_loss, 0);
    }
    EXPECT_EQ(diff_checkpoints(dir + "/a/iter_0000002", dir + "/b/iter_0000002"), "");
    EXPECT_EQ(diff_checkpoints(dir + "/a/iter_0000003", dir + "/b/iter_0000003"), "");
    // Everything saved is restored bitwise on every rank: load iteration 2, save it again.
    EXPECT_EQ(test::diff_resaved(c, l.world, dir + "/b", 2, dir + "/c"), "");
    // The comparison can fail: a checkpoint one step later differs (rank 0 compares).
    if (test::world_rank() == 0) {
      EXPECT_NE(diff_checkpoints(dir + "/b/iter_0000002", dir + "/b/iter_0000003"), "");
    }
    if (test::world_rank() == 0) (void)weft::remove_tree(dir);
  }
}

INSTANTIATE_TEST_SUITE_P(State, MoeScenario,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(model_name(std::get<0>(info.param))) + "_" +
                                  (std::get<1>(info.param) ? "bf16_moments_precision_aware"
                                                           : "fp32_moments");
                         });

std::set<std::string> checkpoint_keys(const std::string& dir) {
  nlohmann::json meta;
  CkptIndex index;
  std::set<std::string> keys;
  if (test::world_rank() != 0) return keys;
  Status s = ckpt_read_metadata(dir, &meta, &index);
  EXPECT_TRUE(static_cast<bool>(s)) << s.message();
  for (const auto& [k, t] : index) keys.insert(k);
  return keys;
}

class MoeReshard : public ::testing::TestWithParam<bool> {};

TEST_P(MoeReshard, Pp2Ep2LoadsAtPp1Ep4AndOneRank) {
  if (test::world_size() < 8) GTEST_SKIP() << "needs 8 ranks";
  const bool hybrid = GetParam();
  const std::string dir = test::shared_temp_dir("moe-reshard");
  TrainConfig c = scenario_config(hybrid);  // fp32
  const auto ref = run_job(c, 8);
  TrainConfig b = c;
  b.save = dir + "/ep2";
  b.exit_interval = 2;
  run_job(b, 8);
  struct Target {
    const char* name;
    int world, pp, ep;
  };
  for (const Target& t : {Target{"pp1_ep4", 8, 1, 4}, Target{"one_rank", 1, 1, 1}}) {
    SCOPED_TRACE(t.name);
    TrainConfig r = c;
    r.layout.pp = t.pp;
    r.layout.ep = t.ep;
    if (t.pp == 1) r.model.hybrid_stage_layers.clear();
    r.load = dir + "/ep2";
    if (t.ep == 4) r.save = dir + "/ep4";
    auto got = run_job(r, t.world);
    if (test::world_rank() < t.world) {
      ASSERT_EQ(got.size(), 1u);
      ASSERT_EQ(ref.size(), 3u);
      EXPECT_EQ(got[0].iteration, 3);
      EXPECT_NEAR(got[0].lm_loss, ref[2].lm_loss, 1e-6 * ref[2].lm_loss);
      EXPECT_NEAR(got[0].aux_loss, ref[2].aux_loss, 1e-6 * ref[2].aux_loss);
      EXPECT_NEAR(got[0].mtp_loss, ref[2].mtp_loss, 1e-6 * ref[2].mtp_loss);
      EXPECT_NEAR(got[0].grad_norm, ref[2].grad_norm, 1e-6 * ref[2].grad_norm);
    }
  }
  // Global expert indices: ep 2 and ep 4 write the same keys, experts 0..3 of every MoE layer.
  const auto k2 = checkpoint_keys(dir + "/ep2/iter_0000002");
  const auto k4 = checkpoint_keys(dir + "/ep4/iter_0000003");
  EXPECT_EQ(k2, k4);
  if (test::world_rank() == 0 && hybrid) {
    EXPECT_TRUE(k2.count("decoder.layers.0.mixer.A_log"));
    EXPECT_TRUE(k2.count("optimizer.exp_avg_sq.decoder.layers.4.mlp.linear_fc1.weight"));
    EXPECT_TRUE(k2.count("decoder.layers.6.mlp.experts.3.linear_fc1.weight"));
    EXPECT_TRUE(k2.count("mtp.layers.1.mtp_model_layer.layers.1.mlp.experts.0.linear_fc2.weight"));
    EXPECT_TRUE(k2.count("mtp.layers.0.mtp_model_layer.layers.0.self_attention.linear_qkv.weight"));
  }
  if (test::world_rank() == 0 && !hybrid) {
    EXPECT_TRUE(k2.count("decoder.layers.7.mlp.experts.3.linear_fc2.weight"));
    EXPECT_TRUE(k2.count("optimizer.exp_avg.mtp.layers.1.transformer_layer.mlp.experts.2.linear_fc1.weight"));
    EXPECT_TRUE(k2.count("mtp.layers.0.eh_proj.weight"));
    EXPECT_TRUE(k2.count("decoder.layers.1.mlp.shared_experts.linear_fc1.weight"));
    EXPECT_FALSE(k2.count("decoder.layers.0.mlp.router.weight"));  // a dense layer
  }
  if (test::world_rank() == 0) (void)weft::remove_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(Model, MoeReshard, ::testing::Bool(),
                         [](const auto& info) { return std::string(model_name(info.param)); });

}  // namespace
}  // namespace weft
