// Single-rank tests of the engine's pieces: the layer split, the LR schedule, config refusals
// (each names its flag), mock-data determinism, the FSDP row-block arithmetic, and that the
// sharded AdamW matches an independent textbook AdamW on one parameter.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "weft/core/error.h"
#include "weft/data/mock_dataset.h"
#include "weft/optim/adamw.h"
#include "weft/optim/lr_schedule.h"
#include "weft/parallel/grad_access.h"
#include "weft/train/trainer.h"

namespace weft {
namespace {

template <typename F>
void expect_usage(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error naming " << needle;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(SplitLayers, EvenAndUneven) {
  EXPECT_EQ(split_layers(8, 2, -1, -1), (std::vector<int>{4, 4}));
  EXPECT_EQ(split_layers(6, 4, 1, 1), (std::vector<int>{1, 2, 2, 1}));
  EXPECT_EQ(split_layers(7, 3, 3, -1), (std::vector<int>{3, 2, 2}));
  EXPECT_EQ(split_layers(5, 2, 3, 2), (std::vector<int>{3, 2}));
  expect_usage([] { split_layers(7, 2, -1, -1); }, "--num-layers 7 is not divisible");
  expect_usage([] { split_layers(6, 4, 1, 2); }, "do not split evenly");
  expect_usage([] { split_layers(5, 2, 3, 3); }, "do not split evenly");
}

// Every iteration of every style against the closed forms, written here: warmup lr * it / W for
// it <= W; then with t = (it - W) / (D - W): cosine min + (lr - min) (1 + cos(pi t)) / 2, linear
// min + (lr - min) (1 - t), constant lr; min after D. Cosine and linear differ everywhere but at
// t = 0, 1/2 and 1, so replacing one by the other fails.
TEST(LrSchedule, WarmupCosineLinear) {
  LrScheduleConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_iters = 4;
  c.decay_iters = 14;
  for (const char* style : {"cosine", "linear", "constant"}) {
    c.style = style;
    for (int it = 1; it <= 20; ++it) {
      double want;
      if (it <= 4) {
        want = it / 4.0;
      } else if (c.style == "constant") {
        want = 1.0;
      } else if (it >= 14) {
        want = 0.1;
      } else {
        const double t = (it - 4) / 10.0;
        want = c.style == "cosine" ? 0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * t))
                                   : 0.1 + 0.9 * (1.0 - t);
      }
      EXPECT_NEAR(lr_at(c, it), want, 1e-12) << style << " iteration " << it;
    }
  }
  c.style = "cosine";
  EXPECT_GT(std::abs(lr_at(c, 6) - (0.1 + 0.9 * 0.8)), 0.05) << "cosine looks linear";
  c.style = "step";
  expect_usage([&] { validate_lr_schedule(c); }, "--lr-decay-style");
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

// One-rank group: the FSDP unit's full weights are views of the flat shard and the update of
// the sharded AdamW equals a textbook AdamW.
TEST(ShardedAdamW, MatchesTextbookAdamW) {
  LayoutConfig l;
  Mesh mesh(l);
  ProcessGroups groups(mesh, Backend::kMpi, MPI_COMM_SELF);
  std::vector<ParamSpec> specs = {{"a.weight", {3, 4}, InitKind::kNormal, true},
                                  {"a.norm", {4}, InitKind::kOnes, false}};
  FsdpUnit unit("a", specs, groups.get("fsdp_shard"), at::kFloat, c10::Device("cpu"));
  at::Tensor w0 = at::randn({3, 4}, at::kDouble).to(at::kFloat);
  unit.load_full([&](const ParamSpec& s) { return s.name == "a.weight" ? w0 : at::ones({4}); });
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  ShardedAdamW opt({&unit}, cfg);
  EXPECT_TRUE(unit.param_shard().is_same(opt.state(0).master));
  // Reference state in double.
  at::Tensor p = w0.to(at::kDouble), m = at::zeros_like(p), v = at::zeros_like(p);
  for (int step = 1; step <= 3; ++step) {
    at::Tensor g = at::randn({3, 4}, at::kDouble);
    opt.zero_grad();
    grad_shard(unit, 0).copy_(g.reshape({-1}));
    opt.step(0.01);
    m = 0.9 * m + 0.1 * g;
    v = 0.95 * v + 0.05 * g * g;
    at::Tensor mh = m / (1 - std::pow(0.9, step)), vh = v / (1 - std::pow(0.95, step));
    p = p * (1 - 0.01 * 0.1) - 0.01 * mh / (vh.sqrt() + 1e-8);
    unit.unshard();
    at::Tensor got = unit.backward_weight(0).to(at::kDouble);
    EXPECT_TRUE(at::allclose(got, p, 1e-5, 1e-6)) << "step " << step;
  }
  // The norm (no_decay) with zero gradient stays at one.
  EXPECT_TRUE(at::equal(unit.backward_weight(1), at::ones({4})));
  EXPECT_EQ(opt.group_name_of("a.norm"), "no_decay");
  EXPECT_EQ(opt.group_name_of("a.weight"), "decay");
}

}  // namespace
}  // namespace weft
