// The collective watchdog: a dead or hung rank must not leave its peers waiting forever.
//
// Every communicator (either backend) owns a WatchedGroup: its name, its members as world ranks,
// and counters of the operations this rank has entered on it (collectives in call order, and
// point-to-point messages per peer). While an operation can block, it is marked active (WatchScope
// around a blocking MPI call; a token held until a CUDA event completes for NCCL work). One
// Watchdog per process runs a thread that looks at the active operations every tick; when one
// has been waiting longer than the timeout (--distributed-timeout-minutes) it asks the other
// members which of them have not reached that operation, prints one line naming this rank, the
// operation, its group, the time waited and the missing ranks, and aborts the job (MPI_Abort), so
// every rank ends. Groups may carry hooks (NCCL: an async-error poll, and ncclCommAbort to call
// before the job is aborted).
//
// How the missing ranks are found, and why this way: the watchdog thread owns a duplicate of
// MPI_COMM_WORLD used for nothing else, and always keeps one receive posted on it for queries.
// The stalled rank sends each member a query naming the group and receives its counters, or no
// answer at all within a grace period. A member that answers with fewer collectives than the
// stalled one is numbered has not reached it (and says what it is doing instead); one that does
// not answer is stopped, dead, or so hung that its watchdog thread cannot run. Point-to-point
// operations compare the per-peer message counts the same way. Unlike a shared file under
// /dev/shm this works across hosts, needs no cleanup after a crash, and exchanges nothing until
// a timeout fires (one MPI_Test per tick otherwise). It needs MPI_THREAD_MULTIPLE, which
// MpiRuntime already requires: the watchdog thread makes MPI calls, on its own communicator only,
// while other threads are inside collectives, and calls MPI_Abort itself.
//
// Invariant: with no Watchdog running, the counters still advance (the MPI backend derives its
// message tags from them) but nothing else happens; the timeout only counts time a rank spends
// inside a communication call (or, for NCCL, an operation enqueued and not yet finished), never
// time spent computing between calls.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>


namespace weft {

// Optional backend hooks, called from the watchdog thread while the group is registered.
struct WatchHooks {
  // Returns "" while healthy, else a description of an asynchronous failure (aborts the job).
  std::function<std::string()> async_error;
  // Called once before the job is aborted (e.g. ncclCommAbort), with a bounded wait.
  std::function<void()> abort;
};

// One communicator's progress, as this rank's watchdog and its peers' queries see it.
// Construct it collectively on the communicator's members (as the communicator itself is): its
// identity is the name, the member list and how many groups with that name and members this
// process created before, which every member counts alike.
class WatchedGroup {
 public:
  // `comm` is the group's MPI communicator (used here only to find the members' world ranks).
  WatchedGroup(std::string name, MPI_Comm comm, WatchHooks hooks = {});
  ~WatchedGroup();  // unregisters; no operation may be active on it any more
  WatchedGroup(const WatchedGroup&) = delete;
  WatchedGroup& operator=(const WatchedGroup&) = delete;

  const std::string& name() const { return name_; }
  const std::vector<int>& world_members() const { return world_; }  // world rank of each group rank
  int rank() const { return rank_; }                                 // this process's group rank
  uint64_t id() const { return id_; }
  const WatchHooks& hooks() const { return hooks_; }

  // The number (1-based) of the collective this rank enters now; every member numbers its
  // collectives on this group alike because it enters them in the same order.
  uint64_t enter_collective() { return collectives_.fetch_add(1) + 1; }
  uint64_t collectives() const { return collectives_.load(); }
  // The index (0-based) of the message this rank posts now to / from group rank `peer`.
  uint64_t next_send(int peer) { return sends_[peer].fetch_add(1); }
  uint64_t next_recv(int peer) { return recvs_[peer].fetch_add(1); }
  uint64_t sends_to(int peer) const { return sends_[peer].load(); }
  uint64_t recvs_from(int peer) const { return recvs_[peer].load(); }

 private:
  std::string name_;
  std::vector<int> world_;
  int rank_ = 0;
  uint64_t id_ = 0;
  WatchHooks hooks_;
  std::atomic<uint64_t> collectives_{0};
  std::unique_ptr<std::atomic<uint64_t>[]> sends_, recvs_;
};

// One point-to-point message of an active operation: to or from group rank `peer`, the
// `index`-th in that direction (WatchedGroup::next_send / next_recv).
struct WatchMessage {
  int peer;
  bool send;
  uint64_t index;
};

// Marks an operation on `group` active from watch_begin until watch_end. `seq` is its collective
// number (0 for point-to-point, then `messages` says what it waits for). `done`, when given, is
// asked by the watchdog thread before declaring the operation stalled (an operation that runs on
// a device stream ends when its event completes, which the owner may only notice later); it must
// be safe to call from another thread until watch_end returns. Cheap (a lock and a list node)
// when a Watchdog runs; nothing at all when none does (the token is then 0).
using WatchToken = uint64_t;
WatchToken watch_begin(WatchedGroup& group, const char* op, uint64_t seq,
                       std::vector<WatchMessage> messages = {}, std::function<bool()> done = {});
void watch_end(WatchToken token);

// watch_begin/watch_end around one blocking call on the calling thread.
class WatchScope {
 public:
  WatchScope(WatchedGroup& group, const char* op, uint64_t seq,
             std::vector<WatchMessage> messages = {})
      : token_(watch_begin(group, op, seq, std::move(messages))) {}
  ~WatchScope() { watch_end(token_); }
  WatchScope(const WatchScope&) = delete;
  WatchScope& operator=(const WatchScope&) = delete;

 private:
  WatchToken token_;
};

// The process's watchdog thread (at most one at a time). Construction and destruction are
// collective over MPI_COMM_WORLD (a duplicate is made and freed); destroy it before
// MPI_Finalize. Requires MPI_THREAD_MULTIPLE (throws otherwise) and timeout_s > 0.
class Watchdog {
 public:
  explicit Watchdog(double timeout_s);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  double timeout_s() const { return timeout_s_; }

 private:
  void loop();

  double timeout_s_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace weft
