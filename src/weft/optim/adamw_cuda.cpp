// Tensor-level wrapper of weft's AdamW kernel (fused_adamw.h, adamw_kernel.h): checks, the
// step's constants, the device guard and the current stream. CUDA build only.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "weft/core/error.h"
#include "weft/optim/adamw_kernel.h"
#include "weft/optim/fused_adamw.h"

namespace weft::fused_adamw {
namespace {

// The address of element `offset` of `t`, checked to be a contiguous CUDA vector of a dtype in
// `dtypes` (named in the message) holding [offset, offset + numel).
const void* checked_range(const at::Tensor& t, int64_t offset, int64_t numel, const char* what,
                          std::initializer_list<at::ScalarType> dtypes, const char* names) {
  const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) != dtypes.end();
  WEFT_CHECK(t.is_cuda() && dtype_ok && t.dim() == 1 && t.is_contiguous() && offset >= 0 &&
                 offset + numel <= t.numel(),
             "fused AdamW: {} must be a contiguous {} CUDA vector holding elements [{}, {})", what,
             names, offset, offset + numel);
  return static_cast<const char*>(t.data_ptr()) + offset * static_cast<int64_t>(t.element_size());
}

float* range_of(const at::Tensor& t, int64_t offset, int64_t numel, const char* what) {
  return static_cast<float*>(
      const_cast<void*>(checked_range(t, offset, numel, what, {at::kFloat}, "float32")));
}

// The gradient's range: float32 or bfloat16 (--grad-reduce-in-bf16).
const void* grad_range_of(const at::Tensor& g, int64_t offset, int64_t numel,
                          adamw_kernel::Grads* kind) {
  *kind = g.scalar_type() == at::kBFloat16 ? adamw_kernel::Grads::kBF16 : adamw_kernel::Grads::kF32;
  return checked_range(g, offset, numel, "grad", {at::kFloat, at::kBFloat16}, "float32 or bf16");
}

}  // namespace

bool compiled() { return true; }

bool step(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& exp_avg,
          const at::Tensor& exp_avg_sq, const at::Tensor& weights, int64_t offset, int64_t numel,
          const Hyper& h, const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  using adamw_kernel::Weights;
  Weights kind = Weights::kNone;
  void* w = nullptr;
  bool written = true;
  if (weights.defined() && !weights.is_same(master)) {
    WEFT_CHECK(weights.device() == master.device() && weights.dim() == 1 &&
                   weights.is_contiguous() && offset + numel <= weights.numel(),
               "fused AdamW: the weight shard must be a contiguous vector beside the master");
    if (weights.scalar_type() == at::kBFloat16) {
      kind = Weights::kBF16;
      w = static_cast<at::BFloat16*>(weights.data_ptr()) + offset;
    } else if (weights.scalar_type() == at::kFloat) {
      kind = Weights::kF32;
      w = weights.data_ptr<float>() + offset;
    } else {
      written = false;
    }
  }
  for (const at::Tensor* t : {&grad_scale, &found_inf})
    WEFT_CHECK(!t->defined() || (t->is_cuda() && t->scalar_type() == at::kFloat &&
                                 t->numel() == 1 && t->device() == master.device()),
               "fused AdamW: grad_scale and found_inf must be one float32 on the master's device");
  adamw_kernel::Constants c;
  c.beta1 = static_cast<float>(h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.lr_decay = static_cast<float>(h.lr * h.weight_decay);
  c.step_size = static_cast<float>(h.lr / (1.0 - std::pow(h.beta1, static_cast<double>(h.step))));
  c.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(h.beta2, static_cast<double>(h.step))));
  c.eps = static_cast<float>(h.eps);
  c10::cuda::CUDAGuard guard(master.device());
  adamw_kernel::Grads grad_kind;
  const void* g = grad_range_of(grad, offset, numel, &grad_kind);
  const std::string err = adamw_kernel::step(
      range_of(master, offset, numel, "master"), g, grad_kind,
      range_of(exp_avg, offset, numel, "exp_avg"),
      range_of(exp_avg_sq, offset, numel, "exp_avg_sq"), w, kind, numel, c,
      grad_scale.defined() ? grad_scale.data_ptr<float>() : nullptr,
      found_inf.defined() ? found_inf.data_ptr<float>() : nullptr,
      c10::cuda::getCurrentCUDAStream(master.device().index()).stream());
  WEFT_CHECK(err.empty(), "fused AdamW kernel: {}", err);
  return written;
}

}  // namespace weft::fused_adamw
