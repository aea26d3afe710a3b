// The chunked SSD scan of the Mamba-2 mixer (mamba.h ssd_chunked), with its backward written out.
//
// The scan, for one head with per-step log-decay a_t = dt_t A (<= 0) and input u_t = dt_t x_t:
//   y_t = sum_{j <= t} exp(a_{j+1} + ... + a_t) (C_t . B_j) u_j  (+ D x_t).
// With the sequence cut into chunks of Q steps and cs the within-chunk cumulative sum of a:
//   1. inside a chunk:   y_i += sum_{j <= i} W_ij u_j, W_ij = exp(cs_i - cs_j) (C_i . B_j)
//   2. chunk end states: S_c = sum_j exp(cs_last - cs_j) B_j u_j^T           ([ds, hd] per head)
//   3. across chunks:    E_c = sum_{c' < c} exp(ct_{c-1} - ct_{c'}) S_c'  (ct: cumsum of cs_last)
//   4. into a chunk:     y_i += exp(cs_i) C_i . E_c
// Every exponent is <= 0, so nothing overflows; masked entries are 0.
//
// Why the backward is written here rather than left to autograd: autograd over this chain of
// permuted views copied the large [b, s, heads, head dim] tensors a dozen times per layer
// (reshapes of permuted gradients, broadcast products and their sums), and those copies cost
// more than the scan's matmuls (bench/gpu/run.sh profhyb). Here every elementwise pass writes its
// result straight into the layout the next batched matmul reads, each matmul's batch dims
// collapse to one (no copy inside matmul), and the backward recomputes the decay-weighted blocks
// instead of keeping them. On CUDA the elementwise passes at the edges (x dt into the matmul
// layouts, the output's sum, the gradient's layouts, dx and the sums over channels) run as the
// fused kernels of ssd_edges.h; the ATen passes here are the CPU path and their reference. Only
// matmuls, elementwise ops and sums in a fixed order: deterministic on CPU and CUDA. Checked
// against the per-step recurrence, forward and every gradient (tests/model/test_mamba.cpp).
//
// Layouts (b batch, nc chunks, Q steps, G groups, R heads per group, P head dim, N state dim):
//   natural  [b, nc, Q, G, R, P]   the caller's [b, s, heads, hd]
//   per head [b, nc, G, R, Q, P]   u, y_diag: W u per (b, chunk, head)
//   folded   [b, nc, G, Q, R * P]  a group's heads side by side: B and C shared, no broadcast
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <vector>

#include "weft/core/compat.h"
#include "weft/core/error.h"
#include "weft/model/fused.h"
#include "weft/model/mamba.h"
#include "weft/model/ops.h"
#include "weft/model/ssd_edges.h"

namespace weft {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [..., n] -> [..., n, n] with entry (i, j) = exp(v_i - v_j) for j <= i, 0 above.
at::Tensor causal_decay(const at::Tensor& v) {
  const int64_t n = v.size(-1);
  const at::Tensor d = v.unsqueeze(-1) - v.unsqueeze(-2);
  const at::Tensor upper = at::ones({n, n}, v.options().dtype(at::kBool)).triu(1);
  return d.masked_fill(upper, -std::numeric_limits<double>::infinity()).exp();
}

bool fused_decay(const at::Tensor& cb, const at::Tensor& cs) {
  return fused::usable(cb) && cs.scalar_type() == at::kFloat;
}

// W [.., G, R, Q, Q] = cb [.., G, Q, Q] (per group) * exp(cs_i - cs_j) (per head), in cb's dtype.
at::Tensor decay_weighted(const at::Tensor& cb, const at::Tensor& cs) {
  if (fused_decay(cb, cs)) return fused::ssd_decay_weighted_forward(cb, cs);
  return (cb.unsqueeze(-3) * causal_decay(cs)).to(cb.scalar_type());
}

// decay_weighted's backward: {dcb [.., G, Q, Q] in cb's dtype, dcs [.., G, R, Q] in cs's}.
std::pair<at::Tensor, at::Tensor> decay_weighted_backward(const at::Tensor& dw,
                                                          const at::Tensor& cb,
                                                          const at::Tensor& cs) {
  if (fused_decay(cb, cs)) return fused::ssd_decay_weighted_backward(dw, cb, cs);
  const at::Tensor decay = causal_decay(cs);
  const at::Tensor dwa = dw.to(cs.scalar_type());
  const at::Tensor g = dwa * cb.to(cs.scalar_type()).unsqueeze(-3) * decay;
  return {(dwa * decay).sum(-3).to(cb.scalar_type()), g.sum(-1) - g.sum(-2)};
}

// [b, T, ...] padded with zeros to T steps along dim 1 (a no-op when T is the length).
at::Tensor pad_steps(const at::Tensor& t, int64_t T) {
  const int64_t pad = T - t.size(1);
  if (pad == 0) return t;
  std::vector<int64_t> p(2 * (t.dim() - 2), 0);  // pairs from the last dim back to dim 1
  p.push_back(0);
  p.push_back(pad);
  return at::constant_pad_nd(t, p);
}

struct Dims {
  int64_t b, s, G, R, P, N, Q, nc, T;
};

Dims dims_of(const at::Tensor& x, const at::Tensor& B, int64_t chunk) {
  Dims d{};
  d.b = x.size(0);
  d.s = x.size(1);
  d.G = B.size(2);
  d.R = x.size(2) / d.G;
  d.P = x.size(3);
  d.N = B.size(3);
  d.Q = std::min<int64_t>(chunk, d.s);
  d.nc = d.Q == 0 ? 0 : (d.s + d.Q - 1) / d.Q;
  d.T = d.nc * d.Q;
  return d;
}

// [b, T, G, N] (any strides) -> [b, nc, G, Q, N] contiguous in `dtype`: one strided copy.
at::Tensor chunk_groups(const at::Tensor& t, const Dims& d, c10::ScalarType dtype) {
  at::Tensor out = at::empty({d.b, d.nc, d.G, d.Q, d.N}, t.options().dtype(dtype));
  out.permute({0, 1, 3, 2, 4}).copy_(t.reshape({d.b, d.nc, d.Q, d.G, d.N}));
  return out;
}

// exp(ct_{c-1} - ct_{c'}) for c' < c, 0 elsewhere (row 0: no state enters the first chunk);
// ct [.., nc] -> [.., nc, nc].
at::Tensor chunk_decay(const at::Tensor& ct) {
  const int64_t nc = ct.size(-1);
  return at::constant_pad_nd(causal_decay(ct).narrow(-2, 0, nc - 1), {0, 0, 1, 0});
}

// The reversed cumulative sum along the last dim: out_k = sum_{i >= k} v_i.
at::Tensor reverse_cumsum(const at::Tensor& v) { return v.flip(-1).cumsum(-1).flip(-1); }

struct SsdFn : torch::autograd::Function<SsdFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& dt_in,
                            const at::Tensor& A, const at::Tensor& B_in, const at::Tensor& C_in,
                            const at::Tensor& D, int64_t chunk, int64_t io_code) {
    const Dims d = dims_of(x_in, B_in, chunk);
    const auto acc = ops::accum_dtype(x_in.scalar_type());
    const auto io = io_code < 0 ? acc : static_cast<c10::ScalarType>(io_code);
    const int64_t b = d.b, nc = d.nc, G = d.G, R = d.R, Q = d.Q, P = d.P, N = d.N;
    // Padding steps have dt = 0: no decay, no input.
    const at::Tensor x6 = pad_steps(x_in, d.T).reshape({b, nc, Q, G, R, P});
    const at::Tensor dt5 = pad_steps(dt_in.to(acc), d.T).reshape({b, nc, Q, G, R});
    const at::Tensor Ag = A.to(acc).view({G, R});
    const at::Tensor cs = (dt5 * Ag).permute({0, 1, 3, 4, 2}).cumsum(-1).contiguous();  // [b,nc,G,R,Q]
    const bool edges = ssd_edges::usable(x6, io);
    const at::Tensor Dacc = D.numel() > 0 ? D.to(acc) : D;
    at::Tensor u, wu;  // head; folded (only with several chunks)
    if (edges) {
      const auto uw = ssd_edges::scale_inputs(x6, dt5, cs, io, nc > 1);
      u = uw[0];
      wu = uw[1];
    } else {
      u = at::empty({b, nc, G, R, Q, P}, x_in.options().dtype(io));
      at::Tensor u_nat = u.permute({0, 1, 4, 2, 3, 5});
      at::mul_out(u_nat, x6, dt5.unsqueeze(-1));
      if (nc > 1) {
        wu = at::empty({b, nc, G, Q, R, P}, u.options());
        at::Tensor wu_head = wu.permute({0, 1, 2, 4, 3, 5});
        at::mul_out(wu_head, u, (cs.narrow(-1, Q - 1, 1) - cs).exp().unsqueeze(-1));
      }
    }
    const at::Tensor Bg = chunk_groups(pad_steps(B_in, d.T), d, io);
    const at::Tensor Cg = chunk_groups(pad_steps(C_in, d.T), d, io);

    // 1. inside each chunk.
    const at::Tensor cb = compat::matmul(Cg, Bg.transpose(-1, -2));  // [b,nc,G,Q,Q]
    const at::Tensor y_diag = compat::matmul(decay_weighted(cb, cs), u);  // [b,nc,G,R,Q,P]

    at::Tensor m, Sh, Ec, Z;
    if (nc > 1) {
      // 2. the chunks' end states, folded: S [b,nc,G,N,R*P] = B^T wu, wu = u * decay to the end.
      const at::Tensor S = compat::matmul(Bg.transpose(-1, -2), wu.view({b, nc, G, Q, R * P}));
      // 3. the state entering each chunk, per head: E [b,G,R,nc,N*P] = m S.
      const at::Tensor ct = cs.select(-1, Q - 1).permute({0, 2, 3, 1}).cumsum(-1);  // [b,G,R,nc]
      m = chunk_decay(ct);                                                         // [b,G,R,nc,nc]
      Sh = S.view({b, nc, G, N, R, P}).permute({0, 2, 4, 1, 3, 5}).reshape({b, G, R, nc, N * P});
      const at::Tensor E = compat::matmul(m.to(io), Sh);
      Ec = E.view({b, G, R, nc, N, P}).permute({0, 3, 1, 4, 2, 5}).reshape({b, nc, G, N, R * P});
      // 4. its contribution before the decay to each step: Z [b,nc,G,Q,R,P] = C E.
      Z = compat::matmul(Cg, Ec).view({b, nc, G, Q, R, P});
    }
    // y = Z exp(cs) + y_diag (+ x D), in the natural layout.
    at::Tensor y;
    if (edges) {
      y = ssd_edges::combine_outputs(y_diag, Z, cs, x6, Dacc);
    } else {
      y = at::empty({b, d.T, G * R, P}, x_in.options());
      at::Tensor y6 = y.view({b, nc, Q, G, R, P});
      if (Z.defined()) {
        at::mul_out(y6, Z.permute({0, 1, 3, 2, 4, 5}),
                    cs.exp().permute({0, 1, 4, 2, 3}).unsqueeze(-1));
        y6.add_(y_diag.permute({0, 1, 4, 2, 3, 5}));
      } else {
        y6.copy_(y_diag.permute({0, 1, 4, 2, 3, 5}));
      }
      if (Dacc.numel() > 0) y6.addcmul_(x6, Dacc.view({G, R, 1}));
    }

    ctx->save_for_backward({x_in, dt_in, A, B_in, C_in, D, u, Bg, Cg, cb, cs, wu, m, Sh, Ec});
    ctx->saved_data["weft_chunk"] = chunk;
    ctx->saved_data["weft_io"] = io_code;
    return y.narrow(1, 0, d.s);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list sv = ctx->get_saved_variables();
    const at::Tensor &x_in = sv[0], &dt_in = sv[1], &A = sv[2], &B_in = sv[3], &C_in = sv[4];
    const at::Tensor &D = sv[5], &u = sv[6], &Bg = sv[7], &Cg = sv[8], &cb = sv[9], &cs = sv[10];
    const at::Tensor &wu = sv[11], &m = sv[12], &Sh = sv[13], &Ec = sv[14];
    const Dims d = dims_of(x_in, B_in, ctx->saved_data["weft_chunk"].toInt());
    const auto acc = cs.scalar_type();
    const auto io = u.scalar_type();
    const int64_t b = d.b, nc = d.nc, G = d.G, R = d.R, Q = d.Q, P = d.P, N = d.N;
    const at::Tensor x6 = pad_steps(x_in, d.T).reshape({b, nc, Q, G, R, P});
    const at::Tensor dt5 = pad_steps(dt_in.to(acc), d.T).reshape({b, nc, Q, G, R});
    const at::Tensor dy6 = pad_steps(grads[0], d.T).reshape({b, nc, Q, G, R, P});

    const bool edges = ssd_edges::usable(x6, io);
    const at::Tensor Dacc = D.numel() > 0 ? D.to(acc) : D;
    // dy in the head layout, and dZ = dy exp(cs) folded (only with several chunks).
    at::Tensor dyh, dZ;
    if (edges) {
      const auto g = ssd_edges::grad_inputs(dy6, cs, io, nc > 1);
      dyh = g[0];
      dZ = g[1];
    } else {
      dyh = at::empty({b, nc, G, R, Q, P}, u.options());
      dyh.permute({0, 1, 4, 2, 3, 5}).copy_(dy6);
      if (nc > 1) {
        dZ = at::empty({b, nc, G, Q, R, P}, u.options());
        at::Tensor dZ_nat = dZ.permute({0, 1, 3, 2, 4, 5});
        at::mul_out(dZ_nat, dy6, cs.exp().permute({0, 1, 4, 2, 3}).unsqueeze(-1));
      }
    }

    // 1. y_diag = W u per head; W recomputed from C.B and the decays.
    const at::Tensor w = decay_weighted(cb, cs);
    at::Tensor du = compat::matmul(w.transpose(-1, -2), dyh);  // [b,nc,G,R,Q,P]
    auto [dcb, dcs] = decay_weighted_backward(compat::matmul(dyh, u.transpose(-1, -2)), cb, cs);
    at::Tensor dCg = compat::matmul(dcb, Bg);                    // [b,nc,G,Q,N]
    at::Tensor dBg = compat::matmul(dcb.transpose(-1, -2), Cg);  // [b,nc,G,Q,N]

    at::Tensor dwu;  // folded [b,nc,G,Q,R,P]
    if (nc > 1) {
      // 4. y += exp(cs) Z with Z = C E: exp(cs)'s share of dcs is the sum over P of dZ Z.
      const at::Tensor dZf = dZ.view({b, nc, G, Q, R * P});
      const at::Tensor Z = compat::matmul(Cg, Ec).view({b, nc, G, Q, R, P});
      dcs.add_(at::sum(dZ * Z, {-1}, false, acc).permute({0, 1, 2, 4, 3}));
      dCg.add_(compat::matmul(dZf, Ec.transpose(-1, -2)));
      const at::Tensor dEc = compat::matmul(Cg.transpose(-1, -2), dZf);  // [b,nc,G,N,RP]
      // 3. E = m S per head: dS, and dm through ct to the chunks' last cs.
      const at::Tensor dE =
          dEc.view({b, nc, G, N, R, P}).permute({0, 2, 4, 1, 3, 5}).reshape({b, G, R, nc, N * P});
      const at::Tensor dSh = compat::matmul(m.to(io).transpose(-1, -2), dE);   // [b,G,R,nc,NP]
      const at::Tensor g = compat::matmul(dE, Sh.transpose(-1, -2)).to(acc) * m;  // [b,G,R,nc,nc]
      at::Tensor dct = -g.sum(-2);
      dct.narrow(-1, 0, nc - 1).add_(g.sum(-1).narrow(-1, 1, nc - 1));
      dcs.select(-1, Q - 1).add_(reverse_cumsum(dct).permute({0, 3, 1, 2}));
      // 2. S = B^T wu, wu = u * exp(cs_last - cs).
      const at::Tensor dS =
          dSh.view({b, G, R, nc, N, P}).permute({0, 3, 1, 4, 2, 5}).reshape({b, nc, G, N, R * P});
      dwu = compat::matmul(Bg, dS).view({b, nc, G, Q, R, P});
      dBg.add_(compat::matmul(wu.view({b, nc, G, Q, R * P}), dS.transpose(-1, -2)));
    }

    // wu's share of du and dcs; u = x dt: dx = du dt (+ dy D), ddt = sum over P of du x (+ the
    // decays' share below).
    at::Tensor dx, ddt, g2, dD;
    if (edges) {
      const auto o = ssd_edges::grad_outputs(du, dwu, u, cs, x6, dt5, dy6, Dacc);
      dx = o[0];
      ddt = o[1];
      g2 = o[2];
      if (Dacc.numel() > 0) dD = o[3].sum({0, 1, 2}).reshape({G * R}).to(D.scalar_type());
    } else {
      at::Tensor gu = du.to(acc);  // du's two shares summed in acc, as the kernel does
      if (nc > 1) {
        const at::Tensor dwu_head = dwu.permute({0, 1, 2, 4, 3, 5});
        const at::Tensor to_end = (cs.narrow(-1, Q - 1, 1) - cs).exp();  // [b,nc,G,R,Q]
        g2 = at::sum(dwu_head.to(acc) * u, {-1}, false, acc) * to_end;
        gu.add_(dwu_head.to(acc) * to_end.unsqueeze(-1));
      }
      const at::Tensor du_nat = gu.permute({0, 1, 4, 2, 3, 5});  // [b,nc,Q,G,R,P]
      dx = at::empty({b, d.T, G * R, P}, x_in.options());
      at::Tensor dx6 = dx.view({b, nc, Q, G, R, P});
      at::mul_out(dx6, du_nat, dt5.unsqueeze(-1));
      if (Dacc.numel() > 0) {
        dx6.addcmul_(dy6, Dacc.view({G, R, 1}));
        dD = at::sum(dy6 * x6, {0, 1, 2, 5}, false, acc).reshape({G * R}).to(D.scalar_type());
      }
      ddt = at::sum(du_nat * x6, {-1}, false, acc);
    }
    if (g2.defined()) {
      dcs.sub_(g2);
      dcs.select(-1, Q - 1).add_(g2.sum(-1));
    }
    // cs = cumsum over Q of dt A: da = reversed cumsum of dcs.
    const at::Tensor da = reverse_cumsum(dcs).permute({0, 1, 4, 2, 3});  // [b,nc,Q,G,R]
    const at::Tensor Ag = A.to(acc).view({G, R});
    ddt = ddt + da * Ag;
    const at::Tensor dA = at::sum(da * dt5, {0, 1, 2}).reshape({G * R}).to(A.scalar_type());

    auto natural = [&](const at::Tensor& g1, const at::Tensor& like) {  // [b,nc,G,Q,N] -> [b,s,G,N]
      at::Tensor out = at::empty({b, d.T, G, N}, like.options());
      out.view({b, nc, Q, G, N}).copy_(g1.permute({0, 1, 3, 2, 4}));
      return out.narrow(1, 0, d.s);
    };
    return {dx.narrow(1, 0, d.s),
            ddt.reshape({b, d.T, G * R}).narrow(1, 0, d.s).to(dt_in.scalar_type()),
            dA,
            natural(dBg, B_in),
            natural(dCg, C_in),
            dD,
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor ssd_chunked(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                       const at::Tensor& B, const at::Tensor& C, int64_t chunk,
                       c10::ScalarType io_dtype, const at::Tensor& D) {
  WEFT_CHECK(x.dim() == 4 && dt.dim() == 3 && B.dim() == 4 && C.sizes() == B.sizes() && chunk > 0,
             "ssd_chunked: x [b, s, nh, hd], dt [b, s, nh], B, C [b, s, ng, ds] expected");
  WEFT_CHECK(x.size(2) % B.size(2) == 0, "ssd_chunked: {} heads in {} groups", x.size(2),
             B.size(2));
  const int64_t io = io_dtype == c10::ScalarType::Undefined ? -1 : static_cast<int64_t>(io_dtype);
  // No D: an empty tensor in its place (custom functions take no undefined inputs).
  return SsdFn::apply(x, dt, A, B, C, D.defined() ? D : at::empty({0}, A.options()), chunk, io);
}

}  // namespace weft
