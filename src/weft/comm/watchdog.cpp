// The collective watchdog (see watchdog.h): the registry of groups and active operations, the
// watchdog thread, and the query protocol that names the ranks a stalled operation waits for.
//
// Protocol on the watchdog's own communicator (a duplicate of MPI_COMM_WORLD): a Query {group
// id, querier's group rank} with tag kQueryTag, answered by the peer's watchdog thread with a
// Reply {its counters for that group, one line on what it is doing} with tag kReplyTag. The
// querier posts its receive before its query, so a reply always has a receive waiting for it.
// Every MPI call on that communicator is made by the watchdog thread.
#include "weft/comm/watchdog.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>

#include "weft/comm/comm_checks.h"
#include "weft/core/error.h"
#include "weft/core/hash.h"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kQueryTag = 1;
constexpr int kReplyTag = 2;

struct ActiveOp {
  WatchedGroup* group;
  const char* op;
  uint64_t seq;
  std::vector<WatchMessage> messages;
  std::function<bool()> done;
  Clock::time_point start;
};

// Process-wide; never destroyed (communicators may be torn down during static destruction).
struct Registry {
  std::mutex mu;
  std::vector<WatchedGroup*> groups;
  std::map<uint64_t, int> instances;     // identity without the instance number -> groups made
  std::map<WatchToken, ActiveOp> active;  // token order is start order
  WatchToken next_token = 1;
  std::atomic<bool> running{false};
};

Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// "all_reduce #12", "recv #3 from rank 1", "batch_p2p (send #4 to rank 2, recv #4 from rank 0)".
// Ranks are world ranks; message numbers count from 1.
std::string describe(const ActiveOp& a) {
  if (a.messages.empty()) return fmt::format("{} #{}", a.op, a.seq);
  std::vector<std::string> parts;
  for (const WatchMessage& m : a.messages)
    parts.push_back(fmt::format("{} #{} {} rank {}", m.send ? "send" : "recv", m.index + 1,
                                m.send ? "to" : "from", a.group->world_members()[m.peer]));
  if (parts.size() == 1 && (std::strcmp(a.op, "send") == 0 || std::strcmp(a.op, "recv") == 0))
    return parts[0];
  return fmt::format("{} ({})", a.op, fmt::join(parts, ", "));
}

// The oldest active operation that has not finished (caller holds the registry lock).
const ActiveOp* oldest_pending(Registry& r) {
  for (const auto& [token, a] : r.active)
    if (!a.done || !a.done()) return &a;
  return nullptr;
}

struct Query {
  uint64_t group;
  int32_t querier;  // the querier's group rank
  int32_t unused;
};

struct Reply {
  uint64_t group;
  uint64_t collectives;
  uint64_t sends_to_querier;
  uint64_t recvs_from_querier;
  int32_t known;  // 0: this rank has no such group
  char doing[228];
};

Reply answer(const Query& q) {
  Registry& r = registry();
  Reply a{};
  a.group = q.group;
  std::lock_guard<std::mutex> lock(r.mu);
  for (WatchedGroup* g : r.groups) {
    if (g->id() != q.group) continue;
    a.known = 1;
    a.collectives = g->collectives();
    if (q.querier >= 0 && q.querier < static_cast<int>(g->world_members().size())) {
      a.sends_to_querier = g->sends_to(q.querier);
      a.recvs_from_querier = g->recvs_from(q.querier);
    }
    break;
  }
  std::string doing = "not in a communication call";
  if (const ActiveOp* op = oldest_pending(r))
    doing = fmt::format("in {} on group '{}' for {:.1f} s", describe(*op), op->group->name(),
                        seconds_since(op->start));
  std::snprintf(a.doing, sizeof a.doing, "%s", doing.c_str());
  return a;
}

// What the watchdog thread knows about the operation it found stalled (copied under the lock).
struct Stall {
  uint64_t group_id;
  std::string group_name;
  std::vector<int> world;
  int rank;
  uint64_t seq;
  std::vector<WatchMessage> messages;
  std::string what;
  double waited_s;
};

// The serving half of the protocol: one receive always posted for queries, and the replies in
// flight (their buffers live until they complete).
class Server {
 public:
  explicit Server(MPI_Comm comm) : comm_(comm) { post(); }

  void serve() {
    for (;;) {
      int flag = 0;
      if (MPI_Test(&req_, &flag, &status_) != MPI_SUCCESS || !flag) break;
      auto reply = std::make_unique<Reply>(answer(query_));
      MPI_Request out = MPI_REQUEST_NULL;
      MPI_Isend(reply.get(), sizeof(Reply), MPI_BYTE, status_.MPI_SOURCE, kReplyTag, comm_, &out);
      replies_.emplace_back(out, std::move(reply));
      post();
    }
    for (auto it = replies_.begin(); it != replies_.end();) {
      int flag = 0;
      MPI_Test(&it->first, &flag, MPI_STATUS_IGNORE);
      it = flag ? replies_.erase(it) : std::next(it);
    }
  }

  // Cancels the posted receive; replies still in flight are released to MPI (their buffers are
  // leaked on purpose: MPI may still read them).
  void shutdown() {
    MPI_Cancel(&req_);
    MPI_Wait(&req_, MPI_STATUS_IGNORE);
    for (auto& [req, buf] : replies_) {
      int flag = 0;
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        MPI_Request_free(&req);
        buf.release();
      }
    }
    replies_.clear();
  }

 private:
  void post() {
    MPI_Irecv(&query_, sizeof(Query), MPI_BYTE, MPI_ANY_SOURCE, kQueryTag, comm_, &req_);
  }

  MPI_Comm comm_;
  Query query_{};
  MPI_Request req_ = MPI_REQUEST_NULL;
  MPI_Status status_{};
  std::list<std::pair<MPI_Request, std::unique_ptr<Reply>>> replies_;
};

// Asks the ranks `s` waits for whether they reached it; returns the "missing: ..." clause.
std::string find_missing(const Stall& s, MPI_Comm comm, Server& server, double grace_s,
                         double tick_s) {
  std::vector<int> targets;  // group ranks
  if (s.messages.empty()) {
    for (int i = 0; i < static_cast<int>(s.world.size()); ++i)
      if (i != s.rank) targets.push_back(i);
  } else {
    for (const WatchMessage& m : s.messages)
      if (m.peer != s.rank && std::find(targets.begin(), targets.end(), m.peer) == targets.end())
        targets.push_back(m.peer);
  }
  const size_t n = targets.size();
  std::vector<Query> queries(n, Query{s.group_id, s.rank, 0});
  std::vector<Reply> replies(n);
  std::vector<MPI_Request> sends(n, MPI_REQUEST_NULL), recvs(n, MPI_REQUEST_NULL);
  std::vector<bool> answered(n, false);
  for (size_t i = 0; i < n; ++i) {
    const int w = s.world[targets[i]];
    MPI_Irecv(&replies[i], sizeof(Reply), MPI_BYTE, w, kReplyTag, comm, &recvs[i]);
    MPI_Isend(&queries[i], sizeof(Query), MPI_BYTE, w, kQueryTag, comm, &sends[i]);
  }
  const auto start = Clock::now();
  size_t left = n;
  while (left > 0 && seconds_since(start) < grace_s) {
    server.serve();  // peers that stalled too are asking us at the same time
    for (size_t i = 0; i < n; ++i) {
      if (answered[i]) continue;
      int flag = 0;
      if (MPI_Test(&recvs[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
        answered[i] = true;
        --left;
      }
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(tick_s));
  }
  // The requests of peers that never answered stay posted: the job is aborted next.

  std::vector<std::string> missing, reached;
  for (size_t i = 0; i < n; ++i) {
    const int p = targets[i];
    const int w = s.world[p];
    const Reply& r = replies[i];
    if (!answered[i]) {
      missing.push_back(fmt::format("rank {} (no answer within {:.1f} s: stopped, dead, or hung "
                                    "so that its watchdog cannot run)", w, grace_s));
      continue;
    }
    const std::string doing(r.doing, strnlen(r.doing, sizeof r.doing));
    if (reached.size() < 4) reached.push_back(fmt::format("rank {} {}", w, doing));
    if (!r.known) {
      missing.push_back(fmt::format("rank {} (has no group '{}' with these members; {})", w,
                                    s.group_name, doing));
    } else if (s.messages.empty()) {
      if (r.collectives < s.seq)
        missing.push_back(fmt::format("rank {} (has entered {} of these {} collectives; {})", w,
                                      r.collectives, s.seq, doing));
    } else {
      // A message of ours is matched once the peer has posted its counterpart.
      uint64_t need_sends = 0, need_recvs = 0;  // counterparts the peer must have posted
      for (const WatchMessage& m : s.messages) {
        if (m.peer != p) continue;
        if (m.send) need_recvs = std::max(need_recvs, m.index + 1);
        else need_sends = std::max(need_sends, m.index + 1);
      }
      if (r.sends_to_querier < need_sends || r.recvs_from_querier < need_recvs)
        missing.push_back(fmt::format("rank {} (has posted {} sends to and {} receives from rank "
                                      "{}; {})", w, r.sends_to_querier, r.recvs_from_querier,
                                      s.world[s.rank], doing));
    }
  }
  // Open MPI resumes a stopped rank (SIGCONT) while it aborts the job, so a peer stopped when it
  // was asked may still answer here, after another rank's watchdog has begun the abort.
  if (missing.empty())
    return fmt::format("no member is missing: every member answered and has reached it ({}{}); "
                       "a network or MPI failure, or a stopped rank just resumed?",
                       fmt::join(reached, "; "), n > reached.size() ? "; ..." : "");
  return fmt::format("missing: {}", fmt::join(missing, "; "));
}

// Calls every group's abort hook (ncclCommAbort) on a helper thread, waiting at most `limit_s`:
// a hook that itself hangs must not keep the job from being aborted.
void run_abort_hooks(double limit_s) {
  std::vector<std::function<void()>> hooks;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (WatchedGroup* g : r.groups)
      if (g->hooks().abort) hooks.push_back(g->hooks().abort);
  }
  if (hooks.empty()) return;
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread([hooks, finished] {
    for (const auto& h : hooks) h();
    *finished = true;
  }).detach();
  const auto start = Clock::now();
  while (!*finished && seconds_since(start) < limit_s)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

[[noreturn]] void fire(const std::string& what) {
  run_abort_hooks(10.0);
  comm_abort(what);
}

}  // namespace

// ---- WatchedGroup ----------------------------------------------------------------------------

WatchedGroup::WatchedGroup(std::string name, MPI_Comm comm, WatchHooks hooks)
    : name_(std::move(name)), hooks_(std::move(hooks)) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> local(static_cast<size_t>(n));
  std::iota(local.begin(), local.end(), 0);
  world_.assign(static_cast<size_t>(n), MPI_UNDEFINED);
  MPI_Group_translate_ranks(group, n, local.data(), world, world_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  MPI_Comm_rank(comm, &rank_);
  sends_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(n));
  recvs_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) sends_[i] = 0, recvs_[i] = 0;

  uint64_t h = fnv1a64(kFnv1a64Offset, name_.data(), name_.size());
  h = fnv1a64(h, world_.data(), world_.size() * sizeof(int));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const int instance = r.instances[h]++;
  id_ = fnv1a64(h, &instance, sizeof instance);
  r.groups.push_back(this);
}

WatchedGroup::~WatchedGroup() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.groups.erase(std::remove(r.groups.begin(), r.groups.end(), this), r.groups.end());
  for (auto it = r.active.begin(); it != r.active.end();)
    it = it->second.group == this ? r.active.erase(it) : std::next(it);
}

// ---- active operations -----------------------------------------------------------------------

WatchToken watch_begin(WatchedGroup& group, const char* op, uint64_t seq,
                       std::vector<WatchMessage> messages, std::function<bool()> done) {
  Registry& r = registry();
  if (!r.running.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(r.mu);
  const WatchToken t = r.next_token++;
  r.active.emplace(t, ActiveOp{&group, op, seq, std::move(messages), std::move(done), Clock::now()});
  return t;
}

void watch_end(WatchToken token) {
  if (token == 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.active.erase(token);
}

// ---- Watchdog --------------------------------------------------------------------------------

Watchdog::Watchdog(double timeout_s) : timeout_s_(timeout_s) {
  if (!(timeout_s > 0)) fail("Watchdog: the timeout must be > 0 seconds (got {})", timeout_s);
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    fail("Watchdog: MPI runs below MPI_THREAD_MULTIPLE; the watchdog thread calls MPI while "
         "other threads are inside collectives");
  if (registry().running.exchange(true)) fail("Watchdog: one is already running in this process");
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // a dead peer must not abort us silently
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  registry().running = false;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void Watchdog::loop() {
  // Ticks short against the timeout (tests use seconds), at most 0.1 s: one MPI_Test and a
  // look at the active list per tick. The grace period bounds the wait for peers' answers.
  const double tick_s = std::min(0.1, timeout_s_ / 20);
  const double grace_s = std::clamp(timeout_s_ / 4, 1.0, 10.0);
  Registry& r = registry();
  Server server(comm_);
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::duration<double>(tick_s));
    server.serve();
    std::string async_failure;
    std::optional<Stall> stall;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      for (WatchedGroup* g : r.groups) {
        if (!g->hooks().async_error) continue;
        std::string e = g->hooks().async_error();
        if (!e.empty()) {
          async_failure = fmt::format("watchdog: group '{}' (ranks {}): {}", g->name(),
                                      fmt::join(g->world_members(), ","), e);
          break;
        }
      }
      if (async_failure.empty()) {
        for (const auto& [token, a] : r.active) {
          if (seconds_since(a.start) < timeout_s_) break;  // later entries started later
          if (a.done && a.done()) continue;
          stall = Stall{a.group->id(), a.group->name(), a.group->world_members(), a.group->rank(),
                        a.seq, a.messages, describe(a), seconds_since(a.start)};
          break;
        }
      }
    }
    if (!async_failure.empty()) fire(async_failure);
    if (!stall) continue;
    const std::string missing = find_missing(*stall, comm_, server, grace_s, tick_s);
    fire(fmt::format("watchdog: {} on group '{}' (ranks {}) has waited {:.1f} s, longer than "
                     "--distributed-timeout-minutes {:g}; {}",
                     stall->what, stall->group_name, fmt::join(stall->world, ","),
                     stall->waited_s, timeout_s_ / 60, missing));
  }
  server.shutdown();
}

}  // namespace weft
