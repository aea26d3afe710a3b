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
  cmd->add_flag("--tokenizer-hf-include-special-tokens", f->hf_include_special_tokens,
                "HuggingFaceTokenizer: the post-processor's special tokens (Llama 3's BOS) around "
                "each text, as transformers' tokenizer(text); default: the text's tokens alone");
  cmd->add_flag("--legacy-tokenizer", f->legacy,
                "Megatron's legacy tokenizer classes: SentencePieceTokenizer with <CLS> <SEP> "
                "<EOD> <MASK> appended (eod <EOD>), Llama2Tokenizer with bos first, "
                "HuggingFaceTokenizer with the post-processor's specials");
  // Accepted for Megatron's scripts; they change nothing weft computes.
  static bool use_fast = false, trust_remote_code = false;
  cmd->add_flag("--tokenizer-hf-use-fast", use_fast,
                "accepted: weft encodes as transformers' fast tokenizer does");
  cmd->add_flag("--trust-remote-code", trust_remote_code,
                "accepted: weft runs no code from a tokenizer directory (it reads tokenizer.json)");
}

bool tokenizer_given(const TokenizerFiles& f) {
  return !f.model.empty() || !f.vocab_file.empty() || !f.merge_file.empty() ||
         f.type == "NullTokenizer";
}

}  // namespace weft::app
