// FullParams: full tensors and full-shape gradient buffers (see full_params.h).
#include "weft/model/full_params.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>
#include <fmt/ranges.h>

#include "weft/core/error.h"

namespace weft {

ParamHandle FullParams::add(const ParamSpec& spec, at::Tensor value) {
  WEFT_CHECK(value.defined() && value.sizes() == at::IntArrayRef(spec.shape),
             "FullParams::add({}): value of shape [{}] does not match the spec's [{}]", spec.name,
             value.defined() ? fmt::format("{}", fmt::join(value.sizes(), ", ")) : "undefined",
             fmt::join(spec.shape, ", "));
  WEFT_CHECK(find(spec.name) < 0, "FullParams::add: parameter {} added twice", spec.name);
  Entry e;
  e.spec = spec;
  e.value = value.detach();
  entries_.push_back(std::move(e));
  return handle(size() - 1);
}

FullParams::Entry& FullParams::entry(int index) {
  WEFT_CHECK(index >= 0 && index < size(), "FullParams: index {} out of range [0, {})", index,
             size());
  return entries_[static_cast<size_t>(index)];
}

const FullParams::Entry& FullParams::entry(int index) const {
  WEFT_CHECK(index >= 0 && index < size(), "FullParams: index {} out of range [0, {})", index,
             size());
  return entries_[static_cast<size_t>(index)];
}

const ParamSpec& FullParams::spec(int index) const { return entry(index).spec; }

ParamHandle FullParams::handle(int index) {
  entry(index);
  return ParamHandle{this, index};
}

int FullParams::find(const std::string& name) const {
  for (int i = 0; i < size(); ++i) {
    if (entries_[static_cast<size_t>(i)].spec.name == name) return i;
  }
  return -1;
}

const at::Tensor& FullParams::value(int index) const { return entry(index).value; }

at::Tensor FullParams::grad(int index) const {
  const Entry& e = entry(index);
  if (e.grad.defined()) return e.grad;
  const auto dtype = e.value.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::zeros(e.value.sizes(), e.value.options().dtype(dtype));
}

void FullParams::zero_grad() {
  for (Entry& e : entries_) {
    if (e.grad.defined()) e.grad.zero_();
    e.pending = 0;
  }
}

int FullParams::pending_uses(int index) const { return entry(index).pending; }

at::Tensor FullParams::forward_weight(int index) {
  Entry& e = entry(index);
  if (at::GradMode::is_enabled()) ++e.pending;
  return e.value;
}

at::Tensor FullParams::backward_weight(int index) {
  Entry& e = entry(index);
  WEFT_CHECK(e.pending > 0, "FullParams: backward_weight({}) for {} without a counted forward use",
             index, e.spec.name);
  return e.value;
}

at::Tensor FullParams::grad_buffer(int index) {
  Entry& e = entry(index);
  if (!e.grad.defined()) {
    const auto dtype = e.value.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    e.grad = at::zeros(e.value.sizes(), e.value.options().dtype(dtype));
  }
  return e.grad;
}

void FullParams::grad_ready(int index) {
  Entry& e = entry(index);
  WEFT_CHECK(e.pending > 0, "FullParams: grad_ready({}) for {} without a pending forward use",
             index, e.spec.name);
  --e.pending;
}

}  // namespace weft
