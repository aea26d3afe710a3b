// main() for multi-rank GoogleTest binaries: starts MPI, gives each rank one intra-op thread
// (ranks outnumber cores in CI), runs the tests, and makes the job fail if any rank failed.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <ucontext.h>
#include <mpi.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include <cstdlib>
#include <string>

#include "weft/comm/communicator.h"
#include "weft/comm/device.h"
#include "weft/comm/mpi_runtime.h"
#include "weft/core/error.h"

namespace {
void print_symbol(const char* what, const void* addr) {
  Dl_info info{};
  const char* sym = dladdr(addr, &info) && info.dli_sname ? info.dli_sname : "?";
  const char* obj = info.dli_fname ? info.dli_fname : "?";
  std::fprintf(stderr, "  %s %p = %s in %s\n", what, addr, sym, obj);
}

// Prints the stack of a crashing test rank (symbol names need -rdynamic, set for tests), the
// running test, the faulting address and program counter; when the program counter is 0 (a
// call through a null function pointer, where backtrace() finds nothing) also the caller, read
// from the return address on top of the stack.
void on_crash(int sig, siginfo_t* info, void* ctx) {
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::fprintf(stderr, "weft test: signal %d in %s.%s, fault address %p\n", sig,
               test ? test->test_suite_name() : "?", test ? test->name() : "?",
               info ? info->si_addr : nullptr);
#if defined(__x86_64__)
  if (ctx) {
    const auto* uc = static_cast<const ucontext_t*>(ctx);
    const auto pc = reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]);
    print_symbol("pc", pc);
    if (pc == nullptr) {
      const auto* sp = reinterpret_cast<void* const*>(uc->uc_mcontext.gregs[REG_RSP]);
      print_symbol("called from", sp[0]);
    }
  }
#else
  (void)ctx;
#endif
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_sigaction = on_crash;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGABRT, &sa, nullptr);
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
