// Global gradient norm and clipping (grad_clip.h).
#include "weft/optim/grad_clip.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <cstdint>

#include "weft/parallel/grad_access.h"
#include "weft/parallel/pipeline_stage.h"

namespace weft {
namespace {

// The squared 2-norm of a gradient shard (float32 or bf16), accumulated in float64 (on the shard's
// device). A float32 accumulation loses ~1e-5 of the norm over millions of elements on the CPU
// (libtorch's CPU reductions add sequentially per thread), which is what the logged grad norm
// and the clipping coefficient used to show; in pieces so the float64 copy stays small.
// On CUDA the reduction is a tree in float32 and already within ~2e-8 of float64 (issue
// measurement), so it stays one kernel there.
at::Tensor squared_norm(const at::Tensor& shard) {
  if (shard.is_cuda())
    return at::linalg_vector_norm(shard, 2, c10::nullopt, false, at::kFloat)
        .to(at::kDouble)
        .pow(2);
  constexpr int64_t kPiece = int64_t{1} << 22;
  at::Tensor acc = at::zeros({}, shard.options().dtype(at::kDouble));
  const at::Tensor flat = shard.reshape({-1});
  for (int64_t i = 0; i < flat.numel(); i += kPiece) {
    const at::Tensor piece = flat.narrow(0, i, std::min(kPiece, flat.numel() - i)).to(at::kDouble);
    acc.add_(piece.dot(piece));
  }
  return acc;
}

}  // namespace

at::Tensor local_grad_sumsq(const PipelineStage& stage) {
  at::Tensor sumsq =
      at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(stage.options().device));
  for (const auto& u : stage.units())
    if (u->main_replica() && !stage.is_embedding_copy(u.get()))
      sumsq.add_(squared_norm(grad_shard(*u)));
  return sumsq;
}

double clip_multiplier(double grad_norm, double clip) {
  return std::min(1.0, clip / (grad_norm + 1e-6));
}

at::Tensor clip_grad_scale(const at::Tensor& global_sumsq, double clip) {
  const at::Tensor norm = global_sumsq.sqrt().add(1e-6);
  const at::Tensor multiplier =
      at::clamp_max(at::div(at::full({}, clip, global_sumsq.options()), norm), 1.0);
  return at::div(at::ones({}, global_sumsq.options()), multiplier).to(at::kFloat);
}

}  // namespace weft
