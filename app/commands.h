// Subcommands other than `mesh` (train, ckpt ...), registered in one place.
#pragma once

#include <CLI/CLI.hpp>

namespace weft::app {

// Registers every subcommand that needs the runtime (MPI, torch). argc/argv are given to
// commands that start MPI.
void add_more_commands(CLI::App* app, int argc, char** argv);

}  // namespace weft::app
