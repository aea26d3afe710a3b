// The optimizer layer's tests (src/weft/optim), one rank: the LR schedule against its closed
// forms; the sharded AdamW against an independent textbook AdamW, with and without a gradient
// multiplier; the device-side clipping multiplier and step (the trainer's CUDA path) bitwise
// against the host's. WEFT_TEST_DEVICE=cuda runs the AdamW tests on the GPU, where the fused
// multi-tensor kernel applies the multiplier itself.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "support/job.h"
#include "support/expect_usage.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"
#include "weft/mesh/mesh.h"
#include "weft/optim/adamw.h"
#include "weft/optim/grad_clip.h"
#include "weft/optim/lr_schedule.h"
#include "weft/parallel/fsdp_unit.h"
#include "weft/parallel/grad_access.h"

namespace weft {
namespace {

using test::expect_usage;

// One rank's process groups (MPI_COMM_SELF): a unit's shard is its whole parameters.
struct OneRank {
  LayoutConfig layout;
  Mesh mesh{layout};
  ProcessGroups groups{mesh, Backend::kMpi, MPI_COMM_SELF};
};

// Every count of updates made (Megatron's scheduler steps, from 0) of every style against the
// closed forms, written here: warmup init + (lr - init) * it / W for it <= W; then with t = (it - W) / (D - W): cosine min + (lr - min) (1 + cos(pi t)) / 2, linear
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
    for (int it = 0; it <= 20; ++it) {
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
  // --lr-warmup-init: the first update's rate, then linear to --lr.
  c.warmup_init = 0.2;
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 0.2);
  EXPECT_DOUBLE_EQ(lr_at(c, 1), 0.2 + 0.8 / 4);
  EXPECT_DOUBLE_EQ(lr_at(c, 4), 1.0);
  c.warmup_init = -1;
  expect_usage([&] { validate_lr_schedule(c); }, "--lr-warmup-init");
  c.warmup_init = 0;
  c.style = "step";
  expect_usage([&] { validate_lr_schedule(c); }, "--lr-decay-style");
}

// The weight decay's schedule (Megatron's get_wd) against its closed forms over samples n of
// an increment of N: linear start + (end - start) n / N, cosine start + (end - start) (1 +
// cos(pi (1 - n / N))) / 2, the end value past N, constant the end value; the flag checks.
TEST(LrSchedule, WeightDecayIncrement) {
  LrScheduleConfig c;
  c.wd_style = "linear";
  c.start_wd = 0.01;
  c.end_wd = 0.11;
  c.wd_incr_samples = 40;
  for (const char* style : {"linear", "cosine"}) {
    c.wd_style = style;
    for (int n = 0; n <= 48; n += 4) {
      const double r = std::min(n / 40.0, 1.0);
      const double coeff = c.wd_style == "linear" ? r : 0.5 * (1.0 + std::cos(M_PI * (1.0 - r)));
      EXPECT_NEAR(wd_at(c, n), 0.01 + 0.1 * coeff, 1e-15) << style << " at " << n;
    }
  }
  EXPECT_GT(std::abs(wd_at(c, 10) - (0.01 + 0.1 * 0.25)), 0.01) << "cosine looks linear";
  EXPECT_DOUBLE_EQ(wd_at(c, 0), 0.01);
  // resolve_weight_decay: constant takes --weight-decay for both ends.
  LrScheduleConfig k;
  resolve_weight_decay(&k, 0.3);
  EXPECT_EQ(k.start_wd, 0.3);
  EXPECT_EQ(wd_at(k, 0), 0.3);
  EXPECT_EQ(wd_at(k, 1e9), 0.3);
  LrScheduleConfig bad;
  bad.start_wd = 0.1;
  expect_usage([&] { resolve_weight_decay(&bad, 0.1); }, "--start-weight-decay 0.1 needs");
  bad.wd_style = "cosine";
  expect_usage([&] { resolve_weight_decay(&bad, 0.1); }, "needs --end-weight-decay");
  bad.end_wd = 0.05;
  expect_usage([&] { resolve_weight_decay(&bad, 0.1); }, "--end-weight-decay 0.05 is smaller");
  bad.start_wd = -0.5;
  expect_usage([&] { resolve_weight_decay(&bad, 0.1); }, "--start-weight-decay must be >= 0");
  bad.wd_style = "exponential";
  expect_usage([&] { resolve_weight_decay(&bad, 0.1); }, "--weight-decay-incr-style");
}

// --decoupled-lr: the same schedule with its own peak and minimum (default --min-lr), from the
// same warmup start; the flag checks.
TEST(LrSchedule, DecoupledRate) {
  LrScheduleConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_iters = 2;
  c.decay_iters = 10;
  c.warmup_init = 0.05;
  c.style = "cosine";
  c.decoupled_lr = 3.0;
  LrScheduleConfig d = c;
  d.lr = 3.0;
  for (int n = 0; n <= 12; ++n) EXPECT_EQ(decoupled_lr_at(c, n), lr_at(d, n)) << n;
  EXPECT_EQ(decoupled_lr_at(c, 2), 3.0);
  EXPECT_EQ(decoupled_lr_at(c, 12), 0.1);
  c.decoupled_min_lr = 0.4;
  EXPECT_EQ(decoupled_lr_at(c, 12), 0.4);
  EXPECT_NEAR(decoupled_lr_at(c, 6), 0.4 + 2.6 * 0.5, 1e-12);  // half way through the decay
  EXPECT_EQ(lr_at(c, 12), 0.1);  // the other parameters keep theirs
  c.decoupled_min_lr = 4.0;
  expect_usage([&] { validate_lr_schedule(c); }, "--decoupled-min-lr 4 must be between");
  c.decoupled_lr = -1;
  expect_usage([&] { validate_lr_schedule(c); }, "--decoupled-min-lr 4 needs --decoupled-lr");
  c.decoupled_min_lr = -1;
  c.decoupled_lr = 0.05;
  expect_usage([&] { validate_lr_schedule(c); }, "--decoupled-lr 0.05 is smaller than --min-lr");
}

// One-rank group: the FSDP unit's full weights are views of the flat shard and the update of
// the sharded AdamW equals a textbook AdamW.
TEST(ShardedAdamW, MatchesTextbookAdamW) {
  OneRank one;
  ProcessGroups& groups = one.groups;
  std::vector<ParamSpec> specs = {{"a.weight", {3, 4}, InitKind::kNormal, true},
                                  {"a.norm", {4}, InitKind::kOnes, false}};
  FsdpUnit unit("a", specs, groups.get("fsdp_shard"), at::kFloat, c10::Device("cpu"));
  at::Tensor w0 = at::randn({3, 4}, at::kDouble).to(at::kFloat);
  unit.load_full([&](const ParamSpec& s) { return s.name == "a.weight" ? w0 : at::ones({4}); });
  AdamWConfig cfg;
  cfg.beta2 = 0.95;  // the textbook reference's
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
  const c10::Device dev(test::test_device());
  OneRank one;
  ProcessGroups& groups = one.groups;
  std::vector<ParamSpec> specs = {{"a.weight", {6, 5}, InitKind::kNormal, true}};
  FsdpUnit unit("a", specs, groups.get("fsdp_shard"), at::kFloat, dev);
  const at::Tensor w0 = at::randn({6, 5}, at::kDouble);
  unit.load_full([&](const ParamSpec&) { return w0.to(at::kFloat).to(dev); });
  AdamWConfig cfg;
  cfg.beta2 = 0.95;  // the textbook reference's
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

// set_weight_decay changes the decay group's weight decay from the next step on, as the
// trainer's schedule does each iteration; the no_decay group keeps none. Against the textbook
// AdamW with each step's value (seen to fail with the setter doing nothing).
TEST(ShardedAdamW, ScheduledWeightDecay) {
  const c10::Device dev(test::test_device());
  OneRank one;
  ProcessGroups& groups = one.groups;
  std::vector<ParamSpec> specs = {{"a.weight", {6, 5}, InitKind::kNormal, true},
                                  {"a.norm", {5}, InitKind::kOnes, false}};
  FsdpUnit unit("a", specs, groups.get("fsdp_shard"), at::kFloat, dev);
  const at::Tensor w0 = at::randn({6, 5}, at::kDouble);
  unit.load_full([&](const ParamSpec& s) {
    return (s.name == "a.weight" ? w0.to(at::kFloat) : at::ones({5})).to(dev);
  });
  AdamWConfig cfg;
  cfg.beta2 = 0.95;
  cfg.weight_decay = 0.1;
  ShardedAdamW opt({&unit}, cfg);
  const double lr = 0.05;
  at::Tensor p = w0.clone(), m = at::zeros_like(p), v = at::zeros_like(p);
  const double wds[] = {0.0, 0.8, 0.3};
  for (int step = 1; step <= 3; ++step) {
    const at::Tensor g = at::randn({6, 5}, at::kDouble);
    opt.zero_grad();
    grad_shard(unit, 0).copy_(g.reshape({-1}));
    opt.set_weight_decay(wds[step - 1]);
    opt.step(lr);
    textbook_adamw_step(p, m, v, g, step, lr, wds[step - 1], cfg.eps);
    unit.unshard();
    const at::Tensor got = unit.backward_weight(0).to(at::kDouble).cpu();
    EXPECT_TRUE(at::allclose(got, p, 1e-5, 1e-6))
        << "step " << step << ": max diff " << (got - p).abs().max().item<double>();
    EXPECT_TRUE(at::equal(unit.backward_weight(1).cpu(), at::ones({5}))) << "no_decay decayed";
  }
  EXPECT_EQ(opt.group_of("a.weight").weight_decay, 0.3);
  EXPECT_EQ(opt.group_of("a.norm").weight_decay, 0.0);
}

// With decoupled_lr the parameters marked embedding_or_output form the "decoupled" group, which
// steps at its set_group_lr rate with the decay group's weight decay; the others at the step's
// rate (seen to fail with the group's rate ignored).
TEST(ShardedAdamW, DecoupledGroupHasItsOwnRate) {
  const c10::Device dev(test::test_device());
  OneRank one;
  ProcessGroups& groups = one.groups;
  ParamSpec emb{"embedding.word_embeddings.weight", {6, 5}, InitKind::kNormal, true};
  emb.embedding_or_output = true;
  const std::vector<ParamSpec> specs = {emb, {"a.weight", {4, 5}, InitKind::kNormal, true}};
  FsdpUnit unit("a", specs, groups.get("fsdp_shard"), at::kFloat, dev);
  const at::Tensor e0 = at::randn({6, 5}, at::kDouble), a0 = at::randn({4, 5}, at::kDouble);
  unit.load_full([&](const ParamSpec& s) {
    return (s.name == "a.weight" ? a0 : e0).to(at::kFloat).to(dev);
  });
  AdamWConfig cfg;
  cfg.beta2 = 0.95;
  cfg.weight_decay = 0.1;
  cfg.decoupled_lr = true;
  ShardedAdamW opt({&unit}, cfg);
  EXPECT_EQ(opt.group_name_of(emb.name), "decoupled");
  EXPECT_EQ(opt.group_name_of("a.weight"), "decay");
  at::Tensor pe = e0.clone(), me = at::zeros_like(pe), ve = at::zeros_like(pe);
  at::Tensor pa = a0.clone(), ma = at::zeros_like(pa), va = at::zeros_like(pa);
  for (int step = 1; step <= 3; ++step) {
    const double lr = 0.01 * step, elr = 0.2 / step, wd = 0.1 + 0.2 * step;
    const at::Tensor ge = at::randn({6, 5}, at::kDouble), ga = at::randn({4, 5}, at::kDouble);
    opt.zero_grad();
    grad_shard(unit, 0).copy_(ge.reshape({-1}));
    grad_shard(unit, 1).copy_(ga.reshape({-1}));
    opt.set_group_lr("decoupled", elr);
    opt.set_weight_decay(wd);
    opt.step(lr);
    textbook_adamw_step(pe, me, ve, ge, step, elr, wd, cfg.eps);
    textbook_adamw_step(pa, ma, va, ga, step, lr, wd, cfg.eps);
    unit.unshard();
    for (auto [i, want] : {std::pair{0, pe}, std::pair{1, pa}}) {
      const at::Tensor got = unit.backward_weight(i).to(at::kDouble).cpu();
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6))
          << "step " << step << " parameter " << i << ": max diff "
          << (got - want).abs().max().item<double>();
    }
  }
  EXPECT_THROW(opt.set_group_lr("nope", 0.1), Error);
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
  const c10::Device dev(test::test_device());
  OneRank one;
  ProcessGroups& groups = one.groups;
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
  cfg.beta2 = 0.95;  // the textbook reference's
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

// Parameters of odd sizes: range starts off the 16-byte grid and scalar tails in weft's AdamW
// kernel; a no_decay parameter between two decay ones gives three ranges.
const std::vector<ParamSpec> kOddSpecs = {{"a.w1", {37, 13}, InitKind::kNormal, true},
                                          {"a.norm", {13}, InitKind::kOnes, false},
                                          {"a.w2", {1001, 3}, InitKind::kNormal, true}};

std::vector<at::Tensor> random_values(const std::vector<ParamSpec>& specs) {
  std::vector<at::Tensor> w;
  for (const ParamSpec& s : specs) w.push_back(at::randn(s.shape, at::kDouble));
  return w;
}

// A bf16 unit of `specs` on one rank, its weights `w0` rounded to bf16.
std::unique_ptr<FsdpUnit> bf16_unit(ProcessGroups& groups, const std::vector<ParamSpec>& specs,
                                    const std::vector<at::Tensor>& w0, const c10::Device& dev) {
  auto u = std::make_unique<FsdpUnit>("a", specs, groups.get("fsdp_shard"), at::kBFloat16, dev);
  u->load_full([&](const ParamSpec& s) {
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].name == s.name) return w0[i].to(at::kBFloat16).to(dev);
    return at::Tensor();
  });
  return u;
}

// The CUDA step (weft's one-pass kernel where WEFT_TEST_DEVICE=cuda, the host update elsewhere)
// on a bfloat16 unit against the textbook AdamW in float64: the masters within float32 rounding,
// and the bfloat16 weights the masters rounded, bitwise. Parameters of odd sizes put range
// starts off the 16-byte grid and leave scalar tails (the kernel's second loop); a no_decay
// parameter between two decay ones gives three ranges with their own constants; a skipped step
// (found_inf) changes nothing; eps of the gradients' order and the moments compared too, so a
// gradient scale ignored or applied the wrong way shows. Seen to fail on the CPU with the
// weights left uncopied and with the multiplier ignored; passed on the H200 through the kernel
// (before the moments were compared and eps raised).
TEST(ShardedAdamW, Bf16WeightsFollowTheMasters) {
  const c10::Device dev(test::test_device());
  OneRank one;
  const std::vector<ParamSpec>& specs = kOddSpecs;
  const std::vector<at::Tensor> w0 = random_values(specs);
  const std::unique_ptr<FsdpUnit> unit_ptr = bf16_unit(one.groups, specs, w0, dev);
  FsdpUnit& unit = *unit_ptr;
  AdamWConfig cfg;
  cfg.beta2 = 0.95;  // the textbook reference's
  cfg.weight_decay = 0.1;
  cfg.eps = 0.05;  // of the order of the gradients, so that their scale shows in the update
  ShardedAdamW opt({&unit}, cfg);
  ASSERT_FALSE(unit.param_shard().is_same(opt.state(0).master));
  std::vector<at::Tensor> p, m, v;
  for (const at::Tensor& w : w0) {
    p.push_back(w.to(at::kBFloat16).to(at::kDouble));  // the masters start from the weights
    m.push_back(at::zeros_like(w));
    v.push_back(at::zeros_like(w));
  }
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
  const double lr = 0.01;
  for (int step = 1; step <= 4; ++step) {
    const bool skip = step == 3;
    std::vector<at::Tensor> g;
    opt.zero_grad();
    for (size_t i = 0; i < specs.size(); ++i) {
      g.push_back(at::randn(specs[i].shape, at::kDouble));
      grad_shard(unit, static_cast<int>(i)).narrow(0, 0, g[i].numel()).copy_(g[i].reshape({-1}));
    }
    const at::Tensor master_before = opt.state(0).master.clone();
    const at::Tensor weights_before = unit.param_shard().clone();
    if (dev.is_cuda()) {
      ASSERT_TRUE(opt.step_on_device(lr, at::full({}, 0.5, f32), at::full({}, skip ? 1.0 : 0.0, f32)));
      if (skip) opt.uncount_step();
    } else if (!skip) {
      opt.step(lr, 2.0);
    }
    if (skip) {
      EXPECT_TRUE(at::equal(opt.state(0).master, master_before));
      EXPECT_TRUE(at::equal(unit.param_shard(), weights_before));
      continue;
    }
    for (size_t i = 0; i < specs.size(); ++i)
      textbook_adamw_step(p[i], m[i], v[i], 2.0 * g[i], opt.steps(), lr,
                          specs[i].decay ? cfg.weight_decay : 0.0, cfg.eps);
    unit.unshard();
    for (size_t i = 0; i < specs.size(); ++i) {
      const ShardSegment& seg = unit.segment(static_cast<int>(i));
      const at::Tensor master =
          opt.state(0).master.narrow(0, seg.offset, p[i].numel()).to(at::kDouble).cpu();
      EXPECT_TRUE(at::allclose(master, p[i].reshape({-1}), 1e-5, 1e-6))
          << specs[i].name << " step " << step << ": max diff "
          << (master - p[i].reshape({-1})).abs().max().item<double>();
      for (const auto& [got, want] : {std::pair{&opt.state(0).exp_avg, &m[i]},
                                      std::pair{&opt.state(0).exp_avg_sq, &v[i]}}) {
        const at::Tensor g64 = got->narrow(0, seg.offset, want->numel()).to(at::kDouble).cpu();
        EXPECT_TRUE(at::allclose(g64, want->reshape({-1}), 1e-5, 1e-7))
            << specs[i].name << " step " << step << ": a moment is off";
      }
      const at::Tensor w = unit.backward_weight(static_cast<int>(i)).cpu().reshape({-1});
      EXPECT_TRUE(at::equal(w, master.to(at::kBFloat16)))
          << specs[i].name << " step " << step << ": weights are not the rounded masters";
    }
  }
  EXPECT_EQ(opt.steps(), 3);
}

// --grad-reduce-in-bf16: the update reads a bf16 gradient shard as the float32 values it holds.
// Two optimizers over two copies of a bf16 unit, one with a float32 gradient shard and one with
// a bf16 shard, get the same bf16-representable gradients each step; masters, moments and
// weights must stay bitwise equal, through the multiplier (host step: the bf16 shard's pieces
// are widened before it scales them) and the device step's scale (weft's kernel where
// WEFT_TEST_DEVICE=cuda, loading 4 bf16 gradients at a time; the odd sizes leave scalar heads
// and tails). The bf16 shard takes half the bytes. Seen to fail with the multiplier applied to
// the bf16 shard in place (the rounded products differ from the float32 ones).
TEST(ShardedAdamW, Bf16GradientShardUpdatesAsItsFloat32Values) {
  const c10::Device dev(test::test_device());
  OneRank one;
  const std::vector<at::Tensor> w0 = random_values(kOddSpecs);
  auto u32 = bf16_unit(one.groups, kOddSpecs, w0, dev);
  auto u16 = bf16_unit(one.groups, kOddSpecs, w0, dev);
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  cfg.eps = 0.05;  // of the order of the gradients, so that their scale shows in the update
  ShardedAdamW opt32({u32.get()}, cfg);
  cfg.grad_dtype = at::kBFloat16;
  ShardedAdamW opt16({u16.get()}, cfg);
  ASSERT_EQ(grad_shard(*u16).scalar_type(), at::kBFloat16);
  ASSERT_EQ(grad_shard(*u32).scalar_type(), at::kFloat);
  EXPECT_EQ(opt16.grad_bytes() * 2, opt32.grad_bytes());
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
  for (int step = 1; step <= 4; ++step) {
    opt32.zero_grad();
    opt16.zero_grad();
    const at::Tensor g =
        at::randn({u32->shard_numel()}, at::kDouble).to(at::kBFloat16).to(dev);
    grad_shard(*u32).copy_(g);
    grad_shard(*u16).copy_(g);
    const double multiplier = step % 2 ? 0.37 : 1.0;
    if (dev.is_cuda() && step > 2) {  // the trainer's device path: the scale on the device
      const at::Tensor scale = at::full({}, 1.0 / multiplier, f32);
      ASSERT_TRUE(opt32.step_on_device(0.01, scale, at::zeros({}, f32)));
      ASSERT_TRUE(opt16.step_on_device(0.01, scale, at::zeros({}, f32)));
    } else {
      opt32.step(0.01, multiplier);
      opt16.step(0.01, multiplier);
    }
    for (auto [a, b] : {std::pair{opt32.state(0).master, opt16.state(0).master},
                        std::pair{opt32.state(0).exp_avg, opt16.state(0).exp_avg},
                        std::pair{opt32.state(0).exp_avg_sq, opt16.state(0).exp_avg_sq},
                        std::pair{u32->param_shard(), u16->param_shard()}})
      EXPECT_TRUE(at::equal(a, b)) << "step " << step << ": max diff "
                                   << (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  }
}

}  // namespace
}  // namespace weft
