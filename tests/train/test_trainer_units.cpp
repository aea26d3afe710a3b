// Single-rank tests of the trainer's pieces: the layer split, config refusals (each names its
// flag), mock-data determinism; that the trainer clips by min(1, clip / (norm + 1e-6)), once,
// and skips a non-finite step without touching the state. The optimizer's own tests (AdamW, the
// LR schedule, the clipping arithmetic) are in tests/optim. (The FSDP row-block arithmetic is
// checked elsewhere: test_plan.cpp compares every rank's shard sizes, padded rows included, with
// plan.cpp's independent count; test_parity.cpp's dp8 runs ranks with empty shards.)
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/expect_usage.h"
#include "support/job.h"
#include "support/tiny_config.h"
#include "weft/comm/device_graph.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"
#include "weft/data/mock_dataset.h"
#include "weft/model/hybrid.h"
#include "weft/optim/adamw.h"
#include "weft/optim/grad_clip.h"
#include "weft/optim/lr_schedule.h"
#include "weft/parallel/grad_access.h"
#include "weft/train/trainer.h"

namespace weft {
namespace {

using test::expect_usage;

TEST(SplitLayers, EvenAndUneven) {
  EXPECT_EQ(split_layers(8, 2, -1, -1), (std::vector<int>{4, 4}));
  EXPECT_EQ(split_layers(6, 4, 1, 1), (std::vector<int>{1, 2, 2, 1}));
  EXPECT_EQ(split_layers(7, 3, 3, -1), (std::vector<int>{3, 2, 2}));
  EXPECT_EQ(split_layers(5, 2, 3, 2), (std::vector<int>{3, 2}));
  expect_usage([] { split_layers(7, 2, -1, -1); }, "--num-layers 7 is not divisible");
  expect_usage([] { split_layers(6, 4, 1, 2); }, "do not split evenly");
  expect_usage([] { split_layers(5, 2, 3, 3); }, "do not split evenly");
}

TEST(TrainConfig, Refusals) {
  TrainConfig c;
  auto v = [&](int world) { return [&c, world] { validate_train_config(c, world); }; };
  c.layout.tp = 2;
  expect_usage(v(2), "--tensor-model-parallel-size");
  c = TrainConfig();
  c.layout.cp = 2;
  expect_usage(v(2), "--context-parallel-size");
  c = TrainConfig();
  c.global_batch_size = 10;
  expect_usage(v(4), "--global-batch-size 10");
  c = TrainConfig();
  c.model.num_query_groups = 3;
  expect_usage(v(1), "--num-query-groups");
  c = TrainConfig();
  c.layout.pp = 3;
  expect_usage(v(3), "--num-layers 4 is not divisible");
  c = TrainConfig();
  c.device = "tpu";
  expect_usage(v(1), "--device");
  c = TrainConfig();
  c.layout.pp = 3;
  expect_usage(v(4), "world size 4 is not divisible by tp*cp*pp");
}

// --cuda-graph-impl: each refusal names its flag, before anything runs; the layouts a graph
// can replay (one stage, FSDP shard groups of one rank, HSDP replicas around them) pass.
TEST(TrainConfig, CudaGraphRefusals) {
  TrainConfig c;
  c.device = "cuda";
  c.cuda_graph_impl = "local";
  auto v = [&](int world) { return [&c, world] { validate_train_config(c, world); }; };
  EXPECT_NO_THROW(v(1)());
  c.layout.dp_outer = 2;
  EXPECT_NO_THROW(v(2)());  // HSDP of two replicas, each a shard group of one rank
  c.layout.dp_outer = 1;
  expect_usage(v(2), "FSDP shard group of one rank (got 2");
  c.layout.pp = 2;
  expect_usage(v(2), "--pipeline-model-parallel-size 1 (got 2)");
  c.layout.pp = 1;
  c.device = "cpu";
  expect_usage(v(1), "--cuda-graph-impl local needs --device cuda");
  c.device = "cuda";
  c.model.num_experts = 4;
  c.model.moe_layer_pattern = {1, 1, 1, 1};
  expect_usage(v(1), "--num-experts 4");
  c.model = TrainConfig().model;
  c.cuda_graph_impl = "transformer_engine";
  expect_usage(v(1), "Transformer Engine");
  c.cuda_graph_impl = "full";
  expect_usage(v(1), "--cuda-graph-impl must be none or local (got 'full')");
  c.cuda_graph_impl = "local";
  c.cuda_graph_warmup_steps = 0;
  expect_usage(v(1), "--cuda-graph-warmup-steps must be >= 1 (got 0)");
  c.cuda_graph_warmup_steps = 1;
  // One batch throughout replays one loss scale; a schedule that changes it cannot.
  c.step_batch_size_schedule = "0:16";
  EXPECT_NO_THROW(v(1)());
  c.step_batch_size_schedule = "0:16 1M:32";
  expect_usage(v(1), "does not support a --step-batch-size-schedule that changes the batch");
}

// --cuda-graph-impl local replays what the eager steps ran: the same losses and gradient
// norms, bit for bit, from the captured iteration on. Dense bf16, dense bf16 with bf16
// gradients (--grad-reduce-in-bf16: the embedding's sums need no host read), dense fp32 with two
// MTP depths, and a hybrid Mamba-2 model; 4 microbatches per step, so one graph is replayed with
// four different batches and accumulates their gradients. Runs with WEFT_TEST_DEVICE=cuda
// (bench/gpu/run.sh tests); skipped on CPU, where there are no graphs.
TEST(CudaGraph, ReplayEqualsEagerBitwise) {
  if (test::test_device() != "cuda" || !cuda_graphs_available())
    GTEST_SKIP() << "needs --device cuda and the CUDA build";
  if (test::world_rank() != 0) GTEST_SKIP() << "one rank";
  for (const std::string variant : {"dense bf16", "bf16 grads", "dense mtp", "hybrid"}) {
    TrainConfig c = test::tiny_config({.num_layers = 2, .global_batch_size = 8,
                                       .train_iters = 6, .seed = 11});
    if (variant == "dense bf16" || variant == "bf16 grads") c.model.bf16 = true;
    if (variant == "bf16 grads") c.adam.grad_dtype = at::kBFloat16;
    if (variant == "dense mtp") c.model.mtp_num_layers = 2;
    if (variant == "hybrid") {
      c.model.mamba_state_dim = 8;
      c.model.mamba_head_dim = 8;
      c.model.mamba_num_groups = 2;
      c.model.mamba_chunk_size = 4;
      apply_hybrid_layer_pattern("M*-M", &c.model);
    }
    const auto eager = test::run_job(c, 1, /*self_only=*/true);
    c.cuda_graph_impl = "local";
    c.cuda_graph_warmup_steps = 2;
    bool captured = false;
    const auto graphed = test::run_job(c, 1, true, nullptr, nullptr,
                                       [&](Trainer& t, const ProcessGroups&) {
                                         captured = t.cuda_graph_captured();
                                       });
    EXPECT_TRUE(captured) << variant;
    ASSERT_EQ(graphed.size(), eager.size()) << variant;
    for (size_t i = 0; i < eager.size(); ++i) {
      EXPECT_EQ(graphed[i].lm_loss, eager[i].lm_loss) << variant << ", iteration " << i + 1;
      EXPECT_EQ(graphed[i].mtp_loss, eager[i].mtp_loss) << variant << ", iteration " << i + 1;
      EXPECT_EQ(graphed[i].grad_norm, eager[i].grad_norm) << variant << ", iteration " << i + 1;
    }
  }
}

TEST(MockDataset, DeterministicAndShifted) {
  MockDataset d(3, 50, 8);
  at::Tensor t1, l1, t2, l2;
  d.batch(10, 4, &t1, &l1);
  d.batch(12, 1, &t2, &l2);
  EXPECT_TRUE(at::equal(t1[2], t2[0]));
  EXPECT_TRUE(at::equal(t1[0].narrow(0, 1, 7), l1[0].narrow(0, 0, 7)));
  EXPECT_LT(t1.max().item<int64_t>(), 50);
  EXPECT_GE(t1.min().item<int64_t>(), 0);
}

// `train_iters` iterations of the tiny model on 2 layers on one rank: global batch 4, constant
// lr 0.01, no evaluation, on test_device().
TrainConfig one_rank_config(int train_iters) {
  TrainConfig c;
  c.model = test::tiny_model(2);
  c.global_batch_size = 4;
  c.train_iters = train_iters;
  c.eval_interval = 0;
  c.quiet = true;
  c.lr.lr = 0.01;
  c.lr.style = "constant";
  c.device = test::test_device();
  return c;
}

// Megatron's schedule timing (lr_schedule.h): an iteration updates with the rate of the updates
// made before it, and logs the rate after. With warmup from 0 the first update moves nothing
// (AdamW's step and its weight decay both scale with the rate); with --lr-warmup-init it does.
// A skipped iteration does not advance the schedule. And without warmup the first update runs
// at --lr, so cosine and constant decay give the same second loss and part after.
TEST(Trainer, LearningRateOfTheUpdatesMadeBefore) {
  auto masters = [](Trainer& t) {
    std::vector<at::Tensor> out;
    for (size_t k = 0; k < t.optimizer().units().size(); ++k)
      out.push_back(t.optimizer().state(k).master.cpu().clone());
    return out;
  };
  LayoutConfig l;
  Mesh mesh(l);
  ProcessGroups groups(mesh, Backend::kMpi, MPI_COMM_SELF);
  for (double init : {0.0, 0.002}) {
    TrainConfig c = one_rank_config(4);
    c.lr.warmup_iters = 2;
    c.lr.warmup_init = init;
    Trainer t(c, groups);
    const std::vector<at::Tensor> before = masters(t);
    const IterationStats s1 = t.train_step();
    EXPECT_DOUBLE_EQ(s1.lr, init + (0.01 - init) / 2);  // the rate after one update
    const std::vector<at::Tensor> after = masters(t);
    for (size_t k = 0; k < before.size(); ++k)
      EXPECT_EQ(at::equal(before[k], after[k]), init == 0.0) << "init " << init << " unit " << k;
    // A skipped step leaves the schedule where it was.
    const at::Tensor& shard = t.optimizer().units().at(0)->param_shard();
    const at::Tensor kept = shard[0].clone();
    shard[0].fill_(std::numeric_limits<double>::quiet_NaN());
    const IterationStats s2 = t.train_step();
    ASSERT_TRUE(s2.skipped);
    EXPECT_DOUBLE_EQ(s2.lr, s1.lr);
    shard[0].copy_(kept);
    EXPECT_DOUBLE_EQ(t.train_step().lr, 0.01);
  }
  std::vector<std::vector<IterationStats>> runs;
  for (const char* style : {"cosine", "constant"}) {
    TrainConfig c = one_rank_config(3);
    c.lr.style = style;
    c.lr.min_lr = 0.001;
    runs.push_back(test::run_job(c, 1, /*self_only=*/true));
  }
  ASSERT_EQ(runs[0].size(), 3u);
  EXPECT_EQ(runs[0][1].lm_loss, runs[1][1].lm_loss);
  EXPECT_NE(runs[0][2].lm_loss, runs[1][2].lm_loss);
}

// The trainer's clipping coefficient is min(1, clip / (norm + 1e-6)), applied once to the
// gradients of the AdamW step. One step of a small model, world 1, weight decay 0, eps 1e-3 (of
// the order of the clipped gradient entries, so that the step depends on their scale): the
// gradients and the norm N come from a run with --clip-grad 0, then runs with --clip-grad N/4
// (coefficient ~1/4) and 1e6 (coefficient 1) must move every master weight by the textbook
// first AdamW step on coefficient * gradient, computed here in float64. The test checks that
// skipping the coefficient, squaring it, or dropping the min(1, ...) would miss the tolerance.
TEST(Trainer, ClipGradCoefficient) {
  TrainConfig c = one_rank_config(1);
  c.adam.weight_decay = 0;
  c.adam.eps = 1e-3;
  LayoutConfig l;
  Mesh mesh(l);
  ProcessGroups groups(mesh, Backend::kMpi, MPI_COMM_SELF);
  auto masters = [](Trainer& t) {
    std::vector<at::Tensor> out;
    for (size_t k = 0; k < t.optimizer().units().size(); ++k)
      out.push_back(t.optimizer().state(k).master.to(at::kDouble).cpu());
    return out;
  };

  // The unclipped run: initial masters, gradients (a multiplier of 1 leaves them in place) and
  // the norm, which must be the norm of these gradients.
  c.clip_grad = 0;
  Trainer ref(c, groups);
  const std::vector<at::Tensor> p0 = masters(ref);
  const IterationStats s0 = ref.train_step();
  std::vector<at::Tensor> grads;
  double sumsq = 0;
  for (FsdpUnit* u : ref.optimizer().units()) {
    grads.push_back(grad_shard(*u).to(at::kDouble).cpu());
    sumsq += grads.back().pow(2).sum().item<double>();
  }
  const double norm = s0.grad_norm;
  ASSERT_GT(norm, 0);
  EXPECT_NEAR(norm, std::sqrt(sumsq), 1e-6 * norm);

  // The masters after one textbook AdamW step (step 1: m^ = g, v^ = g^2) on coef * g.
  auto textbook = [&](double coef) {
    std::vector<at::Tensor> out;
    for (size_t k = 0; k < p0.size(); ++k) {
      const at::Tensor g = coef * grads[k];
      out.push_back(p0[k] - s0.lr * g / (g.abs() + c.adam.eps));
    }
    return out;
  };
  // max |got - want| over the step size: 0 for the exact update, 1 for one twice as large.
  auto step_err = [&](const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
    double e = 0;
    for (size_t k = 0; k < got.size(); ++k)
      e = std::max(e, (got[k] - want[k]).abs().max().item<double>());
    return e / s0.lr;
  };
  constexpr double kTol = 1e-4;  // float32 masters ~0.05 moved by ~lr: ~1e-5 of a step

  for (double clip : {norm / 4, 1e6}) {
    SCOPED_TRACE(::testing::Message() << "--clip-grad " << clip << ", norm " << norm);
    c.clip_grad = clip;
    Trainer t(c, groups);
    const std::vector<at::Tensor> start = masters(t);
    ASSERT_EQ(start.size(), p0.size());
    for (size_t k = 0; k < p0.size(); ++k) ASSERT_TRUE(at::equal(start[k], p0[k])) << k;
    const IterationStats s = t.train_step();
    EXPECT_NEAR(s.grad_norm, norm, 1e-9 * norm);  // the norm before clipping, as Megatron logs it
    const double coef = std::min(1.0, clip / (norm + 1e-6));
    const std::vector<at::Tensor> got = masters(t);
    EXPECT_LT(step_err(got, textbook(coef)), kTol);
    // What a wrong coefficient would give is far outside the tolerance.
    if (coef < 1) {
      EXPECT_GT(step_err(got, textbook(1.0)), 100 * kTol) << "unclipped";
      EXPECT_GT(step_err(got, textbook(coef * coef)), 100 * kTol) << "clipped twice";
    } else {
      EXPECT_GT(step_err(got, textbook(clip / (norm + 1e-6))), 100 * kTol) << "no min(1, .)";
    }
  }
}

// The skip path: a step whose loss and gradient norm are non-finite is counted in both counters
// and changes no weight and no optimizer state. The NaN is planted in one element of a weight
// shard through the public API (with float32 compute the shard is the optimizer's master, so
// the planted value is part of the state and must survive bitwise). One normal step first makes
// the moments non-zero; after the skipped step the planted element is restored and the next
// step must train again (not skipped, every master moved).
TEST(Trainer, NonFiniteStepIsSkippedAndLeavesTheStateUnchanged) {
  TrainConfig c = one_rank_config(3);
  LayoutConfig l;
  Mesh mesh(l);
  ProcessGroups groups(mesh, Backend::kMpi, MPI_COMM_SELF);
  Trainer t(c, groups);
  // Every byte of the training state: weight shards, masters, moments and the step count.
  auto state = [&t] {
    std::vector<at::Tensor> out;
    ShardedAdamW& opt = t.optimizer();
    for (size_t k = 0; k < opt.units().size(); ++k) {
      out.push_back(opt.units()[k]->param_shard().cpu().contiguous().clone());
      out.push_back(opt.state(k).master.cpu().contiguous().clone());
      out.push_back(opt.state(k).exp_avg.cpu().contiguous().clone());
      out.push_back(opt.state(k).exp_avg_sq.cpu().contiguous().clone());
    }
    out.push_back(at::tensor({opt.steps()}, at::kLong));
    return out;
  };
  auto same_bits = [](const at::Tensor& a, const at::Tensor& b) {
    return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
           std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
  };

  const IterationStats s1 = t.train_step();
  ASSERT_FALSE(s1.skipped);
  ASSERT_TRUE(std::isfinite(s1.lm_loss));
  EXPECT_EQ(t.skipped_iterations(), 0);
  EXPECT_EQ(t.nan_iterations(), 0);

  const at::Tensor& shard = t.optimizer().units().at(0)->param_shard();
  const at::Tensor kept = shard[0].clone();
  shard[0].fill_(std::numeric_limits<double>::quiet_NaN());
  const std::vector<at::Tensor> before = state();
  const IterationStats s2 = t.train_step();
  EXPECT_TRUE(s2.skipped);
  EXPECT_FALSE(std::isfinite(s2.lm_loss));
  EXPECT_FALSE(std::isfinite(s2.grad_norm));
  EXPECT_EQ(s2.iteration, 2);
  EXPECT_EQ(t.iteration(), 2);
  EXPECT_EQ(t.skipped_iterations(), 1);
  EXPECT_EQ(t.nan_iterations(), 1);
  const std::vector<at::Tensor> after = state();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(same_bits(before[i], after[i])) << "state tensor " << i << " changed";

  shard[0].copy_(kept);
  const std::vector<at::Tensor> restored = state();
  const IterationStats s3 = t.train_step();
  EXPECT_FALSE(s3.skipped);
  EXPECT_TRUE(std::isfinite(s3.lm_loss));
  EXPECT_EQ(t.skipped_iterations(), 1);
  EXPECT_EQ(t.optimizer().steps(), 2);
  const std::vector<at::Tensor> trained = state();
  for (size_t k = 0; k < t.optimizer().units().size(); ++k)
    EXPECT_FALSE(same_bits(restored[4 * k + 1], trained[4 * k + 1])) << "unit " << k;
}

}  // namespace
}  // namespace weft
