// The chunked SSD's elementwise edges as fused CUDA kernels (ssd_edges_kernels.h), on tensors:
// the passes of ssd.cpp between its batched matmuls, each written once in ATen there (the CPU
// path, and the reference these are tested against) and here in one kernel each. Layouts as in
// ssd.cpp: x6, dt5, dy6 natural [b, nc, Q, G, R(, P)]; head [b, nc, G, R, Q, P]; folded
// [b, nc, G, Q, R, P]; cs [b, nc, G, R, Q] float32. Without CUDA, usable() is false and the
// others fail.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>

namespace weft::ssd_edges {

// Whether the kernels take a scan of x6 (float32 on CUDA, rows uniformly strided and 16-byte
// aligned) with matmul operands in io (float32 or bfloat16) and P channels per head.
bool usable(const at::Tensor& x6, c10::ScalarType io);

// {u = round(x dt) (head), wu = round(u exp(cs_last - cs)) (folded; only with `with_wu`)}.
std::array<at::Tensor, 2> scale_inputs(const at::Tensor& x6, const at::Tensor& dt5,
                                       const at::Tensor& cs, c10::ScalarType io, bool with_wu);

// y [b, nc * Q, G * R, P] float32 = Z exp(cs) + y_diag + x D, Z (folded) undefined for none,
// D of no elements for none.
at::Tensor combine_outputs(const at::Tensor& y_diag, const at::Tensor& Z, const at::Tensor& cs,
                           const at::Tensor& x6, const at::Tensor& D);

// {dyh = round(dy) (head), dZ = round(dy exp(cs)) (folded; only with `with_dz`)}.
std::array<at::Tensor, 2> grad_inputs(const at::Tensor& dy6, const at::Tensor& cs,
                                      c10::ScalarType io, bool with_dz);

// With g = du + dwu exp(cs_last - cs) (dwu undefined for none): {dx [b, T, H, P] = g dt + dy D,
// ddt [b, nc, Q, G, R] = sum_p g x, g2 [b, nc, G, R, Q] = exp(cs_last - cs) sum_p dwu u (with
// dwu), dd [b, nc, Q, G, R] = sum_p dy x (with D)}; all float32.
std::array<at::Tensor, 4> grad_outputs(const at::Tensor& du, const at::Tensor& dwu,
                                       const at::Tensor& u, const at::Tensor& cs,
                                       const at::Tensor& x6, const at::Tensor& dt5,
                                       const at::Tensor& dy6, const at::Tensor& D);

}  // namespace weft::ssd_edges
