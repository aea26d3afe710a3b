// Removing a directory tree, written on nftw(3) instead of std::filesystem::remove_all.
//
// Why not the standard one: PyTorch's CUDA wheels export their own copy of
// std::filesystem::remove_all from libtorch.so; a binary that links libtorch before libstdc++
// binds to that copy, and its throwing overload jumps to address 0 (seen on PyTorch 2.11 +
// CUDA 13: a SIGSEGV with pc 0 called from remove_all, in the checkpoint tests and benchmark).
// weft removes trees only through this function.
#pragma once

#include <string>

#include "weft/core/status.h"

namespace weft {

// Removes `path` and everything below it, without following symbolic links. A missing path is
// not an error; the first failure is returned (with the entry and errno text).
Status remove_tree(const std::string& path);

}  // namespace weft
