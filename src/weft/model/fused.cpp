// Fused path dispatch and autograd (see fused.h). The tensor-level kernels calls live in
// fused_cuda.cpp (CUDA build only); here are the switch and the autograd functions, which only
// run when usable() said yes.
#include "weft/model/fused.h"

#include <torch/csrc/autograd/custom_function.h>

#include <atomic>

#include "weft/core/error.h"

namespace weft::fused {

#if defined(WEFT_WITH_CUDA)
std::pair<at::Tensor, at::Tensor> rms_norm_forward_impl(const at::Tensor& x, const at::Tensor& w,
                                                        double eps);
at::Tensor rms_norm_backward_impl(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor& rstd, at::Tensor* dw_sum);
bool rms_norm_supports_impl(int64_t hidden);
at::Tensor swiglu_forward_impl(const at::Tensor& fc1);
at::Tensor swiglu_backward_impl(const at::Tensor& dact, const at::Tensor& fc1);
std::array<at::Tensor, 3> rope_forward_impl(const at::Tensor& qkv, const at::Tensor& cos,
                                            const at::Tensor& sin);
at::Tensor rope_backward_impl(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                              const at::Tensor& cos, const at::Tensor& sin,
                              at::IntArrayRef qkv_shape);
std::pair<at::Tensor, at::Tensor> cross_entropy_forward_impl(const at::Tensor& logits,
                                                             const at::Tensor& labels);
at::Tensor cross_entropy_backward_impl(const at::Tensor& logits, const at::Tensor& labels,
                                       const at::Tensor& lse, const at::Tensor& grad);
#endif

namespace {

std::atomic<bool> g_enabled{true};

[[noreturn]] void not_compiled() {
  fail("fused CUDA kernels are not part of this build (CPU-only libtorch)");
}

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

struct SwiGluFn : Function<SwiGluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& fc1) {
    ctx->save_for_backward({fc1});
#if defined(WEFT_WITH_CUDA)
    return swiglu_forward_impl(fc1);
#else
    not_compiled();
#endif
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor fc1 = ctx->get_saved_variables()[0];
#if defined(WEFT_WITH_CUDA)
    return {swiglu_backward_impl(grads[0], fc1)};
#else
    (void)fc1, (void)grads;
    not_compiled();
#endif
  }
};

struct RopeQkvFn : Function<RopeQkvFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& cos,
                               const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["weft_shape"] = qkv.sizes().vec();
#if defined(WEFT_WITH_CUDA)
    auto out = rope_forward_impl(qkv, cos, sin);
    return {out[0], out[1], out[2]};
#else
    not_compiled();
#endif
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::vector<int64_t> shape = ctx->saved_data.at("weft_shape").toIntVector();
#if defined(WEFT_WITH_CUDA)
    return {rope_backward_impl(grads[0], grads[1], grads[2], saved[0], saved[1], shape),
            at::Tensor(), at::Tensor()};
#else
    (void)saved, (void)shape, (void)grads;
    not_compiled();
#endif
  }
};

struct CrossEntropyFn : Function<CrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& labels) {
#if defined(WEFT_WITH_CUDA)
    auto [loss_rows, lse] = cross_entropy_forward_impl(logits, labels);
    ctx->save_for_backward({logits, labels, lse});
    return loss_rows.sum();
#else
    (void)ctx, (void)logits, (void)labels;
    not_compiled();
#endif
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
#if defined(WEFT_WITH_CUDA)
    return {cross_entropy_backward_impl(saved[0], saved[1], saved[2], grads[0]), at::Tensor()};
#else
    (void)saved, (void)grads;
    not_compiled();
#endif
  }
};

}  // namespace

bool compiled() {
#if defined(WEFT_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

bool enabled() { return compiled() && g_enabled.load(); }
void set_enabled(bool on) { g_enabled.store(on); }

bool usable(const at::Tensor& x) {
  return enabled() && x.defined() && x.is_cuda() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
}

bool rms_norm_supports(int64_t hidden) {
#if defined(WEFT_WITH_CUDA)
  return rms_norm_supports_impl(hidden);
#else
  (void)hidden;
  return false;
#endif
}

std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& w,
                                                   double eps) {
#if defined(WEFT_WITH_CUDA)
  return rms_norm_forward_impl(x, w, eps);
#else
  (void)x, (void)w, (void)eps;
  not_compiled();
#endif
}

at::Tensor rms_norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                             const at::Tensor& rstd, at::Tensor* dw_sum) {
#if defined(WEFT_WITH_CUDA)
  return rms_norm_backward_impl(dy, x, w, rstd, dw_sum);
#else
  (void)dy, (void)x, (void)w, (void)rstd, (void)dw_sum;
  not_compiled();
#endif
}

at::Tensor swiglu(const at::Tensor& fc1) { return SwiGluFn::apply(fc1); }

at::Tensor swiglu_forward(const at::Tensor& fc1) {
#if defined(WEFT_WITH_CUDA)
  return swiglu_forward_impl(fc1);
#else
  (void)fc1;
  not_compiled();
#endif
}

at::Tensor swiglu_backward(const at::Tensor& dact, const at::Tensor& fc1) {
#if defined(WEFT_WITH_CUDA)
  return swiglu_backward_impl(dact, fc1);
#else
  (void)dact, (void)fc1;
  not_compiled();
#endif
}

at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  return CrossEntropyFn::apply(logits, labels);
}

std::array<at::Tensor, 3> rope_qkv(const at::Tensor& qkv, const at::Tensor& cos,
                                   const at::Tensor& sin) {
  variable_list out = RopeQkvFn::apply(qkv, cos, sin);
  return {out[0], out[1], out[2]};
}

}  // namespace weft::fused
