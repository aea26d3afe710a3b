// Launchers of weft's fused CUDA kernels (kernels_cuda.cu), for the elementwise chains of the
// decoder layer that ATen would run as many separate kernels: RMSNorm forward/backward,
// SwiGLU forward/backward, rotary embedding of the fused QKV projection forward/backward, the
// cross-entropy and the decay-weighted C.B blocks of the Mamba-2 SSD.
// Plain C++ (no CUDA headers): tensors are raw pointers of float (kF32) or bfloat16 (kBF16)
// elements, `stream` is a cudaStream_t. Every kernel reads and writes in the element type and
// computes in float32; each result is rounded once. All reductions run in a fixed order, so
// results are bitwise reproducible (invariant 3). Callers (fused.cpp) check shapes, contiguity
// and dtypes; each launcher returns an empty string or the CUDA error text.
#pragma once

#include <cstdint>
#include <string>

namespace weft::kernels {

enum class Elem { kF32, kBF16 };

// y[r, :] = round(round(x[r, :] * rstd[r]) * w), rstd[r] = 1/sqrt(mean(x[r, :]^2) + eps).
// The inner rounding is to the element type (xhat is cast back before the scale, as Megatron's
// RMSNorm does). rstd is float32 [rows]. With `res` (else null), the residual sum
// s = round(x + res) is normalised instead and stored into `sum` [rows, h]: the bits of an add
// in the element type followed by the norm of its result.
std::string rms_norm_forward(Elem t, const void* x, const void* res, const void* w, void* sum,
                             void* y, float* rstd, int64_t rows, int64_t h, float eps,
                             void* stream);

// Gradients of the above: dx [rows, h] (element type) and, per block of rows, the partial
// weight gradient sum(dy * xhat) into dw_partial [rms_norm_blocks(t, rows, h), h] (float32), to be
// summed over dim 0 by the caller; x is the row normalised (the sum, with a residual). With
// `dres` (else null), the gradient reaching x by another path, dx = round(round(dx) + dres):
// the bits of autograd adding the two. Needs h <= rms_norm_max_hidden().
std::string rms_norm_backward(Elem t, const void* dy, const void* x, const void* w,
                              const float* rstd, const void* dres, void* dx, float* dw_partial,
                              int64_t rows, int64_t h, void* stream);
int64_t rms_norm_blocks(Elem t, int64_t rows, int64_t h);
int64_t rms_norm_max_hidden();

// act[r, c] = silu(fc1[r, c]) * fc1[r, f + c] for fc1 [rows, 2f], act [rows, f].
std::string swiglu_forward(Elem t, const void* fc1, void* act, int64_t rows, int64_t f,
                           void* stream);
// dfc1 [rows, 2f] from dact [rows, f] and fc1.
std::string swiglu_backward(Elem t, const void* dact, const void* fc1, void* dfc1, int64_t rows,
                            int64_t f, void* stream);

// Rotary embedding (rotate-half) of the fused QKV output qkv [b, s, ng, r + 2, hd] (per group:
// r query heads, one key head, one value head): q [b, s, ng * r, hd] and k [b, s, ng, hd]
// rotated with the tables cos/sin [>= s, hd] (element type), v [b, s, ng, hd] copied.
struct RopeShape {
  int64_t b, s, ng, r, hd;
};
std::string rope_qkv_forward(Elem t, const void* qkv, const void* cos, const void* sin, void* q,
                             void* k, void* v, RopeShape shape, void* stream);
// dqkv [b, s, ng, r + 2, hd] (contiguous) from dq [b, s, ng * r, hd], dk and dv [b, s, ng, hd],
// each given with its strides in elements for (b, s, head); the head dim must be contiguous.
struct Strided {
  const void* data;
  int64_t sb, ss, sh;
};
std::string rope_qkv_backward(Elem t, Strided dq, Strided dk, Strided dv, const void* cos,
                              const void* sin, void* dqkv, RopeShape shape, void* stream);

// Cross-entropy of logits [rows, v] against labels [rows] (int64; -100 marks an ignored row, as
// in ATen's nll_loss): per-row loss logsumexp - logit[label] (0 where ignored) and the row's
// logsumexp, both float32 [rows]. One read of the logits (online max and sum of exponentials).
std::string cross_entropy_forward(Elem t, const void* logits, const int64_t* labels, float* loss,
                                  float* lse, int64_t rows, int64_t v, void* stream);
// dlogits = g * (softmax(logits) - onehot(label)) (0 on ignored rows), with the scalar g read
// from device memory (no host synchronisation).
std::string cross_entropy_backward(Elem t, const void* logits, const int64_t* labels,
                                   const float* lse, const float* g, void* dlogits, int64_t rows,
                                   int64_t v, void* stream);

// The Mamba-2 gated RMSNorm (mamba.cpp, mamba_out_proj): per row and group of gs channels,
// g = y * silu(z), out = round(g * rstd * w), rstd = 1 / sqrt(mean(g^2) + eps) (float32
// [rows, ng]). y [rows, ng * gs] and w float32; z (rows z_row_stride apart) and out in the
// element type.
std::string gated_norm_forward(Elem t, const float* y, const void* z, int64_t z_row_stride,
                               const float* w, void* out, float* rstd, int64_t rows, int64_t ng,
                               int64_t gs, float eps, void* stream);
// Its gradients: dy float32, dz (element type, contiguous [rows, ng * gs]) and, per block of
// rows, the partial weight gradient into dw_partial [gated_norm_blocks(rows), ng * gs] (float32;
// the caller sums dim 0). Needs ng * gs <= gated_norm_max_width().
std::string gated_norm_backward(Elem t, const void* dout, const float* y, const void* z,
                                int64_t z_row_stride, const float* w, const float* rstd,
                                float* dy, void* dz, float* dw_partial, int64_t rows, int64_t ng,
                                int64_t gs, void* stream);
int64_t gated_norm_blocks(int64_t rows);
int64_t gated_norm_max_width();

// The Mamba-2 depthwise causal conv and SiLU over x [B, S, C] (element type; row b * S + t at
// x + (b * S + t) * x_row_stride): out [B, S, C] float32 =
// silu(bias[c] + sum_j x[b, t - K + 1 + j, c] w[c, j]), zeros before the start; w [C, K] and
// bias [C] float32, K <= conv_silu_max_kernel().
std::string conv_silu_forward(Elem t, const void* x, int64_t x_row_stride, const float* w,
                              const float* bias, float* out, int64_t B, int64_t S, int64_t C,
                              int K, void* stream);
// Its gradients from dout [B, S, C] float32: dx [B, S, C] (element type, contiguous) and, per
// tile of rows (conv_silu_tiles(B, S) of them), partial dw [tiles, C, K] and dbias [tiles, C]
// float32, summed over dim 0 by the caller.
std::string conv_silu_backward(Elem t, const float* dout, const void* x, int64_t x_row_stride,
                               const float* w, const float* bias, void* dx, float* dw_partial,
                               float* db_partial, int64_t B, int64_t S, int64_t C, int K,
                               void* stream);
int conv_silu_max_kernel();
int64_t conv_silu_tiles(int64_t B, int64_t S);

// The SSD's decay-weighted C.B blocks (mamba.cpp, step 1): for M = G * R blocks of Q x Q (R heads
// share each of the G cb blocks), out[m, i, j] = cb[m / R, i, j] * exp(cs[m, i] - cs[m, j]) for
// j <= i and 0 above the diagonal; cb and out in the element type, the cumulative log-decays cs
// [M, Q] float32. The [M, Q, Q] decay matrix itself is never stored.
std::string ssd_decay_forward(Elem t, const void* cb, const float* cs, void* out, int64_t M,
                              int64_t R, int64_t Q, void* stream);
// Its gradients from dout [M, Q, Q]: dcb [G, Q, Q] (element type; the sum over the R heads in
// order) and dcs [M, Q] float32 (row sums minus column sums of dout * out).
std::string ssd_decay_backward(Elem t, const void* dout, const void* cb, const float* cs,
                               void* dcb, float* dcs, int64_t M, int64_t R, int64_t Q,
                               void* stream);

}  // namespace weft::kernels
