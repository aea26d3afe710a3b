// `weft ckpt inspect|verify|diff`: tools over checkpoint directories, no MPI needed.
#pragma once

#include <CLI/CLI.hpp>

namespace weft::app {

void add_ckpt_command(CLI::App* app);

}  // namespace weft::app
