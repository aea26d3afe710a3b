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
#include <string>
#include <thread>

#include "weft/comm/communicator.h"
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
  if (!finalize_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
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
