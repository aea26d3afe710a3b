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

// One Hugging Face tensor to write: part `part` of weft tensor maps[map] (split with hf_split),
// or zeros (a NemotronH expert bias the model does not have).
struct HfOutTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;  // its safetensors dtype
  size_t map = 0;
  size_t part = 0;
  bool zeros = false;
  int64_t bytes = 0;
};

}  // namespace

void hf_export(const ModelConfig& cfg, const HfWeightSource& weights,
               const nlohmann::json& special_ids, const std::string& out,
               const HfExportOptions& opt) {
  if (opt.dtype != "fp32" && opt.dtype != "bf16")
    fail_usage("--dtype must be fp32 or bf16 (got '{}')", opt.dtype);
  if (opt.max_shard_bytes < 1) fail_usage("--max-shard-size must be at least 1 byte");
  const std::vector<HfTensorMap> maps = hf_tensor_maps(cfg);  // refuses what has no HF layout
  std::set<std::string> known;
  for (const HfTensorMap& m : maps) known.insert(m.weft);
  int mtp = 0;
  for (const auto& [name, shape] : weights.shapes) {
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

  // Every tensor planned, and every name and shape checked, before anything is read.
  const c10::ScalarType dtype = opt.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  const std::string st_dtype = opt.dtype == "bf16" ? "BF16" : "F32";
  std::vector<HfOutTensor> all;
  for (size_t mi = 0; mi < maps.size(); ++mi) {
    const HfTensorMap& m = maps[mi];
    auto it = weights.shapes.find(m.weft);
    const std::string dt = m.float32 ? "F32" : st_dtype;
    const int64_t width = m.float32 || opt.dtype == "fp32" ? 4 : 2;
    if (it == weights.shapes.end() && m.float32 && !cfg.moe_router_enable_expert_bias) {
      // NemotronH's e_score_correction_bias of a model without expert biases: zeros, the same
      // routing (hf_nemotron_h_tensor_maps).
      all.push_back({m.hf[0], m.shape, "F32", mi, 0, true, hf_numel(m.shape) * 4});
      continue;
    }
    if (it == weights.shapes.end())
      fail_usage("hf export: the checkpoint has no tensor '{}'", m.weft);
    if (it->second != m.shape)
      fail_usage("hf export: tensor '{}' has shape [{}], the model config implies [{}]", m.weft,
                 fmt::join(it->second, ","), fmt::join(m.shape, ","));
    for (size_t i = 0; i < m.hf.size(); ++i)
      all.push_back({m.hf[i], m.hf_shapes[i], dt, mi, i, false, hf_numel(m.hf_shapes[i]) * width});
  }
  // NemotronH's lm_head is always a weight of its own: a tied model writes the embedding again.
  if (cfg.hybrid() && cfg.tied()) {
    WEFT_CHECK(all.front().name == "backbone.embeddings.weight", "hf export: {} first",
               all.front().name);
    HfOutTensor lm = all.front();
    lm.name = "lm_head.weight";
    all.push_back(lm);
  }

  // Greedy shards in table order.
  std::vector<std::vector<HfOutTensor>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (HfOutTensor& t : all) {
    if (!shards.back().empty() && in_shard + t.bytes > opt.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += t.bytes;
    total += t.bytes;
  }

  // The weft weight whose parts are being written, split and cast to the export dtype.
  size_t held_map = maps.size();
  std::vector<at::Tensor> held;
  auto part = [&](const HfOutTensor& t) -> const at::Tensor& {
    const HfTensorMap& m = maps[t.map];
    if (held_map != t.map) {
      held.clear();  // the previous weight goes before the next is read
      held_map = maps.size();
      if (t.zeros) {
        held.push_back(at::zeros(m.shape, at::kFloat));
      } else {
        at::Tensor w = weights.read(m.weft).to(at::kCPU).to(at::kFloat);
        if (w.sizes().vec() != m.shape)
          fail("hf export: tensor '{}' was read with shape [{}], its index says [{}]", m.weft,
               fmt::join(w.sizes(), ","), fmt::join(m.shape, ","));
        for (at::Tensor& p : hf_split(m, w, cfg))
          held.push_back(p.to(m.float32 ? at::kFloat : dtype).contiguous());
      }
      held_map = t.map;
    }
    const at::Tensor& p = held.at(t.part);
    // The planned bytes are what the file's header promised: never hand out fewer.
    WEFT_CHECK(p.numel() * static_cast<int64_t>(p.element_size()) == t.bytes,
               "hf export: {} has {} bytes, {} planned", t.name,
               p.numel() * static_cast<int64_t>(p.element_size()), t.bytes);
    return p;
  };
  auto write_shard = [&](const std::string& path, const std::vector<HfOutTensor>& tensors) {
    std::vector<SafetensorsWriteEntry> entries;
    for (const HfOutTensor& t : tensors) {
      SafetensorsWriteEntry e;
      e.name = t.name;
      e.dtype = t.dtype;
      e.shape = t.shape;
      e.nbytes = static_cast<size_t>(t.bytes);
      entries.push_back(e);
    }
    auto source = [&](size_t i, size_t off, size_t n, const void** p) -> Status {
      (void)n;
      *p = static_cast<const char*>(part(tensors[i]).data_ptr()) + off;
      return Status::ok();
    };
    auto metadata = [](const std::vector<uint32_t>&) {
      return std::map<std::string, std::string>{{"format", "pt"}};
    };
    std::vector<uint32_t> crcs;
    constexpr size_t kBlock = size_t{64} << 20;
    if (Status s = safetensors_write_streamed(path, entries, source, metadata, kBlock, &crcs); !s)
      fail("hf export: {}", s.message());
  };

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

void hf_export(const ModelConfig& cfg, const std::map<std::string, at::Tensor>& weights,
               const nlohmann::json& special_ids, const std::string& out,
               const HfExportOptions& opt) {
  HfWeightSource source;
  for (const auto& [name, t] : weights) source.shapes[name] = t.sizes().vec();
  source.read = [&](const std::string& name) { return weights.at(name); };
  hf_export(cfg, source, special_ids, out, opt);
}

}  // namespace weft
