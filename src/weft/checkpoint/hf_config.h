// The mapping between weft models and the Hugging Face layout (docs/hf-interop.md): config.json
// <-> ModelConfig, every weft tensor name <-> its Hugging Face tensor(s), the fused-QKV and
// gate/up splits, and the write-to-temporary-then-rename helpers both conversions use.
//
// Invariant: hf_split and hf_merge are exact inverses made of row selections and copies only,
// so export then import is bitwise; the QKV split follows Megatron's per-group interleave that
// attention_qkv (model/transformer.cpp) reads: per query group, its r = heads/groups query
// heads, then its key head, then its value head. Every refusal is a UsageError of one line that
// names the config field, the tensor or the weft flag involved.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/model/config.h"

namespace weft {

// How one weft tensor becomes Hugging Face tensors.
enum class HfSplit {
  kNone,    // one tensor, copied
  kQkv,     // q_proj, k_proj, v_proj (per-group interleave)
  kGateUp,  // gate (rows [0, f)), up (rows [f, 2f))
};

struct HfTensorMap {
  std::string weft;                              // weft global name
  std::vector<int64_t> shape;                    // its global shape
  HfSplit split = HfSplit::kNone;
  std::vector<std::string> hf;                   // 1, 3 (q, k, v) or 2 (gate, up) names
  std::vector<std::vector<int64_t>> hf_shapes;   // their shapes
  bool float32 = false;  // written as F32 whatever the export dtype (NemotronH's expert bias)
};

// "llama" (dense), "qwen2" (dense with --add-qkv-bias), "qwen3" (dense with --qk-layernorm),
// "qwen3_moe" (MoE with --qk-layernorm, hf_qwen3_moe.h), "mixtral" (MoE without it: every layer
// MoE with a softmax router, no shared expert), "deepseek_v3" (multi-latent attention,
// hf_deepseek_v3.h) or "nemotron_h" (hybrid models, hf_nemotron_h.h). Throws UsageError
// "hf export: ..." naming the weft flag for a model none represents (mixed dense/MoE layers
// without q/k norms, shared experts or the sigmoid router outside hybrids and MLA, ...).
std::string hf_model_type(const ModelConfig& cfg);

// The tensors of the model in Hugging Face order (embedding, layer by layer, final norm, output
// layer when untied), MTP tensors excluded. Requires hf_model_type(cfg) to succeed.
std::vector<HfTensorMap> hf_tensor_maps(const ModelConfig& cfg);

// The element count of a shape (1 for a scalar).
int64_t hf_numel(const std::vector<int64_t>& shape);

// Splits weft tensor `w` (shape m.shape) into m.hf.size() contiguous tensors, and back.
std::vector<at::Tensor> hf_split(const HfTensorMap& m, const at::Tensor& w, const ModelConfig& cfg);
at::Tensor hf_merge(const HfTensorMap& m, const std::vector<at::Tensor>& parts,
                    const ModelConfig& cfg);

// config.json for the model. `torch_dtype` is "float32" or "bfloat16"; `special_ids` may hold
// bos_token_id, eos_token_id, pad_token_id (copied when present).
nlohmann::json hf_config_from_model(const ModelConfig& cfg, const std::string& torch_dtype,
                                    const nlohmann::json& special_ids);

// The ModelConfig a config.json describes. Throws UsageError "hf import: config.json ..."
// naming the field for a missing required key, a wrong type, or anything weft cannot represent
// (rope scaling, biases, another activation, sliding window, head_dim != hidden/heads, ...).
ModelConfig hf_model_config_from_json(const nlohmann::json& config);

// bos/eos/pad ids of a config.json (those present, as {"bos_token_id": ..., ...}).
nlohmann::json hf_special_ids(const nlohmann::json& config);

// Output directories: hf_out_begin refuses an existing non-empty `out` (UsageError naming it)
// and creates and returns a fresh sibling `out.tmp-XXXXXX`; hf_out_commit fsyncs it and
// renames it to `out`. On failure between the two, the caller removes the temporary directory.
std::string hf_out_begin(const std::string& out);
void hf_out_commit(const std::string& tmp, const std::string& out);

// A text file written completely and fsynced; throws Error on failure.
void hf_write_text_file(const std::string& path, const std::string& text);

}  // namespace weft
