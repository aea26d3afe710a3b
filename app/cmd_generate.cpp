// `weft generate`: reads every model weight of a checkpoint (whatever layout saved it) in one
// process, rebuilds the model from metadata["config"]["model"], prefills the prompt and samples
// --max-new-tokens tokens (docs/generate.md). The continuation goes to stdout (text with a
// tokenizer, ids without), one line of counts and tokens/s to stderr.
//
// Every check of the input runs before the weights are read: one line naming the flag, exit 2
// (main.cpp maps UsageError). The prompt plus the new tokens must fit the model's --seq-length
// unless --allow-past-seq-length: the rotary tables cover any position, but the model was
// trained on seq_length positions only.
#include "cmd_generate.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "weft/checkpoint/full_read.h"
#include "weft/comm/device.h"
#include "weft/core/error.h"
#include "tokenizer_flags.h"
#include "weft/data/tokenizer.h"
#include "weft/model/generate.h"
#include "weft/train/config_json.h"

namespace weft::app {
namespace {

struct GenerateArgs {
  std::string load;
  TokenizerFiles tokenizer;
  std::string prompt, prompt_ids, device = "cpu";
  int ckpt_step = -1, threads = 0;
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  uint64_t seed = 1234;
  bool greedy = false, force = false, ignore_eos = false, allow_past_seq_length = false;
  CLI::Option* prompt_opt = nullptr;
  CLI::Option* num_special_opt = nullptr;  // --tiktoken-num-special-tokens
  CLI::Option* prompt_ids_opt = nullptr;
};

std::vector<int64_t> parse_prompt_ids(const std::string& text) {
  std::string s = text;
  for (char& c : s)
    if (c == ',') c = ' ';
  std::istringstream in(s);
  std::vector<int64_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != word.size())
      fail_usage("--prompt-ids: '{}' is not an integer (give ids separated by spaces)", word);
    ids.push_back(v);
  }
  return ids;
}

void run(const GenerateArgs& a) {
  // Flags first: nothing is read before they are all valid.
  const bool has_prompt = a.prompt_opt->count() > 0, has_ids = a.prompt_ids_opt->count() > 0;
  if (has_prompt == has_ids) fail_usage("give exactly one of --prompt and --prompt-ids");
  if (has_prompt && !tokenizer_given(a.tokenizer))
    fail_usage("--prompt needs a tokenizer: --tokenizer-model, or --vocab-file and --merge-file "
               "(or give --prompt-ids)");
  if (a.max_new_tokens < 1) fail_usage("--max-new-tokens must be >= 1 (got {})", a.max_new_tokens);
  SamplingOptions sampling = a.sampling;
  if (a.greedy) sampling.temperature = 0;
  check_sampling_options(sampling);
  if (a.device != "cpu" && a.device != "cuda")
    fail_usage("--device must be cpu or cuda (got '{}')", a.device);
  if (a.device == "cuda" && cuda_device_count() == 0)
    fail_usage("--device cuda: no CUDA device here (or weft was built without CUDA)");
  if (a.threads < 0) fail_usage("--threads must be >= 0 (got {})", a.threads);
  if (a.threads > 0) at::set_num_threads(a.threads);

  std::string iter_dir;
  if (Status s = ckpt_resolve_iter_dir(a.load, a.ckpt_step, &iter_dir); !s)
    fail_usage("--load {}: {}", a.load, s.message());
  nlohmann::json meta;
  CkptIndex index;
  if (Status s = ckpt_read_metadata(iter_dir, &meta, &index); !s)
    fail_usage("--load {}: {}", a.load, s.message());
  if (!meta.contains("config") || !meta["config"].contains("model"))
    fail_usage("--load {}: {}/metadata.json has no config.model to rebuild the model from",
               a.load, iter_dir);
  const ModelConfig cfg = model_config_from_json(meta["config"]["model"]);

  std::unique_ptr<Tokenizer> tok;
  const std::string tok_name = !a.tokenizer.model.empty()      ? "--tokenizer-model " + a.tokenizer.model
                               : !a.tokenizer.vocab_file.empty() ? "--vocab-file " + a.tokenizer.vocab_file
                                                                 : "--tokenizer-type " + a.tokenizer.type;
  if (tokenizer_given(a.tokenizer)) {
    TokenizerFiles files = a.tokenizer;
    const nlohmann::json recorded = meta.value("tokenizer", nlohmann::json());
    if (files.type.empty())  // the type the checkpoint was trained with, else Megatron's default
      files.type = recorded.is_object() ? recorded.value("type", std::string("SentencePieceTokenizer"))
                                        : "SentencePieceTokenizer";
    if (recorded.is_object()) {  // and the way it read texts (--legacy-tokenizer and the like)
      files.legacy |= recorded.value("legacy", false);
      if (!files.hf_special_tokens_flag && recorded.contains("include_special_tokens"))
        files.hf_include_special_tokens = recorded["include_special_tokens"].get<bool>();
    }
    if (files.type == "TikTokenizer" && recorded.is_object() &&
        recorded.value("type", std::string()) == "TikTokenizer") {
      // What the flags leave unsaid, as the checkpoint's tokenizer had it.
      if (files.vocab_size < 1) files.vocab_size = recorded.value("vocab_size", int64_t{-1});
      if (files.tiktoken_pattern.empty())
        files.tiktoken_pattern = recorded.value("tiktoken_pattern", std::string());
      if (files.special_tokens.empty())
        files.special_tokens = recorded.value("special_tokens", std::vector<std::string>());
      if (a.num_special_opt->count() == 0)
        files.tiktoken_num_special_tokens =
            recorded.value("num_special_tokens", files.tiktoken_num_special_tokens);
    }
    if ((files.type == "HuggingFaceTokenizer" || files.type == "GPT2BPETokenizer") &&
        files.special_tokens.empty() && recorded.is_object() &&
        recorded.value("type", std::string()) == files.type)
      // --tokenizer-special-tokens as the checkpoint's run gave it.
      files.special_tokens =
          recorded.value("additional_special_tokens", std::vector<std::string>());
    if (files.type == "NullTokenizer") {
      // The checkpoint's recorded tokenizer gives V (its vocab_size, V + 1 for the legacy
      // class), the end of document and the pad.
      const nlohmann::json saved = meta.value("tokenizer", nlohmann::json());
      if (saved.is_null() || saved.value("type", std::string()) != "NullTokenizer")
        fail_usage("--tokenizer-type NullTokenizer: the checkpoint was not trained with it; give "
                   "--prompt-ids");
      files.vocab_size = saved.at("vocab_size").get<int64_t>() - (files.legacy ? 1 : 0);
      if (!files.legacy) {
        if (files.null_eod_id == -1) files.null_eod_id = saved.value("eod", int64_t{-1});
        if (files.null_pad_id == -1) files.null_pad_id = saved.value("pad", int64_t{-1});
      }
    }
    tok = make_tokenizer(files);
    const nlohmann::json saved = meta.value("tokenizer", nlohmann::json());
    if (!saved.is_null() && !same_tokenizer(saved, tok->identity()) && !a.force)
      fail_usage("{} differs from the tokenizer the checkpoint was trained with "
                 "({}, sha256 {}); pass --force to generate anyway",
                 tok_name, saved.value("model_file", std::string("?")),
                 saved.value("sha256", std::string("?")));
    if (tok->vocab_size() > cfg.vocab_size)
      fail_usage("{} has {} tokens, more than the model's --vocab-size {}",
                 tok_name, tok->vocab_size(), cfg.vocab_size);
  }
  std::vector<int64_t> prompt;
  const char* prompt_flag = has_ids ? "--prompt-ids" : "--prompt";
  if (has_ids) {
    prompt = parse_prompt_ids(a.prompt_ids);
  } else {
    for (int32_t id : tok->encode(a.prompt)) prompt.push_back(id);
  }
  if (prompt.empty()) fail_usage("{} gives no tokens", prompt_flag);
  for (int64_t id : prompt)
    if (id < 0 || id >= cfg.vocab_size)
      fail_usage("{}: token id {} is outside the model's vocabulary [0, {})", prompt_flag, id,
                 cfg.vocab_size);
  // The KV cache and the rotary tables hold every position from the start; the bound keeps the
  // position arithmetic in range (it does not promise that the memory exists).
  constexpr int64_t kMaxPositions = int64_t{1} << 24;
  if (a.max_new_tokens > kMaxPositions - static_cast<int64_t>(prompt.size()))
    fail_usage("{} gives {} tokens; with --max-new-tokens {} that is more than weft generate's "
               "limit of {} positions (the KV cache holds every position)",
               prompt_flag, prompt.size(), a.max_new_tokens, kMaxPositions);
  const int64_t total = static_cast<int64_t>(prompt.size()) + a.max_new_tokens;
  if (total > cfg.seq_length && !a.allow_past_seq_length)
    fail_usage("{} gives {} tokens; with --max-new-tokens {} that is {} positions, more than the "
               "model's --seq-length {} (lower --max-new-tokens, or pass --allow-past-seq-length "
               "to run past the trained length)",
               prompt_flag, prompt.size(), a.max_new_tokens, total, cfg.seq_length);

  // One weight at a time from the checkpoint into the model (in its dtype, on its device): the
  // host never holds the float32 model whole.
  CkptWeightReader reader(iter_dir);
  if (!reader.status()) fail_usage("--load {}: {}", a.load, reader.status().message());
  const c10::Device device = a.device == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (device.is_cuda()) set_cuda_device(0);
  const c10::ScalarType dtype = cfg.bf16 ? at::kBFloat16 : at::kFloat;
  InferenceModel model(
      cfg,
      [&](const ParamSpec& s) {
        at::Tensor t;
        if (!reader.source_key().count(s.name)) return t;
        if (Status st = reader.read(s.name, &t); !st) fail_usage("--load {}: {}", a.load, st.message());
        return t;
      },
      device, dtype);

  GenerateOptions opt;
  opt.max_new_tokens = a.max_new_tokens;
  opt.sampling = sampling;
  opt.seed = a.seed;
  opt.stop_token = tok && !a.ignore_eos ? tok->eod() : -1;
  if (tok) opt.sampling.vocab_limit = tok->vocab_size();  // never a padding id
  const GenerateResult r = generate(model, prompt, opt);

  if (tok) {
    // The continuation alone: the prompt and its continuation decoded together (so that the
    // tokenizer joins the pieces at the seam as inside a text, e.g. the space before the first
    // new word), less the decoded prompt. Where the joint text does not start with it (a piece
    // that merges across the seam), the continuation decoded on its own.
    std::vector<int32_t> ids;
    for (int64_t id : prompt) ids.push_back(static_cast<int32_t>(id));
    const std::string head = tok->decode(ids);
    ids.insert(ids.end(), r.tokens.begin(), r.tokens.end());
    const std::string joint = tok->decode(ids);
    fmt::print("{}\n", joint.compare(0, head.size(), head) == 0
                          ? joint.substr(head.size())
                          : tok->decode(std::vector<int32_t>(r.tokens.begin(), r.tokens.end())));
  } else {
    fmt::print("{}\n", fmt::join(r.tokens, " "));
  }
  std::fflush(stdout);
  const int64_t steps = static_cast<int64_t>(r.tokens.size()) - 1;
  const double total_s = r.prefill_seconds + r.decode_seconds;
  fmt::print(stderr,
             "weft generate: prompt {} tokens | generated {} tokens in {:.3f} s | prefill + first "
             "token {:.3f} s | decoding {:.1f} tokens/s | {} {} ({}, iteration {})\n",
             prompt.size(), r.tokens.size(), total_s, r.prefill_seconds,
             steps > 0 && r.decode_seconds > 0 ? steps / r.decode_seconds : 0.0, a.device,
             cfg.bf16 ? "bf16" : "fp32", iter_dir, meta.value("iteration", -1));
}

}  // namespace

void add_generate_command(CLI::App* app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* c = app->add_subcommand("generate", "generate text from a checkpoint of any layout");
  auto opt = [&](const char* name, auto& v, const char* help) {
    return c->add_option(name, v, help)
        ->capture_default_str()
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  opt("--load", a->load, "save directory (its latest checkpoint) or an iter_NNNNNNN directory")
      ->required();
  opt("--ckpt-step", a->ckpt_step, "load this iteration instead of the latest (-1: latest)");
  add_tokenizer_flags(c, &a->tokenizer);  // needed for --prompt
  a->num_special_opt = c->get_option("--tiktoken-num-special-tokens");
  a->prompt_opt = opt("--prompt", a->prompt, "prompt text (encoded with the tokenizer)");
  a->prompt_ids_opt = opt("--prompt-ids", a->prompt_ids, "prompt as token ids, e.g. \"1 2 3\"");
  opt("--max-new-tokens,--num-tokens-to-generate", a->max_new_tokens,
      "tokens to generate (--num-tokens-to-generate: Megatron's inference name)");
  opt("--temperature", a->sampling.temperature, "sampling temperature (0: greedy)");
  opt("--top-k,--top_k", a->sampling.top_k,
      "sample from the k most likely tokens (0: all; 1: greedy; --top_k: Megatron's name)");
  opt("--top-p,--top_p", a->sampling.top_p,
      "then from the fewest tokens holding probability p (0 or 1: all; --top_p: Megatron's "
      "name)");
  opt("--seed", a->seed, "seed of the sampling generator");
  opt("--device", a->device, "cpu | cuda");
  opt("--threads", a->threads, "intra-op CPU threads (0: libtorch's default)");
  c->add_flag("--greedy", a->greedy, "always the most likely token (same as --temperature 0)");
  c->add_flag("--force", a->force, "generate even when the tokenizer differs from the checkpoint's");
  c->add_flag("--ignore-eos", a->ignore_eos, "do not stop at the tokenizer's end-of-document id");
  c->add_flag("--allow-past-seq-length", a->allow_past_seq_length,
              "let prompt + new tokens exceed the model's --seq-length");
  c->callback([a] { run(*a); });
}

}  // namespace weft::app
