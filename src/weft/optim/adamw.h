// Sharded AdamW: runs on each FSDP unit's local flat shard with float32 master weights.
//
// State per unit: the float32 master shard, exp_avg and exp_avg_sq (float32 or bfloat16:
// --exp-avg-dtype / --exp-avg-sq-dtype, as Megatron's precision-aware optimizer), and, in the
// precision-aware gradient mode, the decoupled float32 gradient beside the master. With float32
// compute the unit's weight shard is the master shard itself. The gradient shard is float32, or
// bfloat16 with --grad-reduce-in-bf16; the update computes in float32 either way. Padding
// elements of a shard have zero gradient and zero value, so the update leaves them zero.
//
// On CUDA with float32 moments the update is weft's one-pass kernel (fused_adamw.h: master,
// moments and the rounded weights in one pass, one launch per range of a group); elsewhere an
// unfused per-parameter update with the same formula.
//
// Parameter groups are keyed by global parameter name (never by position): "decay" for
// matrices, "no_decay" for norms and biases, each with its own weight decay and betas; with
// decoupled_lr (Megatron's --decoupled-lr) the word embedding and output layer form the group
// "decoupled": the decay group's settings at their own learning rate (set_group_lr).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "weft/parallel/fsdp_unit.h"

namespace weft {

struct AdamWConfig {
  double weight_decay = 0.01;  // --weight-decay (decay group)
  double beta1 = 0.9;          // --adam-beta1
  double beta2 = 0.999;        // --adam-beta2 (Megatron's default)
  double eps = 1e-8;           // --adam-eps
  c10::ScalarType exp_avg_dtype = at::kFloat;     // --exp-avg-dtype fp32|bf16
  c10::ScalarType exp_avg_sq_dtype = at::kFloat;  // --exp-avg-sq-dtype fp32|bf16
  bool precision_aware = false;  // --use-precision-aware-optimizer: decoupled gradient
  // The main-grad shard's dtype (default mode): bfloat16 with --grad-reduce-in-bf16 --bf16
  // (Megatron's bf16 main_grad buffer: the backward accumulates, and the reduce-scatter and
  // all-reduces sum, in bf16; the update reads it into float32).
  c10::ScalarType grad_dtype = at::kFloat;
  bool decoupled_lr = false;     // --decoupled-lr given: the "decoupled" group
};

struct ParamGroupSettings {
  double weight_decay = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double lr = -1;  // the group's own learning rate (set_group_lr); -1: the step's
};

struct UnitOptimState {
  at::Tensor master;          // float32 [S]
  at::Tensor exp_avg;         // [S]
  at::Tensor exp_avg_sq;      // [S]
  at::Tensor main_grad;       // [S] in grad_dtype, default gradient mode
  at::Tensor decoupled_grad;  // float32 [S], precision-aware gradient mode
};

class ShardedAdamW {
 public:
  // Takes the units' current weight shards as the initial master values and places every
  // unit's gradient shard (see grad_access.h). Units must outlive the optimizer.
  ShardedAdamW(std::vector<FsdpUnit*> units, const AdamWConfig& cfg);

  void zero_grad();
  // One AdamW step at learning rate `lr` for every unit, on the gradients multiplied by
  // `grad_multiplier` (gradient clipping); then refreshes the weight shards. Whether the
  // gradient shards hold the multiplied gradients afterwards is unspecified.
  void step(double lr, double grad_multiplier = 1.0);
  // The same step with the decisions left on the device, so that the host need not wait for
  // the gradient norm before queueing it: every gradient is divided by `grad_scale` (float32,
  // one element: 1 / the clipping multiplier; undefined: 1), and nothing changes where
  // `found_inf` (float32, one element) is 1. Counts the step; when the host later learns that
  // it was skipped, uncount_step(). Returns false, queueing nothing, where the fused CUDA
  // kernel does not apply (CPU, bf16 moments): then decide on the host and call step(). The
  // gradient shards are left as they were.
  bool step_on_device(double lr, const at::Tensor& grad_scale, const at::Tensor& found_inf);
  // Whether step_on_device applies: float32 moments on CUDA in a CUDA build.
  bool can_step_on_device() const;
  void uncount_step() { --steps_; }
  // The "decay" group's weight decay for the next steps (the schedule's, lr_schedule.h: wd_at);
  // "no_decay" stays 0, as Megatron's wd_mult 0.
  void set_weight_decay(double wd);
  // The learning rate of group `name` for the next steps instead of the step's (the
  // "decoupled" group's schedule). Throws for an unknown group.
  void set_group_lr(const std::string& name, double lr);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

  const AdamWConfig& config() const { return cfg_; }
  const std::vector<FsdpUnit*>& units() const { return units_; }
  UnitOptimState& state(size_t unit_index) { return states_[unit_index]; }
  // The group settings of a parameter, by global name.
  const ParamGroupSettings& group_of(const std::string& param_name) const;
  const std::string& group_name_of(const std::string& param_name) const;

  // Bytes of optimizer state (master, moments, decoupled gradient) held by this rank.
  int64_t state_bytes() const;
  // The same for unit `unit_index` alone.
  int64_t unit_state_bytes(size_t unit_index) const;
  // Bytes of the gradient shards held by this rank (main or decoupled).
  int64_t grad_bytes() const;

 private:
  void fused_step(double lr, const at::Tensor& grad_scale, const at::Tensor& found_inf);

  AdamWConfig cfg_;
  std::vector<FsdpUnit*> units_;
  std::vector<UnitOptimState> states_;
  struct Range {  // consecutive parameters of one group inside a unit's flat shard
    std::string group;
    int64_t offset, numel;
  };
  std::vector<std::vector<Range>> ranges_;  // per unit
  std::map<std::string, ParamGroupSettings> groups_;    // group name -> settings
  std::map<std::string, std::string> param_group_;      // param name -> group name
  int64_t steps_ = 0;
};

}  // namespace weft
