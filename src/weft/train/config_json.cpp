// ModelConfig from checkpoint JSON (see config_json.h).
//
// Required keys are the shape of the model (layers, widths, heads, vocabulary); keys added to
// train_config_to_json later (MoE, hybrid, MTP) are optional and default as ModelConfig does,
// so checkpoints written before a feature existed still load.
#include "weft/train/config_json.h"

#include <fmt/format.h>

#include <cmath>
#include <type_traits>

#include "weft/checkpoint/checkpoint.h"
#include "weft/checkpoint/format.h"
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
  get(j, "squared_relu", &m.squared_relu, false);  // absent before: SwiGLU
  get(j, "num_attention_heads", &m.num_attention_heads, true);
  get(j, "num_query_groups", &m.num_query_groups, true);
  get(j, "kv_channels", &m.kv_channels, false);  // absent before: hidden / heads
  get(j, "qk_layernorm", &m.qk_layernorm, false);
  get(j, "add_qkv_bias", &m.add_qkv_bias, false);  // absent before: no bias
  get(j, "seq_length", &m.seq_length, true);
  get(j, "vocab_size", &m.vocab_size, true);
  get(j, "init_method_std", &m.init_method_std, false);
  get(j, "rotary_base", &m.rotary_base, true);
  get(j, "rotary_percent", &m.rotary_percent, false);  // absent before: the whole head
  get(j, "use_rope_scaling", &m.use_rope_scaling, false);  // absent before: no scaling
  get(j, "rope_scaling_factor", &m.rope_scaling_factor, false);
  get(j, "rotary_seq_len_interpolation_factor", &m.rotary_seq_len_interpolation_factor,
      false);  // absent before: none
  get(j, "norm_epsilon", &m.norm_epsilon, true);
  get(j, "position_embedding_type", &m.position_embedding_type, false);  // absent before: rope
  get(j, "untie_embeddings_and_output_weights", &m.untie_embeddings_and_output_weights, true);
  get(j, "bf16", &m.bf16, false);
  get(j, "num_experts", &m.num_experts, false);
  get(j, "moe_router_topk", &m.moe_router_topk, false);
  get(j, "moe_ffn_hidden_size", &m.moe_ffn_hidden_size, false);
  get(j, "moe_shared_expert_intermediate_size", &m.moe_shared_expert_intermediate_size, false);
  get(j, "moe_aux_loss_coeff", &m.moe_aux_loss_coeff, false);
  get(j, "moe_z_loss_coeff", &m.moe_z_loss_coeff, false);  // absent before: none
  get(j, "moe_router_score_function", &m.moe_router_score_function, false);
  get(j, "moe_router_pre_softmax", &m.moe_router_pre_softmax, false);  // absent before: off
  get(j, "moe_router_topk_scaling_factor", &m.moe_router_topk_scaling_factor, false);
  get(j, "moe_router_num_groups", &m.moe_router_num_groups, false);  // absent before: none
  get(j, "moe_router_group_topk", &m.moe_router_group_topk, false);
  get(j, "moe_router_load_balancing_type", &m.moe_router_load_balancing_type, false);
  get(j, "moe_router_enable_expert_bias", &m.moe_router_enable_expert_bias, false);
  get(j, "moe_router_bias_update_rate", &m.moe_router_bias_update_rate, false);
  get(j, "moe_router_dtype", &m.moe_router_dtype, false);
  get(j, "moe_layer_pattern", &m.moe_layer_pattern, false);
  get(j, "moe_grouped_gemm", &m.moe_grouped_gemm, false);
  get(j, "moe_expert_capacity_factor", &m.moe_expert_capacity_factor, false);  // absent: none
  get(j, "moe_token_drop_policy", &m.moe_token_drop_policy, false);
  get(j, "moe_pad_expert_input_to_capacity", &m.moe_pad_expert_input_to_capacity, false);
  get(j, "moe_apply_probs_on_input", &m.moe_apply_probs_on_input, false);  // absent: off
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
  get(j, "multi_latent_attention", &m.multi_latent_attention, false);  // written with MLA only
  get(j, "q_lora_rank", &m.q_lora_rank, false);
  get(j, "kv_lora_rank", &m.kv_lora_rank, false);
  get(j, "qk_head_dim", &m.qk_head_dim, false);
  get(j, "qk_pos_emb_head_dim", &m.qk_pos_emb_head_dim, false);
  get(j, "v_head_dim", &m.v_head_dim, false);
  get(j, "rope_type", &m.rope_type, false);
  get(j, "rotary_scaling_factor", &m.rotary_scaling_factor, false);
  get(j, "mscale", &m.mscale, false);
  get(j, "mscale_all_dim", &m.mscale_all_dim, false);
  try {
    check_model_config(m);
  } catch (const UsageError& e) {
    fail_usage("checkpoint config: {}", e.what());
  }
  return m;
}

std::vector<std::string> model_mismatches(const ModelConfig& run, const ModelConfig& saved,
                                          std::vector<std::string>* rope) {
  std::vector<std::string> out;
  std::vector<std::string>* to = &out;
  auto text = [](const auto& v) -> std::string {
    if constexpr (std::is_floating_point_v<std::decay_t<decltype(v)>>)  // 500000, not 500000.0
      if (v == std::floor(v) && std::abs(v) < 1e15) return fmt::format("{:.0f}", v);
    return fmt::format("{}", v);
  };
  auto cmp = [&](const char* flag, const auto& a, const auto& b) {
    if (!(a == b)) to->push_back(fmt::format("{} {} (checkpoint: {})", flag, text(a), text(b)));
  };
  cmp("--multi-latent-attention", run.mla(), saved.mla());
  if (run.mla() && saved.mla()) {  // shapes that can agree by chance across these flags
    cmp("--num-attention-heads", run.num_attention_heads, saved.num_attention_heads);
    cmp("--q-lora-rank", run.q_lora_rank, saved.q_lora_rank);
    cmp("--kv-lora-rank", run.kv_lora_rank, saved.kv_lora_rank);
    cmp("--qk-head-dim", run.qk_head_dim, saved.qk_head_dim);
    cmp("--qk-pos-emb-head-dim", run.qk_pos_emb_head_dim, saved.qk_pos_emb_head_dim);
    cmp("--v-head-dim", run.v_head_dim, saved.v_head_dim);
  }
  // Heads and groups: 8 heads in 4 groups have the QKV rows of 4 heads in 2 at the same width.
  if (run.hidden_size == saved.hidden_size && !run.mla() && !saved.mla()) {
    cmp("--num-attention-heads", run.num_attention_heads, saved.num_attention_heads);
    if (run.num_query_groups != saved.num_query_groups &&
        run.num_attention_heads == saved.num_attention_heads &&
        run.num_query_groups == run.num_attention_heads)  // likely --group-query-attention missing
      out.push_back(fmt::format("--num-query-groups {} (checkpoint: {}; without "
                                "--group-query-attention, one key/value head per attention head)",
                                run.num_query_groups, saved.num_query_groups));
    else
      cmp("--num-query-groups", run.num_query_groups, saved.num_query_groups);
    cmp("--kv-channels", run.head_dim(), saved.head_dim());
  }
  if (rope) to = rope;
  cmp("--rotary-base", run.rotary_base, saved.rotary_base);
  if (run.rotary() && saved.rotary() && run.rotary_dim() != saved.rotary_dim())
    cmp("--rotary-percent", run.rotary_percent, saved.rotary_percent);
  cmp("--use-rope-scaling", run.use_rope_scaling, saved.use_rope_scaling);
  if (run.use_rope_scaling && saved.use_rope_scaling)
    cmp("--rope-scaling-factor", run.rope_scaling_factor, saved.rope_scaling_factor);
  cmp("--rotary-seq-len-interpolation-factor", run.rotary_seq_len_interpolation_factor,
      saved.rotary_seq_len_interpolation_factor);
  if (run.mla() && saved.mla()) {
    cmp("--rope-type", std::string(run.yarn() ? "yarn" : "rope"),
        std::string(saved.yarn() ? "yarn" : "rope"));
    cmp("--rotary-scaling-factor", run.rotary_scaling_factor, saved.rotary_scaling_factor);
    cmp("--mscale", run.mscale, saved.mscale);
    cmp("--mscale-all-dim", run.mscale_all_dim, saved.mscale_all_dim);
  }
  to = &out;
  cmp("--norm-epsilon", run.norm_epsilon, saved.norm_epsilon);
  cmp("--squared-relu", run.squared_relu, saved.squared_relu);
  cmp("--position-embedding-type", run.position_embedding_type, saved.position_embedding_type);
  // The q/k/v biases: a run without them would drop what the checkpoint learnt (unexpected keys
  // pass under Megatron's default --dist-ckpt-strictness); a run that adds them to a checkpoint
  // without has missing keys, refused unless the strictness lets them start at zero.
  if (saved.add_qkv_bias) cmp("--add-qkv-bias", run.add_qkv_bias, true);
  if (run.moe() && saved.moe()) {
    cmp("--moe-router-topk", run.moe_router_topk, saved.moe_router_topk);
    cmp("--moe-router-score-function", run.moe_router_score_function,
        saved.moe_router_score_function);
    cmp("--moe-router-pre-softmax", run.moe_router_pre_softmax, saved.moe_router_pre_softmax);
    cmp("--moe-apply-probs-on-input", run.moe_apply_probs_on_input,
        saved.moe_apply_probs_on_input);
    cmp("--moe-router-topk-scaling-factor", run.moe_router_topk_scaling_factor,
        saved.moe_router_topk_scaling_factor);
    cmp("--moe-router-num-groups", run.moe_router_num_groups, saved.moe_router_num_groups);
    cmp("--moe-router-group-topk", run.moe_router_group_topk, saved.moe_router_group_topk);
    // The biases shift every choice; a run without them drops what the checkpoint learnt. A
    // run that adds them to a checkpoint without has missing keys (--dist-ckpt-strictness).
    if (saved.moe_router_enable_expert_bias)
      cmp("--moe-router-enable-expert-bias", run.moe_router_enable_expert_bias, true);
  }
  // Mamba: in_proj, the conv and the norm see only groups x state size.
  if (run.hybrid() && saved.hybrid()) {
    cmp("--mamba-num-groups", run.mamba_num_groups, saved.mamba_num_groups);
    cmp("--mamba-state-dim", run.mamba_state_dim, saved.mamba_state_dim);
  }
  return out;
}

std::optional<CheckpointModel> checkpoint_model(const std::string& load, int step) {
  const int iteration = ckpt_load_iteration(load, step);  // the one ckpt_load reads
  if (iteration < 0) return std::nullopt;
  const std::string iter = ckpt_iter_dir(load, iteration);
  nlohmann::json meta;
  CkptIndex index;
  if (Status s = ckpt_read_metadata(iter, &meta, &index); !s)
    fail_usage("--use-checkpoint-args: --load {}: {}", load, s.message());
  if (!meta.contains("config") || !meta["config"].contains("model"))
    fail_usage("--use-checkpoint-args: --load {}: {} records no model config", load, iter);
  return CheckpointModel{model_config_from_json(meta["config"]["model"]), meta.contains("hf")};
}

bool take_checkpoint_model_args(ModelConfig* run, const ModelConfig& saved,
                                const std::function<bool(const char* flag)>& given) {
  ModelConfig& m = *run;
  auto take = [&](const char* flag, auto& to, const auto& from) {
    if (!given(flag)) to = from;
  };
  take("--hidden-size", m.hidden_size, saved.hidden_size);
  take("--ffn-hidden-size", m.ffn_hidden_size, saved.ffn_hidden_size);
  take("--squared-relu", m.squared_relu, saved.squared_relu);
  take("--num-attention-heads", m.num_attention_heads, saved.num_attention_heads);
  take("--num-query-groups", m.num_query_groups, saved.num_query_groups);
  take("--kv-channels", m.kv_channels, saved.head_dim());
  take("--qk-layernorm", m.qk_layernorm, saved.qk_layernorm);
  take("--multi-latent-attention", m.multi_latent_attention, saved.multi_latent_attention);
  take("--q-lora-rank", m.q_lora_rank, saved.q_lora_rank);
  take("--kv-lora-rank", m.kv_lora_rank, saved.kv_lora_rank);
  take("--qk-head-dim", m.qk_head_dim, saved.qk_head_dim);
  take("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim, saved.qk_pos_emb_head_dim);
  take("--v-head-dim", m.v_head_dim, saved.v_head_dim);
  take("--rope-type", m.rope_type, saved.rope_type);
  take("--rotary-scaling-factor", m.rotary_scaling_factor, saved.rotary_scaling_factor);
  take("--mscale", m.mscale, saved.mscale);
  take("--mscale-all-dim", m.mscale_all_dim, saved.mscale_all_dim);
  take("--add-qkv-bias", m.add_qkv_bias, saved.add_qkv_bias);
  take("--seq-length", m.seq_length, saved.seq_length);
  take("--vocab-size", m.vocab_size, saved.vocab_size);
  take("--rotary-base", m.rotary_base, saved.rotary_base);
  take("--rotary-percent", m.rotary_percent, saved.rotary_percent);
  take("--use-rope-scaling", m.use_rope_scaling, saved.use_rope_scaling);
  take("--rope-scaling-factor", m.rope_scaling_factor, saved.rope_scaling_factor);
  take("--rotary-seq-len-interpolation-factor", m.rotary_seq_len_interpolation_factor,
       saved.rotary_seq_len_interpolation_factor);
  take("--norm-epsilon", m.norm_epsilon, saved.norm_epsilon);
  take("--position-embedding-type", m.position_embedding_type, saved.position_embedding_type);
  take("--untie-embeddings-and-output-weights", m.untie_embeddings_and_output_weights,
       saved.untie_embeddings_and_output_weights);
  take("--num-experts", m.num_experts, saved.num_experts);
  take("--moe-router-topk", m.moe_router_topk, saved.moe_router_topk);
  take("--moe-ffn-hidden-size", m.moe_ffn_hidden_size, saved.expert_ffn());
  take("--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size,
       saved.moe_shared_expert_intermediate_size);
  take("--moe-router-score-function", m.moe_router_score_function,
       saved.moe_router_score_function);
  take("--moe-router-pre-softmax", m.moe_router_pre_softmax, saved.moe_router_pre_softmax);
  take("--moe-apply-probs-on-input", m.moe_apply_probs_on_input, saved.moe_apply_probs_on_input);
  take("--moe-router-topk-scaling-factor", m.moe_router_topk_scaling_factor,
       saved.moe_router_topk_scaling_factor);
  take("--moe-router-num-groups", m.moe_router_num_groups, saved.moe_router_num_groups);
  take("--moe-router-group-topk", m.moe_router_group_topk, saved.moe_router_group_topk);
  take("--moe-router-enable-expert-bias", m.moe_router_enable_expert_bias,
       saved.moe_router_enable_expert_bias);
  take("--mamba-state-dim", m.mamba_state_dim, saved.mamba_state_dim);
  take("--mamba-head-dim", m.mamba_head_dim, saved.mamba_head_dim);
  take("--mamba-num-groups", m.mamba_num_groups, saved.mamba_num_groups);
  take("--mamba-num-heads", m.mamba_num_heads, saved.mamba_heads());
  // The layer structure; a pattern given defines the layers, its '/' the MTP depths.
  if (given("--hybrid-layer-pattern") || given("--hybrid-override-pattern")) return false;
  if (saved.hybrid() && given("--moe-layer-freq"))
    fail_usage("--moe-layer-freq: the checkpoint's model is hybrid, its layer pattern (taken by "
               "--use-checkpoint-args) places the MoE layers as 'E'; drop --moe-layer-freq or "
               "give --hybrid-layer-pattern");
  if (!saved.hybrid()) take("--mtp-num-layers", m.mtp_num_layers, saved.mtp_num_layers);
  take("--num-layers", m.num_layers, saved.num_layers);
  if (m.num_layers != saved.num_layers) return false;  // the user's own count: nothing per layer
  m.layer_symbols = saved.layer_symbols;
  m.mtp_layer_symbols = saved.mtp_layer_symbols;
  m.hybrid_stage_layers.clear();
  if (saved.hybrid()) take("--mtp-num-layers", m.mtp_num_layers, saved.mtp_num_layers);
  if (given("--moe-layer-freq")) return false;
  m.moe_layer_pattern = saved.moe_layer_pattern;
  return true;
}

}  // namespace weft
