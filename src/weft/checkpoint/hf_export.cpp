// Hugging Face export (see hf_export.h, docs/hf-interop.md).
//
// Tensors are produced in hf_tensor_maps order, each weft tensor split (hf_split) and cast to
// the export dtype; shards are filled greedily in that order, a new one started when the next
// tensor would push the current one past the limit, so the file set is deterministic.
#include "weft/checkpoint/hf_export.h"

#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cstdio>
#include <set>

#include "weft/checkpoint/hf_config.h"
#include "weft/checkpoint/safetensors.h"
#include "weft/core/error.h"
#include "weft/core/remove_tree.h"

namespace weft {

int64_t hf_parse_shard_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  std::string unit = text.substr(i);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double n = 0;
  try {
    size_t used = 0;
    n = std::stod(text.substr(0, i), &used);
    if (used != i) throw std::invalid_argument("number");
  } catch (const std::exception&) {
    fail_usage("--max-shard-size '{}' is not a size (e.g. 5GB, 500MB, 2GiB, 1000000)", text);
  }
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "KIB") mult = 1024.0;
  else if (unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else fail_usage("--max-shard-size '{}': unknown unit '{}' (B, KB, MB, GB, KiB, MiB, GiB)", text, unit);
  const double bytes = n * mult;
  if (!(bytes >= 1)) fail_usage("--max-shard-size '{}' must be at least 1 byte", text);
  if (!(bytes <= 0x1p62))
    fail_usage("--max-shard-size '{}' is too large (at most 4 EiB; a size larger than the "
               "checkpoint gives one file)", text);
  return static_cast<int64_t>(bytes);
}

namespace {

struct HfOutTensor {
  std::string name;
  at::Tensor data;    // contiguous CPU tensor in the export dtype (or F32, HfTensorMap::float32)
  std::string dtype;  // its safetensors dtype
};

int64_t tensor_bytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

void write_shard(const std::string& path, const std::vector<HfOutTensor>& tensors) {
  std::vector<SafetensorsWriteEntry> entries;
  for (const HfOutTensor& t : tensors) {
    SafetensorsWriteEntry e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.shape = t.data.sizes().vec();
    e.data = t.data.data_ptr();
    e.nbytes = static_cast<size_t>(tensor_bytes(t.data));
    entries.push_back(e);
  }
  if (Status s = safetensors_write(path, entries, {{"format", "pt"}}); !s)
    fail("hf export: {}", s.message());
}

}  // namespace

void hf_export(const ModelConfig& cfg, const std::map<std::string, at::Tensor>& weights,
               const nlohmann::json& special_ids, const std::string& out,
               const HfExportOptions& opt) {
  if (opt.dtype != "fp32" && opt.dtype != "bf16")
    fail_usage("--dtype must be fp32 or bf16 (got '{}')", opt.dtype);
  if (opt.max_shard_bytes < 1) fail_usage("--max-shard-size must be at least 1 byte");
  const std::vector<HfTensorMap> maps = hf_tensor_maps(cfg);  // refuses what has no HF layout
  std::set<std::string> known;
  for (const HfTensorMap& m : maps) known.insert(m.weft);
  int mtp = 0;
  for (const auto& [name, t] : weights) {
    if (name.rfind("mtp.", 0) == 0) {
      ++mtp;
    } else if (!known.count(name)) {
      fail_usage("hf export: checkpoint tensor '{}' has no Hugging Face name (a model this export "
                 "does not describe?)", name);
    }
  }
  if (mtp > 0)
    std::fprintf(stderr, "weft: warning: hf export: %d multi-token-prediction tensor(s) "
                 "(mtp.layers.*) dropped; Hugging Face has no layout for them\n", mtp);

  const c10::ScalarType dtype = opt.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  const std::string st_dtype = opt.dtype == "bf16" ? "BF16" : "F32";
  std::vector<HfOutTensor> all;
  for (const HfTensorMap& m : maps) {
    auto it = weights.find(m.weft);
    if (it == weights.end() && m.float32 && !cfg.moe_router_enable_expert_bias) {
      // NemotronH's e_score_correction_bias of a model without expert biases: zeros, the same
      // routing (hf_nemotron_h_tensor_maps).
      all.push_back({m.hf[0], at::zeros(m.shape, at::kFloat), "F32"});
      continue;
    }
    if (it == weights.end()) fail_usage("hf export: the checkpoint has no tensor '{}'", m.weft);
    if (it->second.sizes().vec() != m.shape)
      fail_usage("hf export: tensor '{}' has shape [{}], the model config implies [{}]", m.weft,
                 fmt::join(it->second.sizes(), ","), fmt::join(m.shape, ","));
    const at::Tensor w = it->second.to(at::kCPU).to(at::kFloat);
    std::vector<at::Tensor> parts = hf_split(m, w, cfg);
    for (size_t i = 0; i < parts.size(); ++i)
      all.push_back({m.hf[i], parts[i].to(m.float32 ? at::kFloat : dtype).contiguous(),
                     m.float32 ? "F32" : st_dtype});
  }
  // NemotronH's lm_head is always a weight of its own: a tied model writes the embedding again.
  if (cfg.hybrid() && cfg.tied()) {
    WEFT_CHECK(all.front().name == "backbone.embeddings.weight", "hf export: {} first",
               all.front().name);
    all.push_back({"lm_head.weight", all.front().data, st_dtype});
  }

  // Greedy shards in table order.
  std::vector<std::vector<HfOutTensor>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (HfOutTensor& t : all) {
    const int64_t b = tensor_bytes(t.data);
    if (!shards.back().empty() && in_shard + b > opt.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(std::move(t));
    in_shard += b;
    total += b;
  }

  const std::string tmp = hf_out_begin(out);
  try {
    nlohmann::json config =
        hf_config_from_model(cfg, opt.dtype == "bf16" ? "bfloat16" : "float32", special_ids);
    hf_write_text_file(tmp + "/config.json", config.dump(2) + "\n");
    if (shards.size() == 1) {
      write_shard(tmp + "/model.safetensors", shards[0]);
    } else {
      nlohmann::json map = nlohmann::json::object();
      const size_t n = shards.size();
      for (size_t k = 0; k < n; ++k) {
        const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n);
        write_shard(tmp + "/" + file, shards[k]);
        for (const HfOutTensor& t : shards[k]) map[t.name] = file;
      }
      nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
      hf_write_text_file(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
    }
    hf_out_commit(tmp, out);
  } catch (...) {
    (void)remove_tree(tmp);
    throw;
  }
}

}  // namespace weft
