// `weft data`: preprocess (a .jsonl/.txt corpus into Megatron's PREFIX_{key}_document.bin/.idx,
// flags named as tools/preprocess_data.py) and train-tokenizer (a SentencePiece BPE model,
// PREFIX.model). Bad input throws UsageError, which main() turns into one line and exit code 2;
// outputs appear only complete (builders and the trainer write under temporary names).
#include "cmd_data.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "weft/core/error.h"
#include "weft/data/preprocess.h"
#include "tokenizer_flags.h"
#include "weft/data/tokenizer.h"

namespace weft::app {
namespace {

struct PreprocessFlags {
  PreprocessOptions opt;
  TokenizerFiles tokenizer;
};

struct TrainTokenizerFlags {
  std::string input, output_prefix;
  std::vector<std::string> json_keys{"text"};
  int64_t vocab_size = 0;
  int workers = 1;
};

void run_preprocess(const PreprocessFlags& f) {
  auto tok = make_tokenizer(f.tokenizer);
  PreprocessResult r = preprocess_corpus(f.opt, *tok);
  for (size_t k = 0; k < r.output_prefixes.size(); ++k)
    fmt::print("wrote {}.bin/.idx: {} documents, {} tokens\n", r.output_prefixes[k], r.documents,
               r.tokens[k]);
  fmt::print("{:.1f} MB in {:.1f} s ({:.2f} MB/s) with {} workers\n", r.input_bytes / 1e6,
             r.seconds, r.seconds > 0 ? r.input_bytes / 1e6 / r.seconds : 0.0, f.opt.workers);
}

void run_train_tokenizer(const TrainTokenizerFlags& f) {
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(f.input)) fail_usage("--input {}: no such file", f.input);
  std::string text = f.input;
  const bool jsonl = !(f.input.size() >= 4 && f.input.substr(f.input.size() - 4) == ".txt");
  const std::string tmp = f.output_prefix + ".train-text.tmp";
  if (jsonl) {
    fs::path parent = fs::path(f.output_prefix).parent_path();
    if (!parent.empty() && !fs::is_directory(parent))
      fail_usage("--output-prefix {}: directory {} does not exist", f.output_prefix,
                 parent.string());
    try {
      int64_t lines = extract_training_text(f.input, f.json_keys, tmp);
      fmt::print("extracted {} lines of text from {}\n", lines, f.input);
    } catch (...) {
      std::remove(tmp.c_str());
      throw;
    }
    text = tmp;
  }
  try {
    train_sentencepiece(text, f.vocab_size, f.output_prefix, f.workers, f.input);
  } catch (...) {
    if (jsonl) std::remove(tmp.c_str());
    throw;
  }
  if (jsonl) std::remove(tmp.c_str());
  fmt::print("wrote {}.model and {}.vocab (vocab size {})\n", f.output_prefix, f.output_prefix,
             f.vocab_size);
}

}  // namespace

void add_data_command(CLI::App* app) {
  CLI::App* data = app->add_subcommand("data", "tokenizer training and corpus preprocessing");
  data->require_subcommand(1);

  auto p = std::make_shared<PreprocessFlags>();
  CLI::App* pre = data->add_subcommand(
      "preprocess", "tokenize a .jsonl/.txt corpus into PREFIX_{key}_document.bin/.idx");
  pre->add_option("--input", p->opt.input, "FILE.jsonl (one JSON object a line) or FILE.txt "
                  "(one document a line)")->required();
  pre->add_option("--json-keys", p->opt.json_keys, "keys to extract (one dataset each)")
      ->capture_default_str();
  pre->add_option("--output-prefix", p->opt.output_prefix, "output path without suffix")
      ->required();
  add_tokenizer_flags(pre, &p->tokenizer);
  pre->get_option("--tokenizer-type")->required();
  pre->add_option("--vocab-size", p->tokenizer.vocab_size,
                  "NullTokenizer's V: ids 0..V-1, the end of document V - 1 (V with --legacy-tokenizer)");
  pre->add_flag("--append-eod", p->opt.append_eod, "append the eod token to each document");
  pre->add_option("--workers", p->opt.workers, "tokenizing threads")->capture_default_str();
  pre->add_option("--log-interval", p->opt.log_interval, "documents between progress lines")
      ->capture_default_str();
  pre->callback([p] { run_preprocess(*p); });

  auto t = std::make_shared<TrainTokenizerFlags>();
  CLI::App* tr = data->add_subcommand("train-tokenizer",
                                      "train a SentencePiece BPE model PREFIX.model");
  tr->add_option("--input", t->input, "FILE.jsonl or FILE.txt (one sentence a line)")->required();
  tr->add_option("--json-keys", t->json_keys, "keys whose texts to train on (.jsonl)")
      ->capture_default_str();
  tr->add_option("--vocab-size", t->vocab_size, "vocabulary size")->required();
  tr->add_option("--output-prefix", t->output_prefix, "writes PREFIX.model and PREFIX.vocab")
      ->required();
  tr->add_option("--workers", t->workers, "trainer threads")->capture_default_str();
  tr->callback([t] { run_train_tokenizer(*t); });
}

}  // namespace weft::app
