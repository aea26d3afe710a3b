// --async-save: the training thread is blocked only while the state is copied into host
// buffers; a background thread writes, checksums and fsyncs this rank's shard file; the commit
// protocol of docs/checkpoint-format.md is unchanged (the tracker names a checkpoint only after
// every rank's files are durable).
//
// Design (as Megatron's async-calls queue). The background thread issues no collective: two
// threads on one communicator would race (MPI and NCCL order collectives by issue order per
// communicator). Instead the training thread, at each step boundary while a save is pending,
// asks every rank with one all-reduce whether its writer has finished (poll()); when all have,
// it runs phase 3 (gather the chunk lists, agree on success, rank 0 commits). A second save,
// and the end of training (normal end, --exit-interval, --exit-duration-in-mins, SIGTERM/SIGINT,
// all of which leave Trainer::train through its end), first wait for the pending one and commit
// it (finish()). A job that dies, or a saver destroyed with a save pending (an exception on
// the way out), leaves only the temporary directory: the tracker still names the previous
// checkpoint, and the next save of that iteration removes the leftover.
//
// Contract: every method is collective over groups.control() and called from the training
// thread, by every rank, in the same order (pending() is the same on every rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <condition_variable>
#include <thread>

#include "weft/checkpoint/checkpoint.h"
#include "weft/comm/process_groups.h"

namespace weft {

class AsyncCheckpointSaver {
 public:
  // `groups` must outlive the saver.
  explicit AsyncCheckpointSaver(const ProcessGroups& groups);
  // Joins the writer (asking it to stop early); a save not yet committed is abandoned, never
  // listed. No collective.
  ~AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;

  // Allocates the snapshot buffer for this state now (at start-up), not at the first save.
  void reserve(const PipelineStage& stage, ShardedAdamW& opt) {
    ckpt_reserve_snapshot(stage, opt, &snapshot_);
  }
  // Phase 1 of a save (the stall: copies the state into the reused snapshot buffer), then
  // hands the write to the background thread and returns. Requires !pending(). Throws like
  // ckpt_save_begin.
  void start(const SaveRequest& req, const PipelineStage& stage, ShardedAdamW& opt);
  // While a save is pending: one all-reduce asks whether every rank's writer is done; if so,
  // commits. Returns the committed iteration, or -1 (nothing pending or not done yet). Throws
  // like ckpt_save_commit when the save failed (then nothing is pending any more).
  int poll();
  // Waits for this rank's writer, then commits. Returns the committed iteration, or -1 when
  // nothing was pending. Throws like poll().
  int finish();
  bool pending() const { return save_ != nullptr; }
  int pending_iteration() const { return pending_iteration_; }  // -1 when none

  // Test hook: runs on the background thread before it writes (e.g. to hold the write back
  // until the training thread has changed the live state).
  std::function<void()> debug_before_write;

 private:
  void join();
  int commit();

  const ProcessGroups& groups_;
  at::Tensor snapshot_;  // reused by every save; the writer reads it until done_
  CkptSavePtr save_;     // the pending save, or null
  int pending_iteration_ = -1;
  std::thread writer_;
  std::atomic<bool> done_{false};
  std::atomic<bool> cancel_{false};
};

}  // namespace weft
