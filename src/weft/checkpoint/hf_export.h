// Writing a model in the Hugging Face layout (docs/hf-interop.md "Files"): config.json and the
// tensors as one model.safetensors, or size-sharded model-0000k-of-0000n.safetensors files with
// model.safetensors.index.json.
//
// Invariant: the output is a function of (config, weights, special ids, options) alone, so the
// same weights give byte-identical files; nothing exists at `out` unless every file was written
// and fsynced (a temporary sibling directory is renamed to `out` at the end).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/model/config.h"

namespace weft {

struct HfExportOptions {
  std::string dtype = "fp32";               // --dtype fp32|bf16
  int64_t max_shard_bytes = 5'000'000'000;  // --max-shard-size
};

// "5GB", "500MB", "2GiB", "1000" (bytes) -> bytes; throws UsageError naming --max-shard-size.
int64_t hf_parse_shard_size(const std::string& text);

// The weights to export, produced one at a time: every weft global name with its global shape,
// and a function returning that weight (any float dtype, any device).
struct HfWeightSource {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::function<at::Tensor(const std::string&)> read;
};

// Exports the weights (MTP tensors are dropped with one warning on stderr, any other name the
// model does not have is an error) to `out`. `special_ids` may hold bos_token_id / eos_token_id
// / pad_token_id for config.json. Every name and shape is checked before anything is written;
// then each weight is read when its first Hugging Face tensor is written and dropped when the
// next weight is read (a tied NemotronH reads its embedding again for lm_head), so host memory
// is a few times the largest weight. Throws UsageError for a model or
// option that cannot be exported, Error on I/O failure.
void hf_export(const ModelConfig& cfg, const HfWeightSource& weights,
               const nlohmann::json& special_ids, const std::string& out,
               const HfExportOptions& options);
// The same from weights in memory (weft global name -> tensor).
void hf_export(const ModelConfig& cfg, const std::map<std::string, at::Tensor>& weights,
               const nlohmann::json& special_ids, const std::string& out,
               const HfExportOptions& options);

}  // namespace weft
