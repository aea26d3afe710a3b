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
                       const at::Tensor& B, const at::Tensor& C, int64_t chunk) {
  WEFT_CHECK(x.dim() == 4 && dt.dim() == 3 && B.dim() == 4 && C.sizes() == B.sizes() && chunk > 0,
             "ssd_chunked: x [b, s, nh, hd], dt [b, s, nh], B, C [b, s, ng, ds] expected");
  const int64_t b = x.size(0), s = x.size(1), H = x.size(2), P = x.size(3);
  const int64_t G = B.size(2), N = B.size(3);
  WEFT_CHECK(H % G == 0, "ssd_chunked: {} heads in {} groups", H, G);
  const int64_t R = H / G;  // heads per group: they share B and C
  const auto acc = ops::accum_dtype(x.scalar_type());
  const int64_t Q = std::min<int64_t>(chunk, s), nc = (s + Q - 1) / Q, T = nc * Q, pad = T - s;

  // Float32 (float64) throughout; padding steps have dt = 0: no decay, no input.
  auto padded = [&](const at::Tensor& t) {
    at::Tensor f = t.to(acc);
    if (pad == 0) return f;
    std::vector<int64_t> p(2 * (t.dim() - 2), 0);  // pairs from the last dim back to dim 1
    p.push_back(0);
    p.push_back(pad);
    return at::constant_pad_nd(f, p);
  };
  // [b, T, H, ...] -> [b, nc, G, R, Q, ...] and [b, T, G, N] -> [b, nc, G, 1, Q, N]: chunks,
  // then groups, then the heads of a group, then steps.
  auto per_head = [&](const at::Tensor& t) {
    std::vector<int64_t> shape = {b, nc, Q, G, R};
    if (t.dim() == 4) shape.push_back(t.size(3));
    at::Tensor v = t.reshape(shape);
    return t.dim() == 4 ? v.permute({0, 1, 3, 4, 2, 5}) : v.permute({0, 1, 3, 4, 2});
  };
  auto per_group = [&](const at::Tensor& t) {
    return t.reshape({b, nc, Q, G, N}).permute({0, 1, 3, 2, 4}).unsqueeze(3);
  };
  const at::Tensor dtp = padded(dt);                                  // [b, T, H]
  const at::Tensor uc = per_head(padded(x) * dtp.unsqueeze(-1));      // [b, nc, G, R, Q, P]
  const at::Tensor cs = per_head(dtp * A.to(acc)).cumsum(-1);         // [b, nc, G, R, Q]
  const at::Tensor Bc = per_group(padded(B)), Cc = per_group(padded(C));  // [b, nc, G, 1, Q, N]

  // 1. inside each chunk: C.B once per group, the decay per head.
  const at::Tensor decay = causal_differences(cs).exp();              // [b, nc, G, R, Q, Q]
  at::Tensor y = at::matmul(at::matmul(Cc, Bc.transpose(-1, -2)) * decay, uc);  // [.., Q, P]

  // 2. each chunk's final state
  const at::Tensor last = cs.narrow(-1, Q - 1, 1);                    // [b, nc, G, R, 1]
  const at::Tensor states =
      at::matmul((uc * (last - cs).exp().unsqueeze(-1)).transpose(-1, -2), Bc);  // [.., P, N]

  // 3. the state entering each chunk
  if (nc > 1) {
    const at::Tensor ct = last.squeeze(-1).permute({0, 2, 3, 1}).cumsum(-1);  // [b, G, R, nc]
    // entering chunk c from chunk c' < c: exp(ct[c-1] - ct[c']); shift by one chunk.
    at::Tensor m = causal_differences(ct).narrow(-2, 0, nc - 1).exp();  // [b, G, R, nc-1, nc]
    m = at::constant_pad_nd(m, {0, 0, 1, 0});                           // row 0: no state
    const at::Tensor flat = states.permute({0, 2, 3, 1, 4, 5}).reshape({b, G, R, nc, P * N});
    const at::Tensor entering = at::matmul(m, flat)
                                    .reshape({b, G, R, nc, P, N})
                                    .permute({0, 3, 1, 2, 4, 5});       // [b, nc, G, R, P, N]
    // 4. its contribution inside the chunk
    y = y + at::matmul(Cc, entering.transpose(-1, -2)) * cs.exp().unsqueeze(-1);
  }
  return y.permute({0, 1, 4, 2, 3, 5}).reshape({b, T, H, P}).narrow(1, 0, s).to(x.scalar_type());
}

at::Tensor mamba_mixer(const at::Tensor& x, const MambaHandles& w, const ModelConfig& cfg) {
  const int64_t b = x.size(0), s = x.size(1);
  const int64_t nh = cfg.mamba_heads(), hd = cfg.mamba_head_dim, di = nh * hd;
  const int64_t ng = cfg.mamba_num_groups, ds = cfg.mamba_state_dim;
  const at::Tensor proj =
      ops::linear(ops::rms_norm(x, w.in_proj_norm, cfg.norm_epsilon), w.in_proj);
  const at::Tensor z = proj.narrow(-1, 0, di);
  const at::Tensor xbc_raw = proj.narrow(-1, di, di + 2 * ng * ds);
  const at::Tensor dt_raw = proj.narrow(-1, 2 * di + 2 * ng * ds, nh);

  const auto acc = ops::accum_dtype(x.scalar_type());
  const at::Tensor xbc = at::silu(causal_conv1d(xbc_raw.to(acc), ops::param_value(w.conv_weight).to(acc),
                                                ops::param_value(w.conv_bias).to(acc)));
  const at::Tensor xs = xbc.narrow(-1, 0, di).reshape({b, s, nh, hd});
  const at::Tensor Bm = xbc.narrow(-1, di, ng * ds).reshape({b, s, ng, ds});
  const at::Tensor Cm = xbc.narrow(-1, di + ng * ds, ng * ds).reshape({b, s, ng, ds});
  const at::Tensor dt = at::softplus(dt_raw.to(acc) + ops::param_value(w.dt_bias).to(acc));
  const at::Tensor A = -ops::param_value(w.A_log).to(acc).exp();
  at::Tensor y = ssd_chunked(xs, dt, A, Bm, Cm, cfg.mamba_chunk_size) +
                 xs * ops::param_value(w.D).to(acc).view({nh, 1});

  // Gated RMSNorm per group: norm(y * silu(z)) over each of the ng groups of di / ng channels.
  const at::Tensor g = (y.reshape({b, s, di}) * at::silu(z.to(acc))).reshape({b, s, ng, di / ng});
  const at::Tensor normed =
      (g * at::rsqrt(g.pow(2).mean({-1}, /*keepdim=*/true) + 1e-5)).reshape({b, s, di});
  const at::Tensor out = (normed * ops::param_value(w.norm).to(acc)).to(x.scalar_type());
  return ops::linear(out, w.out_proj);
}

}  // namespace weft
