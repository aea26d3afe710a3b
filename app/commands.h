// Every subcommand of `weft` (mesh, train, ckpt, data, generate, plan, verify-resume, plot),
// registered in one place, in the order `weft --help` lists them.
#pragma once

#include <CLI/CLI.hpp>

namespace weft::app {

// Registers every subcommand on `app`. argc/argv are kept for the commands that start MPI
// (train, verify-resume): argv must outlive app.parse() (main's does).
void add_subcommands(CLI::App* app, int argc, char** argv);

}  // namespace weft::app
