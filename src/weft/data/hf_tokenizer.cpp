// Reads a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json) into weft's byte-level BPE pipeline (bpe_tokenizer.h), from the
// format as the tokenizers library writes it. What is read, and what is refused:
//   model          "BPE" with a ByteLevel pre-tokenizer (vocab, merges as "a b" or ["a", "b"],
//                  ignore_merges); dropout, byte_fallback, a subword prefix or suffix: refused
//   normalizer     null, NFC, or a Sequence of those; any other: refused
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex), Split (Regex or String pattern,
//                  Isolated / Removed / MergedWithPrevious / MergedWithNext, not inverted),
//                  Sequence of those; any other (Metaspace, Whitespace, Digits...): refused
//   post_processor null, ByteLevel, TemplateProcessing (its "single" template),
//                  RobertaProcessing / BertProcessing (cls ... sep), Sequence of those
//   added_tokens   matched in the raw text, leftmost then longest, with lstrip/rstrip;
//                  single_word: refused; --tokenizer-special-tokens adds more (Megatron's
//                  additional_special_tokens, see load_hf_tokenizer)
//   specials       eos_token (Megatron's eod), bos_token, pad_token from tokenizer_config.json,
//                  else special_tokens_map.json, else the default of transformers' class
//                  (GPT-2's, Qwen 2's, GPT-NeoX's "<|endoftext|>"); an explicit null is none
// A SentencePiece-converted tokenizer.json (Llama 2, Mistral 7B: Metaspace, byte_fallback) is
// refused with the advice to give its tokenizer.model to Llama2Tokenizer or
// GPTSentencePieceTokenizer.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "weft/core/error.h"
#include "weft/data/bpe_tokenizer.h"
#include "weft/data/sha256.h"

namespace weft {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Reader {
  std::string dir;   // for messages: "--tokenizer-model DIR"
  std::string file;  // tokenizer.json's path

  [[noreturn]] void refuse(const std::string& key, const std::string& why) const {
    fail_usage("--tokenizer-model {}: tokenizer.json {}: {}", dir, key, why);
  }

  static std::string type_of(const json& j) {
    return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                         : "";
  }

  bool read_normalizer(const json& j, const std::string& key) const {  // true: NFC
    if (j.is_null()) return false;
    const std::string t = type_of(j);
    if (t == "NFC") return true;
    if (t == "Sequence") {
      bool nfc = false;
      const json& list = j.value("normalizers", json::array());
      for (size_t i = 0; i < list.size(); ++i)
        nfc |= read_normalizer(list[i], fmt::format("{}.normalizers[{}]", key, i));
      return nfc;
    }
    refuse(key, fmt::format("normalizer {:?} is not supported (weft applies none or NFC)", t));
  }

  void read_pre(const json& j, const std::string& key, std::vector<PreTokenizerStep>* out) const {
    if (j.is_null()) return;
    const std::string t = type_of(j);
    if (t == "Sequence") {
      const json& list = j.value("pretokenizers", json::array());
      for (size_t i = 0; i < list.size(); ++i)
        read_pre(list[i], fmt::format("{}.pretokenizers[{}]", key, i), out);
      return;
    }
    PreTokenizerStep s;
    if (t == "ByteLevel") {
      s.kind = PreTokenizerStep::Kind::kByteLevel;
      s.add_prefix_space = j.value("add_prefix_space", false);
      if (j.value("use_regex", true))
        s.regex = std::make_shared<UnicodeRegex>(kGpt2SplitPattern, "GPT-2's split pattern");
    } else if (t == "Split") {
      if (j.value("invert", false)) refuse(key + ".invert", "an inverted split is not supported");
      const std::string b = j.value("behavior", std::string("Isolated"));
      using B = PreTokenizerStep::Behavior;
      if (b == "Isolated") s.behavior = B::kIsolated;
      else if (b == "Removed") s.behavior = B::kRemoved;
      else if (b == "MergedWithPrevious") s.behavior = B::kMergedWithPrevious;
      else if (b == "MergedWithNext") s.behavior = B::kMergedWithNext;
      else refuse(key + ".behavior", fmt::format("{:?} is not supported", b));
      const json& pat = j.value("pattern", json::object());
      std::string regex;
      if (pat.contains("Regex") && pat["Regex"].is_string()) {
        regex = pat["Regex"].get<std::string>();
      } else if (pat.contains("String") && pat["String"].is_string()) {
        // A literal: quoted for the regex engine (\Q...\E, with any "\E" inside spelled out).
        std::string lit = pat["String"].get<std::string>(), quoted = "\\Q";
        for (size_t at = 0;;) {
          const size_t e = lit.find("\\E", at);
          quoted += lit.substr(at, e == std::string::npos ? std::string::npos : e - at);
          if (e == std::string::npos) break;
          quoted += "\\E\\\\E\\Q";
          at = e + 2;
        }
        regex = quoted + "\\E";
      } else {
        refuse(key + ".pattern", "neither a Regex nor a String");
      }
      s.regex = std::make_shared<UnicodeRegex>(regex, "--tokenizer-model " + dir + ": tokenizer.json " + key);
    } else {
      refuse(key, fmt::format("pre-tokenizer {:?} is not supported", t));
    }
    out->push_back(std::move(s));
  }

  // The ids of a post-processor's special token given by content (or [content, id]).
  int32_t special_id(const json& tokens, const std::string& name, const std::string& key) const {
    if (!tokens.contains(name)) refuse(key, fmt::format("names the special token {:?} without its ids", name));
    const json& ids = tokens[name].value("ids", json::array());
    if (ids.size() != 1) refuse(key, fmt::format("special token {:?} is not one id", name));
    return ids[0].get<int32_t>();
  }

  void read_post(const json& j, const std::string& key, BpePipeline* p) const {
    if (j.is_null()) return;
    const std::string t = type_of(j);
    if (t == "ByteLevel") return;  // offsets only
    if (t == "Sequence") {
      const json& list = j.value("processors", json::array());
      for (size_t i = 0; i < list.size(); ++i)
        read_post(list[i], fmt::format("{}.processors[{}]", key, i), p);
      return;
    }
    if (t == "RobertaProcessing" || t == "BertProcessing") {
      p->prefix = {j.at("cls").at(1).get<int32_t>()};
      p->suffix = {j.at("sep").at(1).get<int32_t>()};
      return;
    }
    if (t != "TemplateProcessing") refuse(key, fmt::format("post-processor {:?} is not supported", t));
    const json& single = j.value("single", json::array());
    const json& specials = j.value("special_tokens", json::object());
    p->prefix.clear();
    p->suffix.clear();
    bool seen_a = false;
    for (const json& item : single) {
      if (item.contains("Sequence")) {
        if (item["Sequence"].value("id", std::string("A")) != "A" || seen_a)
          refuse(key + ".single", "the template of one text has a sequence other than one A");
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].value("id", std::string());
        (seen_a ? p->suffix : p->prefix).push_back(special_id(specials, name, key + ".special_tokens"));
      }
    }
    if (!seen_a) refuse(key + ".single", "the template of one text has no sequence A");
  }
};

json read_json(const fs::path& path, const std::string& dir) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_usage("--tokenizer-model {}: cannot read {}", dir, path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail_usage("--tokenizer-model {}: {} is not JSON ({})", dir, path.filename().string(), e.what());
  }
}

// tokenizer_config.json writes a special token as "text" or {"content": "text", ...}.
std::string token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

}  // namespace

namespace {

std::unique_ptr<Tokenizer> read_hf_tokenizer(const std::string& path, bool include_special_tokens,
                                             const std::vector<std::string>& extra) {
  if (path.empty()) fail_usage("--tokenizer-model is required for --tokenizer-type HuggingFaceTokenizer "
                               "(a local directory holding tokenizer.json)");
  fs::path dir = path, file = fs::path(path) / "tokenizer.json";
  if (fs::is_regular_file(path)) {
    file = path;
    dir = fs::path(path).parent_path();
  }
  if (!fs::is_regular_file(file))
    fail_usage("--tokenizer-model {}: no tokenizer.json there (weft reads a local directory as "
               "saved by transformers' save_pretrained; it downloads nothing)", path);
  Reader r{path, file.string()};
  const json tj = read_json(file, path);
  const json& model = tj.value("model", json::object());
  std::string mtype = Reader::type_of(model);
  // Older files (GPT-2's on the Hub) leave the type out; the tokenizers library then reads the
  // model with merges as BPE.
  if (mtype.empty() && model.contains("merges") && model.contains("vocab")) mtype = "BPE";
  if (mtype != "BPE")
    r.refuse("model.type", fmt::format("{:?}: weft reads byte-level BPE models (GPT-2, Llama 3, "
                                       "Qwen); for a SentencePiece model give its tokenizer.model "
                                       "with --tokenizer-type GPTSentencePieceTokenizer", mtype));
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0)
    r.refuse("model.dropout", "BPE dropout is not supported");
  if (model.value("byte_fallback", false))
    r.refuse("model.byte_fallback",
             "a SentencePiece-style BPE (byte fallback) is not supported; give its tokenizer.model "
             "with --tokenizer-type Llama2Tokenizer or GPTSentencePieceTokenizer");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
      r.refuse(std::string("model.") + k, "is not supported");

  BpePipeline p;
  p.nfc = r.read_normalizer(tj.value("normalizer", json()), "normalizer");
  r.read_pre(tj.value("pre_tokenizer", json()), "pre_tokenizer", &p.pre);
  bool byte_level = false;
  for (const PreTokenizerStep& s : p.pre) {
    // A step after ByteLevel would see GPT-2's stand-in characters ("Ġ" for a space) in the
    // tokenizers library; weft's steps all see the text, so it refuses that order.
    if (byte_level)
      r.refuse("pre_tokenizer", "a step after the ByteLevel step is not supported");
    byte_level |= s.kind == PreTokenizerStep::Kind::kByteLevel;
  }
  if (!byte_level)
    r.refuse("pre_tokenizer", "has no ByteLevel step: weft reads byte-level BPE models; for a "
                              "SentencePiece model give its tokenizer.model with --tokenizer-type "
                              "GPTSentencePieceTokenizer");

  std::vector<std::pair<std::string, int32_t>> vocab;
  const json& vj = model.value("vocab", json::object());
  vocab.reserve(vj.size());
  for (const auto& [token, id] : vj.items()) vocab.emplace_back(token, id.get<int32_t>());
  std::vector<std::pair<std::string, std::string>> merges;
  const json& mj = model.value("merges", json::array());
  merges.reserve(mj.size());
  for (size_t i = 0; i < mj.size(); ++i) {
    if (mj[i].is_array() && mj[i].size() == 2) {
      merges.emplace_back(mj[i][0].get<std::string>(), mj[i][1].get<std::string>());
      continue;
    }
    const std::string m = mj[i].is_string() ? mj[i].get<std::string>() : "";
    const size_t sp = m.find(' ');
    if (sp == std::string::npos || m.find(' ', sp + 1) != std::string::npos)
      r.refuse(fmt::format("model.merges[{}]", i), "is not a pair of tokens");
    merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  auto bpe = std::make_shared<BpeModel>(vocab, merges, model.value("ignore_merges", false),
                                        "--tokenizer-model " + path + ": tokenizer.json model");
  p.model = bpe;

  const json& added = tj.value("added_tokens", json::array());
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    if (a.value("single_word", false))
      r.refuse(fmt::format("added_tokens[{}].single_word", i), "is not supported");
    p.added.push_back({a.at("content").get<std::string>(), a.at("id").get<int32_t>(),
                       a.value("lstrip", false), a.value("rstrip", false)});
  }
  add_special_tokens(&p, static_cast<int64_t>(vocab.size()), extra);
  r.read_post(tj.value("post_processor", json()), "post_processor", &p);
  const std::vector<int32_t> template_prefix = p.prefix, template_suffix = p.suffix;
  if (!include_special_tokens) {
    p.prefix.clear();
    p.suffix.clear();
  }

  // Special tokens: tokenizer_config.json, else special_tokens_map.json (transformers' order).
  json config = json::object(), special_map = json::object();
  std::string config_text;
  if (fs::is_regular_file(dir / "tokenizer_config.json")) {
    config = read_json(dir / "tokenizer_config.json", path);
    config_text = config.dump();
  }
  if (fs::is_regular_file(dir / "special_tokens_map.json"))
    special_map = read_json(dir / "special_tokens_map.json", path);
  // transformers' tokenizer classes that default a special token when no file names it:
  // GPT-2's, Qwen 2's and GPT-NeoX's eos (GPT-2's bos too) is "<|endoftext|>". The class is
  // tokenizer_config.json's tokenizer_class, else the model_type of config.json beside it.
  std::string cls = config.value("tokenizer_class", std::string());
  if (cls.empty() && fs::is_regular_file(dir / "config.json")) {
    const json mc = read_json(dir / "config.json", path);
    const std::string mt = mc.value("model_type", std::string());
    if (mt == "gpt2") cls = "GPT2Tokenizer";
    if (mt.rfind("qwen2", 0) == 0 || mt.rfind("qwen3", 0) == 0) cls = "Qwen2Tokenizer";
    if (mt == "gpt_neox") cls = "GPTNeoXTokenizer";
  }
  if (cls.size() > 4 && cls.compare(cls.size() - 4, 4, "Fast") == 0) cls.resize(cls.size() - 4);
  auto class_default = [&](const std::string& name) -> std::string {
    if (cls == "GPT2Tokenizer" && (name == "eos_token" || name == "bos_token"))
      return "<|endoftext|>";
    if ((cls == "Qwen2Tokenizer" || cls == "GPTNeoXTokenizer") && name == "eos_token")
      return "<|endoftext|>";
    return "";
  };
  auto special = [&](const char* name) -> int32_t {
    std::string text = token_text(config.value(name, json()));
    if (text.empty() && !config.contains(name)) text = token_text(special_map.value(name, json()));
    if (text.empty() && !config.contains(name) && !special_map.contains(name))
      text = class_default(name);
    if (text.empty()) return -1;
    for (const AddedToken& t : p.added)
      if (t.content == text) return t.id;
    const int32_t id = bpe->token_id(text);
    if (id < 0)
      fail_usage("--tokenizer-model {}: the {} {:?} is neither an added token nor in the "
                 "vocabulary", path, name, text);
    return id;
  };
  // transformers' classes that rebuild part of the pipeline from tokenizer_config.json: refuse
  // a file whose setting disagrees with tokenizer.json, since weft reads tokenizer.json only.
  if ((cls == "GPT2Tokenizer" || cls == "RobertaTokenizer") && config.contains("add_prefix_space")) {
    bool in_json = false;
    for (const PreTokenizerStep& s : p.pre)
      if (s.kind == PreTokenizerStep::Kind::kByteLevel) in_json = s.add_prefix_space;
    if (config["add_prefix_space"].is_boolean() && config["add_prefix_space"].get<bool>() != in_json)
      fail_usage("--tokenizer-model {}: tokenizer_config.json add_prefix_space {} disagrees with "
                 "tokenizer.json's ByteLevel pre-tokenizer ({}), which transformers' {} would "
                 "rewrite; weft reads tokenizer.json as it is", path,
                 config["add_prefix_space"].get<bool>(), in_json, cls);
  }
  if (cls == "LlamaTokenizer" || cls == "CodeLlamaTokenizer") {
    const bool bos = config.value("add_bos_token", true), eos = config.value("add_eos_token", false);
    const int32_t bos_id = special("bos_token"), eos_id = special("eos_token");
    const std::vector<int32_t> want_prefix = bos && bos_id >= 0 ? std::vector<int32_t>{bos_id}
                                                                : std::vector<int32_t>{};
    const std::vector<int32_t> want_suffix = eos && eos_id >= 0 ? std::vector<int32_t>{eos_id}
                                                                : std::vector<int32_t>{};
    if (template_prefix != want_prefix || template_suffix != want_suffix)
      fail_usage("--tokenizer-model {}: tokenizer_config.json add_bos_token {} / add_eos_token {} "
                 "disagree with tokenizer.json's post-processor, which transformers' {} would "
                 "rebuild from them; weft reads tokenizer.json as it is", path, bos, eos, cls);
  }
  p.eod = special("eos_token");
  // Megatron's HuggingFaceTokenizer takes the sep_token as the eos_token where the tokenizer
  // names no eos_token (BERT-style tokenizers).
  if (p.eod < 0) p.eod = special("sep_token");
  p.bos = special("bos_token");
  p.pad = special("pad_token");
  if (p.eod < 0)
    fail_usage("--tokenizer-model {}: neither tokenizer_config.json nor special_tokens_map.json "
               "names an eos_token or a sep_token (nor does the tokenizer class '{}' default "
               "one), which Megatron's HuggingFaceTokenizer takes as the end-of-document id",
               path, cls);
  const std::string tj_hash = sha256_file_hex(file.string());
  p.identity = {{"type", "HuggingFaceTokenizer"},
                {"model_file", fs::path(path).filename().string()},
                {"sha256", sha256_hex(tj_hash + sha256_hex(config_text) +
                                      sha256_hex(special_map.dump()))},
                {"include_special_tokens", include_special_tokens}};
  if (!extra.empty()) p.identity["additional_special_tokens"] = extra;
  return make_bpe_tokenizer(std::move(p));
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, bool include_special_tokens,
                                             const std::vector<std::string>& extra_special_tokens) {
  try {
    return read_hf_tokenizer(path, include_special_tokens, extra_special_tokens);
  } catch (const json::exception& e) {  // a value of another type or a missing key
    fail_usage("--tokenizer-model {}: a tokenizer file holds a value weft cannot read as the "
               "format says ({})", path, e.what());
  }
}

}  // namespace weft
