// Megatron's TikTokenizer (tiktoken_tokenizer.h).
#include "weft/data/tiktoken_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "weft/core/error.h"
#include "weft/data/sha256.h"
#include "weft/data/unicode_text.h"

namespace weft {
namespace {

// Megatron's patterns with \s and \S as Unicode's White_Space (the meaning of tiktoken's Rust
// regex); ICU's own \s leaves out U+000B and U+0085.
constexpr const char* kPatternV1 =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\p{White_Space}\p{L}\p{N}]++[\r\n]*|)"
    R"(\p{White_Space}*[\r\n]|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";
constexpr const char* kPatternV2 =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
    R"(\p{N}| ?[^\p{White_Space}\p{L}\p{N}]+[\r\n/]*|\p{White_Space}*[\r\n]+|)"
    R"(\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";

constexpr int64_t kDefaultVocab = int64_t{1} << 17;

// Hash and equality that take string_view keys without building a string.
struct BytesHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Ranks = std::unordered_map<std::string, int32_t, BytesHash, std::equal_to<>>;

// RFC 4648 base64 (padding optional); false on a character outside the alphabet.
bool base64_decode(std::string_view in, std::string* out) {
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else if (c == '=') break;
    else return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return true;
}

class TikTokenizer final : public Tokenizer {
 public:
  explicit TikTokenizer(const TokenizerFiles& f) : legacy_(f.legacy) {
    const std::string flag = "--tokenizer-model " + f.model;
    if (f.model.empty()) fail_usage("--tokenizer-type TikTokenizer needs --tokenizer-model (its JSON vocabulary)");
    const std::string pattern = f.tiktoken_pattern.empty() ? "v2" : f.tiktoken_pattern;
    if (pattern != "v1" && pattern != "v2")
      fail_usage("--tiktoken-pattern {}: must be v1 or v2", pattern);
    vocab_size_ = f.vocab_size > 0 ? f.vocab_size : kDefaultVocab;
    if (vocab_size_ > INT32_MAX)
      fail_usage("--vocab-size {}: TikTokenizer's ids must fit in int32", vocab_size_);
    const int64_t nspecial = f.tiktoken_num_special_tokens;
    // Megatron's default specials: its tokenizer system's seven, its legacy class's three.
    std::vector<std::string> base = {"<unk>", "<s>", "</s>"};
    if (!legacy_) base.insert(base.end(), {"<mask>", "<pad>", "<cls>", "<sep>"});
    std::vector<std::string> specials = f.special_tokens.empty() ? base : f.special_tokens;
    if (std::unordered_set<std::string>(specials.begin(), specials.end()).size() != specials.size())
      fail_usage("--tokenizer-special-tokens: a token is named twice");
    for (const std::string& b : base)
      if (std::find(specials.begin(), specials.end(), b) == specials.end())
        fail_usage("--tokenizer-special-tokens must include {} (Megatron's TikTokenizer needs "
                   "{}{})", b, fmt::join(base, " "), legacy_ ? " with --legacy-tokenizer" : "");
    if (nspecial < static_cast<int64_t>(specials.size()) || nspecial >= vocab_size_)
      fail_usage("--tiktoken-num-special-tokens {}: must be at least the {} special tokens and "
                 "below the vocabulary size {} (--vocab-size)", nspecial, specials.size(), vocab_size_);
    const std::vector<std::string> named = specials;
    for (int64_t i = static_cast<int64_t>(specials.size()); i < nspecial; ++i)
      specials.push_back(fmt::format("<SPECIAL_{}>", i));
    special_set_.insert(specials.begin(), specials.end());
    if (special_set_.size() != specials.size())
      fail_usage("--tokenizer-special-tokens: a token equals a <SPECIAL_i> filler name");
    auto index = [&](const char* t) {
      auto it = std::find(specials.begin(), specials.end(), t);
      return it == specials.end() ? -1 : static_cast<int32_t>(it - specials.begin());
    };
    eod_ = index("</s>");
    bos_ = index("<s>");
    pad_ = legacy_ ? -1 : index("<pad>");

    std::ifstream in(f.model, std::ios::binary);
    if (!in) fail_usage("{}: cannot open the file", flag);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail_usage("{}: not JSON ({})", flag, e.what());
    }
    if (!j.is_array())
      fail_usage("{}: not Megatron's tiktoken vocabulary (a JSON list of {{\"rank\", "
                 "\"token_bytes\", \"token_str\"}})", flag);
    const int64_t inner = vocab_size_ - nspecial;
    if (inner < 256)
      fail_usage("--vocab-size {} less --tiktoken-num-special-tokens {} leaves {} ids, fewer than "
                 "the 256 single bytes", vocab_size_, nspecial, inner);
    if (static_cast<int64_t>(j.size()) < inner)
      fail_usage("{} holds {} tokens, fewer than --vocab-size {} less --tiktoken-num-special-tokens "
                 "{} ({} needed)", flag, j.size(), vocab_size_, nspecial, inner);
    id_bytes_.resize(static_cast<size_t>(vocab_size_));
    for (size_t i = 0; i < specials.size(); ++i) id_bytes_[i] = specials[i];
    ranks_.reserve(static_cast<size_t>(inner));
    std::string bytes;
    for (int64_t i = 0; i < inner; ++i) {
      const nlohmann::json& e = j[static_cast<size_t>(i)];
      const bool shape = e.is_object() && e.size() == 3 && e.contains("rank") &&
                         e.contains("token_bytes") && e.contains("token_str") &&
                         e["rank"].is_number_integer() && e["token_bytes"].is_string();
      if (!shape)
        fail_usage("{}: entry {} is not {{\"rank\", \"token_bytes\", \"token_str\"}}", flag, i);
      if (e["rank"].get<int64_t>() != i)
        fail_usage("{}: entry {} has rank {} (the ranks must be 0, 1, 2, ... in order)", flag, i,
                   e["rank"].get<int64_t>());
      if (!base64_decode(e["token_bytes"].get<std::string>(), &bytes) || bytes.empty())
        fail_usage("{}: entry {}'s token_bytes is not base64 of a token", flag, i);
      if (i < 256 && (bytes.size() != 1 || static_cast<unsigned char>(bytes[0]) != i))
        fail_usage("{}: entry {} must be the single byte {} (ranks 0-255 are the bytes)", flag, i, i);
      const auto id = static_cast<int32_t>(i + nspecial);
      if (!ranks_.emplace(bytes, id).second)
        fail_usage("{}: entry {} repeats the bytes of an earlier entry", flag, i);
      id_bytes_[static_cast<size_t>(id)] = bytes;
    }
    regex_ = std::make_unique<UnicodeRegex>(pattern == "v1" ? kPatternV1 : kPatternV2,
                                            "--tiktoken-pattern " + pattern);
    if (!legacy_) {
      for (size_t i = 0; i < specials.size(); ++i)
        specials_by_first_[static_cast<unsigned char>(specials[i][0])].push_back(
            {specials[i], static_cast<int32_t>(i)});
    }
    identity_ = {{"type", "TikTokenizer"},
                 {"model_file", std::filesystem::path(f.model).filename().string()},
                 {"sha256", sha256_file_hex(f.model)},
                 {"vocab_size", vocab_size_},
                 {"eod", eod_},
                 {"bos", bos_},
                 {"pad", pad_},
                 {"tiktoken_pattern", pattern},
                 {"special_tokens", named},
                 {"num_special_tokens", nspecial}};
    if (legacy_) identity_["legacy"] = true;
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    size_t at = 0;
    while (at < text.size()) {
      size_t b = text.size(), len = 0;
      int32_t id = -1;
      if (!specials_by_first_.empty()) find_special(text, at, &b, &len, &id);
      encode_ordinary(std::string_view(text).substr(at, b - at), &ids);
      if (id < 0) break;
      ids.push_back(id);
      at = b + len;
    }
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size_)
        fail_usage("TikTokenizer: id {} is outside the vocabulary [0, {})", id, vocab_size_);
      out += id_bytes_[static_cast<size_t>(id)];
    }
    return utf8_with_replacements(out);
  }

  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  int32_t bos() const override { return bos_; }
  int32_t pad() const override { return pad_; }
  nlohmann::json identity() const override { return identity_; }

 private:
  struct Special {
    std::string text;
    int32_t id;
  };

  // The leftmost special token at or after `at` (the longest where several start there).
  void find_special(const std::string& text, size_t at, size_t* begin, size_t* len,
                    int32_t* id) const {
    for (size_t i = at; i < text.size(); ++i) {
      auto it = specials_by_first_.find(static_cast<unsigned char>(text[i]));
      if (it == specials_by_first_.end()) continue;
      for (const Special& s : it->second)
        if (s.text.size() > *len && text.compare(i, s.text.size(), s.text) == 0) {
          *len = s.text.size();
          *id = s.id;
        }
      if (*id >= 0) {
        *begin = i;
        return;
      }
    }
  }

  void encode_ordinary(std::string_view text, std::vector<int32_t>* ids) const {
    if (text.empty()) return;
    for (const auto& [b, e] : regex_->find_all(text)) {
      const std::string_view piece = text.substr(b, e - b);
      if (auto it = ranks_.find(piece); it != ranks_.end()) {
        ids->push_back(it->second);
      } else {
        merge(piece, ids);
      }
    }
  }

  int32_t rank_of(std::string_view bytes) const {
    auto it = ranks_.find(bytes);
    return it == ranks_.end() ? INT32_MAX : it->second;
  }

  // tiktoken's byte pair merge: parts start as the bytes; the adjacent pair whose joined bytes
  // have the lowest rank (the leftmost of equal ranks) is joined until no joined pair has a
  // rank. A heap of (rank, start) with stale entries skipped keeps it O(n log n).
  void merge(std::string_view piece, std::vector<int32_t>* ids) const {
    const auto n = static_cast<int32_t>(piece.size());
    std::vector<int32_t> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
    std::vector<int32_t> pair_rank(static_cast<size_t>(n), INT32_MAX);
    for (int32_t i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i - 1;
    using Entry = std::pair<int32_t, int32_t>;  // (rank, start)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    // The rank of part `i` joined with the part after it.
    auto rank_at = [&](int32_t i) -> int32_t {
      const int32_t j = next[i];
      if (j >= n) return INT32_MAX;
      return rank_of(piece.substr(static_cast<size_t>(i), static_cast<size_t>(next[j] - i)));
    };
    auto update = [&](int32_t i) {
      pair_rank[i] = rank_at(i);
      if (pair_rank[i] != INT32_MAX) heap.emplace(pair_rank[i], i);
    };
    for (int32_t i = 0; i < n; ++i) update(i);
    std::vector<bool> alive(static_cast<size_t>(n), true);
    while (!heap.empty()) {
      const auto [r, i] = heap.top();
      heap.pop();
      if (!alive[i] || pair_rank[i] != r) continue;  // stale
      const int32_t j = next[i];
      alive[j] = false;
      next[i] = next[j];
      if (next[j] < n) prev[next[j]] = i;
      update(i);
      if (prev[i] >= 0) update(prev[i]);
    }
    for (int32_t i = 0; i < n; i = next[i])
      ids->push_back(ranks_.find(piece.substr(static_cast<size_t>(i),
                                              static_cast<size_t>(next[i] - i)))->second);
  }

  bool legacy_;
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1, bos_ = -1, pad_ = -1;
  Ranks ranks_;
  std::vector<std::string> id_bytes_;  // id -> its bytes (a special token: its text)
  std::unordered_set<std::string> special_set_;
  std::unordered_map<unsigned char, std::vector<Special>> specials_by_first_;
  std::unique_ptr<UnicodeRegex> regex_;
  nlohmann::json identity_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_tiktoken_tokenizer(const TokenizerFiles& files) {
  return std::make_unique<TikTokenizer>(files);
}

}  // namespace weft
