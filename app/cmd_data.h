// `weft data preprocess|train-tokenizer`: corpus tools, no MPI needed.
#pragma once

#include <CLI/CLI.hpp>

namespace weft::app {

void add_data_command(CLI::App* app);

}  // namespace weft::app
