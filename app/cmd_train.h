// `weft train`: the pretraining loop under mpirun (one rank per process).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "weft/comm/mpi_runtime.h"
#include "weft/comm/process_groups.h"
#include "weft/train/trainer.h"

namespace weft::app {

// Adds the `train` subcommand. argc/argv are handed to MPI at start-up.
void add_train_command(CLI::App* app, int* argc, char*** argv);

// The train flags as other commands (plan, verify-resume) take them.
struct TrainFlags {
  TrainConfig cfg;
  int threads = 0;             // --threads
  std::string backend;         // --distributed-backend
  bool deterministic = false;  // --deterministic
  bool fused_kernels = true;   // not --no-fused-kernels
  bool global_batch_given = false;  // else default_global_batch_size once the world is known
  // What `weft train` prints as warnings (flags with no effect, Megatron's ignored ones): the
  // other commands print them too, on stderr from one rank.
  std::vector<std::string> warnings;
};
// The data-parallel size of layout l on world_size ranks, world / (tp x cp x pp); 0 where that
// does not divide (validation then names the flags).
int data_parallel_size(const LayoutConfig& l, int world_size);
// Megatron's --global-batch-size default: --micro-batch-size x data_parallel_size.
void default_global_batch_size(TrainConfig* t, int world_size);
// Megatron's sample-based training, once --global-batch-size is known: --train-iters is
// --train-samples / --global-batch-size (rounded down, as Megatron). No-op without
// --train-samples; throws UsageError when that is not one global batch.
void resolve_train_samples(TrainConfig* t);
// Registers every `weft train` flag on `c`; the returned function, called in c's callback,
// resolves them as `weft train` does before MPI starts (throws UsageError on bad input).
using ParsedTrainFlags = std::function<TrainFlags()>;
ParsedTrainFlags add_train_flags(CLI::App* c);
// Validates `t` for this world (before any collective), sets the CUDA device, deterministic
// mode and threads, and returns the backend --distributed-backend resolves to.
Backend start_runtime(const TrainConfig& t, int threads, const std::string& backend,
                      bool deterministic, MpiRuntime& mpi);
// Phase 1 of a command under mpirun: runs `check` (local, no collective) on every rank, then
// one agreement that every rank reaches. Where any rank failed, rank 0 prints that rank's one
// line ("weft: error:" for a UsageError, exit 2; "weft: fatal:" otherwise, exit 1) and every
// rank throws CLI::RuntimeError with that code: no MPI_Abort, which could kill rank 0 before
// it printed.
void check_on_every_rank(MpiRuntime& mpi, const std::function<void()>& check);

}  // namespace weft::app
