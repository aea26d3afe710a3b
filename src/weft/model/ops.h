// The parametric ops of the model — linear, a linear layer's bias, the RMSNorm scale, the
// embedding lookup — as custom autograd functions over ParamHandles.
//
// Invariant (param_source.h's contract): under grad mode, each call asks its source for the
// weight once (forward_weight) and its backward delivers the weight gradient exactly once
// (accumulate into grad_buffer, then grad_ready). Ops never keep a weight tensor past the call
// that fetched it: backward fetches it again with backward_weight. Without grad mode, ops call
// forward_weight and build no graph (the source does not count such uses).
//
// Every op gets a graph node under grad mode even when none of its tensor inputs requires grad
// (token ids, a pipeline stage's detached input), so the weight gradient is never skipped.
//
// Dtypes: x and the weight share the compute dtype (bf16, fp32, or fp64 in reference tests).
// Weight gradients are accumulated in the grad buffer's dtype (float32 in training); products
// are computed in the compute dtype and added as a cast unless the dtypes already agree.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

#include "weft/model/param_source.h"

namespace weft::ops {

// y = x @ W^T. x [..., in], W [out, in] -> y [..., out], x and W of one dtype.
at::Tensor linear(const at::Tensor& x, ParamHandle weight);
// linear with x and W cast to `dtype` and the product (and y) in it: Megatron's
// --moe-router-dtype router GEMM. x's gradient comes back in x's dtype; W's is accumulated in
// its gradient buffer as linear's (Megatron rounds it to W's dtype first).
at::Tensor linear_in(const at::Tensor& x, ParamHandle weight, c10::ScalarType dtype);

// y = x + b, x [..., n], b [n] of x's dtype (a linear layer's bias, added after its product).
// b's gradient is the sum of y's over every token, reduced in float32 (float64 for float64) and
// accumulated into its gradient buffer.
at::Tensor add_bias(const at::Tensor& x, ParamHandle bias);

// y = x * rsqrt(mean(x^2, last dim) + eps) * w, w [h]. The normalisation runs in float32
// (float64 for float64 x) and is cast back to x's dtype before the multiply by w.
at::Tensor rms_norm(const at::Tensor& x, ParamHandle weight, double eps);

// The residual add and the RMSNorm of its sum: {s = x + res, rms_norm(s, weight, eps)}, with the
// bits of the two ops; on CUDA one kernel each way (the backward adds the gradient s receives
// from its other uses into the norm's, as autograd would).
std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& res,
                                               ParamHandle weight, double eps);

// tokens [...] int64 -> W[tokens] [..., h]. Tokens get no gradient.
at::Tensor embedding(const at::Tensor& tokens, ParamHandle weight);

// The weight itself as a tensor of the graph (a copy, with autograd): for small parameters used
// by elementwise formulas (conv taps, biases, per-head constants). Its gradient is summed into
// the grad buffer in the buffer's dtype. Not for large matrices: use linear.
at::Tensor param_value(ParamHandle weight);

// The dtype reductions and accumulations run in for a tensor of dtype `t`: float64 for
// float64, float32 otherwise.
inline at::ScalarType accum_dtype(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace weft::ops
