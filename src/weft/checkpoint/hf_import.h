// Reading a Hugging Face model directory (config.json + model.safetensors, or shards listed by
// model.safetensors.index.json) into weft names (docs/hf-interop.md), and writing weights as a
// weft checkpoint of its own: iteration 0, model weights only, one shard of whole tensors.
//
// Invariant: every tensor the config implies is present with its exact shape, no other tensor
// is (each refusal names the tensor or config key), and values are converted to float32
// exactly (F32, BF16, F16 in), so the weft weights equal the Hugging Face ones bitwise.
// ckpt_write_weights_only leaves nothing at `out` unless the checkpoint is complete.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "weft/model/config.h"

namespace weft {

struct HfModel {
  nlohmann::json config;                        // config.json as read
  ModelConfig model;                            // what it describes
  std::map<std::string, at::Tensor> weights;    // weft global name -> float32 CPU tensor
};

// Reads and validates `dir`. Throws UsageError "hf import: ..." naming the key or tensor.
HfModel hf_read_model(const std::string& dir);

// Writes a weights-only weft checkpoint: out/latest_checkpointed_iteration.txt (0),
// out/iter_0000000/{metadata.json, shard_00000.safetensors}. `meta` supplies config and any
// extra fields; format, version, iteration, weights_only, layout and tensors are set here.
// Refuses an existing non-empty `out` (UsageError); throws Error on I/O failure.
void ckpt_write_weights_only(const std::string& out, nlohmann::json meta,
                             const std::map<std::string, at::Tensor>& weights);

}  // namespace weft
