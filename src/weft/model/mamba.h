// The Mamba-2 mixer of hybrid models (Megatron's MambaMixer, `M` in --hybrid-layer-pattern):
//
//   xn            = rmsnorm(x) * in_proj.layer_norm_weight          (the fused pre-norm)
//   z, xBC, dt    = in_proj(xn), rows [z (di), x (di), B (ng*ds), C (ng*ds), dt (nh)]
//   x, B, C       = silu(causal depthwise conv1d(xBC)), kernel 4, with bias
//   dt            = softplus(dt + dt_bias),  A = -exp(A_log)
//   y             = SSD(x, dt, A, B, C) + D * x                       (per head; B, C per group)
//   out           = out_proj(rmsnorm_per_group(y * silu(z)) * norm.weight)
//
// with di = nh * hd inner width, nh heads of hd channels, ng groups of ds state size; head h
// reads B and C of group h / (nh / ng). The SSD scan is h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,
// y_t = h_t C_t ([hd, ds] state per head), computed chunk-wise with matmuls (ssd_chunked): within
// a chunk as a masked, decay-weighted attention-like product, across chunks through the chunks'
// final states. Everything from the conv on runs in float32 (float64 for float64 inputs), as
// Megatron's kernels do, and is cast back before out_proj.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "weft/model/config.h"
#include "weft/model/param_source.h"

namespace weft {

// The SSD scan (ssd.cpp). x [b, s, nh, hd], dt [b, s, nh] (positive), A [nh] (negative), B
// and C [b, s, ng, ds], D [nh] or undefined. Returns y [b, s, nh, hd] in x's dtype, with the D
// skip (y += D x) where D is given, for any s (the last chunk is padded). With autograd, through
// its own backward (every input's gradient). The decays (cumulative sums of dt A and their
// exponentials) are computed in x's accumulation dtype; the matmul operands (dt x, B, C, the
// decay-weighted C.B, the chunk states) in `io_dtype` (Undefined: the accumulation dtype).
// bf16 models pass bf16, as Mamba-2's fused kernels do: tensor-core matmuls with float32
// accumulation, half the memory traffic.
at::Tensor ssd_chunked(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                       const at::Tensor& B, const at::Tensor& C, int64_t chunk,
                       c10::ScalarType io_dtype = c10::ScalarType::Undefined,
                       const at::Tensor& D = {});
// The io_dtype mamba_mixer gives ssd_chunked for a model of `model_dtype`.
c10::ScalarType mamba_ssd_io_dtype(c10::ScalarType model_dtype);

struct MambaHandles {
  ParamHandle in_proj_norm;  // mixer.in_proj.layer_norm_weight [h]
  ParamHandle in_proj;       // mixer.in_proj.weight [2 di + 2 ng ds + nh, h]
  ParamHandle conv_weight;   // mixer.conv1d.weight [di + 2 ng ds, 1, 4]
  ParamHandle conv_bias;     // mixer.conv1d.bias [di + 2 ng ds]
  ParamHandle dt_bias;       // mixer.dt_bias [nh]
  ParamHandle A_log;         // mixer.A_log [nh]
  ParamHandle D;             // mixer.D [nh]
  ParamHandle norm;          // mixer.norm.weight [di]
  ParamHandle out_proj;      // mixer.out_proj.weight [h, di]
};

// The mixer on x [b, s, h] (the layer's input: the pre-norm is inside). Returns [b, s, h].
at::Tensor mamba_mixer(const at::Tensor& x, const MambaHandles& w, const ModelConfig& cfg);

// mamba_mixer's pieces, for incremental decoding (model/generate.h). mamba_mixer(x) is
//   p = mamba_in_proj(x); xbc = silu(causal_conv1d(p.xbc in acc dtype, conv weight, bias));
//   in = mamba_scan_inputs(xbc, p.dt); y = ssd_chunked(in..., D);
//   mamba_out_proj(y, p.z, .., x's dtype)
// with acc = ops::accum_dtype(x's dtype).
struct MambaProjections {
  at::Tensor z;    // [b, s, di] the gate
  at::Tensor xbc;  // [b, s, di + 2 ng ds] the conv's input (x, B, C before the conv)
  at::Tensor dt;   // [b, s, nh] dt before softplus and dt_bias
};
// in_proj(rmsnorm(x) * in_proj.layer_norm_weight), split; in x's dtype.
MambaProjections mamba_in_proj(const at::Tensor& x, const MambaHandles& w, const ModelConfig& cfg);
struct MambaScanInputs {
  at::Tensor x;     // [b, s, nh, hd]
  at::Tensor B, C;  // [b, s, ng, ds]
  at::Tensor dt;    // [b, s, nh] softplus(dt + dt_bias), positive
  at::Tensor A;     // [nh] -exp(A_log), negative
  at::Tensor D;     // [nh]
};
// The scan's inputs from the conv's (silu-activated) output xbc [b, s, di + 2 ng ds] in the
// accumulation dtype and the raw dt [b, s, nh]; all in xbc's dtype.
MambaScanInputs mamba_scan_inputs(const at::Tensor& xbc, const at::Tensor& dt_raw,
                                  const MambaHandles& w, const ModelConfig& cfg);
// out_proj(rmsnorm_per_group(y * silu(z)) * norm.weight) for y [b, s, nh, hd] (with the D skip)
// in the accumulation dtype, cast to `dtype` before out_proj. Returns [b, s, h].
at::Tensor mamba_out_proj(const at::Tensor& y, const at::Tensor& z, const MambaHandles& w,
                          const ModelConfig& cfg, c10::ScalarType dtype);

// Causal depthwise conv over time of x [b, s, c] with taps w [c, 1, k] and bias [c]:
// y_t = bias + sum_j w[:, 0, j] * x_{t-k+1+j} (zeros before the start). Written as k shifted
// products so that it is deterministic on every device.
at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);

}  // namespace weft
