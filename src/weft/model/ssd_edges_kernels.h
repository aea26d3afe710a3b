// Launchers of the chunked SSD's edge kernels (ssd_edges_kernels.cu, used by ssd_edges_cuda.cpp):
// the elementwise passes around the scan's batched matmuls (ssd.cpp), each reading its inputs in
// the layout the previous matmul wrote and writing its outputs in the layout the next one reads.
// Plain C++ (no CUDA headers), like kernels.h. Shapes, for b * nc chunks of Q steps, G groups of
// R heads (H = G R) of P channels:
//   natural [b*nc, Q, H, P]       x (rows `xs` elements apart), y, dy, dx
//   head    [b*nc, H, Q, P]       u, y_diag, dyh, du
//   folded  [b*nc, G, Q, R, P]    wu, Z, dZ, dwu
//   cs      [b*nc, H, Q] float32  within-chunk cumulative log-decays; dt [b*nc*Q, H] float32
// `io` is the element type of the head and folded tensors (float32 or bfloat16); the natural
// ones are float32. P must be a multiple of 4 with P / 4 a power of two up to 32
// (ssd_edges_supported_p). Every sum runs in a fixed order: bitwise reproducible.
#pragma once

#include <cstdint>
#include <string>

#include "weft/model/kernels.h"

namespace weft::kernels {

struct SsdGeometry {
  int64_t chunks;  // b * nc
  int64_t Q, G, R, P;
  int64_t xs;  // x's row stride (elements)
};

bool ssd_edges_supported_p(int64_t P);

// u = round(x * dt) (head); with wu (else null) also wu = round(u * exp(cs_last - cs)) (folded).
std::string ssd_scale_inputs(Elem io, const SsdGeometry& d, const float* x, const float* dt,
                             const float* cs, void* u, void* wu, void* stream);

// y = Z * exp(cs) + y_diag + x * D[h] (natural, float32); Z (folded) and D may be null.
std::string ssd_combine_outputs(Elem io, const SsdGeometry& d, const void* y_diag, const void* Z,
                                const float* cs, const float* x, const float* D, float* y,
                                void* stream);

// dyh = round(dy) (head); with dZ (else null) also dZ = round(dy * exp(cs)) (folded).
std::string ssd_grad_inputs(Elem io, const SsdGeometry& d, const float* dy, const float* cs,
                            void* dyh, void* dZ, void* stream);

// With g = du + dwu * exp(cs_last - cs) (float32; dwu may be null):
//   dx = g * dt + dy * D[h] (natural; D may be null),
//   ddt[row, h] = sum_p g x,
//   g2[chunk, h, q] = exp(cs_last - cs) * sum_p dwu u   (only with dwu),
//   dd[row, h] = sum_p dy x                              (only with D).
std::string ssd_grad_outputs(Elem io, const SsdGeometry& d, const void* du, const void* dwu,
                             const void* u, const float* cs, const float* x, const float* dt,
                             const float* dy, const float* D, float* dx, float* ddt, float* g2,
                             float* dd, void* stream);

}  // namespace weft::kernels
