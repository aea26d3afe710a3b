// Megatron's --data-args-path and --per-split-data-args-path: the data blends read from files
// instead of the command line (for lists of datasets too long for it).
#pragma once

#include <string>

#include "weft/train/trainer.h"

namespace weft {

// --data-args-path FILE: the file's whitespace-separated words are --data-path's list.
// --per-split-data-args-path FILE.json: {"train": ..., "valid": ..., "test": ...}, each a string
// of whitespace-separated words or a list of words (numbers allowed for the weights), as
// --train/valid/test-data-path; a missing or null split is not given. Either flag beside the
// lists it stands for is refused (Megatron asserts the first; it silently prefers the file for
// the second). Throws UsageError naming the flag for an unreadable or malformed file. Local.
void read_data_args_files(const std::string& data_args_path,
                          const std::string& per_split_data_args_path, TrainConfig* t);

}  // namespace weft
