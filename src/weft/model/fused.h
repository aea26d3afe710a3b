// The fused CUDA path of the decoder's elementwise chains (kernels.h), at the tensor level,
// with autograd for the two that carry no weight (SwiGLU, rotary embedding of the fused QKV);
// the RMSNorm scale has a ParamHandle and gets its autograd function in ops.cpp.
//
// usable(x) says whether a tensor takes the fused path: a CUDA build, fused kernels switched on
// (set_enabled, default on; `weft train --no-fused-kernels` turns them off), x on a CUDA device
// in float32 or bfloat16. Everything else (CPU, float64, libtorch without CUDA) runs the ATen
// reference composition in transformer.cpp / ops.cpp, which the fused results are tested
// against (tests/model/test_model.cpp: ModelCuda.FusedKernelsMatchReference,
// ModelCuda.IgnoredLabelsFusedAndUnfused; tests/model/test_mamba.cpp: MambaCuda.*).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <utility>

namespace weft::fused {

bool compiled();             // built with the CUDA kernels
bool enabled();              // compiled() and not switched off
void set_enabled(bool on);
bool usable(const at::Tensor& x);

// RMSNorm with the weight w [h] in x's dtype: {y, rstd [rows] float32}.
std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& w,
                                                   double eps);
// The residual add and the RMSNorm of its result in one pass: {x + res, its norm y, rstd}, the
// bits of the add followed by rms_norm_forward.
std::array<at::Tensor, 3> add_rms_norm_forward(const at::Tensor& x, const at::Tensor& res,
                                               const at::Tensor& w, double eps);
// dx, and the weight gradient sum over rows of dy * xhat (float32 [h]) into *dw_sum. With dres
// (the gradient reaching x by another path, as after add_rms_norm_forward) dx + dres instead,
// with the bits of the separate add.
at::Tensor rms_norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                             const at::Tensor& rstd, at::Tensor* dw_sum,
                             const at::Tensor& dres = at::Tensor());
bool rms_norm_supports(int64_t hidden);

// act = silu(fc1[..., :f]) * fc1[..., f:], with autograd.
at::Tensor swiglu(const at::Tensor& fc1);
// The same without autograd, and its backward: d fc1 from d act (contiguous [rows, 2f] fc1).
at::Tensor swiglu_forward(const at::Tensor& fc1);
at::Tensor swiglu_backward(const at::Tensor& dact, const at::Tensor& fc1);

// Rotary embedding of qkv [b, s, ng, r + 2, hd] with tables cos/sin [s, hd] (contiguous, x's
// dtype), with autograd: {q [b, s, ng * r, hd], k [b, s, ng, hd], v [b, s, ng, hd]}.
std::array<at::Tensor, 3> rope_qkv(const at::Tensor& qkv, const at::Tensor& cos,
                                   const at::Tensor& sin);

// Sum over rows of the cross-entropy of logits [rows, v] against labels [rows] (int64, -100 =
// ignored), float32 0-dim, with autograd; the log-softmax is never materialised.
at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels);

// The Mamba-2 depthwise causal conv and SiLU with autograd: x [b, s, C] float32 or bfloat16
// (rows may be a narrow of a wider projection), w [C, 1, K] and bias [C] float32; float32
// silu(causal_conv1d(x, w, bias)) (mamba.h). conv_silu_supports says when it applies.
at::Tensor conv_silu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);
bool conv_silu_supports(const at::Tensor& x, const at::Tensor& w);

// The Mamba-2 gated RMSNorm with autograd: y [b, s, di] float32, z [b, s, di] (rows may be a
// narrow of a wider projection) float32 or bfloat16, w [di] float32; per group of di / ng
// channels norm(y * silu(z)) * w, in z's dtype. gated_rms_norm_supports says when it applies.
at::Tensor gated_rms_norm(const at::Tensor& y, const at::Tensor& z, const at::Tensor& w,
                          int64_t ng, double eps);
bool gated_rms_norm_supports(const at::Tensor& y, const at::Tensor& z, int64_t ng);

// The Mamba-2 SSD's decay-weighted C.B blocks, with autograd: for cb [..., G, Q, Q] (C.B per
// group and chunk, float32 or bfloat16) and cs [..., G, R, Q] float32 (cumulative log-decays of
// the group's R heads), out [..., G, R, Q, Q] in cb's dtype with
// out[.., g, r, i, j] = cb[.., g, i, j] * exp(cs[.., g, r, i] - cs[.., g, r, j]) for j <= i, 0
// above; equal to (cb.unsqueeze(-3) * exp(causal differences of cs)).to(cb's dtype) without
// materialising the decay matrices (forward or backward).
at::Tensor ssd_decay_weighted(const at::Tensor& cb, const at::Tensor& cs);
// The same kernels without autograd, for a scan that writes its own backward (ssd.cpp):
// the forward, and the backward's {dcb in cb's dtype (summed over R), dcs float32}.
at::Tensor ssd_decay_weighted_forward(const at::Tensor& cb, const at::Tensor& cs);
std::pair<at::Tensor, at::Tensor> ssd_decay_weighted_backward(const at::Tensor& dout,
                                                              const at::Tensor& cb,
                                                              const at::Tensor& cs);

}  // namespace weft::fused
