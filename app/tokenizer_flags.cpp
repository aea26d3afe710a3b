// The tokenizer flags (tokenizer_flags.h).
#include "tokenizer_flags.h"

namespace weft::app {

void add_tokenizer_flags(CLI::App* cmd, TokenizerFiles* f) {
  auto opt = [&](const char* name, std::string& v, const char* help) {
    cmd->add_option(name, v, help)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  opt("--tokenizer-type", f->type,
      "SentencePieceTokenizer, GPTSentencePieceTokenizer or Llama2Tokenizer (--tokenizer-model "
      "M.model), GPT2BPETokenizer (--vocab-file, "
      "--merge-file), HuggingFaceTokenizer (--tokenizer-model DIR with tokenizer.json) or "
      "NullTokenizer (--vocab-size; the text is its ids)");
  opt("--tokenizer-model", f->model,
      "SentencePiece .model file, or a Hugging Face tokenizer directory");
  opt("--vocab-file", f->vocab_file, "GPT2BPETokenizer's vocab.json");
  opt("--merge-file", f->merge_file, "GPT2BPETokenizer's merges.txt");
}

bool tokenizer_given(const TokenizerFiles& f) {
  return !f.model.empty() || !f.vocab_file.empty() || !f.merge_file.empty() ||
         f.type == "NullTokenizer";
}

}  // namespace weft::app
