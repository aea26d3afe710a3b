// Corpus preprocessing (Megatron's tools/preprocess_data.py): a .jsonl or .txt corpus is
// tokenized into one indexed dataset per JSON key, PREFIX_{key}_document.bin/.idx.
//
// Invariant: the output bytes depend only on the input, the keys, the tokenizer and append_eod,
// never on the number of workers (documents are written in input order). The input is streamed
// (a bounded number of line batches in flight), and outputs appear only when complete: a bad
// line, a missing key or an empty result leaves nothing under the final names.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "weft/data/tokenizer.h"

namespace weft {

struct PreprocessOptions {
  // FILE.jsonl (one JSON object per line; any name not ending in .txt) or FILE.txt (one
  // document per line, key "text").
  std::string input;
  std::vector<std::string> json_keys{"text"};
  std::string output_prefix;
  bool append_eod = false;   // one eod token after each non-empty document
  int workers = 1;           // tokenizing threads (reading and writing run on two more)
  // Documents between progress lines (checked per batch of lines, and once at the end); 0: none.
  int64_t log_interval = 1000;
  // Receives each progress line (default: stderr).
  std::function<void(const std::string&)> log;
};

struct PreprocessResult {
  int64_t documents = 0;
  int64_t input_bytes = 0;
  double seconds = 0;
  std::vector<std::string> output_prefixes;  // one per key, in json_keys order
  std::vector<int64_t> tokens;               // per key
};

// PREFIX_{key}_document, Megatron's output name.
std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key);

// Tokenizes options.input with `tokenizer` (shared by the workers; its encode must be
// thread-safe, as SentencePiece's is). Throws UsageError naming the file (and line) on bad input.
PreprocessResult preprocess_corpus(const PreprocessOptions& options, const Tokenizer& tokenizer);

// The text SentencePiece trains on (`weft data train-tokenizer`): every line of every text
// under `json_keys` of a .jsonl input becomes one line of `out` (SentencePiece's "sentence");
// empty lines are dropped. Streams; returns the number of lines written. Throws UsageError naming
// the file and line on bad JSON or a missing key.
int64_t extract_training_text(const std::string& input, const std::vector<std::string>& json_keys,
                              const std::string& out);

}  // namespace weft
