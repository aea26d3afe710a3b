// The byte-level BPE tokenizer pipeline (bpe_tokenizer.h) and Megatron's GPT2BPETokenizer
// files. The Hugging Face tokenizer.json reader is in hf_tokenizer.cpp.
//
// encode is thread-safe (preprocessing shares one tokenizer between its workers): the pipeline
// is immutable after construction and the regular expressions match on per-call clones.
#include "weft/data/bpe_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "weft/core/error.h"
#include "weft/data/sha256.h"

namespace weft {

const char* const kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Unicode's White_Space characters (Rust's char::is_whitespace, which Hugging Face tokenizers'
// lstrip/rstrip use): the length in bytes of the one ending before `end`, or starting at `at`,
// in `s`; 0 when that character is not white space.
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}
size_t space_at(const std::string& s, size_t at) {
  uint32_t cp = 0;
  const size_t len = utf8_char_at(s, at, &cp);
  return len > 0 && is_white_space(cp) ? len : 0;
}
size_t space_before(const std::string& s, size_t end, size_t floor) {
  size_t b = end;  // back over continuation bytes to the lead byte
  while (b > floor && (static_cast<unsigned char>(s[b - 1]) & 0xC0) == 0x80) --b;
  if (b == floor) return 0;
  --b;
  const size_t len = space_at(s, b);
  return len == end - b ? len : 0;
}

// The pieces of `s` after one split step (non-empty pieces only).
void split_piece(const PreTokenizerStep& step, std::string s, std::vector<std::string>* out) {
  if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
    if (step.add_prefix_space && (s.empty() || s[0] != ' ')) s.insert(s.begin(), ' ');
    if (!step.regex) {
      if (!s.empty()) out->push_back(std::move(s));
      return;
    }
  }
  using B = PreTokenizerStep::Behavior;
  const B behavior = step.kind == PreTokenizerStep::Kind::kByteLevel ? B::kIsolated : step.behavior;
  size_t at = 0;
  std::string carry;  // kMergedWithNext: the match waiting for the text after it
  auto emit = [&](std::string piece) {
    if (!piece.empty()) out->push_back(std::move(piece));
  };
  for (const auto& [b, e] : step.regex->find_all(s)) {
    std::string gap = s.substr(at, b - at), match = s.substr(b, e - b);
    switch (behavior) {
      case B::kIsolated: emit(std::move(gap)); emit(std::move(match)); break;
      case B::kRemoved: emit(std::move(gap)); break;
      case B::kMergedWithPrevious: emit(gap + match); break;
      case B::kMergedWithNext:
        emit(carry + gap);
        carry = std::move(match);
        break;
    }
    at = e;
  }
  std::string tail = s.substr(at);
  emit(behavior == B::kMergedWithNext ? carry + tail : tail);
}

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpePipeline p) : p_(std::move(p)) {
    int32_t max_id = p_.model->max_id();
    for (size_t i = 0; i < p_.added.size(); ++i) {
      const AddedToken& t = p_.added[i];
      if (t.content.empty()) continue;
      by_first_byte_[static_cast<unsigned char>(t.content[0])].push_back(i);
      added_by_id_[t.id] = &t;
      max_id = std::max(max_id, t.id);
    }
    // Longest first: at one position the longest added token wins (leftmost-longest).
    for (auto& [byte, list] : by_first_byte_)
      std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
        return p_.added[a].content.size() > p_.added[b].content.size();
      });
    vocab_size_ = static_cast<int64_t>(max_id) + 1;
    p_.identity["vocab_size"] = vocab_size_;
    p_.identity["eod"] = p_.eod;
    p_.identity["bos"] = p_.bos;
    p_.identity["pad"] = p_.pad;
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids(p_.prefix);
    size_t at = 0;
    while (at < text.size()) {
      size_t begin = 0, end = 0;
      const AddedToken* tok = next_added(text, at, &begin, &end);
      encode_text(std::string_view(text).substr(at, begin - at), &ids);
      if (tok == nullptr) break;
      ids.push_back(tok->id);
      at = end;
    }
    ids.insert(ids.end(), p_.suffix.begin(), p_.suffix.end());
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
        out += it->second->content;
      } else if (const std::string* b = p_.model->token_bytes(id)) {
        out += *b;
      } else {
        fail("cannot decode id {}: it is not in the tokenizer's vocabulary of {}", id, vocab_size_);
      }
    }
    return utf8_with_replacements(out);
  }

  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return p_.eod; }
  int32_t bos() const override { return p_.bos; }
  int32_t pad() const override { return p_.pad; }
  nlohmann::json identity() const override { return p_.identity; }

 private:
  // The first added token at or after `from` (leftmost, then longest), widened by its
  // lstrip/rstrip whitespace into [*begin, *end); nullptr (and *begin = size) when none.
  const AddedToken* next_added(const std::string& text, size_t from, size_t* begin,
                               size_t* end) const {
    for (size_t i = from; i < text.size() && !by_first_byte_.empty(); ++i) {
      auto it = by_first_byte_.find(static_cast<unsigned char>(text[i]));
      if (it == by_first_byte_.end()) continue;
      for (size_t k : it->second) {
        const AddedToken& t = p_.added[k];
        if (text.compare(i, t.content.size(), t.content) != 0) continue;
        size_t b = i, e = i + t.content.size();
        if (t.lstrip)
          for (size_t n; (n = space_before(text, b, from)) > 0;) b -= n;
        if (t.rstrip)
          for (size_t n; e < text.size() && (n = space_at(text, e)) > 0;) e += n;
        *begin = b;
        *end = e;
        return &t;
      }
    }
    *begin = *end = text.size();
    return nullptr;
  }

  void encode_text(std::string_view text, std::vector<int32_t>* ids) const {
    if (text.empty()) return;
    std::vector<std::string> pieces{p_.nfc ? unicode_nfc(text) : std::string(text)}, next;
    for (const PreTokenizerStep& step : p_.pre) {
      next.clear();
      for (std::string& piece : pieces) split_piece(step, std::move(piece), &next);
      pieces.swap(next);
    }
    for (const std::string& piece : pieces) p_.model->encode_piece(piece, ids);
  }

  BpePipeline p_;
  std::unordered_map<unsigned char, std::vector<size_t>> by_first_byte_;
  std::unordered_map<int32_t, const AddedToken*> added_by_id_;
  int64_t vocab_size_ = 0;
};

std::string read_file_or_fail(const std::string& path, const char* flag) {
  if (path.empty()) fail_usage("{} is required for this --tokenizer-type", flag);
  if (!std::filesystem::is_regular_file(path)) fail_usage("{} {}: no such file", flag, path);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in && !in.eof()) fail_usage("{} {}: cannot read it", flag, path);
  return s.str();
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpePipeline pipeline) {
  return std::make_unique<BpeTokenizer>(std::move(pipeline));
}

void add_special_tokens(BpePipeline* p, int64_t model_vocab_size,
                        const std::vector<std::string>& extra) {
  for (const std::string& text : extra) {
    if (text.empty()) fail_usage("--tokenizer-special-tokens: a token is empty");
    bool known = false;
    for (AddedToken& t : p->added)
      if (t.content == text) {
        known = true;
        t.lstrip = t.rstrip = false;
      }
    if (known) continue;
    int64_t id = p->model->token_id(text);
    if (id < 0) {
      id = model_vocab_size;
      for (const AddedToken& t : p->added)
        if (t.id >= model_vocab_size) id = std::max<int64_t>(id, int64_t{t.id} + 1);
    }
    p->added.push_back({text, static_cast<int32_t>(id), false, false});
  }
}

std::unique_ptr<Tokenizer> load_gpt2_bpe_tokenizer(const std::string& vocab_file,
                                                   const std::string& merge_file, bool legacy,
                                                   const std::vector<std::string>& extra) {
  const std::string vocab_text = read_file_or_fail(vocab_file, "--vocab-file");
  const std::string merge_text = read_file_or_fail(merge_file, "--merge-file");
  nlohmann::json vocab_json;
  try {
    vocab_json = nlohmann::json::parse(vocab_text);
  } catch (const nlohmann::json::exception& e) {
    fail_usage("--vocab-file {}: not JSON ({})", vocab_file, e.what());
  }
  if (!vocab_json.is_object())
    fail_usage("--vocab-file {}: not a JSON object of token -> id", vocab_file);
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items()) {
    if (!id.is_number_integer())
      fail_usage("--vocab-file {}: the id of {:?} is not an integer", vocab_file, token);
    vocab.emplace_back(token, id.get<int32_t>());
  }
  // merges.txt: a "#version" line, then one "left right" pair per line in rank order.
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream lines(merge_text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || line.find(' ', sp + 1) != std::string::npos)
      fail_usage("--merge-file {}: line {} is not two tokens separated by one space: {:?}",
                 merge_file, n, line);
    merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  BpePipeline p;
  p.model = std::make_shared<BpeModel>(vocab, merges, /*ignore_merges=*/false,
                                       "--vocab-file/--merge-file");
  p.pre.push_back({PreTokenizerStep::Kind::kByteLevel, PreTokenizerStep::Behavior::kIsolated,
                   std::make_shared<UnicodeRegex>(kGpt2SplitPattern, "GPT-2's split pattern"),
                   false});
  p.eod = p.model->token_id("<|endoftext|>");
  if (p.eod < 0)
    fail_usage("--vocab-file {}: has no \"<|endoftext|>\", GPT2BPETokenizer's end-of-document "
               "token", vocab_file);
  if (!legacy) p.added.push_back({"<|endoftext|>", p.eod});
  if (legacy && !extra.empty())
    fail_usage("--tokenizer-special-tokens with --legacy-tokenizer: Megatron's legacy "
               "GPT2Tokenizer has no special tokens");
  namespace fs = std::filesystem;
  p.identity = {{"type", "GPT2BPETokenizer"},
                {"model_file", fs::path(vocab_file).filename().string() + "+" +
                                   fs::path(merge_file).filename().string()},
                {"sha256", sha256_hex(sha256_hex(vocab_text) + sha256_hex(merge_text))}};
  if (legacy) p.identity["legacy"] = true;
  // Megatron's GPT2BPETokenizer is its HuggingFaceTokenizer on these files: the same rule.
  add_special_tokens(&p, static_cast<int64_t>(vocab.size()), extra);
  if (!extra.empty()) p.identity["additional_special_tokens"] = extra;
  return make_bpe_tokenizer(std::move(p));
}

}  // namespace weft
