// Hugging Face's NemotronH (model_type "nemotron_h", NemotronHForCausalLM: the Nemotron-H and
// Nemotron 3 hybrids) <-> weft's hybrid models (--hybrid-layer-pattern), docs/hf-interop.md
// "Hybrid models: NemotronH".
//
// NemotronH's layers are weft's hybrid layers one for one: one RMSNorm per layer (its
// `norm.weight`), then the layer's mixer and the residual add; M is the Mamba-2 mixer with its
// rows z, x, B, C, dt in weft's order, * attention without positional encoding (weft's
// --position-embedding-type none), - an ungated squared-ReLU MLP (--squared-relu), E an MoE
// layer with a sigmoid router whose e_score_correction_bias is weft's expert bias (chooses the
// top k, does not weigh), squared-ReLU experts and one shared expert. Every tensor is a copy
// except attention's q/k/v, split and merged as for Llama. Where weft's model has no exact
// NemotronH form, export refuses naming the weft flag; where a config.json describes a model
// weft does not compute, import refuses naming the key.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "weft/checkpoint/hf_config.h"
#include "weft/model/config.h"

namespace weft {

// Throws UsageError "hf export: ..." naming the flag when the hybrid model `c` has no exact
// NemotronH form (rotary or qk-normed attention, a SwiGLU MLP, a softmax router, no shared
// expert, a --norm-epsilon other than the Mamba gated norm's 1e-5).
void hf_nemotron_h_check(const ModelConfig& c);
// The tensors in Hugging Face order under the hub's names (backbone.*, one tensor per expert),
// MTP excluded. A tied model's lm_head.weight is not among them: export writes it as a copy.
std::vector<HfTensorMap> hf_nemotron_h_tensor_maps(const ModelConfig& c);
// config.json without the dtype and special-token keys.
nlohmann::json hf_nemotron_h_config(const ModelConfig& c);
// The ModelConfig of a nemotron_h config.json; the expert bias is off (hf_read_model turns it on
// when the files hold e_score_correction_bias tensors).
ModelConfig hf_nemotron_h_model_config(const nlohmann::json& j);

}  // namespace weft
