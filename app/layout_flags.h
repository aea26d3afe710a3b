// The layout flags (Megatron-Core names) shared by every `weft` subcommand that takes a layout.
#pragma once

#include <CLI/CLI.hpp>

#include "weft/mesh/mesh.h"

namespace weft::app {

// Registers --tensor-model-parallel-size ... --use-tp-pp-dp-mapping on `cmd`, writing to `cfg`.
// `cfg` must outlive parsing.
void add_layout_flags(CLI::App* cmd, LayoutConfig* cfg);

}  // namespace weft::app
