// `weft ckpt inspect|verify|diff`: tools over checkpoint directories, no MPI needed.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace weft::app {

void add_ckpt_command(CLI::App* app);

// Key-by-key comparison of two checkpoints (save directories or iter_NNNNNNN directories): one
// line per key that is missing on one side or differs (bitwise when rtol == atol == 0, else
// allclose; atol < 0: atol = rtol * the key's largest magnitude). Throws UsageError when one
// cannot be opened.
std::vector<std::string> ckpt_differences(const std::string& a, const std::string& b, double rtol,
                                          double atol);

}  // namespace weft::app
