// Corpus preprocessing: a reader thread cuts the input into numbered batches of lines, `workers`
// threads parse and tokenize batches in any order, and the calling thread writes them to the
// builders strictly in batch order. That order is why the output does not depend on the worker
// count; the bound on batches in flight is why memory does not grow with the input.
#include "weft/data/preprocess.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "weft/core/error.h"
#include "weft/data/indexed_dataset.h"
#include "weft/data/json_line.h"

namespace weft {
namespace {

constexpr size_t kBatchLines = 512;
constexpr int64_t kBatchBytes = 1 << 20;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// One batch of consecutive input lines and, once a worker is done, their tokens.
struct Batch {
  int64_t first_line = 0;  // 1-based line number of lines[0]
  int64_t bytes = 0;
  std::vector<std::string> lines;
  // Per key: all ids back to back, the length of each sequence, the sequences of each document.
  struct Key {
    std::vector<int32_t> ids, seq_lens, doc_seqs;
  };
  std::vector<Key> keys;
  int64_t documents = 0;
  std::exception_ptr error;
};

// Tokenizes one batch (Megatron's Encoder.encode, line by line).
void encode_batch(const PreprocessOptions& o, bool text_mode, const Tokenizer& tok, Batch* b) {
  b->keys.assign(o.json_keys.size(), {});
  std::vector<std::string> sentences;
  for (size_t li = 0; li < b->lines.size(); ++li) {
    const std::string& line = b->lines[li];
    const int64_t line_no = b->first_line + static_cast<int64_t>(li);
    nlohmann::json doc;
    if (!text_mode) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank: no document
      try {
        doc = parse_json_line(line);
      } catch (const nlohmann::json::exception& e) {  // parse_error or out_of_range
        fail_usage("{}:{}: not valid JSON ({})", o.input, line_no, e.what());
      }
      if (!doc.is_object()) fail_usage("{}:{}: a JSON line must be an object", o.input, line_no);
    }
    for (size_t k = 0; k < o.json_keys.size(); ++k) {
      sentences.clear();
      if (text_mode) {
        sentences.push_back(line);
      } else {
        auto it = doc.find(o.json_keys[k]);
        if (it == doc.end())
          fail_usage("{}:{}: no key \"{}\" (--json-keys)", o.input, line_no, o.json_keys[k]);
        if (it->is_string()) {
          sentences.push_back(it->get<std::string>());
        } else if (it->is_array() && std::all_of(it->begin(), it->end(),
                                                 [](const auto& v) { return v.is_string(); })) {
          for (const auto& v : *it) sentences.push_back(v.get<std::string>());
        } else {
          fail_usage("{}:{}: key \"{}\" is neither a string nor a list of strings", o.input,
                     line_no, o.json_keys[k]);
        }
      }
      Batch::Key& out = b->keys[k];
      int32_t nseq = 0;
      for (const std::string& s : sentences) {
        std::vector<int32_t> ids = tok.encode(s);
        if (ids.empty()) continue;
        out.ids.insert(out.ids.end(), ids.begin(), ids.end());
        out.seq_lens.push_back(static_cast<int32_t>(ids.size()));
        ++nseq;
      }
      if (nseq > 0 && o.append_eod) {
        out.ids.push_back(tok.eod());
        ++out.seq_lens.back();
      }
      out.doc_seqs.push_back(nseq);
    }
    ++b->documents;
  }
}

std::string format_seconds(double s) {
  if (s < 0 || s > 1e7) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}h{:02}m", t / 3600, t / 60 % 60)
                   : fmt::format("{}m{:02}s", t / 60, t % 60);
}

}  // namespace

std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key) {
  return fmt::format("{}_{}_document", output_prefix, key);
}

PreprocessResult preprocess_corpus(const PreprocessOptions& o, const Tokenizer& tok) {
  namespace fs = std::filesystem;
  const bool text_mode = ends_with(o.input, ".txt");
  if (!fs::is_regular_file(o.input)) fail_usage("--input {}: no such file", o.input);
  if (o.json_keys.empty()) fail_usage("--json-keys: at least one key is needed");
  if (text_mode && (o.json_keys.size() != 1 || o.json_keys[0] != "text"))
    fail_usage("--json-keys: a .txt input ({}) has one document per line under the key \"text\"",
               o.input);
  if (o.workers < 1) fail_usage("--workers {}: must be at least 1", o.workers);
  if (o.output_prefix.empty()) fail_usage("--output-prefix is required");
  fs::path parent = fs::path(o.output_prefix).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    fail_usage("--output-prefix {}: directory {} does not exist", o.output_prefix, parent.string());
  std::ifstream in(o.input, std::ios::binary);
  if (!in) fail_usage("--input {}: cannot open", o.input);
  const int64_t total_bytes = static_cast<int64_t>(fs::file_size(o.input));
  auto log = o.log ? o.log : [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };

  PreprocessResult r;
  const IndexedDtype dtype = optimal_indexed_dtype(tok.vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const auto& key : o.json_keys) {
    r.output_prefixes.push_back(preprocess_output_prefix(o.output_prefix, key));
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(r.output_prefixes.back(), dtype));
  }
  r.tokens.assign(o.json_keys.size(), 0);

  // Shared state, guarded by mu.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int64_t, std::shared_ptr<Batch>>> todo;
  std::map<int64_t, std::shared_ptr<Batch>> done;
  int64_t in_flight = 0, total_batches = -1;
  bool stop = false;
  std::exception_ptr read_error;
  const int64_t max_in_flight = 4 * static_cast<int64_t>(o.workers) + 2;

  std::thread reader([&] {
    try {
      int64_t line_no = 0, seq = 0;
      std::string line;
      auto batch = std::make_shared<Batch>();
      auto push = [&] {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || in_flight < max_in_flight; });
        if (stop) return false;
        ++in_flight;
        todo.emplace_back(seq++, std::move(batch));
        cv.notify_all();
        batch = std::make_shared<Batch>();
        return true;
      };
      while (std::getline(in, line)) {
        ++line_no;
        int64_t n = static_cast<int64_t>(line.size()) + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (batch->lines.empty()) batch->first_line = line_no;
        batch->bytes += n;
        batch->lines.push_back(std::move(line));
        if (batch->lines.size() >= kBatchLines || batch->bytes >= kBatchBytes)
          if (!push()) return;
      }
      if (in.bad()) fail_usage("--input {}: read failed after line {}", o.input, line_no);
      if (!batch->lines.empty() && !push()) return;
      std::lock_guard<std::mutex> lk(mu);
      total_batches = seq;
      cv.notify_all();
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      read_error = std::current_exception();
      cv.notify_all();
    }
  });

  std::vector<std::thread> workers;
  for (int w = 0; w < o.workers; ++w)
    workers.emplace_back([&] {
      for (;;) {
        std::pair<int64_t, std::shared_ptr<Batch>> job;
        {
          std::unique_lock<std::mutex> lk(mu);
          cv.wait(lk, [&] { return stop || !todo.empty(); });
          if (stop) return;
          job = std::move(todo.front());
          todo.pop_front();
        }
        try {
          encode_batch(o, text_mode, tok, job.second.get());
        } catch (...) {
          job.second->error = std::current_exception();
        }
        job.second->lines = {};
        std::lock_guard<std::mutex> lk(mu);
        done.emplace(job.first, std::move(job.second));
        cv.notify_all();
      }
    });

  auto shutdown = [&] {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
      cv.notify_all();
    }
    reader.join();
    for (auto& t : workers) t.join();
  };

  const auto start = std::chrono::steady_clock::now();
  int64_t logged_documents = -1;
  auto progress = [&] {
    if (r.documents == logged_documents) return;
    logged_documents = r.documents;
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double mb = r.input_bytes / 1e6, rate = secs > 0 ? mb / secs : 0;
    double eta = rate > 0 ? (total_bytes / 1e6 - mb) / rate : -1;
    log(fmt::format("processed {} documents, {:.1f} of {:.1f} MB, {:.2f} MB/s, ETA {}",
                    r.documents, mb, total_bytes / 1e6, rate, format_seconds(eta)));
  };
  try {
    for (int64_t next = 0;; ++next) {
      std::shared_ptr<Batch> b;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] {
          return done.count(next) || read_error || (total_batches >= 0 && next == total_batches);
        });
        if (done.count(next)) {
          b = std::move(done[next]);
          done.erase(next);
          --in_flight;
          cv.notify_all();
        } else if (read_error) {
          std::rethrow_exception(read_error);
        } else {
          break;  // every batch written
        }
      }
      if (b->error) std::rethrow_exception(b->error);
      for (size_t k = 0; k < builders.size(); ++k) {
        const Batch::Key& key = b->keys[k];
        size_t off = 0, s = 0;
        for (int32_t nseq : key.doc_seqs) {
          for (int32_t j = 0; j < nseq; ++j, ++s) {
            builders[k]->add_item(key.ids.data() + off, key.seq_lens[s]);
            off += static_cast<size_t>(key.seq_lens[s]);
          }
          builders[k]->end_document();
        }
        r.tokens[k] += static_cast<int64_t>(key.ids.size());
      }
      const int64_t before = r.documents;
      r.documents += b->documents;
      r.input_bytes += b->bytes;
      if (o.log_interval > 0 && r.documents / o.log_interval != before / o.log_interval)
        progress();
    }
  } catch (...) {
    shutdown();
    throw;  // the builders' destructors remove their temporary files
  }
  shutdown();
  for (size_t k = 0; k < builders.size(); ++k)
    if (builders[k]->sequences() == 0)
      fail_usage("--input {}: no tokens under key \"{}\" ({} documents); nothing written", o.input,
                 o.json_keys[k], r.documents);
  for (auto& b : builders) b->finalize();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (o.log_interval > 0) progress();
  return r;
}

int64_t extract_training_text(const std::string& input, const std::vector<std::string>& json_keys,
                              const std::string& out) {
  std::ifstream in(input, std::ios::binary);
  if (!in) fail_usage("--input {}: cannot open", input);
  std::ofstream o(out, std::ios::binary | std::ios::trunc);
  if (!o) fail_usage("{}: cannot create", out);
  int64_t line_no = 0, written = 0;
  std::string line;
  auto emit = [&](const std::string& text) {
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string_view piece(text.data() + start, end - start);
      if (!piece.empty() && piece.back() == '\r') piece.remove_suffix(1);
      if (!piece.empty()) {
        o << piece << '\n';
        ++written;
      }
      start = end + 1;
    }
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json doc;
    try {
      doc = parse_json_line(line);
    } catch (const nlohmann::json::exception& e) {
      fail_usage("{}:{}: not valid JSON ({})", input, line_no, e.what());
    }
    for (const auto& key : json_keys) {
      auto it = doc.is_object() ? doc.find(key) : doc.end();
      if (it == doc.end()) fail_usage("{}:{}: no key \"{}\" (--json-keys)", input, line_no, key);
      if (it->is_string()) emit(it->get_ref<const std::string&>());
      else if (it->is_array())
        for (const auto& v : *it)
          if (v.is_string()) emit(v.get_ref<const std::string&>());
    }
  }
  o.close();
  if (!o) fail("{}: write failed", out);
  return written;
}

}  // namespace weft
