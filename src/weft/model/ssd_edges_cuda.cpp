// Tensor-level wrappers of the SSD edge kernels (ssd_edges.h, ssd_edges_kernels.h): layout
// checks, output allocation, the device guard and the current stream. CUDA build only; a build
// without CUDA links ssd_edges_cpu.cpp in its place.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "weft/core/error.h"
#include "weft/model/fused.h"
#include "weft/model/ssd_edges.h"
#include "weft/model/ssd_edges_kernels.h"

namespace weft::ssd_edges {
namespace {

kernels::Elem elem_of(c10::ScalarType t) {
  return t == at::kBFloat16 ? kernels::Elem::kBF16 : kernels::Elem::kF32;
}

void* stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

void check_launch(const std::string& err, const char* what) {
  WEFT_CHECK(err.empty(), "ssd kernel {}: {}", what, err);
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// t contiguous and 16-byte aligned for the kernels' vector loads (a misaligned view is copied).
at::Tensor aligned(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return aligned16(c) ? c : c.clone();
}

// x6 [b, nc, Q, G, R, P] with rows (b, nc, Q) `xs` apart and each row's H * P contiguous.
bool rows_uniform(const at::Tensor& x6) {
  const int64_t xs = x6.stride(2), Q = x6.size(2), nc = x6.size(1);
  const int64_t R = x6.size(4), P = x6.size(5);
  return x6.stride(5) == 1 && x6.stride(4) == P && x6.stride(3) == R * P &&
         (nc == 1 || x6.stride(1) == Q * xs) && (x6.size(0) == 1 || x6.stride(0) == nc * Q * xs) &&
         xs % 4 == 0 && aligned16(x6);
}

kernels::SsdGeometry geometry(const at::Tensor& x6) {
  return {x6.size(0) * x6.size(1), x6.size(2), x6.size(3), x6.size(4), x6.size(5), x6.stride(2)};
}

float* floats(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// D of no elements means none.
const float* d_or_null(const at::Tensor& D) { return D.numel() > 0 ? D.data_ptr<float>() : nullptr; }

void check_contiguous(const at::Tensor& t, c10::ScalarType dtype, const char* what) {
  WEFT_CHECK(!t.defined() || (t.is_contiguous() && t.scalar_type() == dtype && aligned16(t)),
             "ssd kernels: {} must be contiguous, aligned and {}", what, c10::toString(dtype));
}

}  // namespace

bool usable(const at::Tensor& x6, c10::ScalarType io) {
  return fused::usable(x6) && x6.scalar_type() == at::kFloat && x6.dim() == 6 &&
         (io == at::kFloat || io == at::kBFloat16) &&
         kernels::ssd_edges_supported_p(x6.size(5)) && rows_uniform(x6);
}

std::array<at::Tensor, 2> scale_inputs(const at::Tensor& x6, const at::Tensor& dt5,
                                       const at::Tensor& cs, c10::ScalarType io, bool with_wu) {
  const int64_t b = x6.size(0), nc = x6.size(1), Q = x6.size(2), G = x6.size(3), R = x6.size(4),
                P = x6.size(5);
  c10::cuda::CUDAGuard guard(x6.device());
  const at::Tensor dt = dt5.contiguous(), c = cs.contiguous();
  const auto opt = x6.options().dtype(io);
  at::Tensor u = at::empty({b, nc, G, R, Q, P}, opt);
  at::Tensor wu = with_wu ? at::empty({b, nc, G, Q, R, P}, opt) : at::Tensor();
  check_launch(kernels::ssd_scale_inputs(elem_of(io), geometry(x6), x6.data_ptr<float>(),
                                         dt.data_ptr<float>(), c.data_ptr<float>(), u.data_ptr(),
                                         with_wu ? wu.data_ptr() : nullptr, stream_of(x6)),
               "scale_inputs");
  return {u, wu};
}

at::Tensor combine_outputs(const at::Tensor& y_diag, const at::Tensor& Z, const at::Tensor& cs,
                           const at::Tensor& x6, const at::Tensor& D) {
  const int64_t b = x6.size(0), nc = x6.size(1), Q = x6.size(2), G = x6.size(3), R = x6.size(4),
                P = x6.size(5);
  c10::cuda::CUDAGuard guard(x6.device());
  check_contiguous(y_diag, y_diag.scalar_type(), "y_diag");
  check_contiguous(Z, y_diag.scalar_type(), "Z");
  const at::Tensor c = cs.contiguous(), d = D.contiguous();
  at::Tensor y = at::empty({b, nc * Q, G * R, P}, x6.options());
  check_launch(kernels::ssd_combine_outputs(elem_of(y_diag.scalar_type()), geometry(x6),
                                            y_diag.data_ptr(), Z.defined() ? Z.data_ptr() : nullptr,
                                            c.data_ptr<float>(), x6.data_ptr<float>(),
                                            d_or_null(d), y.data_ptr<float>(), stream_of(x6)),
               "combine_outputs");
  return y;
}

std::array<at::Tensor, 2> grad_inputs(const at::Tensor& dy6, const at::Tensor& cs,
                                      c10::ScalarType io, bool with_dz) {
  const int64_t b = dy6.size(0), nc = dy6.size(1), Q = dy6.size(2), G = dy6.size(3),
                R = dy6.size(4), P = dy6.size(5);
  c10::cuda::CUDAGuard guard(dy6.device());
  const at::Tensor dy = aligned(dy6), c = cs.contiguous();
  check_contiguous(dy, at::kFloat, "dy");
  const auto opt = dy.options().dtype(io);
  at::Tensor dyh = at::empty({b, nc, G, R, Q, P}, opt);
  at::Tensor dz = with_dz ? at::empty({b, nc, G, Q, R, P}, opt) : at::Tensor();
  kernels::SsdGeometry g = geometry(dy);
  check_launch(kernels::ssd_grad_inputs(elem_of(io), g, dy.data_ptr<float>(), c.data_ptr<float>(),
                                        dyh.data_ptr(), with_dz ? dz.data_ptr() : nullptr,
                                        stream_of(dy)),
               "grad_inputs");
  return {dyh, dz};
}

std::array<at::Tensor, 4> grad_outputs(const at::Tensor& du, const at::Tensor& dwu,
                                       const at::Tensor& u, const at::Tensor& cs,
                                       const at::Tensor& x6, const at::Tensor& dt5,
                                       const at::Tensor& dy6, const at::Tensor& D) {
  const int64_t b = x6.size(0), nc = x6.size(1), Q = x6.size(2), G = x6.size(3), R = x6.size(4),
                P = x6.size(5);
  c10::cuda::CUDAGuard guard(x6.device());
  const auto io = u.scalar_type();
  check_contiguous(du, io, "du");
  check_contiguous(dwu, io, "dwu");
  check_contiguous(u, io, "u");
  const at::Tensor dt = dt5.contiguous(), c = cs.contiguous(), dy = aligned(dy6);
  check_contiguous(dy, at::kFloat, "dy");
  const at::Tensor d = D.contiguous();
  const auto f32 = x6.options();
  at::Tensor dx = at::empty({b, nc * Q, G * R, P}, f32);
  at::Tensor ddt = at::empty({b, nc, Q, G, R}, f32);
  at::Tensor g2 = dwu.defined() ? at::empty({b, nc, G, R, Q}, f32) : at::Tensor();
  at::Tensor dd = D.numel() > 0 ? at::empty({b, nc, Q, G, R}, f32) : at::Tensor();
  check_launch(
      kernels::ssd_grad_outputs(elem_of(io), geometry(x6), du.data_ptr(),
                                dwu.defined() ? dwu.data_ptr() : nullptr, u.data_ptr(),
                                c.data_ptr<float>(), x6.data_ptr<float>(), dt.data_ptr<float>(),
                                dy.data_ptr<float>(), d_or_null(d), dx.data_ptr<float>(),
                                ddt.data_ptr<float>(), floats(g2), floats(dd), stream_of(x6)),
      "grad_outputs");
  return {dx, ddt, g2, dd};
}

}  // namespace weft::ssd_edges
