// MPI start-up and tear-down for the process, the collective watchdog's start, and the error
// agreement of `weft train` (mpi_runtime.cpp).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

namespace weft {

class Watchdog;  // watchdog.h

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

}  // namespace weft
