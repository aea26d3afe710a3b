// Collectives on tensors over one process group of the mesh.
//
// A Communicator is bound to one group (its members are global ranks in group-rank order) and
// one backend: MPI for CPU tensors (CUDA tensors are staged through host memory), NCCL for CUDA
// tensors where weft is built with CUDA. Every member must enter every collective in the same
// order, including members whose buffer is empty (invariant 6): zero-length buffers are legal
// everywhere. Buffers must be contiguous; `out` buffers are written in place and never
// reallocated, so callers may pass views into larger flat buffers.
//
// Contract on peers and roots: they are group ranks (0..size()-1), not global ranks.
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/mesh/mesh.h"

namespace weft {

// Reductions take float32/64, bfloat16, float16, int8, uint8, int32 and int64 (every backend
// the same set); kAvg (sum, then one division by the group size) needs a floating dtype.
// Data movement (gather, broadcast, p2p, all-to-all) takes any dtype.
enum class ReduceOp { kSum, kAvg, kMax };

// One point-to-point operation of a batch (see Communicator::batch_p2p).
struct P2POp {
  enum Kind { kSend, kRecv } kind;
  at::Tensor tensor;  // contiguous; written in place for kRecv
  int peer;           // group rank
};

// A collective in flight (Communicator::reduce_scatter_async). wait() makes its result visible
// to the caller: the MPI backend's host waits for the request (and copies staged results to the
// device); the NCCL backend's caller's current stream waits for the communicator's stream (the
// host does not). Call wait() exactly once, from a thread whose current stream is the caller's;
// destroying a Work that was never waited for waits.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }                    // this process's group rank
  int size() const { return static_cast<int>(members_.size()); }
  const Group& members() const { return members_; }     // global ranks, group-rank order
  const std::string& name() const { return name_; }     // e.g. "fsdp_shard", for messages
  virtual std::string backend() const = 0;              // "mpi" or "nccl"

  // out.numel() == size() * in.numel(); rank i's `in` lands at out[i*n, (i+1)*n).
  virtual void all_gather(const at::Tensor& in, const at::Tensor& out) = 0;
  // in.numel() == size() * out.numel(); out = op over ranks of in[rank*n, (rank+1)*n).
  virtual void reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op) = 0;
  // The same, started and returned before it completes: `in` must stay unmodified and `out`
  // unread until the Work's wait(). Collectives on one communicator are still matched in call
  // order, so every member starts its async collectives in the same order as the blocking ones.
  virtual std::unique_ptr<Work> reduce_scatter_async(const at::Tensor& in, const at::Tensor& out,
                                                     ReduceOp op) = 0;
  virtual void all_reduce(const at::Tensor& t, ReduceOp op) = 0;
  virtual void broadcast(const at::Tensor& t, int root) = 0;
  virtual void send(const at::Tensor& t, int peer) = 0;
  virtual void recv(const at::Tensor& t, int peer) = 0;
  // Posts every operation, then waits for all: a send and a recv in one batch never deadlock.
  virtual void batch_p2p(const std::vector<P2POp>& ops) = 0;
  // Uneven all-to-all along dim 0 of flat buffers: send_counts[i] elements of `in` (in rank
  // order) go to rank i; recv_counts[i] elements from rank i land in `out` in rank order.
  virtual void all_to_all(const at::Tensor& in, const std::vector<int64_t>& send_counts,
                          const at::Tensor& out, const std::vector<int64_t>& recv_counts) = 0;
  virtual void barrier() = 0;

 protected:
  Communicator(std::string name, Group members, int rank)
      : name_(std::move(name)), members_(std::move(members)), rank_(rank) {}

 private:
  std::string name_;
  Group members_;
  int rank_;
};

}  // namespace weft
