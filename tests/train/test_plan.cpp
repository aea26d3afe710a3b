// weft plan (train/plan.h) against the real thing: the state bytes (weight, gradient, master
// and moment shards) it computes for every rank equal, byte for byte, what PipelineStage and
// ShardedAdamW allocate on that rank, for dense, MoE + expert parallel + MTP, hybrid Mamba-2,
// HSDP, uneven stages and bf16 moments. (Activations: test_plan_activations.cpp.)
#include <gtest/gtest.h>

#include "support/job.h"
#include "weft/comm/process_groups.h"
#include "weft/model/hybrid.h"
#include "weft/model/moe.h"
#include "weft/train/plan.h"

namespace weft {
namespace {

TrainConfig small_config() {
  TrainConfig c;
  c.model.num_layers = 4;
  c.model.hidden_size = 64;
  c.model.ffn_hidden_size = 172;
  c.model.num_attention_heads = 4;
  c.model.num_query_groups = 2;
  c.model.seq_length = 32;
  c.model.vocab_size = 131;  // not a multiple of the shard count: padded rows
  c.micro_batch_size = 2;
  c.global_batch_size = 8;
  c.train_iters = 0;
  return c;
}

// Real bytes of rank `groups.rank()`: every unit's shards as the optimizer holds them.
RankPlan measured_state(Trainer& t) {
  RankPlan r;
  ShardedAdamW& opt = t.optimizer();
  for (size_t k = 0; k < opt.units().size(); ++k) {
    const FsdpUnit& u = *opt.units()[k];
    const UnitOptimState& st = opt.state(k);
    auto bytes = [](const at::Tensor& x) { return x.numel() * static_cast<int64_t>(x.element_size()); };
    r.params += u.shard_numel();
    if (!u.param_shard().is_same(st.master)) r.weights += bytes(u.param_shard());
    r.grads += bytes(u.grad_target());
    r.master += bytes(st.master);
    r.exp_avg += bytes(st.exp_avg);
    r.exp_avg_sq += bytes(st.exp_avg_sq);
  }
  return r;
}

void expect_state_exact(const TrainConfig& cfg, int world, const std::string& what) {
  const TrainPlan plan = make_train_plan(cfg, world, 0.4, 989, /*fused=*/false);
  test::run_job(cfg, world, false, nullptr, nullptr, [&](Trainer& t, const ProcessGroups& g) {
    const RankPlan got = measured_state(t);
    const RankPlan& want = plan.ranks.at(g.rank());
    const std::string where = what + ", rank " + std::to_string(g.rank());
    EXPECT_EQ(want.stage, t.stage().stage()) << where;
    EXPECT_EQ(want.params, got.params) << where;
    EXPECT_EQ(want.weights, got.weights) << where;
    EXPECT_EQ(want.grads, got.grads) << where;
    EXPECT_EQ(want.master, got.master) << where;
    EXPECT_EQ(want.exp_avg, got.exp_avg) << where;
    EXPECT_EQ(want.exp_avg_sq, got.exp_avg_sq) << where;
  });
}

TEST(Plan, StateBytesEqualTheRealShards) {
  const int world = std::min(4, test::world_size());
  TrainConfig dense = small_config();
  dense.layout.pp = world >= 2 ? 2 : 1;
  expect_state_exact(dense, world, "dense fp32");

  TrainConfig bf16 = small_config();
  bf16.model.bf16 = true;
  bf16.adam.exp_avg_sq_dtype = at::kBFloat16;
  bf16.layout.pp = world >= 2 ? 2 : 1;
  bf16.first_stage_layers = world >= 2 ? 1 : -1;  // uneven stages: 1 + 3
  expect_state_exact(bf16, world, "bf16, bf16 exp_avg_sq, uneven stages");

  if (world >= 4) {
    TrainConfig hsdp = small_config();
    hsdp.model.bf16 = true;
    hsdp.layout.dp_outer = 2;
    expect_state_exact(hsdp, world, "HSDP dp 4 = 2 x 2");
  }

  TrainConfig moe = small_config();
  moe.model.bf16 = true;
  moe.model.num_experts = 4;
  moe.model.moe_ffn_hidden_size = 48;
  moe.model.moe_shared_expert_intermediate_size = 32;
  moe.model.moe_layer_pattern = parse_moe_layer_freq("[0,1,1,0]", 4);
  moe.model.mtp_num_layers = 2;
  moe.layout.pp = world >= 2 ? 2 : 1;
  moe.layout.ep = world >= 4 ? 2 : 1;
  expect_state_exact(moe, world, "MoE + ep + MTP");

  TrainConfig hybrid = small_config();
  hybrid.model.bf16 = true;
  hybrid.model.num_experts = 4;
  hybrid.model.mamba_state_dim = 16;
  hybrid.model.mamba_head_dim = 16;
  hybrid.model.mamba_num_groups = 2;
  apply_hybrid_layer_pattern(world >= 2 ? "M*M|-E*/*E" : "M*M-E*/*E", &hybrid.model);
  hybrid.layout.pp = world >= 2 ? 2 : 1;
  expect_state_exact(hybrid, world, "hybrid Mamba-2 + MoE + MTP");
}

}  // namespace
// The evaluation's forward-only peak follows --eval-micro-batch-size and is the plan's peak
// where it exceeds the training step's; a run that never evaluates has none.
TEST(Plan, EvaluationPeakFollowsTheEvalMicroBatch) {
  TrainConfig c = small_config();
  c.model.vocab_size = 8192;  // logits dominate the forward
  const RankPlan same = make_train_plan(c, 1, 0.4, 989, false).ranks[0];
  EXPECT_GT(same.eval_peak, 0);
  EXPECT_LT(same.eval_peak, same.peak) << "a forward at the training micro-batch keeps less";
  c.eval_micro_batch_size = 32;
  c.eval_global_batch_size = 32;
  const RankPlan big = make_train_plan(c, 1, 0.4, 989, false).ranks[0];
  EXPECT_EQ(big.peak, big.eval_peak) << "16x the training micro-batch in the evaluation";
  EXPECT_GT(big.eval_peak - big.state(), 8 * (same.eval_peak - same.state()));
  c.eval_interval = 0;
  const RankPlan none = make_train_plan(c, 1, 0.4, 989, false).ranks[0];
  EXPECT_EQ(none.eval_peak, 0);
  EXPECT_EQ(none.peak, same.peak);
}

}  // namespace weft
