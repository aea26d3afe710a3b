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

#include "weft/model/config.h"

namespace weft {

// `config_model` is metadata["config"]["model"]. Throws UsageError naming the key for a missing
// required key or a value of the wrong type, and for a config the model rejects.
ModelConfig model_config_from_json(const nlohmann::json& config_model);

}  // namespace weft
