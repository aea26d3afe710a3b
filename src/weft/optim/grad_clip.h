// The global gradient norm and its clipping (Megatron's --clip-grad): the squared norm of each
// rank's share, summed over the job by the caller's one all-reduce, then the multiplier
// min(1, clip / (norm + 1e-6)) applied inside the AdamW step.
#pragma once

#include <ATen/core/Tensor.h>

namespace weft {

class PipelineStage;

// The squared 2-norm of the gradient shards this rank contributes to the global norm, so that
// the sum over all ranks counts every parameter once: the units' main replicas (HSDP replicas
// hold copies), without the tied embedding's copy on the last stage. Float64 scalar on the
// compute device.
at::Tensor local_grad_sumsq(const PipelineStage& stage);

// min(1, clip / (grad_norm + 1e-6)); clip > 0.
double clip_multiplier(double grad_norm, double clip);

// The same from the global squared norm (float64 scalar tensor) without leaving the device, as
// the fused AdamW step's grad_scale: 1 / multiplier in float32 (the kernel divides by it). The
// arithmetic is clip_multiplier's (float64, true division), so both give the same bits.
at::Tensor clip_grad_scale(const at::Tensor& global_sumsq, double clip);

}  // namespace weft
