// The model config back from a checkpoint's metadata["config"]["model"]: the inverse of the
// "model" part of train_config_to_json (trainer.cpp), for tools that rebuild the model from a
// checkpoint alone (`weft generate`).
//
// Invariant: for every valid ModelConfig m, model_config_from_json(train_config_to_json(
// {m})["model"]) describes the same model: every field the JSON carries is restored, and the
// resolved values train_config_to_json writes (moe_ffn_hidden_size as expert_ffn(),
// mamba_num_heads as mamba_heads()) restore to the same expert_ffn() and mamba_heads().
// Fields the JSON does not carry keep ModelConfig's defaults (mamba_chunk_size: the SSD chunk,
// fixed at 128 in weft train). The result passes check_model_config.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "weft/model/config.h"

namespace weft {

// `config_model` is metadata["config"]["model"]. Throws UsageError naming the key for a missing
// required key or a value of the wrong type, and for a config the model rejects.
ModelConfig model_config_from_json(const nlohmann::json& config_model);

// The settings that make `run` compute another function than `saved` (a checkpoint's model)
// while every tensor keeps its name and shape, so that the load itself cannot tell: heads, query
// groups and head dim at the same width, the RoPE base and scaling, the norm epsilon, the router's
// top-k and score function, Mamba's groups and state size (only their product shows). Each as "--flag RUN (checkpoint: SAVED)"; empty when they agree.
// Layers, widths, vocabulary, experts and the layer pattern show in the tensors (the load's key
// and shape checks, with --dist-ckpt-strictness); run settings (--seq-length, --bf16, loss
// coefficients) may change.
// `rope` receives the RoPE differences (base, scaling) instead when given: a context extension
// changes them on purpose (--override-checkpoint-rope).
std::vector<std::string> model_mismatches(const ModelConfig& run, const ModelConfig& saved,
                                          std::vector<std::string>* rope = nullptr);

// The model recorded in the checkpoint that `weft train --load load [--ckpt-step step]` loads
// (iteration `step`, or the tracker's latest for step < 0), and whether `weft ckpt import`
// wrote it (its seq_length is then the Hugging Face max_position_embeddings, a context limit,
// not a training length). Empty when step < 0 and `load` has no tracker (which the --load check
// refuses). Throws UsageError naming --load when the checkpoint is unreadable.
struct CheckpointModel {
  ModelConfig model;
  bool imported = false;
};
std::optional<CheckpointModel> checkpoint_model(const std::string& load, int step);

// --use-checkpoint-args (Megatron's): every model setting whose flag `given` says was not on the
// command line takes `saved`'s value; run before the layer patterns are resolved. The layer
// structure: --num-layers unless it or a --hybrid-layer-pattern is given; without a pattern, the
// checkpoint's hybrid layer symbols (with their MTP depth) when the layer counts agree, a
// non-hybrid model's MTP depth, and its MoE layers unless --moe-layer-freq is given (returns true
// when it took them, and --moe-layer-freq must then not be parsed); --moe-layer-freq beside a
// hybrid checkpoint is refused. Not taken: the pipeline split of a pattern's
// '|' (a layout choice), and run settings (--bf16, --init-method-std, loss coefficients,
// --moe-grouped-gemm).
bool take_checkpoint_model_args(ModelConfig* run, const ModelConfig& saved,
                                const std::function<bool(const char* flag)>& given);

}  // namespace weft
