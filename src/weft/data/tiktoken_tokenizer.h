// Megatron's --tokenizer-type TikTokenizer (the tokenizer of NVIDIA's Nemotron recipes): a
// tiktoken vocabulary in Megatron's JSON form (a list of {"rank", "token_bytes" (base64),
// "token_str"}, rank i at index i, ranks 0-255 the single bytes), the split pattern v1 or v2
// (--tiktoken-pattern), and --tiktoken-num-special-tokens ids in front of the vocabulary: the
// special tokens (--tokenizer-special-tokens, default <unk> <s> </s> <mask> <pad> <cls> <sep>)
// then "<SPECIAL_i>" fillers; token rank r has id r + num_special_tokens, and the vocabulary is
// cut to --vocab-size (default 2^17) ids in all. The eod is </s>.
//
// Encoding is tiktoken's: the text's special tokens are matched first (Megatron's default
// tokenizer system encodes with allowed_special="all"; --legacy-tokenizer, its legacy class,
// encodes them as text and knows only <unk> <s> </s>); where two special tokens start at the
// same place (one a prefix of the other, possible only with --tokenizer-special-tokens) weft
// takes the longer, while tiktoken's choice follows its hash map's order; each stretch between them is split by
// the pattern (text the pattern does not match is dropped, as tiktoken drops it), a piece that
// is a token is that token, and any other piece is merged byte pair by byte pair, the pair
// whose bytes have the lowest rank first (the leftmost of equal ranks). The merge is written
// here (rather than linking tiktoken, a Rust library no Debian package carries) with a heap, in
// O(n log n) for a piece of n bytes, giving tiktoken's result.
//
// Invariant: encode gives the ids that Megatron's TikTokenizer gives for the same file and
// flags; decode writes the tokens' bytes (an invalid UTF-8 stretch as U+FFFD, as tiktoken's
// decode with errors="replace").
#pragma once

#include <memory>

#include "weft/data/tokenizer.h"

namespace weft {

// Throws UsageError naming the flag or the file (its entry) for a file that is not Megatron's
// tiktoken JSON, a pattern other than v1/v2, or special tokens that do not fit.
std::unique_ptr<Tokenizer> load_tiktoken_tokenizer(const TokenizerFiles& files);

}  // namespace weft
