// Test helper: runs a trainer on the first `world` ranks of MPI_COMM_WORLD (or on this rank
// alone) and returns its per-iteration stats; ranks outside the job return an empty list.
#pragma once

#include <mpi.h>

#include <functional>
#include <vector>

#include "weft/train/trainer.h"

namespace weft::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// `inspect`, if given, runs on every member after each iteration (collective allowed over the
// job's groups).
inline std::vector<IterationStats> run_job(
    TrainConfig cfg, int world, bool self_only = false,
    const std::function<void(Trainer&, const ProcessGroups&)>& inspect = nullptr) {
  MPI_Comm base = MPI_COMM_SELF;
  bool member = true;
  if (!self_only) {
    member = world_rank() < world;
    MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, world_rank(), &base);
  }
  std::vector<IterationStats> out;
  if (member) {
    cfg.layout.world_size = self_only ? 1 : world;
    cfg.quiet = true;
    Mesh mesh(cfg.layout);
    {
      ProcessGroups groups(mesh, Backend::kMpi, base);
      Trainer t(cfg, groups);
      while (t.iteration() < cfg.train_iters) {
        out.push_back(t.train_step());
        if (inspect) inspect(t, groups);
      }
    }
    if (!self_only) MPI_Comm_free(&base);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return out;
}

}  // namespace weft::test
