// `weft plot RUN.jsonl [more.jsonl ...] -o run.png`: training curves of one or several runs.
#pragma once

#include <CLI/CLI.hpp>

namespace weft::app {

// Adds the `plot` subcommand; its callback throws UsageError naming the file or flag on bad
// input and when gnuplot is not installed.
void add_plot_command(CLI::App* app);

}  // namespace weft::app
