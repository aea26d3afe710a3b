// `weft train`: the pretraining loop under mpirun (one rank per process).
#pragma once

#include <CLI/CLI.hpp>

namespace weft::app {

// Adds the `train` subcommand. argc/argv are handed to MPI at start-up.
void add_train_command(CLI::App* app, int* argc, char*** argv);

}  // namespace weft::app
