// Single-rank tests of the engine's pieces: the layer split, the LR schedule, config refusals
// (each names its flag), mock-data determinism, and that the sharded AdamW matches an
// independent textbook AdamW on one parameter, with and without a gradient multiplier; and that
// the trainer clips by min(1, clip / (norm + 1e-6)), once. (The FSDP row-block arithmetic is
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

#include "weft/comm/process_groups.h"
#include "weft/core/error.h"
#include "weft/data/mock_dataset.h"
#include "weft/optim/adamw.h"
#include "weft/optim/grad_clip.h"
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

// The device of the tests below: WEFT_TEST_DEVICE (cpu unless set to cuda; on CUDA the
// optimizer takes the fused multi-tensor kernel, which applies the multiplier itself).
c10::Device clip_test_device() {
  const char* d = std::getenv("WEFT_TEST_DEVICE");
  return c10::Device(d && std::string(d) == "cuda" ? "cuda" : "cpu");
}

// One AdamW step of the textbook update on the gradient g, in float64, with the state (p, m, v)
// carried by the caller: weight decay wd, betas 0.9/0.95, the given eps.
void textbook_adamw_step(at::Tensor& p, at::Tensor& m, at::Tensor& v, const at::Tensor& g,
                         int step, double lr, double wd, double eps) {
  m = 0.9 * m + 0.1 * g;
  v = 0.95 * v + 0.05 * g * g;
  at::Tensor mh = m / (1 - std::pow(0.9, step)), vh = v / (1 - std::pow(0.95, step));
  p = p * (1 - lr * wd) - lr * mh / (vh.sqrt() + eps);
}

// step(lr, c) on gradients g equals a textbook AdamW on c * g, over steps with different
// coefficients. Adam divides m by sqrt(v), so a coefficient only shows where eps is not small
// against |c g| or where it changes between steps: eps 0.05 against gradients ~N(0, 1) and the
// coefficients 0.3, 1, 0.02 make a skipped, squared or inverted coefficient fail (checked below:
// the same steps without the coefficients end far away).
TEST(ShardedAdamW, GradMultiplierScalesTheGradients) {
  const c10::Device dev = clip_test_device();
  LayoutConfig l;
  Mesh mesh(l);
  ProcessGroups groups(mesh, Backend::kMpi, MPI_COMM_SELF);
  std::vector<ParamSpec> specs = {{"a.weight", {6, 5}, InitKind::kNormal, true}};
  FsdpUnit unit("a", specs, groups.get("fsdp_shard"), at::kFloat, dev);
  const at::Tensor w0 = at::randn({6, 5}, at::kDouble);
  unit.load_full([&](const ParamSpec&) { return w0.to(at::kFloat).to(dev); });
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  cfg.eps = 0.05;
  ShardedAdamW opt({&unit}, cfg);
  const double lr = 0.01;
  at::Tensor p = w0.clone(), m = at::zeros_like(p), v = at::zeros_like(p);
  at::Tensor p1 = w0.clone(), m1 = at::zeros_like(p), v1 = at::zeros_like(p);  // coefficient 1
  const double coefs[] = {0.3, 1.0, 0.02};
  for (int step = 1; step <= 3; ++step) {
    const double c = coefs[step - 1];
    const at::Tensor g = at::randn({6, 5}, at::kDouble);
    opt.zero_grad();
    grad_shard(unit, 0).copy_(g.reshape({-1}));
    opt.step(lr, c);
    textbook_adamw_step(p, m, v, c * g, step, lr, cfg.weight_decay, cfg.eps);
    textbook_adamw_step(p1, m1, v1, g, step, lr, cfg.weight_decay, cfg.eps);
    unit.unshard();
    const at::Tensor got = unit.backward_weight(0).to(at::kDouble).cpu();
    EXPECT_TRUE(at::allclose(got, p, 1e-5, 1e-6))
        << "step " << step << " coefficient " << c << ": max diff "
        << (got - p).abs().max().item<double>();
  }
  // The test can tell: without the coefficients the weights end far from these.
  EXPECT_GT((p - p1).abs().max().item<double>(), 1e-3);
}

// The clipping multiplier computed on the device (clip_grad_scale, fed to the fused AdamW as its
// grad_scale) is bitwise the host's: 1 / clip_multiplier(sqrt(sumsq), clip) in float32, over
// norms below, at and far above the clip value. Seen to fail with the min(1, ...) left out and
// with the 1e-6 left out.
TEST(GradClip, DeviceScaleEqualsHostMultiplier) {
  at::Tensor draws = at::rand({2000}, at::kDouble).mul_(12).sub_(6).exp_();  // norms e^-6..e^6
  int checked = 0;
  for (double clip : {0.3, 1.0, 7.0}) {
    for (int64_t i = 0; i < draws.numel(); ++i) {
      const double norm = draws[i].item<double>();
      const double sumsq = norm * norm;
      const float host = static_cast<float>(1.0 / clip_multiplier(std::sqrt(sumsq), clip));
      const float dev = clip_grad_scale(at::full({}, sumsq, at::kDouble), clip).item<float>();
      ASSERT_EQ(host, dev) << "norm " << norm << " clip " << clip;
      ++checked;
    }
    EXPECT_EQ(clip_grad_scale(at::full({}, 0.0, at::kDouble), clip).item<float>(), 1.0f);
  }
  EXPECT_EQ(checked, 6000);
}

// step_on_device (the trainer's CUDA path: the clipping multiplier as a device tensor holding
// 1 / coefficient, the skip decision as found_inf) updates bitwise like step(lr, coefficient)
// on the host's decisions, over clipped, unclipped and skipped steps; a skipped step changes
// neither the state nor, once uncounted, the step count. On CPU it queues nothing.
TEST(ShardedAdamW, StepOnDeviceEqualsHostStep) {
  const c10::Device dev = clip_test_device();
  LayoutConfig l;
  Mesh mesh(l);
  ProcessGroups groups(mesh, Backend::kMpi, MPI_COMM_SELF);
  std::vector<ParamSpec> specs = {{"a.weight", {6, 5}, InitKind::kNormal, true},
                                  {"a.norm", {5}, InitKind::kOnes, false}};
  const at::Tensor w0 = at::randn({6, 5}, at::kDouble);
  auto make_unit = [&] {
    auto u = std::make_unique<FsdpUnit>("a", specs, groups.get("fsdp_shard"), at::kFloat, dev);
    u->load_full([&](const ParamSpec& s) {
      return (s.name == "a.weight" ? w0.to(at::kFloat) : at::ones({5})).to(dev);
    });
    return u;
  };
  auto host_unit = make_unit(), dev_unit = make_unit();
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  ShardedAdamW host({host_unit.get()}, cfg), on_dev({dev_unit.get()}, cfg);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
  if (!dev.is_cuda()) {
    EXPECT_FALSE(on_dev.step_on_device(0.01, at::Tensor(), at::zeros({}, f32)));
    EXPECT_EQ(on_dev.steps(), 0);
    return;
  }
  const double coefs[] = {0.3, 1.0, -1 /* skipped */, 0.02};
  for (double c : coefs) {
    const at::Tensor g = at::randn({35}, at::kDouble).to(f32);
    host.zero_grad();
    on_dev.zero_grad();
    grad_shard(*host_unit).copy_(g);
    grad_shard(*dev_unit).copy_(g);
    if (c > 0) host.step(0.01, c);
    at::Tensor scale;
    if (c > 0) scale = at::full({}, 1.0 / c, f32);  // 1.0 too, as the trainer passes it
    ASSERT_TRUE(on_dev.step_on_device(0.01, scale, at::full({}, c > 0 ? 0.0 : 1.0, f32)));
    if (c < 0) on_dev.uncount_step();
    EXPECT_EQ(on_dev.steps(), host.steps());
    for (auto [a, b] : {std::pair{host.state(0).master, on_dev.state(0).master},
                        std::pair{host.state(0).exp_avg, on_dev.state(0).exp_avg},
                        std::pair{host.state(0).exp_avg_sq, on_dev.state(0).exp_avg_sq}})
      EXPECT_TRUE(at::equal(a, b)) << "coefficient " << c;
  }
}

// The trainer's clipping coefficient is min(1, clip / (norm + 1e-6)), applied once to the
// gradients of the AdamW step. One step of a small model, world 1, weight decay 0, eps 1e-3 (of
// the order of the clipped gradient entries, so that the step depends on their scale): the
// gradients and the norm N come from a run with --clip-grad 0, then runs with --clip-grad N/4
// (coefficient ~1/4) and 1e6 (coefficient 1) must move every master weight by the textbook
// first AdamW step on coefficient * gradient, computed here in float64. The test checks that
// skipping the coefficient, squaring it, or dropping the min(1, ...) would miss the tolerance.
TEST(Trainer, ClipGradCoefficient) {
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden_size = 32;
  c.model.ffn_hidden_size = 48;
  c.model.seq_length = 16;
  c.model.vocab_size = 64;
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  c.train_iters = 1;
  c.eval_interval = 0;
  c.quiet = true;
  c.adam.weight_decay = 0;
  c.adam.eps = 1e-3;
  c.lr.lr = 0.01;
  c.lr.style = "constant";
  c.device = clip_test_device().str();
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
  TrainConfig c;
  c.model.num_layers = 2;
  c.model.hidden_size = 32;
  c.model.ffn_hidden_size = 48;
  c.model.seq_length = 16;
  c.model.vocab_size = 64;
  c.micro_batch_size = 2;
  c.global_batch_size = 4;
  c.train_iters = 3;
  c.eval_interval = 0;
  c.quiet = true;
  c.lr.lr = 0.01;
  c.lr.style = "constant";
  c.device = clip_test_device().str();
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
