// Tensor-level wrappers of the fused CUDA kernels (see fused.h, kernels.h): shape and dtype
// checks, output allocation, the device guard and the current stream. CUDA build only; a build
// without CUDA links fused_cpu.cpp in its place.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "weft/core/error.h"
#include "weft/model/fused.h"
#include "weft/model/fused_impl.h"
#include "weft/model/kernels.h"

namespace weft::fused {
namespace {

kernels::Elem elem_of(const at::Tensor& t) {
  WEFT_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
             "fused kernels take float32 or bfloat16, got {}", c10::toString(t.scalar_type()));
  return t.scalar_type() == at::kBFloat16 ? kernels::Elem::kBF16 : kernels::Elem::kF32;
}

void* stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

void check_launch(const std::string& err, const char* what) {
  WEFT_CHECK(err.empty(), "fused kernel {}: {}", what, err);
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  WEFT_CHECK(a.scalar_type() == b.scalar_type() && a.device() == b.device(),
             "{}: tensors disagree in dtype or device ({} on {} vs {} on {})", what,
             c10::toString(a.scalar_type()), a.device().str(), c10::toString(b.scalar_type()),
             b.device().str());
}

// x as a contiguous tensor whose data is 16-byte aligned (the kernels' vector accesses need it;
// a fresh allocation always is, a view with an odd offset is copied).
at::Tensor aligned(const at::Tensor& x) {
  at::Tensor c = x.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

// A tensor viewed as [b, s, heads, hd] with a contiguous last dim, as the kernel's strides.
kernels::Strided strided(const at::Tensor& t) {
  WEFT_CHECK(t.dim() == 4 && t.stride(3) == 1, "rope backward: gradient must be 4-D with a "
             "contiguous last dim");
  return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
}

}  // namespace

bool compiled() { return true; }

bool rms_norm_supports(int64_t hidden) { return hidden <= kernels::rms_norm_max_hidden(); }

namespace {

// {sum (x + res, or undefined without res), y, rstd}.
std::array<at::Tensor, 3> rms_norm_impl(const at::Tensor& x, const at::Tensor& res,
                                        const at::Tensor& w, double eps) {
  check_same(x, w, "rms_norm");
  const int64_t h = x.size(-1);
  WEFT_CHECK(w.numel() == h, "rms_norm: weight of {} elements for hidden {}", w.numel(), h);
  c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = aligned(x), wc = aligned(w);
  at::Tensor rc, sum;
  if (res.defined()) {
    check_same(x, res, "add_rms_norm");
    WEFT_CHECK(res.sizes() == x.sizes(), "add_rms_norm: residual and input differ in shape");
    rc = aligned(res);
    sum = at::empty_like(xc);
  }
  const int64_t rows = h == 0 ? 0 : xc.numel() / h;
  at::Tensor y = at::empty_like(xc);
  at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  check_launch(kernels::rms_norm_forward(elem_of(xc), xc.data_ptr(),
                                         rc.defined() ? rc.data_ptr() : nullptr, wc.data_ptr(),
                                         sum.defined() ? sum.data_ptr() : nullptr, y.data_ptr(),
                                         rstd.data_ptr<float>(), rows, h,
                                         static_cast<float>(eps), stream_of(xc)),
               "rms_norm_forward");
  return {sum, y, rstd};
}

}  // namespace

std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& w,
                                                   double eps) {
  auto [sum, y, rstd] = rms_norm_impl(x, at::Tensor(), w, eps);
  return {y, rstd};
}

std::array<at::Tensor, 3> add_rms_norm_forward(const at::Tensor& x, const at::Tensor& res,
                                               const at::Tensor& w, double eps) {
  return rms_norm_impl(x, res, w, eps);
}

at::Tensor rms_norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                             const at::Tensor& rstd, at::Tensor* dw_sum, const at::Tensor& dres) {
  check_same(x, w, "rms_norm backward");
  check_same(x, dy, "rms_norm backward");
  const int64_t h = x.size(-1);
  c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = aligned(x), dyc = aligned(dy), wc = aligned(w);
  at::Tensor drc;
  if (dres.defined()) {
    check_same(x, dres, "rms_norm backward");
    WEFT_CHECK(dres.sizes() == x.sizes(), "rms_norm backward: residual gradient of another shape");
    drc = aligned(dres);
  }
  const int64_t rows = h == 0 ? 0 : xc.numel() / h;
  at::Tensor dx = at::empty_like(xc);
  at::Tensor partial =
      at::empty({kernels::rms_norm_blocks(elem_of(xc), rows, h), h}, x.options().dtype(at::kFloat));
  check_launch(kernels::rms_norm_backward(elem_of(xc), dyc.data_ptr(), xc.data_ptr(),
                                          wc.data_ptr(), rstd.data_ptr<float>(),
                                          drc.defined() ? drc.data_ptr() : nullptr, dx.data_ptr(),
                                          partial.data_ptr<float>(), rows, h, stream_of(xc)),
               "rms_norm_backward");
  *dw_sum = rows == 0 ? at::zeros({h}, partial.options()) : partial.sum(0);
  return dx;
}

at::Tensor swiglu_forward(const at::Tensor& fc1) {
  const int64_t two_f = fc1.size(-1);
  WEFT_CHECK(two_f % 2 == 0, "swiglu: last dim {} is odd", two_f);
  c10::cuda::CUDAGuard guard(fc1.device());
  const at::Tensor in = aligned(fc1);
  std::vector<int64_t> shape = in.sizes().vec();
  shape.back() = two_f / 2;
  at::Tensor act = at::empty(shape, in.options());
  const int64_t rows = two_f == 0 ? 0 : in.numel() / two_f;
  check_launch(kernels::swiglu_forward(elem_of(in), in.data_ptr(), act.data_ptr(), rows,
                                       two_f / 2, stream_of(in)),
               "swiglu_forward");
  return act;
}

at::Tensor swiglu_backward(const at::Tensor& dact, const at::Tensor& fc1) {
  check_same(dact, fc1, "swiglu backward");
  c10::cuda::CUDAGuard guard(fc1.device());
  const at::Tensor in = aligned(fc1), d = aligned(dact);
  const int64_t two_f = in.size(-1), rows = two_f == 0 ? 0 : in.numel() / two_f;
  at::Tensor dfc1 = at::empty_like(in);
  check_launch(kernels::swiglu_backward(elem_of(in), d.data_ptr(), in.data_ptr(), dfc1.data_ptr(),
                                        rows, two_f / 2, stream_of(in)),
               "swiglu_backward");
  return dfc1;
}

std::array<at::Tensor, 3> rope_forward_impl(const at::Tensor& qkv, const at::Tensor& cos,
                                            const at::Tensor& sin) {
  WEFT_CHECK(qkv.dim() == 5, "rope: qkv must be [b, s, ng, r + 2, hd]");
  check_same(qkv, cos, "rope");
  check_same(qkv, sin, "rope");
  const kernels::RopeShape s{qkv.size(0), qkv.size(1), qkv.size(2), qkv.size(3) - 2, qkv.size(4)};
  WEFT_CHECK(s.hd % 2 == 0 && s.r >= 1, "rope: bad qkv shape");
  WEFT_CHECK(cos.is_contiguous() && sin.is_contiguous() &&
                 reinterpret_cast<uintptr_t>(cos.data_ptr()) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(sin.data_ptr()) % 16 == 0 && cos.size(0) >= s.s &&
                 cos.size(1) == s.hd && sin.sizes() == cos.sizes(),
             "rope: tables must be contiguous [>= {}, {}]", s.s, s.hd);
  c10::cuda::CUDAGuard guard(qkv.device());
  const at::Tensor in = aligned(qkv);
  at::Tensor q = at::empty({s.b, s.s, s.ng * s.r, s.hd}, in.options());
  at::Tensor k = at::empty({s.b, s.s, s.ng, s.hd}, in.options());
  at::Tensor v = at::empty({s.b, s.s, s.ng, s.hd}, in.options());
  check_launch(kernels::rope_qkv_forward(elem_of(in), in.data_ptr(), cos.data_ptr(),
                                         sin.data_ptr(), q.data_ptr(), k.data_ptr(),
                                         v.data_ptr(), s, stream_of(in)),
               "rope_qkv_forward");
  return {q, k, v};
}

at::Tensor rope_backward_impl(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                              const at::Tensor& cos, const at::Tensor& sin,
                              at::IntArrayRef qkv_shape) {
  const kernels::RopeShape s{qkv_shape[0], qkv_shape[1], qkv_shape[2], qkv_shape[3] - 2,
                             qkv_shape[4]};
  const at::TensorOptions opt = cos.options();
  auto grad = [&](const at::Tensor& g, int64_t heads) {
    at::Tensor t = g.defined() ? g : at::zeros({s.b, s.s, heads, s.hd}, opt);
    check_same(t, cos, "rope backward");
    const bool ok = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
    return ok ? t : t.clone(at::MemoryFormat::Contiguous);
  };
  const at::Tensor gq = grad(dq, s.ng * s.r), gk = grad(dk, s.ng), gv = grad(dv, s.ng);
  c10::cuda::CUDAGuard guard(cos.device());
  at::Tensor dqkv = at::empty(qkv_shape, opt);
  check_launch(kernels::rope_qkv_backward(elem_of(cos), strided(gq), strided(gk), strided(gv),
                                          cos.data_ptr(), sin.data_ptr(), dqkv.data_ptr(), s,
                                          stream_of(cos)),
               "rope_qkv_backward");
  return dqkv;
}

std::pair<at::Tensor, at::Tensor> cross_entropy_forward_impl(const at::Tensor& logits,
                                                             const at::Tensor& labels) {
  WEFT_CHECK(logits.dim() == 2 && labels.dim() == 1 && labels.size(0) == logits.size(0) &&
                 labels.scalar_type() == at::kLong && labels.device() == logits.device(),
             "cross_entropy: logits [rows, v] and int64 labels [rows] on one device expected");
  c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor x = aligned(logits), y = labels.contiguous();
  const int64_t rows = x.size(0), v = x.size(1);
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor loss = at::empty({rows}, f32), lse = at::empty({rows}, f32);
  check_launch(kernels::cross_entropy_forward(elem_of(x), x.data_ptr(), y.data_ptr<int64_t>(),
                                              loss.data_ptr<float>(), lse.data_ptr<float>(), rows,
                                              v, stream_of(x)),
               "cross_entropy_forward");
  return {loss, lse};
}

at::Tensor cross_entropy_backward_impl(const at::Tensor& logits, const at::Tensor& labels,
                                       const at::Tensor& lse, const at::Tensor& grad) {
  c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor x = aligned(logits), y = labels.contiguous();
  const at::Tensor g = grad.to(at::kFloat).contiguous();
  at::Tensor dx = at::empty_like(x);
  check_launch(kernels::cross_entropy_backward(elem_of(x), x.data_ptr(), y.data_ptr<int64_t>(),
                                               lse.data_ptr<float>(), g.data_ptr<float>(),
                                               dx.data_ptr(), x.size(0), x.size(1), stream_of(x)),
               "cross_entropy_backward");
  return dx;
}

int conv_silu_max_kernel_impl() { return kernels::conv_silu_max_kernel(); }

at::Tensor conv_silu_forward_impl(const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor& bias) {
  const int64_t B = x.size(0), S = x.size(1), C = x.size(2);
  const int K = static_cast<int>(w.size(-1));
  c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor wc = w.reshape({C, K}).contiguous(), bc = bias.contiguous();
  at::Tensor out = at::empty({B, S, C}, x.options().dtype(at::kFloat));
  check_launch(kernels::conv_silu_forward(elem_of(x), x.data_ptr(), x.stride(1),
                                          wc.data_ptr<float>(), bc.data_ptr<float>(),
                                          out.data_ptr<float>(), B, S, C, K, stream_of(x)),
               "conv_silu_forward");
  return out;
}

std::array<at::Tensor, 3> conv_silu_backward_impl(const at::Tensor& dout, const at::Tensor& x,
                                                  const at::Tensor& w, const at::Tensor& bias) {
  const int64_t B = x.size(0), S = x.size(1), C = x.size(2);
  const int K = static_cast<int>(w.size(-1));
  c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor wc = w.reshape({C, K}).contiguous(), bc = bias.contiguous();
  const at::Tensor d = dout.to(at::kFloat).contiguous();
  const int64_t tiles = kernels::conv_silu_tiles(B, S);
  at::Tensor dx = at::empty({B, S, C}, x.options());
  at::Tensor dw = at::empty({tiles, C, K}, wc.options());
  at::Tensor db = at::empty({tiles, C}, wc.options());
  check_launch(kernels::conv_silu_backward(elem_of(x), d.data_ptr<float>(), x.data_ptr(),
                                           x.stride(1), wc.data_ptr<float>(),
                                           bc.data_ptr<float>(), dx.data_ptr(),
                                           dw.data_ptr<float>(), db.data_ptr<float>(), B, S, C,
                                           K, stream_of(x)),
               "conv_silu_backward");
  return {dx, dw.sum(0).view(w.sizes()), db.sum(0)};
}

int64_t gated_norm_max_width_impl() { return kernels::gated_norm_max_width(); }

namespace {

// z as rows of a 2-D [rows, di] view with unit column stride: its row stride (a narrow of the
// in_proj output keeps the projection's), or a contiguous copy when the rows are not evenly
// spaced.
std::pair<at::Tensor, int64_t> as_rows(const at::Tensor& z) {
  const int64_t n = z.dim();
  bool even = n >= 2 && z.stride(n - 1) == 1 && z.stride(n - 2) >= z.size(n - 1);
  for (int64_t d = 0; even && d + 2 < n; ++d)
    even = z.size(d) == 1 || z.stride(d) == z.stride(d + 1) * z.size(d + 1);
  if (even) return {z, z.stride(n - 2)};
  at::Tensor c = z.contiguous();
  return {c, c.size(-1)};
}

}  // namespace

std::pair<at::Tensor, at::Tensor> gated_norm_forward_impl(const at::Tensor& y, const at::Tensor& z,
                                                          const at::Tensor& w, int64_t ng,
                                                          double eps) {
  const int64_t di = y.size(-1), rows = di == 0 ? 0 : y.numel() / di;
  WEFT_CHECK(y.scalar_type() == at::kFloat && w.numel() == di && z.numel() == y.numel() &&
                 di % ng == 0,
             "gated_norm: y float32 [.., {}], z of as many elements, w [{}] expected", di, di);
  c10::cuda::CUDAGuard guard(y.device());
  const at::Tensor yc = y.contiguous(), wc = w.to(at::kFloat).contiguous();
  const auto [zr, zs] = as_rows(z);
  at::Tensor out = at::empty(y.sizes(), z.options());
  at::Tensor rstd = at::empty({rows, ng}, y.options());
  check_launch(kernels::gated_norm_forward(elem_of(z), yc.data_ptr<float>(), zr.data_ptr(), zs,
                                           wc.data_ptr<float>(), out.data_ptr(),
                                           rstd.data_ptr<float>(), rows, ng, di / ng,
                                           static_cast<float>(eps), stream_of(y)),
               "gated_norm_forward");
  return {out, rstd};
}

std::array<at::Tensor, 3> gated_norm_backward_impl(const at::Tensor& dout, const at::Tensor& y,
                                                   const at::Tensor& z, const at::Tensor& w,
                                                   const at::Tensor& rstd, int64_t ng) {
  const int64_t di = y.size(-1), rows = di == 0 ? 0 : y.numel() / di;
  WEFT_CHECK(di <= kernels::gated_norm_max_width(), "gated_norm: width {} too large", di);
  c10::cuda::CUDAGuard guard(y.device());
  const at::Tensor yc = y.contiguous(), wc = w.to(at::kFloat).contiguous();
  const at::Tensor d = dout.to(z.scalar_type()).contiguous();
  const auto [zr, zs] = as_rows(z);
  at::Tensor dy = at::empty(y.sizes(), y.options());
  at::Tensor dz = at::empty(y.sizes(), z.options());
  at::Tensor partial = at::empty({kernels::gated_norm_blocks(rows), di}, y.options());
  check_launch(kernels::gated_norm_backward(elem_of(z), d.data_ptr(), yc.data_ptr<float>(),
                                            zr.data_ptr(), zs, wc.data_ptr<float>(),
                                            rstd.data_ptr<float>(), dy.data_ptr<float>(),
                                            dz.data_ptr(), partial.data_ptr<float>(), rows, ng,
                                            di / ng, stream_of(y)),
               "gated_norm_backward");
  return {dy, dz, partial.sum(0).to(w.scalar_type())};
}

namespace {

// cb [..., G, Q, Q], cs [..., G, R, Q]: {M = blocks of cs rows, R, Q}.
std::array<int64_t, 3> ssd_decay_shape(const at::Tensor& cb, const at::Tensor& cs) {
  WEFT_CHECK(cs.scalar_type() == at::kFloat && cs.dim() >= 2 && cb.dim() == cs.dim() &&
                 cs.device() == cb.device(),
             "ssd_decay: cs float32 [..., G, R, Q] and cb [..., G, Q, Q] on one device expected");
  const int64_t Q = cs.size(-1), R = cs.size(-2);
  WEFT_CHECK(cb.size(-1) == Q && cb.size(-2) == Q && cb.numel() * R == cs.numel() * Q,
             "ssd_decay: cb of {} elements does not match cs of {}", cb.numel(), cs.numel());
  return {Q == 0 ? 0 : cs.numel() / Q, R, Q};
}

}  // namespace

at::Tensor ssd_decay_forward_impl(const at::Tensor& cb, const at::Tensor& cs) {
  const auto [M, R, Q] = ssd_decay_shape(cb, cs);
  c10::cuda::CUDAGuard guard(cb.device());
  const at::Tensor b = aligned(cb), c = cs.contiguous();
  std::vector<int64_t> shape = cs.sizes().vec();
  shape.push_back(Q);
  at::Tensor out = at::empty(shape, cb.options());
  check_launch(kernels::ssd_decay_forward(elem_of(b), b.data_ptr(), c.data_ptr<float>(),
                                          out.data_ptr(), M, R, Q, stream_of(cb)),
               "ssd_decay_forward");
  return out;
}

std::pair<at::Tensor, at::Tensor> ssd_decay_backward_impl(const at::Tensor& dout,
                                                          const at::Tensor& cb,
                                                          const at::Tensor& cs) {
  const auto [M, R, Q] = ssd_decay_shape(cb, cs);
  c10::cuda::CUDAGuard guard(cb.device());
  const at::Tensor b = aligned(cb), c = cs.contiguous(), d = aligned(dout.to(cb.scalar_type()));
  at::Tensor dcb = at::empty(cb.sizes(), cb.options());
  at::Tensor dcs = at::empty(cs.sizes(), cs.options());
  check_launch(kernels::ssd_decay_backward(elem_of(b), d.data_ptr(), b.data_ptr(),
                                           c.data_ptr<float>(), dcb.data_ptr(),
                                           dcs.data_ptr<float>(), M, R, Q, stream_of(cb)),
               "ssd_decay_backward");
  return {dcb, dcs};
}

}  // namespace weft::fused
