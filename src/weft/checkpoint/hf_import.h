// Reading a Hugging Face model directory (config.json + model.safetensors, or shards listed by
// model.safetensors.index.json) into weft names (docs/hf-interop.md), and writing weights as a
// weft checkpoint of its own: iteration 0, model weights only, one shard of whole tensors.
//
// Invariant: every tensor the config implies is present with its exact shape, no other tensor
// is (each refusal names the tensor or config key), and values are converted to float32
// exactly (F32, BF16, F16 in), so the weft weights equal the Hugging Face ones bitwise.
// ckpt_write_weights_only leaves nothing at `out` unless the checkpoint is complete.
//
// Memory: HfModelReader checks every name, shape and dtype from the files' headers and reads
// only the few values that decide the model config; the import (train/hf_convert.cpp) then
// reads one weight at a time and streams it into the checkpoint file, so its host memory is a
// few times the largest tensor, not the model (a 30B-parameter model is 120 GB in float32).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "weft/checkpoint/hf_config.h"
#include "weft/checkpoint/safetensors.h"
#include "weft/model/config.h"

namespace weft {

// A model directory opened and checked, its weights not yet read. The constructor throws
// UsageError "hf import: ..." naming the key or tensor; it reads NemotronH's expert biases
// (all zeros: the flag stays off and they are not imported) and, for a tied model that also
// holds lm_head.weight, that tensor and the embedding (they must be bitwise equal).
class HfModelReader {
 public:
  explicit HfModelReader(const std::string& dir);
  HfModelReader(const HfModelReader&) = delete;
  HfModelReader& operator=(const HfModelReader&) = delete;

  const nlohmann::json& config() const { return config_; }  // config.json as read
  const ModelConfig& model() const { return model_; }        // what it describes
  // The weights to import, in Hugging Face order: weft name, global shape, source tensors.
  const std::vector<HfTensorMap>& tensors() const { return maps_; }
  // Weight i of tensors(): read, converted to float32 exactly, merged into weft's layout.
  at::Tensor read(size_t i) const;
  // The dtype the files hold weight i's parts in (F32, BF16 or F16); float32 where its parts
  // differ. Converting read(i) to it is exact.
  c10::ScalarType source_dtype(size_t i) const;

 private:
  at::Tensor read_hf(const std::string& name, const std::vector<int64_t>& shape) const;

  nlohmann::json config_;
  ModelConfig model_;
  std::vector<HfTensorMap> maps_;
  std::map<std::string, SafetensorsHeader> headers_;  // file path -> its header
  std::map<std::string, std::string> where_;          // tensor name -> file path
};

struct HfModel {
  nlohmann::json config;                        // config.json as read
  ModelConfig model;                            // what it describes
  std::map<std::string, at::Tensor> weights;    // weft global name -> float32 CPU tensor
};

// Every weight of `dir` in memory (HfModelReader, then read() of each).
HfModel hf_read_model(const std::string& dir);

// Writes a weights-only weft checkpoint: out/latest_checkpointed_iteration.txt (0),
// out/iter_0000000/{metadata.json, shard_00000.safetensors}. `meta` supplies config and any
// extra fields; format, version, iteration, weights_only, layout and tensors are set here.
// `shapes` names each weight and its global shape, in the order written; weight(i) produces
// weight i (any float dtype and device) when the file reaches it, and is released before
// weight i + 1 is asked for. Weight i is stored as dtypes[i] (float32 where `dtypes` is empty;
// the loader converts any float dtype into the float32 master). Refuses an existing non-empty
// `out` (UsageError); throws Error on I/O failure or a weight of another shape.
using WeightShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;
void ckpt_write_weights_only(const std::string& out, nlohmann::json meta,
                             const WeightShapes& shapes,
                             const std::function<at::Tensor(size_t)>& weight,
                             const std::vector<c10::ScalarType>& dtypes = {});
// The same from weights in memory (written in name order).
void ckpt_write_weights_only(const std::string& out, nlohmann::json meta,
                             const std::map<std::string, at::Tensor>& weights);

}  // namespace weft
