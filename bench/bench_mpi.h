// Helpers the MPI benchmarks share: every rank in step, times barrier to barrier (the slowest
// rank's), sums over ranks, and one main() (MPI, error rank, threads per rank, errors to exit 2).
#pragma once

#include <ATen/Parallel.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <exception>

#include "weft/comm/mpi_runtime.h"
#include "weft/core/error.h"

namespace weft::bench {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

inline double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

inline int64_t sum_over_ranks(int64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

// Seconds of `fn` from a barrier to a barrier: the slowest rank's time.
template <class Fn>
double timed(Fn&& fn) {
  barrier();
  const double t0 = MPI_Wtime();
  fn();
  barrier();
  return max_over_ranks(MPI_Wtime() - t0);
}


// main() of an MPI benchmark: starts MPI, gives each rank its fair share of intra-op threads
// (ranks share the cores, DESIGN.md), runs `run`; an error ends the job with exit 2 (one line
// naming the benchmark and the rank).
template <class Run>
int bench_main(int argc, char** argv, const char* name, Run&& run) {
  MpiRuntime mpi(&argc, &argv);
  set_error_rank(mpi.world_rank());
  at::set_num_threads(mpi.threads_per_rank());
  try {
    return run(argc, argv, mpi);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", name, mpi.world_rank(), e.what());
    MpiRuntime::abort(2);
  }
  return 2;
}

}  // namespace weft::bench
