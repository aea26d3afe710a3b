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
// top-k and score function. Each as "--flag RUN (checkpoint: SAVED)"; empty when they agree.
// Layers, widths, vocabulary, experts and the layer pattern show in the tensors (the load's key
// and shape checks, with --dist-ckpt-strictness); run settings (--seq-length, --bf16, loss
// coefficients) may change.
std::vector<std::string> model_mismatches(const ModelConfig& run, const ModelConfig& saved);

// The model recorded in the checkpoint `load` names (its iteration `step`, or the tracker's
// latest for step < 0), and whether `weft ckpt import` wrote it (its seq_length is then the
// Hugging Face max_position_embeddings, a context limit, not a training length). Throws
// UsageError naming --load when there is none or it is unreadable.
struct CheckpointModel {
  ModelConfig model;
  bool imported = false;
};
CheckpointModel checkpoint_model(const std::string& load, int step);

// --use-checkpoint-args (Megatron's): every model setting whose flag `given` says was not on the
// command line takes `saved`'s value. The layer structure (--num-layers, --hybrid-layer-pattern,
// --moe-layer-freq) is taken whole or not at all: from the checkpoint when none of its flags is
// given. Not taken: the pipeline split of a pattern's '|' (a layout choice), and run settings
// (--bf16, --init-method-std, loss coefficients, --moe-grouped-gemm).
void take_checkpoint_model_args(ModelConfig* run, const ModelConfig& saved,
                                const std::function<bool(const char* flag)>& given);

}  // namespace weft
