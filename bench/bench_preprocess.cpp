// bench_preprocess: `weft data preprocess` throughput (input MB/s) with 1 tokenizing worker and
// with N workers on the same corpus in the same run, their ratio, and a check that both outputs
// are byte-identical. The corpus is a .jsonl or .txt file, or a directory of fortune files
// (records separated by lines holding a single "%"; default /usr/share/games/fortunes from
// Debian's `fortunes`), turned into JSON lines and repeated --repeat times. A SentencePiece BPE
// model is trained on it first unless --tokenizer-model is given.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>

#include "weft/core/error.h"
#include "weft/data/preprocess.h"
#include "weft/data/tokenizer.h"

namespace fs = std::filesystem;

namespace {

// Fortune records of every text file under `dir` (not the .dat indexes nor the .u8 links).
std::vector<std::string> fortune_records(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string ext = e.path().extension().string();
    if (e.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> records;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string line, rec;
    while (std::getline(in, line)) {
      if (line == "%") {
        if (!rec.empty()) records.push_back(rec);
        rec.clear();
      } else {
        rec += line + "\n";
      }
    }
    if (!rec.empty()) records.push_back(rec);
  }
  return records;
}

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_preprocess: corpus preprocessing throughput, 1 worker vs N"};
  std::string corpus = "/usr/share/games/fortunes", model;
  int threads = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  int repeat = 4;
  int64_t vocab = 8000;
  app.add_option("corpus", corpus, "a .jsonl or .txt file, or a directory of fortune files")
      ->capture_default_str();
  app.add_option("--threads", threads, "workers of the second run")->capture_default_str();
  app.add_option("--repeat", repeat, "copies of a fortune corpus in the input")->capture_default_str();
  app.add_option("--vocab-size", vocab, "vocabulary of the trained tokenizer")->capture_default_str();
  app.add_option("--tokenizer-model", model, "use this SentencePiece model instead of training one");
  CLI11_PARSE(app, argc, argv);

  try {
    fs::path dir = fs::temp_directory_path() / fmt::format("weft_bench_pre_{}", ::getpid());
    fs::create_directories(dir);
    std::string input = corpus;
    if (fs::is_directory(corpus)) {
      auto records = fortune_records(corpus);
      input = (dir / "corpus.jsonl").string();
      std::ofstream out(input);
      for (int r = 0; r < repeat; ++r)
        for (const auto& rec : records)
          out << nlohmann::json{{"text", rec}}.dump(-1, ' ', false,
                                                    nlohmann::json::error_handler_t::replace)
              << "\n";
      fmt::print("corpus: {} records from {} x {}\n", records.size(), corpus, repeat);
    }
    if (model.empty()) {
      std::string text = input;
      if (input.size() < 4 || input.substr(input.size() - 4) != ".txt") {
        text = (dir / "train.txt").string();
        weft::extract_training_text(input, {"text"}, text);
      }
      weft::train_sentencepiece(text, vocab, (dir / "tok").string(), threads);
      model = (dir / "tok.model").string();
    }
    auto tok = weft::make_tokenizer("SentencePieceTokenizer", model);
    fmt::print("input {} ({:.1f} MB), tokenizer vocab {}, {} hardware threads\n", input,
               fs::file_size(input) / 1e6, tok->vocab_size(), std::thread::hardware_concurrency());

    weft::PreprocessOptions o;
    o.input = input;
    o.append_eod = true;
    o.log_interval = 0;
    double rate[2];
    int workers[2] = {1, threads};
    for (int i = 0; i < 2; ++i) {
      o.workers = workers[i];
      o.output_prefix = (dir / fmt::format("w{}", workers[i])).string();
      weft::PreprocessResult r = weft::preprocess_corpus(o, *tok);
      rate[i] = r.input_bytes / 1e6 / r.seconds;
      fmt::print("workers {:>2}: {} documents, {} tokens, {:.2f} s, {:.2f} MB/s\n", workers[i],
                 r.documents, r.tokens[0], r.seconds, rate[i]);
    }
    bool same = true;
    for (const char* ext : {".bin", ".idx"})
      same = same && slurp((dir / fmt::format("w1_text_document{}", ext)).string()) ==
                         slurp((dir / fmt::format("w{}_text_document{}", threads, ext)).string());
    fmt::print("speedup {} workers / 1 worker: {:.2f}x; outputs byte-identical: {}\n", threads,
               rate[1] / rate[0], same ? "yes" : "NO");
    fs::remove_all(dir);
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_preprocess: {}\n", e.what());
    return 2;
  }
}
