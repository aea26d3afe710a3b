// The fused AdamW entry points of a build without CUDA (the counterpart of adamw_cuda.cpp):
// compiled() is false, so ShardedAdamW never calls step() here; a direct call fails.
#include "weft/core/error.h"
#include "weft/optim/fused_adamw.h"

namespace weft::fused_adamw {

bool compiled() { return false; }

bool step(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
          const at::Tensor&, int64_t, int64_t, const Hyper&, const at::Tensor&,
          const at::Tensor&) {
  fail("the fused AdamW kernel is not part of this build (CPU-only libtorch)");
}

}  // namespace weft::fused_adamw
