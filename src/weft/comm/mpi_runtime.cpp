// MpiRuntime: MPI start-up and tear-down for the process.
//
// Invariant: after construction MPI runs with MPI_THREAD_MULTIPLE (autograd's worker threads
// may call collectives), or the constructor has thrown; MPI is finalized exactly once, by the
// object that initialized it, so a process that initialized MPI elsewhere (a test harness, a
// host application) keeps ownership of it.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "weft/comm/communicator.h"
#include "weft/comm/mpi_runtime.h"
#include "weft/comm/watchdog.h"
#include "weft/core/error.h"

namespace weft {
namespace {

void mpi_runtime_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("MPI start-up: {} failed: {}", what, std::string(msg, len));
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) fail("MpiRuntime: MPI was already finalized in this process; it cannot restart");

  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    mpi_runtime_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided),
                      "MPI_Init_thread");
    finalize_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (finalize_) {
      MPI_Finalize();
      finalize_ = false;
    }
    fail("MpiRuntime: the MPI library provides {} but weft needs MPI_THREAD_MULTIPLE "
         "(autograd threads call collectives); use an MPI built with thread support ({})",
         thread_level_name(provided), library_version());
  }

  mpi_runtime_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  mpi_runtime_check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");

  // Processes that share memory are the ones on this host; the key keeps world order, so the
  // local rank is this process's position among them.
  MPI_Comm local = MPI_COMM_NULL;
  mpi_runtime_check(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
      "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  mpi_runtime_check(MPI_Comm_rank(local, &local_rank_), "MPI_Comm_rank(local)");
  mpi_runtime_check(MPI_Comm_size(local, &local_size_), "MPI_Comm_size(local)");
  MPI_Comm_free(&local);
  mpi_runtime_check(MPI_Comm_dup(MPI_COMM_WORLD, &errors_), "MPI_Comm_dup(errors)");
}

int MpiRuntime::threads_per_rank() const {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local_size_));
}

void MpiRuntime::start_watchdog(double timeout_s) {
  WEFT_CHECK(!watchdog_, "MpiRuntime: the watchdog was already started");
  watchdog_ = std::make_unique<Watchdog>(timeout_s);
}

MpiRuntime::~MpiRuntime() {
  watchdog_.reset();  // its thread makes MPI calls: stop it while MPI still runs
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (errors_ != MPI_COMM_NULL) MPI_Comm_free(&errors_);
  if (finalize_) MPI_Finalize();
}

int MpiRuntime::first_failure(bool failed, const std::string& message,
                              std::string* first_message) const {
  int mine = failed ? rank_ : size_, first = size_;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, errors_);
  if (first == size_) {
    if (first_message) first_message->clear();
    return -1;
  }
  // The failing rank's message, length first.
  int len = rank_ == first ? static_cast<int>(message.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, errors_);
  std::string text = rank_ == first ? message : std::string(static_cast<size_t>(len), '\0');
  MPI_Bcast(text.data(), len, MPI_CHAR, first, errors_);
  if (first_message) *first_message = text;
  return first;
}

bool MpiRuntime::all_ranks_failed_within(double seconds) const {
  if (size_ == 1) return true;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Ibarrier(errors_, &req);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;  // the request is left open:
                                                                     // the job is aborted next
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// The first line of MPI_Get_library_version, up to its first comma, trimmed: Open MPI reports
// "Open MPI v4.1.4, package: ..., repo rev: ...", and the version is what messages need.
// Callable before MPI_Init.
std::string MpiRuntime::library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(buf, &len) != MPI_SUCCESS) return "unknown MPI";
  std::string s(buf);  // NUL-terminated; len is not always counted the same way
  s = s.substr(0, s.find_first_of("\n,"));
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "unknown MPI";
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

void MpiRuntime::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this satisfies [[noreturn]]
}

}  // namespace weft
