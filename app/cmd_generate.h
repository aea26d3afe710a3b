// `weft generate`: text from a checkpoint of any layout, in one process (no MPI).
#pragma once

#include <CLI/CLI.hpp>

namespace weft::app {

// Adds the `generate` subcommand; its callback throws UsageError (exit 2) on bad input.
void add_generate_command(CLI::App* app);

}  // namespace weft::app
