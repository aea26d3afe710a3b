// The Mamba-2 mixer and its chunked SSD scan (see mamba.h).
//
// The scan, for one head with per-step log-decay a_t = dt_t A (<= 0) and input u_t = dt_t x_t:
//   y_t = sum_{j <= t} exp(a_{j+1} + ... + a_t) (C_t . B_j) u_j.
// With the sequence cut into chunks of Q steps and cs the within-chunk cumulative sum of a:
//   1. inside a chunk:   y_i += sum_{j <= i} exp(cs_i - cs_j) (C_i . B_j) u_j  (masked matmuls)
//   2. chunk end states: S_c = sum_j exp(cs_last - cs_j) u_j B_j^T          ([hd, ds] per head)
//   3. across chunks:    E_c = sum_{c' < c} exp(total decay of chunks c'+1 .. c-1) S_c'
//                        (one masked [nc, nc] decay matrix times the stacked states)
//   4. into a chunk:     y_i += exp(cs_i) C_i . E_c
// Every exponent is <= 0, so nothing overflows; masked entries are set to -inf before exp.
// Only matmuls, elementwise ops and sums: deterministic on CPU and CUDA.
#include "weft/model/mamba.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>
#include <limits>

#include "weft/core/error.h"
#include "weft/model/fused.h"
#include "weft/model/ops.h"

namespace weft {
namespace {

// [..., n] cumulative sums -> [..., n, n] with entry (i, j) = cs_i - cs_j for j <= i, -inf above.
at::Tensor causal_differences(const at::Tensor& cs) {
  const int64_t n = cs.size(-1);
  at::Tensor d = cs.unsqueeze(-1) - cs.unsqueeze(-2);
  const at::Tensor upper = at::ones({n, n}, cs.options().dtype(at::kBool)).triu(1);
  return d.masked_fill(upper, -std::numeric_limits<double>::infinity());
}

}  // namespace

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

at::Tensor ssd_chunked(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                       const at::Tensor& B, const at::Tensor& C, int64_t chunk,
                       c10::ScalarType io_dtype) {
  WEFT_CHECK(x.dim() == 4 && dt.dim() == 3 && B.dim() == 4 && C.sizes() == B.sizes() && chunk > 0,
             "ssd_chunked: x [b, s, nh, hd], dt [b, s, nh], B, C [b, s, ng, ds] expected");
  const int64_t b = x.size(0), s = x.size(1), H = x.size(2), P = x.size(3);
  const int64_t G = B.size(2), N = B.size(3);
  WEFT_CHECK(H % G == 0, "ssd_chunked: {} heads in {} groups", H, G);
  const int64_t R = H / G;  // heads per group: they share B and C
  const auto acc = ops::accum_dtype(x.scalar_type());
  // Decays and their sums always in acc; the big operands of the matmuls in io_dtype.
  const auto io = io_dtype == c10::ScalarType::Undefined ? acc : io_dtype;
  const int64_t Q = std::min<int64_t>(chunk, s), nc = (s + Q - 1) / Q, T = nc * Q, pad = T - s;

  // Padding steps have dt = 0: no decay, no input.
  auto padded = [&](const at::Tensor& t, c10::ScalarType dtype) {
    at::Tensor f = t.to(dtype);
    if (pad == 0) return f;
    std::vector<int64_t> p(2 * (t.dim() - 2), 0);  // pairs from the last dim back to dim 1
    p.push_back(0);
    p.push_back(pad);
    return at::constant_pad_nd(f, p);
  };
  // Layouts: "natural" [b, nc, Q, G, R, ...] is [b, T, H, ...] viewed; per head [b, nc, G, R, Q, ..];
  // per group [b, nc, G, Q, ...] with the group's R heads folded into the last dim where a
  // matmul would otherwise broadcast B or C over them.
  const at::Tensor dtp = padded(dt, acc);                                       // [b, T, H]
  const at::Tensor cs =
      (dtp * A.to(acc)).reshape({b, nc, Q, G, R}).permute({0, 1, 3, 4, 2}).cumsum(-1);  // [b,nc,G,R,Q]
  const at::Tensor u = (padded(x, acc) * dtp.unsqueeze(-1)).to(io).reshape({b, nc, Q, G, R, P});
  auto per_group = [&](const at::Tensor& t) {  // [b, T, G, N] -> [b, nc, G, Q, N]
    return padded(t, io).reshape({b, nc, Q, G, N}).permute({0, 1, 3, 2, 4}).contiguous();
  };
  const at::Tensor Bg = per_group(B), Cg = per_group(C);

  // 1. inside each chunk: C.B once per group, the decay per head.
  // On CUDA one fused kernel forms the decay-weighted blocks (fused.h), never storing the decays.
  const at::Tensor cb = at::matmul(Cg, Bg.transpose(-1, -2));                  // [b,nc,G,Q,Q]
  const at::Tensor weighted_cb =                                               // [b,nc,G,R,Q,Q]
      fused::usable(cb) && cs.scalar_type() == at::kFloat
          ? fused::ssd_decay_weighted(cb, cs)
          : (cb.unsqueeze(3) * causal_differences(cs).exp()).to(io);
  const at::Tensor u_head = u.permute({0, 1, 3, 4, 2, 5});                     // [b,nc,G,R,Q,P]
  const at::Tensor y_diag = at::matmul(weighted_cb, u_head);

  // 2. each chunk's final state, per group with the heads folded: [b, nc, G, R*P, N]
  const at::Tensor last = cs.narrow(-1, Q - 1, 1);                             // [b,nc,G,R,1]
  const at::Tensor to_end = (last - cs).exp().to(io).permute({0, 1, 4, 2, 3}); // [b,nc,Q,G,R]
  const at::Tensor weighted = (u * to_end.unsqueeze(-1))
                                  .permute({0, 1, 3, 2, 4, 5})
                                  .reshape({b, nc, G, Q, R * P});
  const at::Tensor states = at::matmul(weighted.transpose(-1, -2), Bg);        // [b,nc,G,RP,N]

  at::Tensor y = y_diag.permute({0, 1, 4, 2, 3, 5});                           // [b,nc,Q,G,R,P]
  if (nc > 1) {
    // 3. the state entering chunk c: sum over c' < c of exp(ct[c-1] - ct[c']) S_c'.
    const at::Tensor ct = last.squeeze(-1).permute({0, 2, 3, 1}).cumsum(-1);   // [b,G,R,nc]
    at::Tensor m = causal_differences(ct).narrow(-2, 0, nc - 1).exp();         // [b,G,R,nc-1,nc]
    m = at::constant_pad_nd(m, {0, 0, 1, 0}).to(io);                          // row 0: no state
    const at::Tensor flat =
        states.reshape({b, nc, G, R, P * N}).permute({0, 2, 3, 1, 4});         // [b,G,R,nc,PN]
    const at::Tensor entering = at::matmul(m, flat)
                                    .reshape({b, G, R, nc, P, N})
                                    .permute({0, 3, 1, 2, 4, 5})
                                    .reshape({b, nc, G, R * P, N});
    // 4. its contribution inside the chunk, decayed to each step: [b, nc, G, Q, R, P]
    const at::Tensor into = cs.exp().to(io).permute({0, 1, 2, 4, 3}).unsqueeze(-1);  // [b,nc,G,Q,R,1]
    const at::Tensor y_off =
        at::matmul(Cg, entering.transpose(-1, -2)).reshape({b, nc, G, Q, R, P}) * into;
    y = y + y_off.permute({0, 1, 3, 2, 4, 5});
  }
  return y.reshape({b, T, H, P}).narrow(1, 0, s).to(x.scalar_type());
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
  MambaProjections p;
  p.z = proj.narrow(-1, 0, di);
  p.xbc = proj.narrow(-1, di, di + 2 * ng * ds);
  p.dt = proj.narrow(-1, 2 * di + 2 * ng * ds, nh);
  return p;
}

MambaScanInputs mamba_scan_inputs(const at::Tensor& xbc, const at::Tensor& dt_raw,
                                  const MambaHandles& w, const ModelConfig& cfg) {
  const int64_t b = xbc.size(0), s = xbc.size(1);
  const int64_t nh = cfg.mamba_heads(), hd = cfg.mamba_head_dim, di = nh * hd;
  const int64_t ng = cfg.mamba_num_groups, ds = cfg.mamba_state_dim;
  const auto acc = xbc.scalar_type();
  MambaScanInputs in;
  in.x = xbc.narrow(-1, 0, di).reshape({b, s, nh, hd});
  in.B = xbc.narrow(-1, di, ng * ds).reshape({b, s, ng, ds});
  in.C = xbc.narrow(-1, di + ng * ds, ng * ds).reshape({b, s, ng, ds});
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
  const int64_t nh = cfg.mamba_heads();
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
                                   mamba_ssd_io_dtype(x.scalar_type())) +
                       in.x * in.D.view({nh, 1});
  return mamba_out_proj(y, p.z, w, cfg, x.scalar_type());
}

}  // namespace weft
