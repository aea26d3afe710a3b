// MpiCommunicator: the MPI backend of Communicator over one MPI_Comm, plus the argument checks
// every backend shares (comm_check_*).
//
// CPU tensors go to MPI directly; CUDA tensors are staged through host memory (copied to the
// CPU, reduced or moved there, copied back), so this backend needs no CUDA code and works on
// any device ATen can copy from. Reductions on bf16/fp16 are upcast to fp32, reduced in fp32
// and cast back once, so the result is the correctly rounded fp32 result, independent of the
// reduction order for values that fp32 holds exactly. Avg is a Sum followed by one division by
// size() in the reduction dtype.
//
// Invariant: every argument error is detected locally and thrown (weft::Error naming the group,
// the op and the sizes) before this rank enters MPI; once the ranks are inside a collective, an
// MPI failure aborts the whole job (comm_abort) instead of leaving peers hanging.
//
// Threading: MPI runs with MPI_THREAD_MULTIPLE, so different communicators may be used from
// different threads at once. Collectives on one communicator must still be issued in the same
// order on every member; the caller serializes them. Point-to-point tags are per-peer sequence
// numbers (atomic counters of the WatchedGroup, see tag_of), so the k-th message from A to B
// on this communicator always meets the k-th receive at B from A, whichever call (send, recv,
// batch_p2p) posts them.
//
// Watchdog: every blocking MPI call is made inside a WatchScope naming the operation and its
// collective number or messages, so a running Watchdog (watchdog.h) can abort the job when one
// waits too long and name the ranks it waits for.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "weft/comm/comm_checks.h"
#include "weft/comm/communicator.h"
#include "weft/comm/watchdog.h"

namespace weft {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor while MPI still runs). `members` are the
  // global ranks of comm in comm-rank order; the size is checked here, the membership itself by
  // ProcessGroups. Sets MPI_ERRORS_RETURN on comm so failures are reported with context.
  MpiCommunicator(std::string name, Group members, MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string backend() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }
  WatchedGroup& watched() { return watch_; }  // this rank's progress on the group

  void all_gather(const at::Tensor& in, const at::Tensor& out) override;
  void reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op) override;
  // MPI_Ireduce_scatter_block on host views; wait() = MPI_Wait, then kAvg's division and the
  // copy back of device-staged results.
  std::unique_ptr<Work> reduce_scatter_async(const at::Tensor& in, const at::Tensor& out,
                                             ReduceOp op) override;
  void all_reduce(const at::Tensor& t, ReduceOp op) override;
  void broadcast(const at::Tensor& t, int root) override;
  void send(const at::Tensor& t, int peer) override;
  void recv(const at::Tensor& t, int peer) override;
  void batch_p2p(const std::vector<P2POp>& ops) override;
  void all_to_all(const at::Tensor& in, const std::vector<int64_t>& send_counts,
                  const at::Tensor& out, const std::vector<int64_t>& recv_counts) override;
  void barrier() override;

 private:
  // The host buffers, count and MPI type of a reduce-scatter (blocking or not): `in` and `out`
  // themselves when they are host tensors of the reduction dtype, else staged copies.
  // The tag of message `index` (WatchedGroup::next_send/next_recv) to or from a peer.
  int tag_of(uint64_t index) const;
  void check(int rc, const char* op) const;  // aborts the job on an MPI error
  int count(int64_t n, const char* op, const char* what) const;  // n must fit MPI's int

  MPI_Comm comm_;
  int tag_ub_ = 32767;  // the MPI standard's guaranteed minimum until MPI_TAG_UB is read
  WatchedGroup watch_;  // collective numbers, per-peer message counts (tags), watchdog identity
};

}  // namespace weft
