// Tokenizers behind Megatron's --tokenizer-type names: SentencePiece through weft's SentencePiece
// module (data/spm/spm_module.h, loaded once per process with dlopen), NullTokenizer, the
// dispatch to the BPE tokenizers (bpe_tokenizer.h), and the trainer that builds a SentencePiece
// model.
//
// Invariant: a tokenizer's identity() depends only on the model file's bytes (sha256), the
// special ids read from it and the flags that change how it reads a text (e.g.
// --tokenizer-special-tokens), so two runs agree on "same tokenizer" whatever the path. Without
// SentencePiece at build time every entry point throws one UsageError saying so.
#include "weft/data/tokenizer.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "weft/core/error.h"
#include "weft/core/module.h"
#include "weft/data/bpe_tokenizer.h"
#include "weft/data/sha256.h"
#include "weft/data/spm/spm_module.h"
#include "weft/data/tiktoken_tokenizer.h"

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
  weft_spm_piece_fn piece;
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
    m.piece = reinterpret_cast<weft_spm_piece_fn>(sym("weft_spm_piece"));
    m.decode = reinterpret_cast<weft_spm_decode_fn>(sym("weft_spm_decode"));
    m.train = reinterpret_cast<weft_spm_train_fn>(sym("weft_spm_train"));
    if (m.load && m.free && m.info && m.encode && m.piece && m.decode && m.train) error.clear();
  });
  if (!error.empty() || m.load == nullptr)
    fail_usage("cannot load weft's SentencePiece module libweft_spm.so ({}); set WEFT_SPM_MODULE "
               "to its path", error);
  return m;
}

// Megatron's legacy SentencePiece tokenizers over one .model file (its default system encodes
// all three as GPTSentencePieceTokenizer):
//   SentencePieceTokenizer     the pieces, then <CLS> <SEP> <EOD> <MASK> and the pad, bos and eos
//                              pieces (<PAD>, <BOS>, <EOS> where the model has none) appended
//                              where not already pieces; eod <EOD>; those specials written in a
//                              text are their ids (the earliest first), the rest SentencePiece's
//   GPTSentencePieceTokenizer  the pieces; eod the eos (weft: else the pad)
//   Llama2Tokenizer            the pieces; every text starts with bos; eod the eos
enum class SpmFlavor { kMegatron, kGpt, kLlama2 };

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& model, SpmFlavor flavor, std::string type, bool legacy)
      : model_(model), type_(std::move(type)), flavor_(flavor), legacy_(legacy) {
    const SpmModule& spm = spm_module();
    if (!std::filesystem::is_regular_file(model))
      fail_usage("--tokenizer-model {}: no such file", model);
    char err[512] = {0};
    handle_ = spm.load(model.c_str(), err, sizeof(err));
    if (handle_ == nullptr)
      fail_usage("--tokenizer-model {}: not a SentencePiece model ({})", model, err);
    spm.info(handle_, &info_);
    vocab_size_ = info_.vocab_size;
    bos_ = info_.bos;
    pad_ = info_.pad;
    if (flavor_ == SpmFlavor::kMegatron) {
      add_megatron_specials();
    } else {
      eod_ = info_.eos >= 0 ? info_.eos : info_.pad;
      if (eod_ < 0)
        fail_usage("--tokenizer-model {}: the model defines neither eos nor pad, so there is no "
                   "end-of-document id for --tokenizer-type {}; train it with an eos piece", model,
                   type_);
      if (flavor_ == SpmFlavor::kLlama2 && bos_ < 0)
        fail_usage("--tokenizer-model {}: the model has no bos piece, which --tokenizer-type "
                   "Llama2Tokenizer starts every text with", model);
    }
    sha256_ = sha256_file_hex(model);
  }
  ~SentencePieceTokenizer() override { spm_module().free(handle_); }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> out;
    if (flavor_ == SpmFlavor::kLlama2) out.push_back(bos_);
    size_t at = 0;
    while (flavor_ == SpmFlavor::kMegatron) {  // the earliest special, the first listed on a tie
      size_t best = std::string::npos;
      const Special* hit = nullptr;
      for (const Special& sp : specials_) {
        const size_t k = text.find(sp.text, at);
        if (k < best) best = k, hit = &sp;
      }
      if (hit == nullptr) break;
      encode_plain(std::string_view(text).substr(at, best - at), &out);
      out.push_back(hit->id);
      at = best + hit->text.size();
    }
    encode_plain(std::string_view(text).substr(at), &out);
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    if (flavor_ != SpmFlavor::kMegatron) return decode_plain(ids);
    // Megatron's detokenize: each special as its text between spaces.
    std::string text;
    size_t last = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const Special* sp = special_of(ids[i]);
      if (sp == nullptr) continue;
      text += decode_plain({ids.begin() + static_cast<std::ptrdiff_t>(last),
                            ids.begin() + static_cast<std::ptrdiff_t>(i)}) + " " + sp->text + " ";
      last = i + 1;
    }
    return text + decode_plain({ids.begin() + static_cast<std::ptrdiff_t>(last), ids.end()});
  }

  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  int32_t bos() const override { return bos_; }
  int32_t pad() const override { return pad_; }

  nlohmann::json identity() const override {
    nlohmann::json id = {{"type", type_},
            {"model_file", std::filesystem::path(model_).filename().string()},
            {"sha256", sha256_},
            {"vocab_size", vocab_size_},
            {"eod", eod_},
            {"bos", bos_},
            {"pad", pad_}};
    if (legacy_) id["legacy"] = true;
    return id;
  }

 private:
  struct Special {
    std::string text;
    int32_t id;
  };

  std::string piece(int32_t id) const {
    const char* p = nullptr;
    const int64_t n = spm_module().piece(handle_, id, &p);
    return n < 0 ? std::string() : std::string(p, static_cast<size_t>(n));
  }

  // Megatron's _SentencePieceTokenizer._initalize (without --vocab-extra-ids).
  void add_megatron_specials() {
    std::unordered_map<std::string, int32_t> ids;
    for (int32_t i = 0; i < info_.vocab_size; ++i) ids.emplace(piece(i), i);
    auto add = [&](const std::string& t) {
      auto [it, fresh] = ids.emplace(t, vocab_size_);
      if (fresh) ++vocab_size_;
      for (const Special& sp : specials_)
        if (sp.text == t) return it->second;
      specials_.push_back({t, it->second});
      return it->second;
    };
    add("<CLS>");
    add("<SEP>");
    eod_ = add("<EOD>");
    add("<MASK>");
    pad_ = add(info_.pad >= 0 ? piece(info_.pad) : "<PAD>");
    bos_ = add(info_.bos >= 0 ? piece(info_.bos) : "<BOS>");
    add(info_.eos >= 0 ? piece(info_.eos) : "<EOS>");
  }

  const Special* special_of(int32_t id) const {
    for (const Special& sp : specials_)
      if (sp.id == id) return &sp;
    return nullptr;
  }

  void encode_plain(std::string_view text, std::vector<int32_t>* out) const {
    if (text.empty()) return;
    const int32_t* ids = nullptr;
    int64_t n = spm_module().encode(handle_, text.data(), text.size(), &ids);
    if (n < 0) fail("{}: SentencePiece failed to encode a text of {} bytes", model_, text.size());
    out->insert(out->end(), ids, ids + n);
  }

  std::string decode_plain(const std::vector<int32_t>& ids) const {
    const char* text = nullptr;
    int64_t n = spm_module().decode(handle_, ids.data(), static_cast<int64_t>(ids.size()), &text);
    if (n < 0) fail("{}: cannot decode the ids (one is outside [0, {}))", model_, vocab_size_);
    return std::string(text, static_cast<size_t>(n));
  }

  std::string model_, type_, sha256_;
  SpmFlavor flavor_;
  bool legacy_;
  void* handle_ = nullptr;
  WeftSpmInfo info_{};
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1, bos_ = -1, pad_ = -1;
  std::vector<Special> specials_;  // kMegatron: in Megatron's order, one entry per text
};

#endif  // WEFT_WITH_SENTENCEPIECE

// Megatron's NullTokenizer: a text is its ids, written in decimal and separated by single
// spaces ("5 17 3" is [5, 17, 3]). Its current class (megatron/core/tokenizers, since April
// 2026) has V ids, the end of document --null-tokenizer-eod-id (default V - 1) and the pad
// --null-tokenizer-pad-id (default -1: none); its legacy class (--legacy-tokenizer, also the
// default system before April 2026) has V + 1 ids, the end of document V and no pad.
class NullTokenizer final : public Tokenizer {
 public:
  NullTokenizer(int64_t v, int64_t eod, int64_t pad, bool legacy)
      : v_(v), eod_(eod), pad_(pad), legacy_(legacy) {}

  std::vector<int32_t> encode(const std::string& text) const override { return parse_ids(text); }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += std::to_string(ids[i]);
    }
    return out;
  }

  int64_t vocab_size() const override { return legacy_ ? v_ + 1 : v_; }
  int32_t eod() const override { return static_cast<int32_t>(eod_); }
  int32_t bos() const override { return -1; }
  int32_t pad() const override { return static_cast<int32_t>(pad_); }
  nlohmann::json identity() const override {
    nlohmann::json id = {{"type", "NullTokenizer"}, {"model_file", ""},
                         {"sha256", sha256_hex("NullTokenizer " + std::to_string(v_))},
                         {"vocab_size", vocab_size()}, {"eod", eod_}, {"bos", -1}, {"pad", pad_}};
    if (legacy_) id["legacy"] = true;
    return id;
  }

 private:
  std::vector<int32_t> parse_ids(const std::string& text) const {
    std::vector<int32_t> ids;
    const int64_t n = vocab_size();
    size_t at = 0;
    while (true) {
      const size_t sp = text.find(' ', at);
      const std::string field = text.substr(at, sp == std::string::npos ? sp : sp - at);
      // Python's int() takes surrounding whitespace; so does this.
      const size_t b = field.find_first_not_of(" \t\n\r\v\f");
      const size_t e = field.find_last_not_of(" \t\n\r\v\f");
      const std::string digits = b == std::string::npos ? "" : field.substr(b, e - b + 1);
      char* end = nullptr;
      const long long id = digits.empty() ? -1 : std::strtoll(digits.c_str(), &end, 10);
      if (digits.empty() || *end != '\0' || id < 0 || id >= n)
        fail_usage("NullTokenizer: {:?} is not an id in [0, {}] (the text must be ids "
                   "separated by single spaces)", field, n - 1);
      ids.push_back(static_cast<int32_t>(id));
      if (sp == std::string::npos) break;
      at = sp + 1;
    }
    return ids;
  }

  int64_t v_, eod_, pad_;
  bool legacy_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerFiles& f) {
  const std::string& type = f.type;
  if (type != "TikTokenizer") {
    // In this order: the first of these flags given names the error.
    const bool specials_read = type == "HuggingFaceTokenizer" || type == "GPT2BPETokenizer";
    const char* tik = !f.tiktoken_pattern.empty()                   ? "--tiktoken-pattern"
                      : !f.special_tokens.empty() && !specials_read ? "--tokenizer-special-tokens"
                      : f.tiktoken_num_special_tokens != 1000 ? "--tiktoken-num-special-tokens"
                                                              : nullptr;
    if (tik != nullptr)
      fail_usage("{} is read by --tokenizer-type TikTokenizer{} only (got --tokenizer-type '{}')",
                 tik, std::string(tik) == "--tokenizer-special-tokens"
                          ? ", HuggingFaceTokenizer and GPT2BPETokenizer" : "",
                 type);
  }
  if (type != "NullTokenizer" && (f.null_eod_id != -1 || f.null_pad_id != -1))
    fail_usage("{} is read by --tokenizer-type NullTokenizer only (got --tokenizer-type '{}')",
               f.null_eod_id != -1 ? "--null-tokenizer-eod-id" : "--null-tokenizer-pad-id", type);
  if (type == "GPT2BPETokenizer")
    return load_gpt2_bpe_tokenizer(f.vocab_file, f.merge_file, f.legacy, f.special_tokens);
  if (type == "TikTokenizer") return load_tiktoken_tokenizer(f);
  if (type == "HuggingFaceTokenizer")
    return load_hf_tokenizer(f.model, f.hf_include_special_tokens || f.legacy, f.special_tokens);
  if (type == "NullTokenizer") {
    if (f.vocab_size < 1 || f.vocab_size >= (int64_t{1} << 31) - 1)
      fail_usage("--tokenizer-type NullTokenizer needs --vocab-size V >= 1 (its ids are 0..V-1, "
                 "the end of document V - 1)");
    if (f.legacy && (f.null_eod_id != -1 || f.null_pad_id != -1))
      fail_usage("{} is read by Megatron's current NullTokenizer, not its legacy class "
                 "(--legacy-tokenizer: eod V, no pad)",
                 f.null_eod_id != -1 ? "--null-tokenizer-eod-id" : "--null-tokenizer-pad-id");
    const int64_t eod = f.legacy ? f.vocab_size : f.null_eod_id != -1 ? f.null_eod_id : f.vocab_size - 1;
    if (eod < 0 || eod >= f.vocab_size + (f.legacy ? 1 : 0))
      fail_usage("--null-tokenizer-eod-id {} is outside the NullTokenizer's ids 0..{} "
                 "(--vocab-size {})", eod, f.vocab_size - 1, f.vocab_size);
    if (f.null_pad_id < -1)
      fail_usage("--null-tokenizer-pad-id must be -1 (no pad) or an id >= 0 (got {})",
                 f.null_pad_id);
    return std::make_unique<NullTokenizer>(f.vocab_size, eod, f.null_pad_id, f.legacy);
  }
  if (type != "SentencePieceTokenizer" && type != "GPTSentencePieceTokenizer" &&
      type != "Llama2Tokenizer")
    fail_usage("--tokenizer-type {} is not supported (weft knows: SentencePieceTokenizer, "
               "GPTSentencePieceTokenizer, Llama2Tokenizer, GPT2BPETokenizer, "
               "HuggingFaceTokenizer, TikTokenizer, NullTokenizer)", type);
#if WEFT_WITH_SENTENCEPIECE
  if (f.model.empty()) fail_usage("--tokenizer-model is required for --tokenizer-type {}", type);
  // Megatron's default system encodes the three alike; its legacy classes differ.
  const SpmFlavor flavor = !f.legacy                             ? SpmFlavor::kGpt
                           : type == "GPTSentencePieceTokenizer" ? SpmFlavor::kGpt
                           : type == "Llama2Tokenizer"           ? SpmFlavor::kLlama2
                                                                 : SpmFlavor::kMegatron;
  return std::make_unique<SentencePieceTokenizer>(f.model, flavor, type, f.legacy);
#else
  fail_usage("{}", kNoSentencePiece);
#endif
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model) {
  TokenizerFiles f;
  f.type = type;
  f.model = model;
  return make_tokenizer(f);
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
  // How a text is read: absent (older identities, the default) is false.
  for (const char* k : {"legacy", "include_special_tokens"})
    if (a.value(k, false) != b.value(k, false)) return false;
  for (const char* k : {"tiktoken_pattern", "special_tokens", "num_special_tokens",
                        "additional_special_tokens"})
    if (a.value(k, nlohmann::json()) != b.value(k, nlohmann::json())) return false;
  return true;
}

}  // namespace weft
