// --eod-mask-loss in the last stage's loss (PipelineStage::forward with a loss mask), one rank:
// - a mask of ones gives the unmasked objective (the normalisation is the count);
// - a microbatch of two equal samples, the second masked out, gives the unmasked objective and
//   gradients of the two (each microbatch's mean over its unmasked count, Megatron's default),
//   also for the MTP depths (their mask shifted by the depth);
// - a masked position's label moves neither the loss nor any gradient; an unmasked one does;
// - the logged loss is the masked sum times log_scale;
// - MTP depth 1 reads the mask shifted by one (its label's position).
#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include "support/job.h"
#include "weft/comm/process_groups.h"
#include "weft/parallel/grad_access.h"

namespace weft {
namespace {

TrainConfig config(int mtp) {
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden_size = 32;
  c.model.ffn_hidden_size = 48;
  c.model.num_attention_heads = 4;
  c.model.num_query_groups = 2;
  c.model.seq_length = 16;
  c.model.vocab_size = 64;
  c.model.mtp_num_layers = mtp;
  c.micro_batch_size = 2;
  c.global_batch_size = 2;
  c.train_iters = 0;
  c.device = test::test_device();  // on CUDA: the fused cross entropy's ignored labels
  return c;
}

// Equal on the CPU (deterministic); on CUDA within float32 noise of reordered sums.
bool cuda() { return test::test_device() == "cuda"; }

struct Result {
  double objective, logged_lm, logged_aux, logged_mtp;
  at::Tensor grads;  // every parameter gradient the stage holds, flattened
};

// One forward and backward of microbatch 0 on a fresh trainer (the same initial weights).
Result run(const TrainConfig& cfg, const at::Tensor& tokens, const at::Tensor& labels,
           const at::Tensor& mask, double log_scale, bool per_token = false) {
  Result r{};
  test::run_job(cfg, 1, /*self_only=*/true, nullptr, nullptr, [&](Trainer& t, const ProcessGroups&) {
    t.stage().reset_losses();
    const double loss_scale = 1.0 / (static_cast<double>(cfg.global_batch_size) * cfg.model.seq_length);
    const c10::Device dev(cfg.device);
    LossOptions o;
    o.mask = mask.defined() ? mask.to(dev) : mask;
    o.log_scale = log_scale;
    o.per_token = per_token;
    const at::Tensor loss = t.stage().forward(0, tokens.to(dev), labels.to(dev), loss_scale, o);
    r.objective = loss.item<double>();
    r.logged_lm = t.stage().losses()[0].item<double>();
    r.logged_aux = t.stage().losses()[1].item<double>();
    r.logged_mtp = t.stage().losses()[2].item<double>();
    t.stage().backward(0, loss, at::Tensor());
    std::vector<at::Tensor> g;
    for (const auto& u : t.stage().units()) g.push_back(grad_shard(*u).flatten().cpu());
    r.grads = at::cat(g);
  });
  return r;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

TEST(LossMask, OnesAndDuplicatedSamplesGiveTheUnmaskedObjective) {
  for (int mtp : {0, 1}) {
    SCOPED_TRACE(mtp);
    const TrainConfig cfg = config(mtp);
    at::manual_seed(5);
    const at::Tensor row = at::randint(64, {1, 16}, at::kLong);
    const at::Tensor tokens = at::cat({row, row});
    const at::Tensor lab_row = at::randint(64, {1, 16}, at::kLong);
    const at::Tensor labels = at::cat({lab_row, lab_row});
    const Result plain = run(cfg, tokens, labels, at::Tensor(), 0);
    const Result ones = run(cfg, tokens, labels, at::ones({2, 16}), 1.0 / 32);
    EXPECT_LE(rel(ones.objective, plain.objective), 1e-6);
    EXPECT_LE(rel(ones.logged_lm, plain.logged_lm), 1e-6);
    EXPECT_LE(rel(ones.logged_mtp, plain.logged_mtp), 1e-6);
    EXPECT_TRUE(at::allclose(ones.grads, plain.grads, 1e-5, 1e-7));
    // Row 1 masked out: the mean over row 0 alone, which equals the mean over both rows.
    const at::Tensor half = at::cat({at::ones({1, 16}), at::zeros({1, 16})});
    const Result masked = run(cfg, tokens, labels, half, 1.0 / 16);
    EXPECT_LE(rel(masked.objective, plain.objective), 1e-5);
    EXPECT_LE(rel(masked.logged_lm, plain.logged_lm), 1e-5);
    EXPECT_LE(rel(masked.logged_mtp, plain.logged_mtp), 1e-5);
    // Row 0 at twice the weight pulls as both equal rows did.
    EXPECT_TRUE(at::allclose(masked.grads, plain.grads, 1e-4, 1e-7));
  }
}

TEST(LossMask, AMaskedPositionsLabelChangesNothing) {
  const TrainConfig cfg = config(0);
  at::manual_seed(6);
  const at::Tensor tokens = at::randint(64, {2, 16}, at::kLong);
  const at::Tensor labels = at::randint(64, {2, 16}, at::kLong);
  at::Tensor mask = at::ones({2, 16});
  mask[0][5] = 0;
  mask[1][0] = 0;
  mask[1][9] = 0;
  const double log_scale = 1.0 / 29;
  const Result a = run(cfg, tokens, labels, mask, log_scale);
  at::Tensor other = labels.clone();
  other[0][5] = (other[0][5].item<int64_t>() + 7) % 64;
  other[1][9] = (other[1][9].item<int64_t>() + 3) % 64;
  const Result b = run(cfg, tokens, other, mask, log_scale);
  if (cuda()) {
    EXPECT_LE(rel(b.objective, a.objective), 1e-6);
    EXPECT_TRUE(at::allclose(a.grads, b.grads, 1e-5, 1e-8));
  } else {
    EXPECT_EQ(a.objective, b.objective);
    EXPECT_TRUE(at::equal(a.grads, b.grads));
  }
  at::Tensor unmasked = labels.clone();
  unmasked[0][6] = (unmasked[0][6].item<int64_t>() + 7) % 64;
  const Result c = run(cfg, tokens, unmasked, mask, log_scale);
  EXPECT_NE(a.objective, c.objective);
  // The microbatch's mean over its unmasked positions (micro batch = global batch: weight 1):
  // with row 1 masked out, row 0's masked sum over its 15 positions.
  at::Tensor only0 = mask.clone();
  only0[1].zero_();
  const Result d = run(cfg, tokens, labels, only0, 1.0);
  const double sum0 = d.logged_lm;  // log_scale 1: the masked sum itself
  EXPECT_LE(rel(d.objective, sum0 / 15), 1e-6);
  EXPECT_LE(rel(a.logged_lm, (a.objective * 29) * log_scale), 1e-6);  // sum / 29 both ways
}

// MTP depth 1 at position t predicts label t+1: position 0's mask (the label of position 0)
// never enters it, the last position's does (through position s-2).
TEST(LossMask, MtpTakesTheMaskShiftedByItsDepth) {
  const TrainConfig cfg = config(1);
  at::manual_seed(7);
  const at::Tensor tokens = at::randint(64, {2, 16}, at::kLong);
  const at::Tensor labels = at::randint(64, {2, 16}, at::kLong);
  at::Tensor first = at::ones({2, 16}), last = at::ones({2, 16});
  first.select(1, 0).zero_();
  last.select(1, 15).zero_();
  const Result all = run(cfg, tokens, labels, at::ones({2, 16}), 1.0 / 32);
  const Result a = run(cfg, tokens, labels, first, 1.0 / 30);
  const Result b = run(cfg, tokens, labels, last, 1.0 / 30);
  EXPECT_LE(rel(a.logged_mtp, all.logged_mtp), cuda() ? 1e-6 : 0.0);
  EXPECT_GT(rel(b.logged_mtp, all.logged_mtp), 1e-5);
  EXPECT_NE(a.logged_lm, all.logged_lm);
}

// --calculate-per-token-loss: the step's counted positions weigh the same. With a mask, the
// objective is the masked sum over the step's count (log_scale), not over the microbatch's;
// without one, the LM part is the default's and each MTP depth's sum takes the same weight
// (Megatron divides every gradient by the step's tokens), where the default takes its mean.
TEST(LossMask, PerTokenLossWeighsEveryCountedPositionAlike) {
  at::manual_seed(8);
  const at::Tensor tokens = at::randint(64, {2, 16}, at::kLong);
  const at::Tensor labels = at::randint(64, {2, 16}, at::kLong);
  at::Tensor mask = at::ones({2, 16});
  mask[0][3] = 0;
  mask[1][7] = 0;
  const TrainConfig lm_only = config(0);
  const Result dflt = run(lm_only, tokens, labels, mask, 1.0 / 40);
  const Result tok = run(lm_only, tokens, labels, mask, 1.0 / 40, /*per_token=*/true);
  const double sum = dflt.logged_lm * 40;
  EXPECT_LE(rel(dflt.objective, sum / 30), 1e-6);  // the microbatch's 30 positions
  EXPECT_LE(rel(tok.objective, sum / 40), 1e-6);   // the step's 40
  EXPECT_LE(rel(tok.logged_lm, dflt.logged_lm), 1e-6);
  const TrainConfig mtp = config(1);
  const Result d1 = run(mtp, tokens, labels, at::Tensor(), 0);
  const Result t1 = run(mtp, tokens, labels, at::Tensor(), 0, /*per_token=*/true);
  const double f = mtp.model.mtp_loss_scaling_factor;
  // logged MTP = its sum over 2 x 15 positions; per token it weighs 1 / 32 per position
  EXPECT_LE(rel(d1.objective, d1.logged_lm + f * d1.logged_mtp), 1e-6);
  EXPECT_LE(rel(t1.objective, d1.logged_lm + f * d1.logged_mtp * 30 / 32), 1e-6);
  EXPECT_LE(rel(t1.logged_mtp, d1.logged_mtp), 1e-6);
}

// The MoE aux losses: the default weighs them by the microbatch's share of the step (1 here);
// --calculate-per-token-loss by its positions over the step's counted ones (32 / 40), as
// Megatron's aux loss times the microbatch's tokens over the step's count.
TEST(LossMask, PerTokenAuxLossWeight) {
  TrainConfig cfg = config(0);
  cfg.model.num_experts = 4;
  cfg.model.moe_router_topk = 2;
  cfg.model.moe_ffn_hidden_size = 32;
  cfg.model.moe_aux_loss_coeff = 0.01;
  at::manual_seed(9);
  const at::Tensor tokens = at::randint(64, {2, 16}, at::kLong);
  const at::Tensor labels = at::randint(64, {2, 16}, at::kLong);
  at::Tensor mask = at::ones({2, 16});
  mask[0][2] = 0;
  mask[1][11] = 0;
  const Result d = run(cfg, tokens, labels, mask, 1.0 / 40);
  const Result t = run(cfg, tokens, labels, mask, 1.0 / 40, /*per_token=*/true);
  const double aux = d.logged_aux * cfg.model.num_moe_layers();  // share 1: the summed aux loss
  ASSERT_GT(aux, 0);
  const double c = cfg.model.moe_aux_loss_coeff;
  EXPECT_LE(rel(d.objective, d.logged_lm * 40 / 30 + c * aux), 1e-6);
  EXPECT_LE(rel(t.objective, t.logged_lm + c * aux * 32 / 40), 1e-6);
  EXPECT_LE(rel(t.logged_aux, d.logged_aux), 1e-6);
}

}  // namespace
}  // namespace weft
