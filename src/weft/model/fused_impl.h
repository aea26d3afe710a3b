// The kernel entry points behind fused.cpp's autograd functions: defined by fused_cuda.cpp in
// CUDA builds and by fused_cpu.cpp (each one fails) in builds without CUDA. Not part of the
// model's API; use fused.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <utility>

namespace weft::fused {

// {q, k, v} with the rotary embedding applied, and the gradient of qkv from theirs.
std::array<at::Tensor, 3> rope_forward_impl(const at::Tensor& qkv, const at::Tensor& cos,
                                            const at::Tensor& sin);
at::Tensor rope_backward_impl(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                              const at::Tensor& cos, const at::Tensor& sin,
                              at::IntArrayRef qkv_shape);
// {loss per row, log-sum-exp per row}, and the gradient of the logits.
std::pair<at::Tensor, at::Tensor> cross_entropy_forward_impl(const at::Tensor& logits,
                                                             const at::Tensor& labels);
at::Tensor cross_entropy_backward_impl(const at::Tensor& logits, const at::Tensor& labels,
                                       const at::Tensor& lse, const at::Tensor& grad);

// The conv + SiLU (fused.h conv_silu), and its gradients {dx, dw, dbias}.
at::Tensor conv_silu_forward_impl(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);
std::array<at::Tensor, 3> conv_silu_backward_impl(const at::Tensor& dout, const at::Tensor& x,
                                                  const at::Tensor& w, const at::Tensor& bias);
int conv_silu_max_kernel_impl();

// The gated RMSNorm (fused.h gated_rms_norm): {out, rstd}, and the gradients {dy, dz, dw}.
std::pair<at::Tensor, at::Tensor> gated_norm_forward_impl(const at::Tensor& y, const at::Tensor& z,
                                                          const at::Tensor& w, int64_t ng,
                                                          double eps);
std::array<at::Tensor, 3> gated_norm_backward_impl(const at::Tensor& dout, const at::Tensor& y,
                                                   const at::Tensor& z, const at::Tensor& w,
                                                   const at::Tensor& rstd, int64_t ng);
int64_t gated_norm_max_width_impl();

// The SSD's decay-weighted C.B blocks (fused.h ssd_decay_weighted) and their gradients
// {dcb, dcs}.
at::Tensor ssd_decay_forward_impl(const at::Tensor& cb, const at::Tensor& cs);
std::pair<at::Tensor, at::Tensor> ssd_decay_backward_impl(const at::Tensor& dout,
                                                          const at::Tensor& cb,
                                                          const at::Tensor& cs);

}  // namespace weft::fused
