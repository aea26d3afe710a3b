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

class Watchdog;  // watchdog.h

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

// MPI start-up and tear-down for the process (MPI_THREAD_MULTIPLE, since autograd may call
// collectives from its worker threads). Safe to construct once per process.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  int local_rank() const { return local_rank_; }  // rank among processes on this host
  int local_size() const { return local_size_; }  // processes on this host
  // This rank's fair share of the host's cores (hardware threads / local_size(), at least 1).
  int threads_per_rank() const;
  static std::string library_version();           // e.g. "Open MPI v4.1.4"
  // Aborts every rank of the job with `code` (MPI_Abort on the world); does not return.
  [[noreturn]] static void abort(int code);
  // Starts the collective watchdog (watchdog.h): a communication call waiting longer than
  // `timeout_s` prints which ranks it waits for and aborts the job. Collective over the world;
  // at most once. It stops before MPI is finalized.
  void start_watchdog(double timeout_s);

  // Error agreement, on a duplicate of the world communicator that no training collective uses
  // (so these can never match, or be matched by, a collective of the trainer).
  // Blocking and collective: every rank must call it at a point every rank reaches whatever
  // its flags (e.g. right after local validation). Returns the failing rank with the lowest
  // number and its message on every rank, or -1 (and "") when no rank failed.
  int first_failure(bool failed, const std::string& message, std::string* first_message) const;
  // Called by a rank that caught an error at an unknown point: true when every rank of the
  // world calls it within `seconds` (all of them failed, so each may exit cleanly), false when
  // some rank did not (it may be waiting for this one in a collective: abort the job).
  bool all_ranks_failed_within(double seconds) const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool finalize_ = false;
  std::unique_ptr<Watchdog> watchdog_;
  MPI_Comm errors_ = MPI_COMM_NULL;  // duplicate of the world, for the error agreement only
};

enum class Backend { kMpi, kNccl };

// Every group of the mesh that holds this rank, as communicators over one backend.
// Construction is collective over the world: every rank must construct it, and each group is
// checked by its members (they compare a digest of the membership list) before it is used;
// a disagreement fails with a message naming the group kind and both member lists.
class ProcessGroups {
 public:
  // `base` is the communicator the mesh's ranks are numbered in (a test may run a job on a
  // subset of the world); it must be valid while the groups are constructed.
  ProcessGroups(const Mesh& mesh, Backend backend, MPI_Comm base = MPI_COMM_WORLD);
  ~ProcessGroups();

  const Mesh& mesh() const { return mesh_; }
  int rank() const { return rank_; }
  // The communicator of group `kind` holding this rank; null for "embedding" on middle stages.
  Communicator* get(const std::string& kind) const;
  Communicator& world() const { return *world_; }
  // An MPI communicator over the world for small host-side exchanges (agreement flags,
  // checkpoint chunk lists), whatever the backend: it takes CPU tensors.
  Communicator& control() const { return *control_; }

 private:
  Mesh mesh_;
  int rank_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Communicator> control_;
  std::vector<std::pair<std::string, std::unique_ptr<Communicator>>> groups_;
};

// True when weft was built with the NCCL backend.
bool nccl_available();
std::string nccl_version();  // "" when not built

}  // namespace weft
