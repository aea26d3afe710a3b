// Tokenizers (Megatron's --tokenizer-type / --tokenizer-model): SentencePiece from Debian's
// libsentencepiece, wrapped; no hand-written tokenizer.
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

// type "SentencePieceTokenizer" with model = a SentencePiece .model file. Throws UsageError
// naming --tokenizer-type or --tokenizer-model for an unknown type or an unreadable model.
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

// Two identities name the same tokenizer (sha256, vocab size, special ids).
bool same_tokenizer(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace weft
