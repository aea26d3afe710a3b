// Tokenizers behind Megatron's --tokenizer-type names: SentencePieceTokenizer,
// GPTSentencePieceTokenizer and Llama2Tokenizer (Debian's libsentencepiece, wrapped, with
// Megatron's special tokens), GPT2BPETokenizer and HuggingFaceTokenizer (byte-level BPE,
// bpe_tokenizer.h), and NullTokenizer (the text is its ids).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace weft {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const = 0;   // end of document (SentencePiece: eos, else pad)
  virtual int32_t bos() const = 0;   // -1 when the model has none
  virtual int32_t pad() const = 0;   // -1 when the model has none
  // What the checkpoint records: {"type", "model_file" (basename), "sha256" of the model
  // file, "vocab_size", "eod", "bos", "pad"}.
  virtual nlohmann::json identity() const = 0;
};

// What the tokenizer flags name (Megatron's).
struct TokenizerFiles {
  std::string type;        // --tokenizer-type
  std::string model;       // --tokenizer-model: a SentencePiece .model, or a Hugging Face directory
  std::string vocab_file;  // --vocab-file (GPT2BPETokenizer's vocab.json)
  std::string merge_file;  // --merge-file (GPT2BPETokenizer's merges.txt)
  int64_t vocab_size = -1; // --vocab-size (NullTokenizer: ids 0..V-1; TikTokenizer: ids)
  // NullTokenizer: --null-tokenizer-eod-id (-1: V - 1) and --null-tokenizer-pad-id (-1: none).
  int64_t null_eod_id = -1;
  int64_t null_pad_id = -1;
  // TikTokenizer (tiktoken_tokenizer.h): --tiktoken-pattern (v1 or v2; "" is v2),
  // --tiktoken-num-special-tokens, --tokenizer-special-tokens (empty: Megatron's defaults).
  // HuggingFaceTokenizer and GPT2BPETokenizer: --tokenizer-special-tokens are additional special
  // tokens (add_special_tokens in bpe_tokenizer.h).
  std::string tiktoken_pattern;
  int64_t tiktoken_num_special_tokens = 1000;
  std::vector<std::string> special_tokens;
  // HuggingFaceTokenizer: the post-processor's special tokens (Llama 3's BOS) around each text, as
  // Megatron's default since February 2026 (and its --legacy-tokenizer, which always adds them);
  // false (--tokenizer-hf-no-include-special-tokens, Megatron's default before): a text is its
  // tokens alone. hf_special_tokens_flag: one of the two flags was given.
  bool hf_include_special_tokens = true;
  bool hf_special_tokens_flag = false;
  // --legacy-tokenizer: Megatron's legacy tokenizer classes, where the three SentencePiece types
  // differ (see make_tokenizer); Megatron's default system encodes all three alike.
  bool legacy = false;
};

// The tokenizer the flags name:
//   SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer
//                           --tokenizer-model M.model: the pieces; eod the eos (Megatron's
//                           default tokenizer system). With legacy (--legacy-tokenizer), as
//                           Megatron's legacy classes: SentencePieceTokenizer appends <CLS> <SEP>
//                           <EOD> <MASK> (and the pad, bos, eos pieces, where missing) to the
//                           pieces, eod <EOD>, those specials in a text their ids;
//                           Llama2Tokenizer starts every text with bos
//   GPT2BPETokenizer        --vocab-file vocab.json --merge-file merges.txt (eod <|endoftext|>)
//   HuggingFaceTokenizer    --tokenizer-model DIR (tokenizer.json; eod = its eos_token); the
//                           post-processor's specials only with hf_include_special_tokens
//   TikTokenizer            --tokenizer-model VOCAB.json (Megatron's tiktoken form), with
//                           --tiktoken-pattern, --tiktoken-num-special-tokens,
//                           --tokenizer-special-tokens and --vocab-size (default 2^17 ids);
//                           eod </s> (tiktoken_tokenizer.h)
//   NullTokenizer           --vocab-size V: the text is its ids written in decimal, separated
//                           by single spaces; V ids, eod null_eod_id (default V - 1), pad
//                           null_pad_id (Megatron's current class), or with legacy V + 1 ids,
//                           eod V, no pad (its legacy class)
// Throws UsageError naming the flag for an unknown type, a missing file or flag, or a file
// that is not what the type reads.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerFiles& files);
// make_tokenizer({type, model}).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model);

// SentencePiece's trainer (BPE, byte fallback off, ids unk 0 / bos 1 / eos 2 / pad 3, identity
// normalisation, fixed sampling seed): builds OUTPUT_PREFIX.model and .vocab from one sentence
// per line of `text_file`, written under OUTPUT_PREFIX.tmp.* and renamed. Equal inputs give
// equal model files. Throws UsageError naming the flag on bad arguments, and when weft was
// built without SentencePiece (as make_tokenizer does). `input_name`: the file a message names
// as --input (the user's file where `text_file` is text extracted from it); "": text_file.
void train_sentencepiece(const std::string& text_file, int64_t vocab_size,
                         const std::string& output_prefix, int threads,
                         const std::string& input_name = "");

// Two identities name the same tokenizer (sha256, vocab size, special ids) read the same way
// (legacy, include_special_tokens, TikTokenizer's pattern and special tokens).
bool same_tokenizer(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace weft
