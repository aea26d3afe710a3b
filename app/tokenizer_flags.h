// The tokenizer flags (Megatron's names) shared by `weft train`, `weft data preprocess` and
// `weft generate`: --tokenizer-type, --tokenizer-model, --vocab-file, --merge-file, and
// TikTokenizer's --tiktoken-pattern, --tiktoken-num-special-tokens, --tokenizer-special-tokens.
#pragma once

#include <CLI/CLI.hpp>

#include "weft/data/tokenizer.h"

namespace weft::app {

// Registers the flags on `cmd`, writing to `files` (which must outlive parsing). --vocab-size
// (NullTokenizer's V, TikTokenizer's ids) is registered by each command, since `weft train`
// reads it as the model's.
void add_tokenizer_flags(CLI::App* cmd, TokenizerFiles* files);

// True when the flags name a tokenizer to load (a type with its files, or NullTokenizer).
bool tokenizer_given(const TokenizerFiles& files);

}  // namespace weft::app
