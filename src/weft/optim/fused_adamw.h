// weft's one-pass AdamW step on CUDA (adamw_kernel.h) at the tensor level, for ShardedAdamW's
// device path. CUDA build only (adamw_cuda.cpp); a build without CUDA links adamw_cpu.cpp,
// where compiled() is false.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace weft::fused_adamw {

bool compiled();

struct Hyper {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1 for the first step (bias correction)
};

// One AdamW step over elements [offset, offset + numel) of the flat float32 CUDA tensors master,
// grad (or a bfloat16 grad), exp_avg and exp_avg_sq, with the gradients divided by grad_scale (float32, one element;
// undefined: 1) and nothing changed where found_inf (float32, one element; may be undefined)
// is non-zero. `weights` (the same elements of the model's weight shard) gets the new master
// rounded where it is a separate bfloat16 or float32 tensor; returns false if it is of another
// dtype, which the caller then copies itself. A weights tensor that is the master is left alone.
bool step(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& exp_avg,
          const at::Tensor& exp_avg_sq, const at::Tensor& weights, int64_t offset, int64_t numel,
          const Hyper& h, const at::Tensor& grad_scale, const at::Tensor& found_inf);

}  // namespace weft::fused_adamw
