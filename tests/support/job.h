// Test support: runs a trainer on the first `world` ranks of MPI_COMM_WORLD (or on this rank
// alone) and returns its per-iteration stats; ranks outside the job return an empty list.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "weft/comm/process_groups.h"
#include "weft/train/trainer.h"

namespace weft::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The device the engine tests run on: WEFT_TEST_DEVICE (cpu unless set to cuda).
inline std::string test_device() {
  const char* d = std::getenv("WEFT_TEST_DEVICE");
  return d ? d : "cpu";
}

// The backend run_job builds its process groups with (MPI unless a test switches it).
inline Backend job_backend = Backend::kMpi;

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A run of the trainer on a sub-world. With `inspect`, steps are driven here and `inspect`
// runs on every member after each iteration (collectives over the job's groups allowed);
// without it, Trainer::train() runs (saving, loading and exit conditions included).
// `error`, if given, receives the message of an exception thrown by the job (every member is
// expected to throw the same); otherwise exceptions propagate.
inline std::vector<IterationStats> run_job(
    TrainConfig cfg, int world, bool self_only = false,
    const std::function<void(Trainer&, const ProcessGroups&)>& inspect = nullptr,
    std::string* error = nullptr,
    const std::function<void(Trainer&, const ProcessGroups&)>& after = nullptr) {
  MPI_Comm base = MPI_COMM_SELF;
  bool member = true;
  if (!self_only) {
    member = world_rank() < world;
    MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, world_rank(), &base);
  }
  std::vector<IterationStats> out;
  std::string message;
  if (member) {
    cfg.layout.world_size = self_only ? 1 : world;
    cfg.quiet = true;
    try {
      Mesh mesh(cfg.layout);
      ProcessGroups groups(mesh, job_backend, base);
      Trainer t(cfg, groups);
      if (inspect) {
        while (t.iteration() < cfg.train_iters) {
          out.push_back(t.train_step());
          inspect(t, groups);
        }
      } else {
        out = t.train();
      }
      if (after) after(t, groups);
    } catch (const std::exception& e) {
      if (!error) throw;
      message = e.what();
    }
    if (!self_only) MPI_Comm_free(&base);
  }
  if (error) *error = message;
  MPI_Barrier(MPI_COMM_WORLD);
  return out;
}

// A fresh directory made by rank 0 and known to every rank.
inline std::string shared_temp_dir(const std::string& tag) {
  char buf[256] = {0};
  if (world_rank() == 0) {
    std::string tmpl = "/tmp/weft-" + tag + "-XXXXXX";
    std::snprintf(buf, sizeof buf, "%s", tmpl.c_str());
    if (!mkdtemp(buf)) buf[0] = 0;
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}

}  // namespace weft::test
