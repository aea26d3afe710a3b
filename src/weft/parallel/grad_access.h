// The one accessor for a parameter's reduced gradient shard (invariant 7).
//
// Where the gradient shard lives depends on the gradient mode: in the default mode it is the
// unit's main-grad buffer (float32, bf16 with --grad-reduce-in-bf16); in the precision-aware
// mode (--use-precision-aware-optimizer) it is the optimizer's decoupled float32 gradient beside
// the master shard. The tied-embedding reduction, clipping, the optimizer and checkpointing all
// read and write it through this function and nothing else, so no consumer can look in the
// wrong place.
#pragma once

#include <ATen/core/Tensor.h>

#include "weft/core/error.h"
#include "weft/parallel/fsdp_unit.h"

namespace weft {

// The whole flat gradient shard of `unit` (float32 or bf16, shard_numel() elements).
inline const at::Tensor& grad_shard(const FsdpUnit& unit) {
  WEFT_CHECK(unit.grad_target().defined(), "unit {}: gradient shard requested before the "
             "optimizer placed it", unit.name());
  return unit.grad_target();
}

// The gradient shard of parameter `i` of `unit`, padding included.
inline at::Tensor grad_shard(const FsdpUnit& unit, int i) {
  const ShardSegment& s = unit.segment(i);
  return grad_shard(unit).narrow(0, s.offset, s.numel());
}

}  // namespace weft
