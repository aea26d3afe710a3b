// The Mamba-2 mixer (see mamba.h); its SSD scan is in ssd.cpp.
#include "weft/model/mamba.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <vector>

#include "weft/core/error.h"
#include "weft/model/fused.h"
#include "weft/model/ops.h"

namespace weft {
at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  const int64_t s = x.size(1), k = w.size(-1);
  WEFT_CHECK(w.dim() == 3 && w.size(0) == x.size(2) && w.size(1) == 1,
             "causal_conv1d: weight [{}, 1, k] expected", x.size(2));
  const at::Tensor taps = w.squeeze(1);  // [c, k]
  const at::Tensor padded = at::constant_pad_nd(x, {0, 0, k - 1, 0});  // zeros before the start
  at::Tensor y = bias.to(x.scalar_type()).expand_as(x);
  for (int64_t j = 0; j < k; ++j) y = y + padded.narrow(1, j, s) * taps.select(1, j);
  return y;
}

c10::ScalarType mamba_ssd_io_dtype(c10::ScalarType model_dtype) {
  return model_dtype == at::kBFloat16 ? at::kBFloat16 : c10::ScalarType::Undefined;
}

MambaProjections mamba_in_proj(const at::Tensor& x, const MambaHandles& w,
                               const ModelConfig& cfg) {
  const int64_t nh = cfg.mamba_heads(), di = nh * cfg.mamba_head_dim;
  const int64_t ng = cfg.mamba_num_groups, ds = cfg.mamba_state_dim;
  const at::Tensor proj =
      ops::linear(ops::rms_norm(x, w.in_proj_norm, cfg.norm_epsilon), w.in_proj);
  // One split, not three narrows: its backward writes the three gradients into one buffer in one
  // pass, where each narrow's would zero-fill a whole projection-sized gradient and add them up.
  const std::vector<at::Tensor> parts = at::split_with_sizes(proj, {di, di + 2 * ng * ds, nh}, -1);
  MambaProjections p;
  p.z = parts[0];
  p.xbc = parts[1];
  p.dt = parts[2];
  return p;
}

MambaScanInputs mamba_scan_inputs(const at::Tensor& xbc, const at::Tensor& dt_raw,
                                  const MambaHandles& w, const ModelConfig& cfg) {
  const int64_t b = xbc.size(0), s = xbc.size(1);
  const int64_t nh = cfg.mamba_heads(), hd = cfg.mamba_head_dim, di = nh * hd;
  const int64_t ng = cfg.mamba_num_groups, ds = cfg.mamba_state_dim;
  const auto acc = xbc.scalar_type();
  const std::vector<at::Tensor> parts = at::split_with_sizes(xbc, {di, ng * ds, ng * ds}, -1);
  MambaScanInputs in;
  in.x = parts[0].view({b, s, nh, hd});
  in.B = parts[1].view({b, s, ng, ds});
  in.C = parts[2].view({b, s, ng, ds});
  in.dt = at::softplus(dt_raw.to(acc) + ops::param_value(w.dt_bias).to(acc));
  in.A = -ops::param_value(w.A_log).to(acc).exp();
  in.D = ops::param_value(w.D).to(acc);
  return in;
}

at::Tensor mamba_out_proj(const at::Tensor& y, const at::Tensor& z, const MambaHandles& w,
                          const ModelConfig& cfg, c10::ScalarType dtype) {
  const int64_t b = y.size(0), s = y.size(1);
  const int64_t di = cfg.mamba_heads() * cfg.mamba_head_dim, ng = cfg.mamba_num_groups;
  // Gated RMSNorm per group: norm(y * silu(z)) over each of the ng groups of di / ng channels
  // (on CUDA one fused kernel each way, fused.h).
  const at::Tensor yr = y.reshape({b, s, di});
  if (fused::gated_rms_norm_supports(yr, z, ng) && z.scalar_type() == dtype) {
    const at::Tensor scale = ops::param_value(w.norm).to(at::kFloat);
    return ops::linear(fused::gated_rms_norm(yr, z, scale, ng, 1e-5), w.out_proj);
  }
  const at::Tensor g =
      (y.reshape({b, s, di}) * at::silu(z.to(y.scalar_type()))).reshape({b, s, ng, di / ng});
  const at::Tensor normed =
      (g * at::rsqrt(g.pow(2).mean({-1}, /*keepdim=*/true) + 1e-5)).reshape({b, s, di});
  const at::Tensor out = (normed * ops::param_value(w.norm).to(y.scalar_type())).to(dtype);
  return ops::linear(out, w.out_proj);
}

at::Tensor mamba_mixer(const at::Tensor& x, const MambaHandles& w, const ModelConfig& cfg) {
  const MambaProjections p = mamba_in_proj(x, w, cfg);
  const auto acc = ops::accum_dtype(x.scalar_type());
  const at::Tensor conv_w = ops::param_value(w.conv_weight).to(acc);
  const at::Tensor conv_b = ops::param_value(w.conv_bias).to(acc);
  // On CUDA one fused kernel each way reads the projection's bf16 rows directly (fused.h).
  const at::Tensor xbc = fused::conv_silu_supports(p.xbc, conv_w) && acc == at::kFloat
                             ? fused::conv_silu(p.xbc, conv_w, conv_b)
                             : at::silu(causal_conv1d(p.xbc.to(acc), conv_w, conv_b));
  const MambaScanInputs in = mamba_scan_inputs(xbc, p.dt, w, cfg);
  const at::Tensor y = ssd_chunked(in.x, in.dt, in.A, in.B, in.C, cfg.mamba_chunk_size,
                                   mamba_ssd_io_dtype(x.scalar_type()), in.D);
  return mamba_out_proj(y, p.z, w, cfg, x.scalar_type());
}

}  // namespace weft
