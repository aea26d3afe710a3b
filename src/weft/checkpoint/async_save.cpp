// Asynchronous checkpoint save (see async_save.h).
#include "weft/checkpoint/async_save.h"

#include <ATen/Functions.h>

#include "weft/comm/process_groups.h"
#include "weft/core/error.h"

namespace weft {

AsyncCheckpointSaver::AsyncCheckpointSaver(const ProcessGroups& groups) : groups_(groups) {}

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  cancel_ = true;
  join();
}

void AsyncCheckpointSaver::join() {
  if (writer_.joinable()) writer_.join();
}

void AsyncCheckpointSaver::start(const SaveRequest& req, const PipelineStage& stage,
                                 ShardedAdamW& opt) {
  WEFT_CHECK(!save_, "an asynchronous save of iteration {} is still pending", pending_iteration());
  save_ = ckpt_save_begin(req, stage, opt, groups_, &snapshot_);
  pending_iteration_ = req.iteration;
  done_ = false;
  cancel_ = false;
  CkptSave* save = save_.get();
  writer_ = std::thread([this, save] {
    if (debug_before_write) debug_before_write();
    ckpt_save_write(*save, &cancel_);
    done_ = true;
  });
}

int AsyncCheckpointSaver::commit() {
  join();
  CkptSavePtr save = std::move(save_);  // nothing is pending from here on, also on failure
  const int iteration = pending_iteration_;
  pending_iteration_ = -1;
  ckpt_save_commit(*save, groups_);
  return iteration;
}

int AsyncCheckpointSaver::poll() {
  if (!save_) return -1;
  at::Tensor busy = at::full({1}, done_ ? 0 : 1, at::kInt);  // any rank still writing?
  groups_.control().all_reduce(busy, ReduceOp::kMax);
  if (busy.item<int>() != 0) return -1;
  return commit();
}

int AsyncCheckpointSaver::finish() {
  if (!save_) return -1;
  return commit();
}

}  // namespace weft
