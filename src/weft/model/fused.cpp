// Fused path switch and autograd (see fused.h). The kernel calls live in fused_cuda.cpp in CUDA
// builds and fused_cpu.cpp (each fails) otherwise, so this file has no build conditionals; the
// autograd functions only run when usable() said yes.
#include "weft/model/fused.h"

#include <torch/csrc/autograd/custom_function.h>

#include <atomic>

#include "weft/model/fused_impl.h"

namespace weft::fused {
namespace {

std::atomic<bool> g_enabled{true};

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

struct SwiGluFn : Function<SwiGluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& fc1) {
    ctx->save_for_backward({fc1});
    return swiglu_forward(fc1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {swiglu_backward(grads[0], ctx->get_saved_variables()[0])};
  }
};

struct RopeQkvFn : Function<RopeQkvFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& cos,
                               const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["weft_shape"] = qkv.sizes().vec();
    auto out = rope_forward_impl(qkv, cos, sin);
    return {out[0], out[1], out[2]};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::vector<int64_t> shape = ctx->saved_data.at("weft_shape").toIntVector();
    return {rope_backward_impl(grads[0], grads[1], grads[2], saved[0], saved[1], shape),
            at::Tensor(), at::Tensor()};
  }
};

struct CrossEntropyFn : Function<CrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& labels) {
    auto [loss_rows, lse] = cross_entropy_forward_impl(logits, labels);
    ctx->save_for_backward({logits, labels, lse});
    return loss_rows.sum();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {cross_entropy_backward_impl(saved[0], saved[1], saved[2], grads[0]), at::Tensor()};
  }
};

struct ConvSiluFn : Function<ConvSiluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& bias) {
    ctx->save_for_backward({x, w, bias});
    return conv_silu_forward_impl(x, w, bias);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto [dx, dw, db] = conv_silu_backward_impl(grads[0], s[0], s[1], s[2]);
    return {dx, dw, db};
  }
};

struct GatedNormFn : Function<GatedNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& z,
                            const at::Tensor& w, int64_t ng, double eps) {
    auto [out, rstd] = gated_norm_forward_impl(y, z, w, ng, eps);
    ctx->save_for_backward({y, z, w, rstd});
    ctx->saved_data["weft_ng"] = ng;
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto [dy, dz, dw] =
        gated_norm_backward_impl(grads[0], s[0], s[1], s[2], s[3], ctx->saved_data["weft_ng"].toInt());
    return {dy, dz, dw, at::Tensor(), at::Tensor()};
  }
};

struct SsdDecayFn : Function<SsdDecayFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& cb, const at::Tensor& cs) {
    ctx->save_for_backward({cb, cs});
    return ssd_decay_forward_impl(cb, cs);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dcb, dcs] = ssd_decay_backward_impl(grads[0], saved[0], saved[1]);
    return {dcb, dcs};
  }
};

}  // namespace

bool enabled() { return compiled() && g_enabled.load(); }
void set_enabled(bool on) { g_enabled.store(on); }

bool usable(const at::Tensor& x) {
  return enabled() && x.defined() && x.is_cuda() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
}

at::Tensor swiglu(const at::Tensor& fc1) { return SwiGluFn::apply(fc1); }

at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  return CrossEntropyFn::apply(logits, labels);
}

std::array<at::Tensor, 3> rope_qkv(const at::Tensor& qkv, const at::Tensor& cos,
                                   const at::Tensor& sin) {
  variable_list out = RopeQkvFn::apply(qkv, cos, sin);
  return {out[0], out[1], out[2]};
}

at::Tensor conv_silu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  return ConvSiluFn::apply(x, w, bias);
}

bool conv_silu_supports(const at::Tensor& x, const at::Tensor& w) {
  return usable(x) && x.dim() == 3 && x.stride(-1) == 1 && w.scalar_type() == at::kFloat &&
         w.dim() == 3 && w.size(0) == x.size(2) && w.size(1) == 1 &&
         w.size(2) <= conv_silu_max_kernel_impl() &&
         (x.size(0) == 1 || x.stride(0) == x.stride(1) * x.size(1));
}

at::Tensor gated_rms_norm(const at::Tensor& y, const at::Tensor& z, const at::Tensor& w,
                          int64_t ng, double eps) {
  return GatedNormFn::apply(y, z, w, ng, eps);
}

bool gated_rms_norm_supports(const at::Tensor& y, const at::Tensor& z, int64_t ng) {
  const int64_t di = y.size(-1);
  return usable(z) && y.scalar_type() == at::kFloat && y.is_cuda() && ng > 0 && di % ng == 0 &&
         z.size(-1) == di && z.stride(-1) == 1 && di <= gated_norm_max_width_impl();
}

at::Tensor ssd_decay_weighted(const at::Tensor& cb, const at::Tensor& cs) {
  return SsdDecayFn::apply(cb, cs);
}

at::Tensor ssd_decay_weighted_forward(const at::Tensor& cb, const at::Tensor& cs) {
  return ssd_decay_forward_impl(cb, cs);
}

std::pair<at::Tensor, at::Tensor> ssd_decay_weighted_backward(const at::Tensor& dout,
                                                              const at::Tensor& cb,
                                                              const at::Tensor& cs) {
  return ssd_decay_backward_impl(dout, cb, cs);
}

}  // namespace weft::fused
