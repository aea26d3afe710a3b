// The tokenizer flags (tokenizer_flags.h).
#include "tokenizer_flags.h"

#include "weft/core/error.h"

namespace weft::app {

void add_tokenizer_flags(CLI::App* cmd, TokenizerFiles* f) {
  auto opt = [&](const char* name, std::string& v, const char* help) {
    cmd->add_option(name, v, help)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  opt("--tokenizer-type", f->type,
      "SentencePieceTokenizer, GPTSentencePieceTokenizer or Llama2Tokenizer (--tokenizer-model "
      "M.model), GPT2BPETokenizer (--vocab-file, "
      "--merge-file), HuggingFaceTokenizer (--tokenizer-model DIR with tokenizer.json), "
      "TikTokenizer (--tokenizer-model VOCAB.json, Megatron's tiktoken form) or NullTokenizer "
      "(--vocab-size; the text is its ids)");
  opt("--tokenizer-model", f->model,
      "SentencePiece .model file, or a Hugging Face tokenizer directory");
  opt("--vocab-file", f->vocab_file, "GPT2BPETokenizer's vocab.json");
  opt("--merge-file", f->merge_file, "GPT2BPETokenizer's merges.txt");
  // Megatron's current default (since February 2026) includes the post-processor's specials;
  // --tokenizer-hf-no-include-special-tokens leaves them out, as its default did before.
  // --tokenizer-hf-include-special-tokens (the older flag) asks for them explicitly.
  auto hf_special = [f](bool on, const char* name) {
    return [f, on, name](int64_t n) {
      const bool value = n > 0 ? on : !on;  // --flag=false: the other way
      if (f->hf_special_tokens_flag && f->hf_include_special_tokens != value)
        fail_usage("{} contradicts {}", name,
                   on ? "--tokenizer-hf-no-include-special-tokens"
                      : "--tokenizer-hf-include-special-tokens");
      f->hf_include_special_tokens = value;
      f->hf_special_tokens_flag = true;
    };
  };
  cmd->add_flag_function("--tokenizer-hf-include-special-tokens",
                         hf_special(true, "--tokenizer-hf-include-special-tokens"),
                         "HuggingFaceTokenizer: the post-processor's special tokens (Llama 3's "
                         "BOS) around each text, as transformers' tokenizer(text) (the default)");
  cmd->add_flag_function("--tokenizer-hf-no-include-special-tokens",
                         hf_special(false, "--tokenizer-hf-no-include-special-tokens"),
                         "HuggingFaceTokenizer: a text's tokens alone, without the "
                         "post-processor's special tokens");
  cmd->add_flag("--legacy-tokenizer", f->legacy,
                "Megatron's legacy tokenizer classes: SentencePieceTokenizer with <CLS> <SEP> "
                "<EOD> <MASK> appended (eod <EOD>), Llama2Tokenizer with bos first, "
                "HuggingFaceTokenizer with the post-processor's specials");
  opt("--tiktoken-pattern", f->tiktoken_pattern,
      "TikTokenizer's split pattern: v1 or v2 (default v2, Megatron's)");
  cmd->add_option("--tiktoken-num-special-tokens", f->tiktoken_num_special_tokens,
                  "TikTokenizer: ids reserved in front of the vocabulary for special tokens")
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // Megatron's current name and its older one (TikTokenizer's only).
  for (const char* name : {"--tokenizer-special-tokens", "--tiktoken-special-tokens"})
    cmd->add_option(name, f->special_tokens,
                    "TikTokenizer's special tokens, ids 0, 1, ... (default: <unk> <s> </s> <mask> "
                    "<pad> <cls> <sep>; with --legacy-tokenizer <unk> <s> </s>); "
                    "HuggingFaceTokenizer: additional special tokens (new ones take ids after the "
                    "vocabulary)")
        ->expected(1, -1)
        ->trigger_on_parse()  // a repeated flag: its last occurrence's tokens
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--null-tokenizer-eod-id", f->null_eod_id,
                  "NullTokenizer: the end-of-document id (default --vocab-size - 1)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--null-tokenizer-pad-id", f->null_pad_id,
                  "NullTokenizer: the pad id, whose labels leave the loss (default -1: none)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // Accepted for Megatron's scripts; they change nothing weft computes.
  static bool use_fast = false, no_use_fast = false, trust_remote_code = false;
  cmd->add_flag("--tokenizer-hf-use-fast", use_fast,
                "accepted: weft encodes as transformers' fast tokenizer does");
  cmd->add_flag("--tokenizer-hf-no-use-fast", no_use_fast,
                "accepted: weft encodes as transformers' fast tokenizer does (a slow one encodes "
                "alike)");
  cmd->add_flag("--trust-remote-code", trust_remote_code,
                "accepted: weft runs no code from a tokenizer directory (it reads tokenizer.json)");
}

bool tokenizer_given(const TokenizerFiles& f) {
  return !f.model.empty() || !f.vocab_file.empty() || !f.merge_file.empty() ||
         f.type == "NullTokenizer";
}

}  // namespace weft::app
