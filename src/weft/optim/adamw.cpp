// Sharded AdamW (see adamw.h). Moments stored in bfloat16 are updated in float32 and rounded
// back once per step.
#include "weft/optim/adamw.h"

#include "weft/optim/fused_adamw.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "weft/core/error.h"
#include "weft/parallel/grad_access.h"

namespace weft {

ShardedAdamW::ShardedAdamW(std::vector<FsdpUnit*> units, const AdamWConfig& cfg)
    : cfg_(cfg), units_(std::move(units)) {
  groups_["decay"] = ParamGroupSettings{cfg.weight_decay, cfg.beta1, cfg.beta2, cfg.eps};
  groups_["no_decay"] = ParamGroupSettings{0.0, cfg.beta1, cfg.beta2, cfg.eps};
  if (cfg.decoupled_lr) groups_["decoupled"] = groups_["decay"];
  at::NoGradGuard no_grad;
  for (FsdpUnit* u : units_) {
    for (int i = 0; i < u->num_params(); ++i) {
      const ParamSpec& s = u->spec(i);
      param_group_[s.name] = cfg.decoupled_lr && s.embedding_or_output ? "decoupled"
                             : s.decay                                  ? "decay"
                                                                        : "no_decay";
    }
    UnitOptimState st;
    const at::Tensor& w = u->param_shard();
    auto f32 = w.options().dtype(at::kFloat);
    st.master = w.to(at::kFloat).clone();
    st.exp_avg = at::zeros({u->shard_numel()}, w.options().dtype(cfg.exp_avg_dtype));
    st.exp_avg_sq = at::zeros({u->shard_numel()}, w.options().dtype(cfg.exp_avg_sq_dtype));
    if (cfg.precision_aware) {
      st.decoupled_grad = at::zeros({u->shard_numel()}, f32);
      u->set_grad_target(st.decoupled_grad);
    } else {
      st.main_grad = at::zeros({u->shard_numel()}, w.options().dtype(cfg.grad_dtype));
      u->set_grad_target(st.main_grad);
    }
    if (w.scalar_type() == at::kFloat) u->bind_param_shard(st.master);
    states_.push_back(std::move(st));
    // Consecutive parameters of one group become one range of the flat shard (padding between
    // them has zero value and zero gradient, which the update leaves zero): an expert unit is
    // one range, not one per weight, so a step launches and builds lists for far fewer tensors.
    std::vector<Range> ranges;
    for (int i = 0; i < u->num_params(); ++i) {
      const ShardSegment& seg = u->segment(i);
      const std::string& g = param_group_[u->spec(i).name];
      if (!ranges.empty() && ranges.back().group == g &&
          ranges.back().offset + ranges.back().numel == seg.offset)
        ranges.back().numel += seg.numel();
      else
        ranges.push_back(Range{g, seg.offset, seg.numel()});
    }
    ranges_.push_back(std::move(ranges));
  }
}

void ShardedAdamW::set_weight_decay(double wd) {
  groups_.at("decay").weight_decay = wd;
  if (auto d = groups_.find("decoupled"); d != groups_.end()) d->second.weight_decay = wd;
}

void ShardedAdamW::set_group_lr(const std::string& name, double lr) {
  auto g = groups_.find(name);
  if (g == groups_.end()) fail("optimizer: no parameter group '{}'", name);
  g->second.lr = lr;
}

const ParamGroupSettings& ShardedAdamW::group_of(const std::string& name) const {
  return groups_.at(group_name_of(name));
}

const std::string& ShardedAdamW::group_name_of(const std::string& name) const {
  auto it = param_group_.find(name);
  if (it == param_group_.end()) fail("optimizer: no parameter named '{}'", name);
  return it->second;
}

void ShardedAdamW::zero_grad() {
  for (FsdpUnit* u : units_) u->zero_grad();
}

// The device path: weft's one-pass kernel (fused_adamw.h) per range of a group, where the
// moments are float32 and the shards live on a CUDA device of a CUDA build.
bool ShardedAdamW::can_step_on_device() const {
  return cfg_.exp_avg_dtype == at::kFloat && cfg_.exp_avg_sq_dtype == at::kFloat &&
         !units_.empty() && units_[0]->param_shard().is_cuda() && fused_adamw::compiled();
}

bool ShardedAdamW::step_on_device(double lr, const at::Tensor& grad_scale,
                                  const at::Tensor& found_inf) {
  if (!can_step_on_device()) return false;
  at::NoGradGuard no_grad;
  ++steps_;
  fused_step(lr, grad_scale, found_inf);
  return true;
}

// Each range is one launch that updates the master and moments and writes the rounded weights;
// padding between ranges keeps its zero value and gradient, and so its zero weight. Weights of
// a dtype the kernel does not write are copied from the master after the step.
void ShardedAdamW::fused_step(double lr, const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  for (size_t k = 0; k < units_.size(); ++k) {
    UnitOptimState& st = states_[k];
    const at::Tensor& grad = grad_shard(*units_[k]);
    const at::Tensor& weights = units_[k]->param_shard();
    bool written = true;
    for (const Range& r : ranges_[k]) {
      const ParamGroupSettings& g = groups_.at(r.group);
      const fused_adamw::Hyper h{g.lr >= 0 ? g.lr : lr, g.beta1, g.beta2, g.eps, g.weight_decay,
                                 steps_};
      written = fused_adamw::step(st.master, grad, st.exp_avg, st.exp_avg_sq, weights, r.offset,
                                  r.numel, h, grad_scale, found_inf) && written;
    }
    if (!written) weights.copy_(st.master);
  }
}

void ShardedAdamW::step(double lr, double grad_multiplier) {
  at::NoGradGuard no_grad;
  ++steps_;
  if (can_step_on_device()) {
    at::Tensor scale;  // the kernel divides each gradient by it (AMP's unscale)
    if (grad_multiplier != 1.0)
      scale = at::full({}, 1.0 / grad_multiplier,
                       units_[0]->param_shard().options().dtype(at::kFloat));
    fused_step(lr, scale, at::Tensor());
    return;
  }
  // The multiplier scales float32 gradients in place; a bf16 shard's pieces are widened first,
  // so that the update sees the same float32 values as from a float32 shard of those gradients.
  const bool narrow_grads = !cfg_.precision_aware && cfg_.grad_dtype != at::kFloat;
  if (grad_multiplier != 1.0 && !narrow_grads)
    for (FsdpUnit* u : units_) grad_shard(*u).mul_(grad_multiplier);
  for (size_t k = 0; k < units_.size(); ++k) {
    FsdpUnit& u = *units_[k];
    UnitOptimState& st = states_[k];
    // Pieces of at most kPiece elements: the float32 temporaries of bf16 moments stay small.
    constexpr int64_t kPiece = int64_t{16} << 20;
    for (const Range& range : ranges_[k])
    for (int64_t off = range.offset; off < range.offset + range.numel; off += kPiece) {
      const Range r{range.group, off, std::min(kPiece, range.offset + range.numel - off)};
      const ParamGroupSettings& g = groups_.at(r.group);
      at::Tensor p = st.master.narrow(0, r.offset, r.numel);
      at::Tensor grad = grad_shard(u).narrow(0, r.offset, r.numel);
      if (narrow_grads) {
        grad = grad.to(at::kFloat);
        if (grad_multiplier != 1.0) grad.mul_(grad_multiplier);
      }
      at::Tensor m_store = st.exp_avg.narrow(0, r.offset, r.numel);
      at::Tensor v_store = st.exp_avg_sq.narrow(0, r.offset, r.numel);
      at::Tensor m = m_store.scalar_type() == at::kFloat ? m_store : m_store.to(at::kFloat);
      at::Tensor v = v_store.scalar_type() == at::kFloat ? v_store : v_store.to(at::kFloat);
      m.mul_(g.beta1).add_(grad, 1.0 - g.beta1);
      v.mul_(g.beta2).addcmul_(grad, grad, 1.0 - g.beta2);
      const double bc1 = 1.0 - std::pow(g.beta1, static_cast<double>(steps_));
      const double bc2 = 1.0 - std::pow(g.beta2, static_cast<double>(steps_));
      at::Tensor denom = v.sqrt().div_(std::sqrt(bc2)).add_(g.eps);
      const double glr = g.lr >= 0 ? g.lr : lr;
      if (g.weight_decay != 0) p.mul_(1.0 - glr * g.weight_decay);
      p.addcdiv_(m, denom, -glr / bc1);
      if (!m.is_same(m_store)) m_store.copy_(m);
      if (!v.is_same(v_store)) v_store.copy_(v);
    }
    if (!u.param_shard().is_same(st.master)) u.param_shard().copy_(st.master);
  }
}

int64_t ShardedAdamW::unit_state_bytes(size_t k) const {
  const UnitOptimState& st = states_.at(k);
  int64_t b = 0;
  for (const at::Tensor* t : {&st.master, &st.exp_avg, &st.exp_avg_sq, &st.decoupled_grad})
    if (t->defined()) b += t->numel() * t->element_size();
  return b;
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t b = 0;
  for (size_t k = 0; k < states_.size(); ++k) b += unit_state_bytes(k);
  return b;
}

int64_t ShardedAdamW::grad_bytes() const {
  int64_t b = 0;
  for (const FsdpUnit* u : units_)
    b += u->grad_target().numel() * static_cast<int64_t>(u->grad_target().element_size());
  return b;
}

}  // namespace weft
