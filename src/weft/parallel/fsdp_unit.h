// An FSDP unit: a few parameters (at most one transformer layer) sharded row-wise over the
// fsdp_shard group, gathered only while they compute, their gradients reduce-scattered in
// float32 (bf16 with --grad-reduce-in-bf16) after each microbatch's backward.
//
// Sharding (FSDP2-style, chosen so every saved chunk is a box in the global tensor): parameter
// p with R rows of `row_numel` elements is cut into D = shard-group-size blocks of
// c = ceil(R/D) rows; rank i holds rows [i*c, min(R, (i+1)*c)), padded with zeros to c rows.
// A rank whose block starts past R holds only padding: its shard is "empty" but it enters
// every collective like the others (invariant 6). The rank's blocks of all parameters are
// concatenated into one flat shard of shard_numel() elements, so a unit gathers with one
// all-gather and reduces with one reduce-scatter. With D = 1 the full weights and gradient
// buffers are views of the flat shard: nothing is gathered, copied or reduced.
//
// Lifecycle per microbatch m (the stage sets the microbatch before forward and backward):
// forward_weight() gathers lazily and counts a use of m; the stage calls reshard() after the
// unit's forward; in backward, backward_weight() gathers lazily, grad_buffer() hands out
// full-shape buffers in the gradient shard's dtype, and the last grad_ready() of m reduce-scatters into the gradient shard
// and frees the full weights and buffers. So full weights exist only while the unit computes.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "weft/comm/communicator.h"
#include "weft/model/param_source.h"

namespace weft {

// Where one parameter lives inside this rank's flat shard.
struct ShardSegment {
  int64_t offset = 0;          // into the flat shard, in elements
  int64_t rows_per_rank = 0;   // c = ceil(R / D)
  int64_t row_numel = 1;       // elements per row (product of dims after the first)
  int64_t row_start = 0;       // global row of this rank's first row (i*c)
  int64_t valid_rows = 0;      // rows of real data on this rank (0 for an empty shard)
  int64_t numel() const { return rows_per_rank * row_numel; }
  int64_t valid_numel() const { return valid_rows * row_numel; }
};

// Gradient reductions started by units' backward (reduce-scatter in flight while the backward of
// earlier layers computes) and finished in start order: at most `depth` in flight, since each
// holds a full-size send buffer; drain() finishes all (the stage calls it at the end of
// each microbatch's backward, before anything reads a gradient shard). Finishing in start order
// keeps every shard's accumulation order, so results are bitwise those of blocking reductions.
class GradReductionQueue {
 public:
  explicit GradReductionQueue(int depth) : depth_(depth < 1 ? 1 : depth) {}
  void push(std::function<void()> finish);
  void drain();
  bool empty() const { return pending_.empty(); }

 private:
  int depth_;
  std::deque<std::function<void()>> pending_;
};

class FsdpUnit : public ParamSource {
 public:
  // `shard` (and `replicate`, if given) must outlive the unit. `dtype` is the compute dtype of
  // the gathered weights. `replicate` is the HSDP replicate group the unit's reduced gradients
  // are summed over (fsdp_replicate for dense units, expert_fsdp_replicate for experts); null
  // means none (a single replica).
  FsdpUnit(std::string name, std::vector<ParamSpec> specs, Communicator* shard,
           c10::ScalarType dtype, c10::Device device, Communicator* replicate = nullptr);
  ~FsdpUnit() override;

  const std::string& name() const { return name_; }
  int num_params() const { return static_cast<int>(specs_.size()); }
  const ParamSpec& spec(int i) const { return specs_[i]; }
  const ShardSegment& segment(int i) const { return segments_[i]; }
  int64_t shard_numel() const { return shard_numel_; }
  Communicator& shard_comm() const { return *shard_; }
  Communicator* replicate_comm() const { return replicate_; }  // may be null
  // Whether this rank holds the main replica of its shard (replicate rank 0): the one that
  // counts the shard in the grad norm and writes it into checkpoints.
  bool main_replica() const { return replicate_ == nullptr || replicate_->rank() == 0; }
  ParamHandle handle(int i) { return ParamHandle{this, i}; }

  // This rank's flat shard of the weights, in compute dtype. With float32 compute it may be
  // bound to the optimizer's master shard (bind_param_shard), so both are one tensor.
  const at::Tensor& param_shard() const { return param_shard_; }
  void bind_param_shard(const at::Tensor& t);
  // Fills the shard from each parameter's full float32 value (e.g. init_param).
  void load_full(const std::function<at::Tensor(const ParamSpec&)>& full_value);

  // The shard that reduced gradients accumulate into (float32, or bf16 with
  // --grad-reduce-in-bf16; the full-shape buffers and the reductions take its dtype). Who owns
  // it depends on the gradient mode (see optim/); read it only through grad_shard() in
  // grad_access.h.
  void set_grad_target(const at::Tensor& g);
  const at::Tensor& grad_target() const { return grad_target_; }

  // The unit whose weights the backward needs next (the previous layer in forward order):
  // gathered as soon as this unit's backward starts, so that with an asynchronous backend
  // (NCCL) its all-gather overlaps this unit's backward compute. Null: no prefetch.
  void set_backward_prefetch(FsdpUnit* next) { backward_prefetch_ = next; }
  // Where this unit's reduce-scatters go to finish later (null: each finishes at once). Used
  // only with D > 1; the queue must outlive the unit's backward.
  void set_grad_reduction_queue(GradReductionQueue* q) { reduce_queue_ = q; }
  bool gathered() const { return gathered_; }

  // The microbatch that forward and backward uses are counted against.
  void set_microbatch(int m) { microbatch_ = m; }
  void unshard();  // gathers the full weights now (no-op if gathered)
  void reshard();  // frees the full weights (no-op with D = 1)
  // Whether some forward use of microbatch `mb` has not received its gradient yet.
  bool has_pending_grads(int mb) const { return pending_uses_.count(mb) > 0; }

  at::Tensor forward_weight(int index) override;
  at::Tensor backward_weight(int index) override;
  at::Tensor grad_buffer(int index) override;
  WriteTarget grad_buffer_to_write(int index) override;
  void grad_ready(int index) override;

  // Clears the gradient shard for the next step. With lazy zeroing on, nothing is written now:
  // each parameter's gradient is marked unwritten, its first writer of the step overwrites it
  // (grad_buffer_to_write() hands it out fresh), a first adder gets it zeroed first, and
  // zero_unwritten_grads() zeroes what no backward reached. For the eager schedules only: a
  // replayed CUDA graph repeats its captured writes without this bookkeeping (trainer.cpp).
  void zero_grad();
  void set_lazy_grad_zeroing(bool on) { lazy_zero_ = on; }
  // Zeroes the gradients still unwritten since zero_grad(); the stage calls it at the end of
  // every microbatch's backward, so that every reader of a gradient shard finds it whole.
  void zero_unwritten_grads();

 private:
  void reduce_grads();
  void on_backward_touch();  // gathers this unit (and prefetches) when its backward starts

  std::string name_;
  std::vector<ParamSpec> specs_;
  std::vector<ShardSegment> segments_;
  Communicator* shard_;
  Communicator* replicate_;
  c10::ScalarType dtype_;
  c10::Device device_;
  int64_t shard_numel_ = 0;
  at::Tensor param_shard_;
  at::Tensor grad_target_;
  std::vector<at::Tensor> full_;       // gathered weights (empty when resharded)
  std::vector<at::Tensor> full_grad_;  // full-shape gradient buffers of this backward
  bool gathered_ = false;
  FsdpUnit* backward_prefetch_ = nullptr;
  GradReductionQueue* reduce_queue_ = nullptr;
  int microbatch_ = 0;
  std::map<int, int> pending_uses_;    // microbatch -> forward uses still awaiting a gradient
  bool lazy_zero_ = false;
  // Since the last lazy zero_grad(), not yet written: per parameter with D = 1 (the buffers
  // are views of the gradient shard), the whole shard with D > 1 (written by the reduction).
  std::vector<char> unwritten_;
  bool shard_unwritten_ = false;
};

}  // namespace weft
