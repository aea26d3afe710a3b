// FSDP unit (see fsdp_unit.h): row-block sharding, one all-gather per gather, one
// reduce-scatter per microbatch backward, gradient reduction in the gradient shard's dtype.
#include "weft/parallel/fsdp_unit.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <memory>

#include "weft/core/error.h"

namespace weft {
namespace {

int64_t rows_of(const ParamSpec& s) { return s.shape.empty() ? 1 : s.shape[0]; }
int64_t row_numel_of(const ParamSpec& s) {
  int64_t n = 1;
  for (size_t i = 1; i < s.shape.size(); ++i) n *= s.shape[i];
  return n;
}

}  // namespace

void GradReductionQueue::push(std::function<void()> finish) {
  pending_.push_back(std::move(finish));
  while (static_cast<int>(pending_.size()) > depth_) {
    std::function<void()> f = std::move(pending_.front());
    pending_.pop_front();
    f();
  }
}

void GradReductionQueue::drain() {
  while (!pending_.empty()) {
    std::function<void()> f = std::move(pending_.front());
    pending_.pop_front();
    f();
  }
}

FsdpUnit::FsdpUnit(std::string name, std::vector<ParamSpec> specs, Communicator* shard,
                   c10::ScalarType dtype, c10::Device device, Communicator* replicate)
    : name_(std::move(name)), specs_(std::move(specs)), shard_(shard), replicate_(replicate),
      dtype_(dtype),
      device_(device) {
  const int64_t D = shard_->size(), r = shard_->rank();
  for (const auto& s : specs_) {
    ShardSegment seg;
    const int64_t R = rows_of(s);
    seg.rows_per_rank = (R + D - 1) / D;
    seg.row_numel = row_numel_of(s);
    seg.row_start = r * seg.rows_per_rank;
    seg.valid_rows = std::max<int64_t>(0, std::min(R, seg.row_start + seg.rows_per_rank) - seg.row_start);
    seg.offset = shard_numel_;
    shard_numel_ += seg.numel();
    segments_.push_back(seg);
  }
  param_shard_ = at::zeros({shard_numel_}, at::TensorOptions().dtype(dtype_).device(device_));
  full_.resize(specs_.size());
  full_grad_.resize(specs_.size());
  unwritten_.assign(specs_.size(), 0);
}

FsdpUnit::~FsdpUnit() = default;

void FsdpUnit::bind_param_shard(const at::Tensor& t) {
  WEFT_CHECK(t.numel() == shard_numel_ && t.scalar_type() == dtype_ && t.is_contiguous(),
             "unit {}: bound shard must be contiguous {} of {} elements", name_,
             c10::toString(dtype_), shard_numel_);
  t.copy_(param_shard_);
  param_shard_ = t;
  if (gathered_ && shard_->size() == 1) {
    gathered_ = false;  // the views pointed at the old buffer
    unshard();
  }
}

void FsdpUnit::load_full(const std::function<at::Tensor(const ParamSpec&)>& full_value) {
  at::NoGradGuard no_grad;
  param_shard_.zero_();
  for (size_t i = 0; i < specs_.size(); ++i) {
    const auto& seg = segments_[i];
    if (seg.valid_rows == 0) continue;
    at::Tensor full = full_value(specs_[i]).reshape({rows_of(specs_[i]), seg.row_numel});
    at::Tensor mine = full.narrow(0, seg.row_start, seg.valid_rows).reshape({-1});
    param_shard_.narrow(0, seg.offset, seg.valid_numel()).copy_(mine);
  }
}

void FsdpUnit::set_grad_target(const at::Tensor& g) {
  WEFT_CHECK(g.numel() == shard_numel_ &&
                 (g.scalar_type() == at::kFloat || g.scalar_type() == at::kBFloat16) &&
                 g.is_contiguous(),
             "unit {}: gradient shard must be contiguous float32 or bf16 of {} elements", name_,
             shard_numel_);
  grad_target_ = g;
  std::fill(unwritten_.begin(), unwritten_.end(), 0);  // its owner's values count
  shard_unwritten_ = false;
}

void FsdpUnit::zero_grad() {
  WEFT_CHECK(grad_target_.defined(), "unit {}: no gradient shard set", name_);
  if (!lazy_zero_) {
    grad_target_.zero_();
  } else if (shard_->size() == 1) {
    std::fill(unwritten_.begin(), unwritten_.end(), 1);
  } else {
    shard_unwritten_ = true;
  }
}

void FsdpUnit::zero_unwritten_grads() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < unwritten_.size(); ++i)
    if (unwritten_[i]) {
      grad_target_.narrow(0, segments_[i].offset, segments_[i].numel()).zero_();
      unwritten_[i] = 0;
    }
  // With D > 1 the shard is written only by a reduction, which runs once every use of the
  // microbatch has its gradient; a unit no backward reached has none in flight.
  if (shard_unwritten_ && pending_uses_.empty()) {
    grad_target_.zero_();
    shard_unwritten_ = false;
  }
}

void FsdpUnit::unshard() {
  if (gathered_) return;
  at::NoGradGuard no_grad;
  const int64_t D = shard_->size();
  if (D == 1) {
    for (size_t i = 0; i < specs_.size(); ++i)
      full_[i] = param_shard_.narrow(0, segments_[i].offset, segments_[i].numel()).view(specs_[i].shape);
  } else {
    at::Tensor gathered = at::empty({D * shard_numel_}, param_shard_.options());
    shard_->all_gather(param_shard_, gathered);
    at::Tensor by_rank = gathered.view({D, shard_numel_});
    for (size_t i = 0; i < specs_.size(); ++i) {
      const auto& seg = segments_[i];
      // [D, c*rn] column block -> [D*c, rn] rows -> the first R rows.
      at::Tensor rows = by_rank.narrow(1, seg.offset, seg.numel())
                            .contiguous()
                            .view({D * seg.rows_per_rank, seg.row_numel});
      full_[i] = rows.narrow(0, 0, rows_of(specs_[i])).view(specs_[i].shape);
    }
  }
  gathered_ = true;
}

void FsdpUnit::reshard() {
  if (!gathered_ || shard_->size() == 1) return;
  for (auto& t : full_) t = at::Tensor();
  gathered_ = false;
}

at::Tensor FsdpUnit::forward_weight(int index) {
  unshard();
  if (at::GradMode::is_enabled()) ++pending_uses_[microbatch_];
  return full_[index];
}

void FsdpUnit::on_backward_touch() {
  // Only a unit whose backward for this microbatch is still to come is worth gathering.
  if (backward_prefetch_ && !backward_prefetch_->gathered_ && shard_->size() > 1 &&
      backward_prefetch_->has_pending_grads(microbatch_))
    backward_prefetch_->unshard();
}

at::Tensor FsdpUnit::backward_weight(int index) {
  on_backward_touch();
  unshard();
  return full_[index];
}

at::Tensor FsdpUnit::grad_buffer(int index) {
  WriteTarget t = grad_buffer_to_write(index);  // zeroed where fresh, for an adder
  if (t.fresh) t.buffer.zero_();
  return t.buffer;
}

FsdpUnit::WriteTarget FsdpUnit::grad_buffer_to_write(int index) {
  WEFT_CHECK(grad_target_.defined(), "unit {}: no gradient shard set", name_);
  on_backward_touch();
  at::Tensor& g = full_grad_[index];
  bool fresh = false;
  if (shard_->size() == 1) {  // accumulate straight into the gradient shard
    fresh = unwritten_[index] != 0;
    unwritten_[index] = 0;
    if (!g.defined()) {
      const auto& seg = segments_[index];
      g = grad_target_.narrow(0, seg.offset, seg.numel()).view(specs_[index].shape);
    }
  } else if (!g.defined()) {  // this backward's full-shape buffer, reduced at its end
    g = at::empty(specs_[index].shape, grad_target_.options());
    fresh = true;
  }
  return {g, fresh};
}

void FsdpUnit::grad_ready(int index) {
  auto it = pending_uses_.find(microbatch_);
  WEFT_CHECK(it != pending_uses_.end() && it->second > 0,
             "unit {}: gradient of microbatch {} delivered more often than it was used", name_,
             microbatch_);
  if (--it->second > 0) return;
  pending_uses_.erase(it);
  reduce_grads();
  reshard();
}

// Sums this microbatch's full gradients over the shard group into the gradient shard.
void FsdpUnit::reduce_grads() {
  at::NoGradGuard no_grad;
  const int64_t D = shard_->size();
  if (D > 1) {
    at::Tensor send = at::zeros({D * shard_numel_}, grad_target_.options());
    at::Tensor by_rank = send.view({D, shard_numel_});
    for (size_t i = 0; i < specs_.size(); ++i) {
      if (!full_grad_[i].defined()) continue;
      const auto& seg = segments_[i];
      const int64_t R = rows_of(specs_[i]);
      at::Tensor padded = at::zeros({D * seg.rows_per_rank, seg.row_numel}, send.options());
      padded.narrow(0, 0, R).copy_(full_grad_[i].reshape({R, seg.row_numel}));
      by_rank.narrow(1, seg.offset, seg.numel()).copy_(padded.view({D, seg.numel()}));
    }
    at::Tensor mine = at::empty({shard_numel_}, grad_target_.options());
    // The first reduction of a lazily zeroed step writes the shard; later ones add.
    const bool overwrite = shard_unwritten_;
    shard_unwritten_ = false;
    if (reduce_queue_) {
      std::shared_ptr<Work> work = shard_->reduce_scatter_async(send, mine, ReduceOp::kSum);
      at::Tensor target = grad_target_;
      reduce_queue_->push([work, mine, target, overwrite]() mutable {
        at::NoGradGuard no_grad;
        work->wait();
        if (overwrite)
          target.copy_(mine);
        else
          target.add_(mine);
      });
    } else {
      shard_->reduce_scatter(send, mine, ReduceOp::kSum);
      if (overwrite)
        grad_target_.copy_(mine);
      else
        grad_target_.add_(mine);
    }
  }
  for (auto& g : full_grad_) g = at::Tensor();
}

}  // namespace weft
