// Tokenizers behind Megatron's --tokenizer-type names: SentencePiece through weft's SentencePiece
// module (data/spm/spm_module.h, loaded once per process with dlopen), and the trainer that
// builds a SentencePiece model.
//
// Invariant: a tokenizer's identity() depends only on the model file's bytes (sha256) and the
// special ids read from it, so two runs agree on "same tokenizer" whatever the path. Without
// SentencePiece at build time every entry point throws one UsageError saying so.
#include "weft/data/tokenizer.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "weft/core/error.h"
#include "weft/core/module.h"
#include "weft/data/sha256.h"
#include "weft/data/spm/spm_module.h"

namespace weft {
namespace {

[[maybe_unused]] constexpr const char* kNoSentencePiece =
    "weft was built without SentencePiece (install libsentencepiece-dev and rebuild)";

#if WEFT_WITH_SENTENCEPIECE

// The module's functions, resolved once; the module stays loaded for the process lifetime.
struct SpmModule {
  weft_spm_load_fn load;
  weft_spm_free_fn free;
  weft_spm_info_fn info;
  weft_spm_encode_fn encode;
  weft_spm_decode_fn decode;
  weft_spm_train_fn train;
};

const SpmModule& spm_module() {
  static SpmModule m{};
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = open_module("WEFT_SPM_MODULE", WEFT_SPM_MODULE_PATH, "libweft_spm.so", &error);
    if (h == nullptr) return;
    auto sym = [&](const char* name) {
      void* f = ::dlsym(h, name);
      if (f == nullptr) error = fmt::format("weft's SentencePiece module lacks {}", name);
      return f;
    };
    m.load = reinterpret_cast<weft_spm_load_fn>(sym("weft_spm_load"));
    m.free = reinterpret_cast<weft_spm_free_fn>(sym("weft_spm_free"));
    m.info = reinterpret_cast<weft_spm_info_fn>(sym("weft_spm_info"));
    m.encode = reinterpret_cast<weft_spm_encode_fn>(sym("weft_spm_encode"));
    m.decode = reinterpret_cast<weft_spm_decode_fn>(sym("weft_spm_decode"));
    m.train = reinterpret_cast<weft_spm_train_fn>(sym("weft_spm_train"));
    if (m.load && m.free && m.info && m.encode && m.decode && m.train) error.clear();
  });
  if (!error.empty() || m.load == nullptr)
    fail_usage("cannot load weft's SentencePiece module libweft_spm.so ({}); set WEFT_SPM_MODULE "
               "to its path", error);
  return m;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model) : model_(model) {
    const SpmModule& spm = spm_module();
    if (!std::filesystem::is_regular_file(model))
      fail_usage("--tokenizer-model {}: no such file", model);
    char err[512] = {0};
    handle_ = spm.load(model.c_str(), err, sizeof(err));
    if (handle_ == nullptr)
      fail_usage("--tokenizer-model {}: not a SentencePiece model ({})", model, err);
    spm.info(handle_, &info_);
    eod_ = info_.eos >= 0 ? info_.eos : info_.pad;
    if (eod_ < 0)
      fail_usage("--tokenizer-model {}: the model defines neither eos nor pad, so there is no "
                 "end-of-document id; train it with an eos piece", model);
    sha256_ = sha256_file_hex(model);
  }
  ~SentencePieceTokenizer() override { spm_module().free(handle_); }

  std::vector<int32_t> encode(const std::string& text) const override {
    const int32_t* ids = nullptr;
    int64_t n = spm_module().encode(handle_, text.data(), text.size(), &ids);
    if (n < 0) fail("{}: SentencePiece failed to encode a text of {} bytes", model_, text.size());
    return std::vector<int32_t>(ids, ids + n);
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    const char* text = nullptr;
    int64_t n = spm_module().decode(handle_, ids.data(), static_cast<int64_t>(ids.size()), &text);
    if (n < 0) fail("{}: cannot decode the ids (one is outside [0, {}))", model_, info_.vocab_size);
    return std::string(text, static_cast<size_t>(n));
  }

  int64_t vocab_size() const override { return info_.vocab_size; }
  int32_t eod() const override { return eod_; }
  int32_t bos() const override { return info_.bos; }
  int32_t pad() const override { return info_.pad; }

  nlohmann::json identity() const override {
    return {{"type", "SentencePieceTokenizer"},
            {"model_file", std::filesystem::path(model_).filename().string()},
            {"sha256", sha256_},
            {"vocab_size", info_.vocab_size},
            {"eod", eod_},
            {"bos", info_.bos},
            {"pad", info_.pad}};
  }

 private:
  std::string model_, sha256_;
  void* handle_ = nullptr;
  WeftSpmInfo info_{};
  int32_t eod_ = -1;
};

#endif  // WEFT_WITH_SENTENCEPIECE

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model) {
  if (type != "SentencePieceTokenizer")
    fail_usage("--tokenizer-type {} is not supported (weft knows: SentencePieceTokenizer)", type);
#if WEFT_WITH_SENTENCEPIECE
  if (model.empty()) fail_usage("--tokenizer-model is required for --tokenizer-type {}", type);
  return std::make_unique<SentencePieceTokenizer>(model);
#else
  fail_usage("{}", kNoSentencePiece);
#endif
}

void train_sentencepiece(const std::string& text_file, int64_t vocab_size,
                         const std::string& output_prefix, int threads,
                         const std::string& input_name) {
#if WEFT_WITH_SENTENCEPIECE
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(text_file)) fail_usage("--input {}: no such file", text_file);
  if (vocab_size < 8 || vocab_size > (1 << 24))
    fail_usage("--vocab-size {}: must be in [8, 2^24]", vocab_size);
  if (threads < 1) fail_usage("--workers {}: must be at least 1", threads);
  fs::path parent = fs::path(output_prefix).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    fail_usage("--output-prefix {}: directory {} does not exist", output_prefix, parent.string());
  const SpmModule& spm = spm_module();
  // Written under a temporary prefix and renamed, so a failed run leaves no model behind.
  // The model records its trainer options, model_prefix among them: keep the name fixed so
  // that equal inputs give equal model files.
  const std::string tmp = output_prefix + ".tmp";
  const std::vector<std::pair<std::string, std::string>> opts = {
      {"input", text_file},
      {"model_prefix", tmp},
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", "bpe"},
      {"character_coverage", "1.0"},
      {"byte_fallback", "false"},
      // Text comes back exactly as it went in (no NFKC, no whitespace folding).
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"unk_id", "0"}, {"bos_id", "1"}, {"eos_id", "2"}, {"pad_id", "3"},
      {"num_threads", std::to_string(threads)},
      {"input_sentence_size", "10000000"},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", "16384"},
      {"minloglevel", "2"},
      {"random_seed", "1234"},  // taken by the module: the sampling above is reproducible
  };
  std::vector<const char*> keys, values;
  for (const auto& [k, v] : opts) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  char err[1024] = {0};
  if (spm.train(keys.data(), values.data(), static_cast<int>(opts.size()), err, sizeof(err)) != 0) {
    std::remove((tmp + ".model").c_str());
    std::remove((tmp + ".vocab").c_str());
    fail_usage("train-tokenizer on --input {} failed: {}",
               input_name.empty() ? text_file : input_name, err);
  }
  std::error_code ec;
  fs::rename(tmp + ".vocab", output_prefix + ".vocab", ec);
  if (!ec) fs::rename(tmp + ".model", output_prefix + ".model", ec);
  if (ec) fail("{}: rename to {}.model failed: {}", tmp, output_prefix, ec.message());
#else
  fail_usage("{}", kNoSentencePiece);
#endif
}

bool same_tokenizer(const nlohmann::json& a, const nlohmann::json& b) {
  for (const char* k : {"sha256", "vocab_size", "eod", "bos", "pad"})
    if (!a.contains(k) || !b.contains(k) || a.at(k) != b.at(k)) return false;
  return true;
}

}  // namespace weft
