// Launcher of weft's AdamW CUDA kernel (adamw_kernel.cu). Plain C++, no CUDA headers: the
// buffers are raw pointers, `stream` is a cudaStream_t; returns an empty string or the CUDA
// error text. The tensor-level caller is adamw_cuda.cpp (fused_adamw.h).
//
// One pass over n elements of the flat float32 master, gradient and moments: reads 16 bytes per
// element (14 with a bfloat16 gradient, --grad-reduce-in-bf16) and writes 12, plus the rounded
// weight (2 bytes in bfloat16) where the weights are a separate copy. That is the whole step: PyTorch's multi-tensor kernel followed by a cast of
// the masters into the weights reads and writes 38 bytes per element in two passes.
#pragma once

#include <cstdint>
#include <string>

namespace weft::adamw_kernel {

// The weights written beside the master: none (they are the master), bfloat16, or float32 (a
// separate float32 copy).
enum class Weights { kNone, kBF16, kF32 };
// The gradient's type: float32, or bfloat16 (widened to float32 on load).
enum class Grads { kF32, kBF16 };

// One group's constants for this step, in float32 as the kernel uses them.
struct Constants {
  float beta1, beta2;       // moment decays
  float one_minus_beta1;    // 1 - beta1
  float one_minus_beta2;    // 1 - beta2
  float lr_decay;           // lr * weight_decay (decoupled decay: p -= lr_decay * p)
  float step_size;          // lr / (1 - beta1^step)
  float bc2_sqrt;           // sqrt(1 - beta2^step)
  float eps;
};

// For each i < n, with g = grad[i] / *grad_scale (grad_scale may be null: 1):
//   p = master[i]; p -= lr_decay * p;
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g g;
//   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps);
// and weights[i] = p rounded to the weights' type. Where found_inf (may be null) holds a
// non-zero value, nothing is written. Purely elementwise: every element's bits depend on its own
// inputs only, whatever the launch.
std::string step(float* master, const void* grad, Grads grad_kind, float* exp_avg,
                 float* exp_avg_sq, void* weights, Weights kind, int64_t n, const Constants& c,
                 const float* grad_scale, const float* found_inf, void* stream);

}  // namespace weft::adamw_kernel
