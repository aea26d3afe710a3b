// The byte-level BPE tokenizers behind Megatron's --tokenizer-type GPT2BPETokenizer
// (--vocab-file vocab.json, --merge-file merges.txt) and HuggingFaceTokenizer (--tokenizer-model
// a directory with tokenizer.json and tokenizer_config.json, as transformers' AutoTokenizer
// reads it): one pipeline, text -> added tokens split out -> normaliser -> pre-tokenizer steps
// -> BPE per piece -> the post-processor's special tokens around the ids.
//
// decode writes each token's bytes, an invalid UTF-8 stretch (a character cut between tokens) as
// U+FFFD, as the reference decoders do.
//
// Invariant: encode gives the ids that the reference tokenizer gives for the same files
// (Megatron's GPT2Tokenizer for the first type, transformers' tokenizer(text).input_ids for
// the second); what weft cannot reproduce exactly is refused when the files are read, naming
// the file and key, never approximated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/data/bpe_model.h"
#include "weft/data/tokenizer.h"
#include "weft/data/unicode_text.h"

namespace weft {

// One pre-tokenizer step, applied to every piece the steps before it produced.
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  // How a split keeps the pattern's matches (tokenizer.json's "behavior").
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext };
  Kind kind = Kind::kSplit;
  Behavior behavior = Behavior::kIsolated;
  std::shared_ptr<UnicodeRegex> regex;  // kSplit; kByteLevel with use_regex: GPT-2's pattern
  bool add_prefix_space = false;        // kByteLevel: " " before a piece not starting with one
};

// A token matched in the raw text before anything else (tokenizer.json's added_tokens).
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool lstrip = false, rstrip = false;  // also swallow the (Unicode) white space on that side
};

struct BpePipeline {
  std::shared_ptr<const BpeModel> model;
  bool nfc = false;  // normaliser: Unicode NFC
  std::vector<PreTokenizerStep> pre;
  std::vector<AddedToken> added;
  std::vector<int32_t> prefix, suffix;  // the post-processor's ids around each text
  int32_t eod = -1, bos = -1, pad = -1;
  nlohmann::json identity;  // Tokenizer::identity(); vocab_size is filled in by the tokenizer
};

// GPT-2's pre-tokenizer pattern (its encoder's, and tokenizer.json's ByteLevel use_regex).
extern const char* const kGpt2SplitPattern;

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpePipeline pipeline);

// Megatron's GPT2BPETokenizer: vocab.json and merges.txt, GPT-2's pattern, eod
// "<|endoftext|>". "<|endoftext|>" in a text is that token, as Megatron's default system
// (transformers' GPT-2 tokenizer on the files) reads it; with `legacy` (--legacy-tokenizer) it
// is text, as Megatron's legacy GPT2Tokenizer (special_tokens=[]) reads it. Throws UsageError
// naming --vocab-file or --merge-file.
std::unique_ptr<Tokenizer> load_gpt2_bpe_tokenizer(const std::string& vocab_file,
                                                   const std::string& merge_file, bool legacy,
                                                   const std::vector<std::string>& extra_special_tokens = {});

// Megatron's additional_special_tokens (--tokenizer-special-tokens) added to `p` as transformers'
// add_special_tokens hands them to the tokenizers library's AddedVocabulary, in order, each a
// special token without lstrip/rstrip: an added token keeps its id and takes those flags; a token
// of the model's vocabulary keeps its id and is split out of the raw text from then on; a new one
// takes `model_vocab_size` (the number of vocabulary entries), or the largest added id + 1 where
// that is larger. An empty token is refused naming the flag. The caller records the list in the
// tokenizer's identity.
void add_special_tokens(BpePipeline* p, int64_t model_vocab_size,
                        const std::vector<std::string>& extra);

// Megatron's HuggingFaceTokenizer from a local directory (or its tokenizer.json): eod is
// tokenizer_config.json's eos_token (else special_tokens_map.json's), bos and pad likewise.
// include_special_tokens: the post-processor's special tokens around each text (Megatron's
// --tokenizer-hf-include-special-tokens: transformers' tokenizer(text).input_ids); else the
// text's tokens alone (its tokenize + convert_tokens_to_ids). extra_special_tokens
// (--tokenizer-special-tokens): Megatron's additional_special_tokens, added in order as
// transformers' add_special_tokens adds them: a token already added keeps its id, one of the
// vocabulary keeps its id and is matched in the raw text from then on, a new one takes the next
// id after the vocabulary and the added tokens. Throws UsageError naming --tokenizer-model, the
// file and the key it cannot use.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, bool include_special_tokens,
                                             const std::vector<std::string>& extra_special_tokens = {});

}  // namespace weft
