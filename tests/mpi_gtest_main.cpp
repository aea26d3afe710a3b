// main() for multi-rank GoogleTest binaries: starts MPI, gives each rank one intra-op thread
// (ranks outnumber cores in CI), runs the tests, and makes the job fail if any rank failed.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <execinfo.h>
#include <mpi.h>
#include <unistd.h>

#include <csignal>

#include <cstdlib>
#include <string>

#include "weft/comm/communicator.h"
#include "weft/comm/device.h"
#include "weft/core/error.h"

namespace {
// Prints the stack of a crashing test rank (symbol names need -rdynamic, set for tests).
void on_crash(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGSEGV, on_crash);
  std::signal(SIGABRT, on_crash);
  weft::MpiRuntime mpi(&argc, &argv);
  weft::set_error_rank(mpi.world_rank());
  at::set_num_threads(1);
  // WEFT_TEST_DEVICE=cuda runs the engine tests on CUDA (ranks share the GPUs round-robin).
  if (const char* d = std::getenv("WEFT_TEST_DEVICE"); d && std::string(d) == "cuda") {
    weft::set_deterministic_mode();
    weft::set_cuda_device(mpi.local_rank());
  }
  ::testing::InitGoogleTest(&argc, argv);
  int local_fail = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_fail = 0;
  MPI_Allreduce(&local_fail, &any_fail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_fail;
}
