// Checkpoint <-> Hugging Face glue (see hf_convert.h).
//
// Export reads one weight at a time with CkptWeightReader (the float32 master preferred, any
// saving layout) and the model config with model_config_from_json; the special token ids come
// from the checkpoint's tokenizer identity (bos, eod, pad), or, for a checkpoint that import
// wrote, from the ids import kept. Import stores the model config as train_config_to_json
// writes it (weft's training defaults for everything but the model), so tools that rebuild a
// model from a checkpoint (`weft generate`, export) read it like any other.
#include "weft/train/hf_convert.h"

#include "weft/checkpoint/full_read.h"
#include "weft/checkpoint/hf_config.h"
#include "weft/checkpoint/hf_import.h"
#include "weft/core/error.h"
#include "weft/train/config_json.h"
#include "weft/train/trainer.h"

namespace weft {

void hf_export_checkpoint(const std::string& ckpt, const std::string& out,
                          const HfExportOptions& options) {
  std::string iter;
  if (Status s = ckpt_resolve_iter_dir(ckpt, -1, &iter); !s) fail_usage("hf export: {}", s.message());
  CkptWeightReader reader(iter);
  if (!reader.status()) fail_usage("hf export: {}", reader.status().message());
  const nlohmann::json& meta = reader.meta();
  const nlohmann::json model_json =
      meta.contains("config") ? meta["config"].value("model", nlohmann::json()) : nlohmann::json();
  const ModelConfig cfg = model_config_from_json(model_json);
  nlohmann::json ids = nlohmann::json::object();
  if (meta.contains("tokenizer") && meta["tokenizer"].is_object()) {
    const nlohmann::json& t = meta["tokenizer"];
    for (auto [from, to] : {std::pair{"bos", "bos_token_id"}, std::pair{"eod", "eos_token_id"},
                            std::pair{"pad", "pad_token_id"}})
      if (t.contains(from) && t[from].is_number_integer() && t[from].get<int64_t>() >= 0)
        ids[to] = t[from];
  } else if (meta.contains("hf") && meta["hf"].contains("special_ids")) {
    ids = meta["hf"]["special_ids"];
  }
  // One weight at a time from the checkpoint's shards into the Hugging Face files.
  HfWeightSource source;
  for (const auto& [name, key] : reader.source_key()) source.shapes[name] = reader.shape(name);
  source.read = [&](const std::string& name) {
    at::Tensor t;
    if (Status s = reader.read(name, &t); !s) fail_usage("hf export: {}", s.message());
    return t;
  };
  hf_export(cfg, source, ids, out, options);
}

HfImportStats hf_import_checkpoint(const std::string& hf_dir, const std::string& out,
                                   const std::string& dtype) {
  if (dtype != "fp32" && dtype != "bf16" && dtype != "source")
    fail_usage("--dtype '{}': expected fp32, bf16 or source", dtype);
  const HfModelReader reader(hf_dir);
  TrainConfig tc;
  tc.model = reader.model();
  nlohmann::json meta;
  meta["config"] = train_config_to_json(tc);
  meta["hf"] = {{"special_ids", hf_special_ids(reader.config())}, {"config", reader.config()}};
  // One weight at a time from the Hugging Face files into the checkpoint's (hf_import.h).
  WeightShapes shapes;
  std::vector<c10::ScalarType> dtypes;
  HfImportStats stats;
  for (size_t i = 0; i < reader.tensors().size(); ++i) {
    const HfTensorMap& m = reader.tensors()[i];
    shapes.emplace_back(m.weft, m.shape);
    // NemotronH's expert bias (HfTensorMap::float32) chooses the experts by small margins and
    // is updated in small steps: kept in float32 unless its files hold it narrower.
    dtypes.push_back(dtype == "fp32"   ? at::kFloat
                     : dtype == "bf16" ? (m.float32 ? reader.source_dtype(i) : at::kBFloat16)
                                       : reader.source_dtype(i));
    const int64_t n = hf_numel(m.shape);
    stats.parameters += n;
    stats.bytes += n * static_cast<int64_t>(c10::elementSize(dtypes.back()));
  }
  stats.tensors = static_cast<int64_t>(shapes.size());
  ckpt_write_weights_only(out, meta, shapes, [&](size_t i) { return reader.read(i); }, dtypes);
  return stats;
}

}  // namespace weft
