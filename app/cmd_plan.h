// `weft plan --world-size N <train flags> [--mfu 0.4] [--peak-tflops 989] [--json]`: the memory
// per rank, checkpoint size and step time of a training config, without starting MPI.
#pragma once

#include <CLI/CLI.hpp>

namespace weft::app {

void add_plan_command(CLI::App* app);

}  // namespace weft::app
