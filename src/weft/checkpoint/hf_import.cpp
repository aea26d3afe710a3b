// Hugging Face import and the weights-only checkpoint writer (see hf_import.h,
// docs/hf-interop.md).
//
// The set of tensor names the files hold is checked against hf_tensor_maps(config) before any
// data is read: every expected name present with its exact shape and a float dtype, nothing
// else (a tied model's lm_head.weight is allowed when bitwise equal to the embedding; old
// rotary_emb.inv_freq buffers are skipped). Parts are merged back with hf_merge. The writer
// emits the checkpoint format of docs/checkpoint-format.md for a world of one rank: each key
// one chunk covering the whole tensor, with its CRC-32C.
#include "weft/checkpoint/hf_import.h"

#include <ATen/Functions.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "weft/checkpoint/checkpoint.h"
#include "weft/checkpoint/crc32c.h"
#include "weft/checkpoint/format.h"
#include "weft/checkpoint/hf_config.h"
#include "weft/checkpoint/hf_deepseek_v3.h"
#include "weft/checkpoint/hf_json.h"
#include "weft/checkpoint/safetensors.h"
#include "weft/core/error.h"
#include "weft/core/remove_tree.h"

namespace weft {
namespace fs = std::filesystem;
namespace {

// Python's json writes float('inf') and float('nan') as the bare tokens Infinity and NaN, which
// JSON lacks (NemotronH configs hold time_step_limit [0.0, Infinity]): outside strings they
// become 1e308 (-Infinity: -1e308) and null before parsing.
std::string python_json_to_json(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      out += ch;
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
    } else if (ch == '"') {
      in_string = true;
      out += ch;
    } else if (text.compare(i, 8, "Infinity") == 0) {
      out += "1e308";
      i += 7;
    } else if (text.compare(i, 3, "NaN") == 0) {
      out += "null";
      i += 2;
    } else {
      out += ch;
    }
  }
  return out;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail_usage("hf import: {} not found", path);
  std::stringstream text;
  text << f.rdbuf();
  try {
    return nlohmann::json::parse(python_json_to_json(text.str()));
  } catch (const std::exception& e) {
    fail_usage("hf import: {} is not valid JSON ({})", path, e.what());
  }
}

struct HfSource {
  std::string file;  // path
  const SafetensorsHeader* header;
};

c10::ScalarType hf_dtype(const std::string& name, const std::string& d) {
  if (d == "F32") return at::kFloat;
  if (d == "BF16") return at::kBFloat16;
  if (d == "F16") return at::kHalf;
  fail_usage("hf import: tensor '{}' has dtype {}; weft imports F32, BF16 and F16", name, d);
}

}  // namespace

HfModelReader::HfModelReader(const std::string& dir) {
  if (!fs::is_directory(dir)) fail_usage("hf import: {} is not a directory", dir);
  config_ = read_json_file(dir + "/config.json");
  model_ = hf_model_config_from_json(config_);

  // The files and every tensor they hold.
  std::vector<std::string> files;
  nlohmann::json weight_map;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(index_path)) {
    nlohmann::json index = read_json_file(index_path);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      fail_usage("hf import: {} has no 'weight_map' object", index_path);
    weight_map = index["weight_map"];
    std::set<std::string> seen;
    for (const auto& [name, file] : weight_map.items()) {
      if (!file.is_string())
        fail_usage("hf import: {}: weight_map['{}'] is not a file name", index_path, name);
      if (seen.insert(file.get<std::string>()).second) files.push_back(file.get<std::string>());
    }
  } else if (fs::exists(dir + "/model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    fail_usage("hf import: {} has neither model.safetensors nor model.safetensors.index.json", dir);
  }
  for (const std::string& f : files) {
    const std::string path = dir + "/" + f;
    SafetensorsHeader h;
    if (Status s = safetensors_read_header(path, &h); !s) fail_usage("hf import: {}", s.message());
    const SafetensorsHeader& stored = headers_.emplace(path, std::move(h)).first->second;
    for (const auto& [name, e] : stored.entries) {
      if (where_.count(name))
        fail_usage("hf import: tensor '{}' is in both {} and {}", name, where_[name], path);
      where_[name] = path;
    }
  }
  for (const auto& [name, file] : weight_map.items())
    if (!where_.count(name) || where_[name] != dir + "/" + file.get<std::string>())
      fail_usage("hf import: tensor '{}' listed in model.safetensors.index.json is not in {}",
                 name, file.get<std::string>());

  const ModelConfig& cfg = model_;
  std::vector<HfTensorMap> maps = hf_tensor_maps(cfg);
  std::set<std::string> expected;
  for (const HfTensorMap& m : maps)
    for (const std::string& n : m.hf) expected.insert(n);
  const bool extra_lm_head = cfg.tied() && where_.count("lm_head.weight");
  // The multi-token-prediction tensors of NemotronH (mtp.*) and DeepSeek-V3 (the layers past
  // num_hidden_layers): transformers ignores them too.
  int mtp = 0;
  const int mtp_layers = hf_get_or(config_, "num_nextn_predict_layers", 0);
  for (const auto& [name, file] : where_) {
    if (expected.count(name) || (extra_lm_head && name == "lm_head.weight")) continue;
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    if ((cfg.hybrid() && name.rfind("mtp.", 0) == 0) ||
        (cfg.mla() && hf_deepseek_v3_mtp_tensor(name, cfg.num_layers, mtp_layers))) {
      ++mtp;
      continue;
    }
    fail_usage("hf import: unknown tensor '{}' in {} (not part of a {} model with this "
               "config.json)", name, file, config_.value("model_type", "?"));
  }
  if (mtp > 0)
    std::fprintf(stderr, "weft: warning: hf import: %d multi-token-prediction tensor(s) (%s) "
                 "skipped; the imported model has no MTP layers\n", mtp,
                 cfg.mla() ? "model.layers past num_hidden_layers" : "mtp.*");
  // NemotronH's e_score_correction_bias (HfTensorMap::float32): absent, transformers routes
  // with zeros; all zeros, it is weft's model without --moe-router-enable-expert-bias; any
  // non-zero (a model trained with aux-loss-free balancing) turns the flag on, so that a
  // fine-tune goes on balancing as the model was trained.
  auto optional = [&](const HfTensorMap& m) { return m.float32 && !where_.count(m.hf[0]); };
  // Check every name and shape before reading any data.
  for (const HfTensorMap& m : maps)
    for (size_t i = 0; i < m.hf.size() && !optional(m); ++i) {
      auto it = where_.find(m.hf[i]);
      if (it == where_.end()) fail_usage("hf import: tensor '{}' is missing", m.hf[i]);
      const SafetensorsEntry& e = headers_.at(it->second).entries.at(m.hf[i]);
      if (e.shape != m.hf_shapes[i])
        fail_usage("hf import: tensor '{}' has shape [{}], config.json implies [{}]", m.hf[i],
                   fmt::join(e.shape, ","), fmt::join(m.hf_shapes[i], ","));
      (void)hf_dtype(m.hf[i], e.dtype);
    }
  bool biased = false;
  for (const HfTensorMap& m : maps)
    if (m.float32 && !optional(m))
      biased |= read_hf(m.hf[0], m.hf_shapes[0]).ne(0).any().item<bool>();
  for (const HfTensorMap& m : maps) {
    if (m.float32 && biased && optional(m))
      fail_usage("hf import: tensor '{}' is missing while other layers' expert biases are "
                 "non-zero (give every MoE layer its e_score_correction_bias, or none)", m.hf[0]);
    if (!(m.float32 && !biased)) maps_.push_back(m);
  }
  model_.moe_router_enable_expert_bias = biased;
  if (extra_lm_head) {
    const at::Tensor lm = read_hf("lm_head.weight", {cfg.vocab_size, cfg.hidden_size});
    const HfTensorMap& emb = maps_.front();  // the embedding comes first
    if (!at::equal(lm, read_hf(emb.hf[0], emb.hf_shapes[0])))
      fail_usage("hf import: lm_head.weight differs from the embedding ({}) but config.json "
                 "tie_word_embeddings is true", emb.hf[0]);
  }
}

at::Tensor HfModelReader::read_hf(const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail_usage("hf import: tensor '{}' is missing", name);
  const SafetensorsHeader& header = headers_.at(it->second);
  const SafetensorsEntry& e = header.entries.at(name);
  if (e.shape != shape)
    fail_usage("hf import: tensor '{}' has shape [{}], config.json implies [{}]", name,
               fmt::join(e.shape, ","), fmt::join(shape, ","));
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(hf_dtype(name, e.dtype)));
  if (Status s = safetensors_read_entry(it->second, header, name, t.data_ptr(),
                                        static_cast<size_t>(e.end - e.begin));
      !s)
    fail_usage("hf import: {}", s.message());
  return t.to(at::kFloat);
}

at::Tensor HfModelReader::read(size_t i) const {
  const HfTensorMap& m = maps_.at(i);
  std::vector<at::Tensor> parts;
  for (size_t j = 0; j < m.hf.size(); ++j) parts.push_back(read_hf(m.hf[j], m.hf_shapes[j]));
  return hf_merge(m, parts, model_);
}

c10::ScalarType HfModelReader::source_dtype(size_t i) const {
  const HfTensorMap& m = maps_.at(i);
  c10::ScalarType dtype = at::kFloat;
  for (size_t j = 0; j < m.hf.size(); ++j) {
    const std::string& file = where_.at(m.hf[j]);
    const c10::ScalarType d = hf_dtype(m.hf[j], headers_.at(file).entries.at(m.hf[j]).dtype);
    if (j > 0 && d != dtype) return at::kFloat;
    dtype = d;
  }
  return dtype;
}

HfModel hf_read_model(const std::string& dir) {
  const HfModelReader reader(dir);
  HfModel out;
  out.config = reader.config();
  out.model = reader.model();
  for (size_t i = 0; i < reader.tensors().size(); ++i)
    out.weights[reader.tensors()[i].weft] = reader.read(i);
  return out;
}

void ckpt_write_weights_only(const std::string& out, nlohmann::json meta,
                             const WeightShapes& shapes,
                             const std::function<at::Tensor(size_t)>& weight,
                             const std::vector<c10::ScalarType>& dtypes) {
  WEFT_CHECK(dtypes.empty() || dtypes.size() == shapes.size(),
             "ckpt_write_weights_only: {} dtypes for {} weights", dtypes.size(), shapes.size());
  auto dtype_of = [&](size_t i) { return dtypes.empty() ? at::kFloat : dtypes[i]; };
  const std::string file = ckpt_shard_file_name(0);
  std::vector<SafetensorsWriteEntry> entries;
  std::vector<CkptChunk> chunks;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& [key, shape] = shapes[i];
    SafetensorsWriteEntry e;
    e.name = key + "@0";
    e.dtype = ckpt_dtype_name(dtype_of(i));
    e.shape = shape;
    e.nbytes = static_cast<size_t>(hf_numel(shape)) * c10::elementSize(dtype_of(i));
    entries.push_back(e);
    CkptChunk c;
    c.key = key;
    c.file = file;
    c.entry = e.name;
    c.dtype = e.dtype;
    c.shape = shape;
    c.offsets.assign(shape.size(), 0);
    c.lengths = shape;
    chunks.push_back(c);
  }
  auto chunks_json = [&](const std::vector<uint32_t>& crcs) {
    nlohmann::json j = nlohmann::json::array();
    for (size_t i = 0; i < chunks.size(); ++i) {
      CkptChunk c = chunks[i];
      c.crc32c = crcs.at(i);
      j.push_back(ckpt_chunk_to_json(c));
    }
    return j;
  };
  // The shard's header holds the checksums (fixed-width hex, so the header's length is known
  // before the data); each weight is produced when the file reaches it and dropped after.
  auto metadata = [&](const std::vector<uint32_t>& crcs) {
    return std::map<std::string, std::string>{{"format", kCheckpointFormat},
                                              {"version", std::to_string(kCheckpointVersion)},
                                              {"rank", "0"},
                                              {"chunks", chunks_json(crcs).dump()}};
  };
  at::Tensor held;
  size_t held_index = 0;
  auto source = [&](size_t i, size_t off, size_t n, const void** p) -> Status {
    if (!held.defined() || held_index != i) {
      held = at::Tensor();  // the previous weight goes before the next is read
      at::Tensor w = weight(i).to(at::kCPU).to(dtype_of(i)).contiguous();
      if (w.sizes().vec() != shapes[i].second)
        fail("weights-only checkpoint: weight '{}' has shape [{}], expected [{}]",
             shapes[i].first, fmt::join(w.sizes(), ","), fmt::join(shapes[i].second, ","));
      held = std::move(w);
      held_index = i;
    }
    *p = static_cast<const char*>(held.data_ptr()) + off;
    (void)n;
    return Status::ok();
  };

  const std::string tmp = hf_out_begin(out);
  try {
    const std::string iter = tmp + "/" + ckpt_iter_dir_name(0);
    std::error_code ec;
    fs::create_directory(iter, ec);
    if (ec) fail("{}: cannot create: {}", iter, ec.message());
    constexpr size_t kBlock = size_t{64} << 20;
    std::vector<uint32_t> crcs;
    if (Status s = safetensors_write_streamed(iter + "/" + file, entries, source, metadata,
                                              kBlock, &crcs);
        !s)
      fail("{}", s.message());
    held = at::Tensor();
    const nlohmann::json cj = chunks_json(crcs);
    nlohmann::json tensors = nlohmann::json::object();
    for (size_t i = 0; i < chunks.size(); ++i)
      tensors[chunks[i].key] = {
          {"shape", chunks[i].shape}, {"dtype", chunks[i].dtype}, {"chunks", {cj[i]}}};
    meta["format"] = kCheckpointFormat;
    meta["version"] = kCheckpointVersion;
    meta["iteration"] = 0;
    meta["weights_only"] = true;
    meta["consumed_samples"] = 0;
    meta["consumed_tokens"] = 0;
    meta["layout"] = {{"world", 1}, {"tp", 1}, {"cp", 1}, {"pp", 1}, {"ep", 1}, {"etp", 1},
                      {"dp", 1}, {"dp_outer", 1}, {"order", "tp-cp-ep-dp-pp"},
                      {"first_stage_layers", -1}, {"last_stage_layers", -1}};
    meta["tensors"] = tensors;
    hf_write_text_file(iter + "/metadata.json", meta.dump(1));
    if (Status s = ckpt_fsync_dir(iter); !s) fail("{}", s.message());
    hf_write_text_file(tmp + "/" + kTrackerFile, "0\n");
    hf_out_commit(tmp, out);
  } catch (...) {
    (void)remove_tree(tmp);
    throw;
  }
}

void ckpt_write_weights_only(const std::string& out, nlohmann::json meta,
                             const std::map<std::string, at::Tensor>& weights) {
  WeightShapes shapes;
  std::vector<const at::Tensor*> ordered;
  for (const auto& [key, w] : weights) {
    shapes.emplace_back(key, w.sizes().vec());
    ordered.push_back(&w);
  }
  ckpt_write_weights_only(out, std::move(meta), shapes,
                          [&](size_t i) { return *ordered[i]; });
}

}  // namespace weft
