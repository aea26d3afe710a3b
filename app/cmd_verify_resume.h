// `weft verify-resume`: a straight run against a save + restart (optionally on another layout)
// of the same training flags, compared iteration by iteration and checkpoint by checkpoint.
#pragma once

#include <CLI/CLI.hpp>

namespace weft::app {

// Adds the `verify-resume` subcommand (launched under mpirun like `weft train`). argc/argv are
// handed to MPI at start-up.
void add_verify_resume_command(CLI::App* app, int* argc, char*** argv);

}  // namespace weft::app
