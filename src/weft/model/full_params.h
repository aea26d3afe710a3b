// FullParams: the unsharded ParamSource. It holds every parameter as one full tensor in the
// compute dtype, with a full-shape gradient buffer beside it; used by tests and single-process
// tools (the FSDP unit in parallel/ is the sharded source).
//
// Invariants: forward_weight/backward_weight return the stored tensor itself (no copy; callers
// must not modify it). Gradients only accumulate: grad(i) is the sum over every delivered use
// since the last zero_grad(). Each grad_ready must match an earlier counted forward use (one
// under grad mode); a surplus grad_ready is a broken op contract and throws.
//
// Gradient dtype: float32, except float64 for float64 parameters (reference tests), so that a
// float64 model is exact end to end.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "weft/model/param_source.h"

namespace weft {

class FullParams : public ParamSource {
 public:
  FullParams() = default;
  FullParams(const FullParams&) = delete;  // handles point at this object
  FullParams& operator=(const FullParams&) = delete;

  // Registers a parameter. `value` must have spec.shape; it is stored as given (its dtype is the
  // compute dtype) and detached. The returned handle is valid while this object lives.
  ParamHandle add(const ParamSpec& spec, at::Tensor value);

  int size() const { return static_cast<int>(entries_.size()); }
  const ParamSpec& spec(int index) const;
  ParamHandle handle(int index);
  // Index of the parameter named `name`, or -1.
  int find(const std::string& name) const;

  // The stored value (modify in place only between steps, never inside a forward/backward).
  const at::Tensor& value(int index) const;
  // The accumulated gradient (float32, or float64 for float64 parameters): the live buffer, not
  // a copy; zeros if no gradient was ever delivered.
  at::Tensor grad(int index) const;
  // Zeroes every gradient and forgets pending (forwarded but not yet delivered) uses.
  void zero_grad();

  // Counted forward uses whose gradient has not been delivered yet.
  int pending_uses(int index) const;

  // ParamSource
  at::Tensor forward_weight(int index) override;
  at::Tensor backward_weight(int index) override;
  at::Tensor grad_buffer(int index) override;
  void grad_ready(int index) override;

 private:
  struct Entry {
    ParamSpec spec;
    at::Tensor value;
    at::Tensor grad;  // allocated on first grad_buffer() call
    int pending = 0;
  };
  Entry& entry(int index);
  const Entry& entry(int index) const;

  std::vector<Entry> entries_;
};

}  // namespace weft
