// `weft mesh`: prints every rank's coordinates and groups for a layout (table or --json).
#pragma once

#include <CLI/CLI.hpp>

namespace weft::app {

// Adds the `mesh` subcommand to `app`; its callback runs the command and throws UsageError
// on an invalid layout.
void add_mesh_command(CLI::App* app);

}  // namespace weft::app
