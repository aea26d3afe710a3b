// ModelConfig from checkpoint JSON (see config_json.h).
//
// Required keys are the shape of the model (layers, widths, heads, vocabulary); keys added to
// train_config_to_json later (MoE, hybrid, MTP) are optional and default as ModelConfig does,
// so checkpoints written before a feature existed still load.
#include "weft/train/config_json.h"

#include "weft/core/error.h"
#include "weft/model/transformer.h"

namespace weft {
namespace {

template <typename T>
void get(const nlohmann::json& j, const char* key, T* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required)
      fail_usage("checkpoint config: model.{} is missing (metadata.json[\"config\"][\"model\"])",
                 key);
    return;
  }
  try {
    *out = it->get<T>();
  } catch (const std::exception& e) {
    fail_usage("checkpoint config: model.{} has the wrong type ({}): {}", key, it->dump(),
               e.what());
  }
}

}  // namespace

ModelConfig model_config_from_json(const nlohmann::json& j) {
  if (!j.is_object())
    fail_usage("checkpoint config: metadata.json[\"config\"][\"model\"] is missing or not an "
               "object");
  ModelConfig m;
  get(j, "num_layers", &m.num_layers, true);
  get(j, "hidden_size", &m.hidden_size, true);
  get(j, "ffn_hidden_size", &m.ffn_hidden_size, true);
  get(j, "num_attention_heads", &m.num_attention_heads, true);
  get(j, "num_query_groups", &m.num_query_groups, true);
  get(j, "seq_length", &m.seq_length, true);
  get(j, "vocab_size", &m.vocab_size, true);
  get(j, "init_method_std", &m.init_method_std, false);
  get(j, "rotary_base", &m.rotary_base, true);
  get(j, "norm_epsilon", &m.norm_epsilon, true);
  get(j, "untie_embeddings_and_output_weights", &m.untie_embeddings_and_output_weights, true);
  get(j, "bf16", &m.bf16, false);
  get(j, "num_experts", &m.num_experts, false);
  get(j, "moe_router_topk", &m.moe_router_topk, false);
  get(j, "moe_ffn_hidden_size", &m.moe_ffn_hidden_size, false);
  get(j, "moe_shared_expert_intermediate_size", &m.moe_shared_expert_intermediate_size, false);
  get(j, "moe_aux_loss_coeff", &m.moe_aux_loss_coeff, false);
  get(j, "moe_router_score_function", &m.moe_router_score_function, false);
  get(j, "moe_router_load_balancing_type", &m.moe_router_load_balancing_type, false);
  get(j, "moe_layer_pattern", &m.moe_layer_pattern, false);
  get(j, "moe_grouped_gemm", &m.moe_grouped_gemm, false);
  get(j, "mtp_num_layers", &m.mtp_num_layers, false);
  get(j, "mtp_loss_scaling_factor", &m.mtp_loss_scaling_factor, false);
  get(j, "layer_symbols", &m.layer_symbols, false);
  get(j, "hybrid_stage_layers", &m.hybrid_stage_layers, false);
  get(j, "mtp_layer_symbols", &m.mtp_layer_symbols, false);
  get(j, "mamba_state_dim", &m.mamba_state_dim, false);
  get(j, "mamba_head_dim", &m.mamba_head_dim, false);
  get(j, "mamba_num_groups", &m.mamba_num_groups, false);
  get(j, "mamba_num_heads", &m.mamba_num_heads, false);
  get(j, "mamba_chunk_size", &m.mamba_chunk_size, false);  // not written today: default 128
  try {
    check_model_config(m);
  } catch (const UsageError& e) {
    fail_usage("checkpoint config: {}", e.what());
  }
  return m;
}

}  // namespace weft
