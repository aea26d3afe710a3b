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
  // tools/preprocess_data.py's flags that change no output byte here (run_preprocess).
  int partitions = 1;
  bool keep_sequential_samples = false, split_sentences = false, keep_newlines = false;
  std::string lang = "english";
};

struct TrainTokenizerFlags {
  std::string input, output_prefix;
  std::vector<std::string> json_keys{"text"};
  int64_t vocab_size = 0;
  int workers = 1;
};

void run_preprocess(const PreprocessFlags& f) {
  // Megatron's --split-sentences splits each text with nltk's punkt model into sequences;
  // weft has no sentence splitter (a list of strings is taken as the sentences, as Megatron's).
  if (f.split_sentences)
    fail_usage("--split-sentences is not implemented in weft (Megatron splits with nltk's punkt "
               "model); give each document's sentences as a JSON list of strings instead");
  // --partitions N processes N parts of the input and merges them: the documents in input order
  // only with --keep-sequential-samples (else Megatron deals the lines round-robin), which is
  // what weft writes in one pass.
  if (f.partitions < 1) fail_usage("--partitions must be >= 1 (got {})", f.partitions);
  if (f.partitions > 1 && !f.keep_sequential_samples)
    fail_usage("--partitions {} without --keep-sequential-samples deals the documents "
               "round-robin over the partitions in Megatron; weft writes them in input order "
               "(add --keep-sequential-samples, or give --partitions 1)", f.partitions);
  for (size_t i = 0; i < f.opt.json_keys.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (f.opt.json_keys[i] == f.opt.json_keys[j])
        fail_usage("--json-keys: \"{}\" is given twice (each key writes one dataset)",
                   f.opt.json_keys[i]);
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
  pre->add_option("--partitions", p->partitions,
                  "Megatron's input partitions: 1, or any with --keep-sequential-samples (the "
                  "same output, written in one pass)")
      ->capture_default_str();
  pre->add_flag("--keep-sequential-samples", p->keep_sequential_samples,
                "the documents in input order (always in weft)");
  pre->add_flag("--split-sentences", p->split_sentences,
                "refused: weft has no sentence splitter (give JSON lists of sentences)");
  pre->add_flag("--keep-newlines", p->keep_newlines,
                "read only with --split-sentences, as in Megatron: no effect");
  pre->add_option("--lang", p->lang, "read only with --split-sentences, as in Megatron: no effect")
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
