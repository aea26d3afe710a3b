// `weft train`: parses Megatron-named flags into a TrainConfig, starts MPI, validates every
// flag and path flag locally and agrees on the outcome before any collective (so a bad flag is
// one clear line and exit code 2 on every rank, without MPI_Abort), builds and checks the
// process groups, and trains.
#include "cmd_train.h"

#include <ATen/Parallel.h>

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data_args.h"
#include "layout_flags.h"
#include "megatron_flags.h"
#include "recipe_flags.h"
#include "tokenizer_flags.h"
#include "weft/comm/communicator.h"
#include "weft/comm/device.h"
#include "weft/comm/mpi_runtime.h"
#include "weft/comm/process_groups.h"
#include "weft/core/compat.h"
#include "weft/core/error.h"
#include "weft/core/hash.h"
#include "weft/data/gpt_dataset.h"
#include "weft/data/tokenizer.h"
#include "weft/model/fused.h"
#include "weft/model/hybrid.h"
#include "weft/model/moe.h"
#include "weft/model/recompute.h"
#include "weft/train/config_json.h"
#include "weft/train/preflight.h"
#include "weft/train/trainer.h"

namespace weft::app {

void prepare_training(TrainConfig& t, const std::string& backend, MpiRuntime& mpi);
void run_training(TrainConfig& t, int threads, const std::string& backend, bool deterministic,
                  MpiRuntime& mpi);

namespace {

// How long a rank that caught an error during training waits for every other rank to catch
// one too before it aborts the job (see the handler in add_train_command).
constexpr double kErrorAgreeSeconds = 10.0;

struct TrainArgs {
  TrainConfig cfg;
  bool deterministic = false;
  bool no_fused = false;
  bool enable_cuda_graph = false;  // --enable-cuda-graph (Megatron's older name)
  // Megatron's activation recomputation flags (model/recompute.h).
  bool recompute_activations = false, moe_layer_recompute = false;
  std::string recompute_granularity, recompute_method;
  int recompute_num_layers = 0;
  std::vector<std::string> recompute_modules;
  CLI::Option* cuda_graph_impl_opt = nullptr;
  std::string exp_avg_dtype = "fp32", exp_avg_sq_dtype = "fp32", backend = "auto";
  std::string moe_layer_freq = "1";
  std::string hybrid_pattern, hybrid_override_pattern;
  double hybrid_attention_ratio = 0, hybrid_mlp_ratio = 0;  // Megatron's defaults
  bool is_hybrid_model = false;
  CLI::Option* moe_layer_freq_opt = nullptr;
  CLI::Option* num_layers_opt = nullptr;
  CLI::Option* rope_scaling_factor_opt = nullptr;
  RecipeFlags recipe;  // Megatron's architecture flags (recipe_flags.h)
  MegatronFlags megatron;  // Megatron's other flags (megatron_flags.h)
  std::vector<std::string> megatron_warnings;  // from check_megatron_flags
  std::string data_args_path, per_split_data_args_path;  // data_args.h
  bool account_for_embedding = false, account_for_loss = false;  // --account-for-*-in-pipeline-split
  bool grad_reduce_in_bf16 = false;
  CLI::App* app = nullptr;  // the command's flags, to ask which were given
  bool use_checkpoint_args = false;
  bool group_query_attention = false;  // Megatron's --group-query-attention
  bool vocab_from_checkpoint = false;
  bool global_batch_given = false;  // else micro-batch x dp, once the world size is known
  bool allow_ambiguous_pad_tokens = false;  // Megatron's: keep a pad equal to the eod
  TokenizerFiles tokenizer;  // --tokenizer-type, --tokenizer-model, --vocab-file, --merge-file
  int vocab_divisible_by = 128;  // Megatron's --make-vocab-size-divisible-by
  int64_t padded_vocab_size = 0;  // --padded-vocab-size (0: not given)
  // --moe-router-load-balancing-type and --moe-aux-loss-coeff (Megatron's lists; one here).
  std::vector<std::string> load_balancing_types;
  std::vector<double> aux_loss_coeffs;
  bool no_pad_vocab_size = false;  // --no-pad-vocab-size
  CLI::Option* vocab_size_opt = nullptr;
  int threads = 0;
};

c10::ScalarType moment_dtype(const std::string& flag, const std::string& v) {
  if (v == "fp32") return at::kFloat;
  if (v == "bf16") return at::kBFloat16;
  fail_usage("{} must be fp32 or bf16 (got '{}')", flag, v);
}

void add_flags(CLI::App* c, TrainArgs* a) {
  TrainConfig& t = a->cfg;
  ModelConfig& m = t.model;
  auto opt = [&](const char* name, auto& v, const char* help) {
    c->add_option(name, v, help)
        ->capture_default_str()
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  opt("--num-layers", m.num_layers, "transformer layers");
  opt("--hidden-size", m.hidden_size, "hidden size");
  c->add_option("--ffn-hidden-size", m.ffn_hidden_size,
                "MLP hidden size (default: Megatron's, int(4 * hidden * 2 / 3 / 64) * 64 for "
                "SwiGLU, 4 * hidden with --squared-relu)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  c->add_flag("--squared-relu", m.squared_relu,
              "MLPs and experts are fc2(relu(fc1 x)^2), no gate (Megatron's flag, Nemotron-H's "
              "MLP); default SwiGLU");
  opt("--num-attention-heads", m.num_attention_heads, "attention heads");
  c->add_flag("--group-query-attention", a->group_query_attention,
              "grouped-query attention: --num-query-groups key/value heads (Megatron's flag; "
              "without it one key/value head per attention head)");
  c->add_option("--num-query-groups", m.num_query_groups,
                "key/value heads with --group-query-attention (Megatron's default 1); without "
                "that flag it has no effect, as in Megatron")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  opt("--kv-channels", m.kv_channels, "head dim of the attention (-1: hidden / heads)");
  c->add_flag("--qk-layernorm", m.qk_layernorm,
              "RMSNorm of each query and key head over the head dim, before RoPE (Qwen3)");
  c->add_flag("--add-qkv-bias", m.add_qkv_bias,
              "a bias on the query/key/value projection only (Megatron's flag; Qwen2); weft's "
              "other linear layers have none");
  c->add_flag("--multi-latent-attention", m.multi_latent_attention,
              "multi-latent attention (DeepSeek-V2/V3's; Megatron's MLA): queries, keys and "
              "values from low-rank latents, --num-query-groups and --kv-channels unused");
  opt("--q-lora-rank", m.q_lora_rank,
      "MLA: rank of the query latent (0: queries projected from the hidden state, Megatron's "
      "None)");
  opt("--kv-lora-rank", m.kv_lora_rank, "MLA: rank of the key/value latent");
  opt("--qk-head-dim", m.qk_head_dim, "MLA: query/key channels per head without position");
  opt("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim,
      "MLA: rotated query/key channels per head (the key's shared by the heads)");
  opt("--v-head-dim", m.v_head_dim, "MLA: value channels per head");
  c->add_option("--rope-type", m.rope_type,
                "rope or yarn (Megatron's default: yarn with --multi-latent-attention, rope "
                "otherwise; yarn only with MLA)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  opt("--rotary-scaling-factor", m.rotary_scaling_factor,
      "MLA's YaRN: the context scaling factor (1: plain RoPE)");
  opt("--mscale", m.mscale, "MLA's YaRN: mscale of the rotary tables' attention factor");
  opt("--mscale-all-dim", m.mscale_all_dim,
      "MLA's YaRN: mscale of the softmax scale (and the tables' divisor)");
  opt("--seq-length", m.seq_length, "sequence length");
  opt("--vocab-size", m.vocab_size,
      "the model's vocabulary without a tokenizer; NullTokenizer's V and TikTokenizer's ids "
      "(padded); other tokenizers size the vocabulary themselves (Megatron's)");
  opt("--init-method-std", m.init_method_std, "std of the normal initialisation");
  opt("--rotary-base", m.rotary_base, "RoPE base");
  opt("--rotary-percent", m.rotary_percent,
      "share of each head's channels RoPE rotates (the first int(head dim x percent))");
  c->add_flag("--use-rope-scaling", m.use_rope_scaling,
              "Llama 3.x RoPE scaling of the low frequencies (original context 8192, low/high "
              "frequency factors 1 and 4)");
  opt("--rope-scaling-factor", m.rope_scaling_factor,
      "the factor of --use-rope-scaling (Llama 3.1: 8, Llama 3.2: 32)");
  a->rope_scaling_factor_opt = c->get_option("--rope-scaling-factor");
  c->add_option("--rotary-seq-len-interpolation-factor", m.rotary_seq_len_interpolation_factor,
                "linear position interpolation: position t rotates as t / factor (Megatron's "
                "flag; default none)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  opt("--norm-epsilon", m.norm_epsilon, "RMSNorm epsilon");
  c->add_flag("--untie-embeddings-and-output-weights", m.untie_embeddings_and_output_weights,
              "separate output layer instead of the tied embedding");
  opt("--num-experts", m.num_experts, "routed experts per MoE layer (0: dense model)");
  opt("--moe-router-topk", m.moe_router_topk, "experts per token");
  opt("--moe-ffn-hidden-size", m.moe_ffn_hidden_size,
      "hidden size of each routed expert (-1: --ffn-hidden-size)");
  opt("--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size,
      "hidden size of the shared expert run on every token (0: none)");
  // Megatron takes one value per load-balancing type (nargs '+'); weft runs one type.
  c->add_option("--moe-aux-loss-coeff", a->aux_loss_coeffs, "weight of the load-balancing loss")
      ->expected(1, -1)
      ->trigger_on_parse()  // a repeated flag: its last occurrence's values
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  opt("--moe-z-loss-coeff", m.moe_z_loss_coeff,
      "weight of the router z-loss, mean logsumexp(router logits)^2 (0: none)");
  opt("--moe-router-score-function", m.moe_router_score_function, "softmax | sigmoid");
  c->add_flag("--moe-router-pre-softmax", m.moe_router_pre_softmax,
              "softmax router: weight each chosen expert by its softmax over all experts (not "
              "renormalised over the top k)");
  opt("--moe-router-topk-scaling-factor", m.moe_router_topk_scaling_factor,
      "multiply the chosen experts' weights by this (0: not scaled)");
  opt("--moe-router-num-groups", m.moe_router_num_groups,
      "group-limited routing: the experts in this many contiguous groups (0: none)");
  opt("--moe-router-group-topk", m.moe_router_group_topk,
      "group-limited routing: each token's experts come from its this many best groups (a group "
      "scored by the sum of its top topk / group-topk scores; 0: none)");
  c->add_option("--moe-router-load-balancing-type", a->load_balancing_types,
                "aux_loss | seq_aux_loss (per sequence, averaged) | none")
      ->expected(1, -1)
      ->trigger_on_parse()  // a repeated flag: its last occurrence's values
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  c->add_flag("--moe-router-enable-expert-bias", m.moe_router_enable_expert_bias,
              "aux-loss-free load balancing (sigmoid router): a per-expert bias on the scores "
              "chooses the top k, moved each step towards balance (DeepSeek-V3)");
  opt("--moe-router-bias-update-rate", m.moe_router_bias_update_rate,
      "step of the expert bias per iteration (--moe-router-enable-expert-bias)");
  opt("--moe-router-dtype", m.moe_router_dtype,
      "fp32 | fp64: the router's GEMM in that dtype (default: the compute dtype)");
  opt("--moe-layer-freq", a->moe_layer_freq,
      "MoE layer pattern: an int N (layer i is MoE when i % N == 0) or a list like [0,1,1,1]");
  a->moe_layer_freq_opt = c->get_option("--moe-layer-freq");
  a->num_layers_opt = c->get_option("--num-layers");
  opt("--moe-token-dispatcher-type", t.moe_token_dispatcher_type,
      "allgather | alltoall: the same tokens reach the same experts; weft exchanges them "
      "all-to-all for both");
  opt("--moe-expert-capacity-factor", m.moe_expert_capacity_factor,
      "token dropping: each expert takes at most ceil(tokens x topk / experts x this) of a "
      "micro-batch's routed pairs (negative: none, Megatron's None)");
  opt("--moe-token-drop-policy", m.moe_token_drop_policy,
      "probs (keep the highest routing weights) | position (keep the earliest tokens)");
  c->add_flag("--moe-pad-expert-input-to-capacity", m.moe_pad_expert_input_to_capacity,
              "with a capacity factor: every expert counted at its capacity for the expert bias "
              "(the padding rows weigh 0; weft does not run them)");
  c->add_flag("--moe-apply-probs-on-input", m.moe_apply_probs_on_input,
              "top 1: scale each expert's input by its routing probability instead of its "
              "output (Llama 4's experts)");
  c->add_flag("--moe-grouped-gemm", m.moe_grouped_gemm,
              "run all experts of a layer through grouped GEMMs (CUDA, bf16, torch >= 2.8)");
  c->add_flag("--recompute-activations", a->recompute_activations,
              "recompute the --recompute-modules in the backward (= --recompute-granularity "
              "selective)");
  opt("--recompute-granularity", a->recompute_granularity,
      "full: recompute whole layers (chunks per --recompute-method) and the MTP depths in the "
      "backward, keeping only their inputs; selective: only the --recompute-modules");
  opt("--recompute-method", a->recompute_method,
      "full: uniform (every --recompute-num-layers layers of a stage one chunk) | block (the "
      "first --recompute-num-layers layers of each stage)");
  opt("--recompute-num-layers", a->recompute_num_layers,
      "full: layers per chunk (uniform) or per stage (block)");
  c->add_option("--recompute-modules", a->recompute_modules,
                "selective: core_attn (default), mlp, moe, shared_experts")
      ->expected(1, CLI::detail::expected_max_vector_size);
  c->add_flag("--moe-layer-recompute", a->moe_layer_recompute,
              "deprecated (Megatron's): --recompute-granularity selective with moe");
  opt("--hybrid-layer-pattern", a->hybrid_pattern,
      "hybrid model, one symbol per layer: M Mamba-2, * attention, - MLP, E MoE; | between "
      "pipeline stages, / before each MTP depth (defines --num-layers)");
  opt("--hybrid-override-pattern", a->hybrid_override_pattern,
      "deprecated name of --hybrid-layer-pattern");
  opt("--hybrid-attention-ratio", a->hybrid_attention_ratio,
      "hybrid model without a pattern: this share of --num-layers attention, spread evenly "
      "(Megatron's allocation); with a pattern, its counts must agree");
  opt("--hybrid-mlp-ratio", a->hybrid_mlp_ratio,
      "hybrid model without a pattern: this share of --num-layers MLP (the rest Mamba-2)");
  c->add_flag("--is-hybrid-model", a->is_hybrid_model,
              "a hybrid Mamba-2 model: without --hybrid-layer-pattern its layers come from the "
              "ratios (all Mamba-2 when both are 0), as with --spec of Megatron's Mamba stack");
  opt("--mamba-state-dim", m.mamba_state_dim, "Mamba-2 state size per group");
  opt("--mamba-head-dim", m.mamba_head_dim, "Mamba-2 head dimension");
  opt("--mamba-num-groups", m.mamba_num_groups, "Mamba-2 groups of B and C");
  opt("--mamba-num-heads", m.mamba_num_heads, "Mamba-2 heads (-1: 2 * hidden / head dim)");
  opt("--mtp-num-layers", m.mtp_num_layers, "multi-token prediction depth (0: off)");
  opt("--mtp-loss-scaling-factor", m.mtp_loss_scaling_factor,
      "weight of the MTP loss (averaged over depths) in the objective");
  c->add_flag("--overlap-param-gather,!--no-overlap-param-gather", t.overlap_param_gather,
              "prefetch the next FSDP unit's all-gather (default off, as Megatron; same results)");
  c->add_flag("--overlap-grad-reduce,!--no-overlap-grad-reduce", t.overlap_grad_reduce,
              "keep up to two FSDP reduce-scatters in flight during backward (default off, as "
              "Megatron; same results)");
  c->add_flag("--bf16", m.bf16, "bf16 compute and weights (fp32 master weights)");
  opt("--micro-batch-size", t.micro_batch_size, "samples per microbatch");
  c->add_option("--global-batch-size", t.global_batch_size,
                "samples per step over all replicas (default: --micro-batch-size x the data-"
                "parallel size, as Megatron)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  c->add_option("--step-batch-size-schedule", t.step_batch_size_schedule,
                "the global batch by consumed tokens, Megatron's \"THRESHOLD:BS ...\" (e.g. "
                "\"0:768 250B:1536\"; K, M, B, T suffixes): a step uses the batch of the last "
                "threshold at or below the tokens consumed before it; instead of "
                "--global-batch-size")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  opt("--train-iters", t.train_iters, "iterations to train");
  opt("--seed", t.seed, "seed for initialisation and the data order");
  c->get_option("--seed")->check([](const std::string& v) {  // else "-1" wraps around
    return v.rfind('-', 0) == 0 ? "must be an integer >= 0 (got " + v + ")" : std::string();
  });
  opt("--lr", t.lr.lr, "peak learning rate");
  opt("--min-lr", t.lr.min_lr, "final learning rate");
  opt("--lr-warmup-iters", t.lr.warmup_iters, "linear warmup iterations");
  opt("--lr-warmup-init", t.lr.warmup_init, "learning rate the warmup starts from");
  opt("--lr-decay-iters", t.lr.decay_iters, "decay iterations (-1: --train-iters)");
  opt("--lr-decay-style", t.lr.style, "cosine | linear | constant");
  c->add_option("--decoupled-lr", t.lr.decoupled_lr,
                "peak learning rate of the word embedding and output layer (-1: none, their "
                "rate is --lr's)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  c->add_option("--decoupled-min-lr", t.lr.decoupled_min_lr,
                "final learning rate of the word embedding and output layer, with --decoupled-lr "
                "(-1: --min-lr)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  c->add_option("--lr-warmup-fraction", t.lr.warmup_fraction,
                "warmup as a fraction of the decay (instead of --lr-warmup-iters/-samples)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  c->add_option("--train-samples", t.train_samples,
                "train this many samples instead of --train-iters: --train-samples / "
                "--global-batch-size iterations, the schedule counted in samples (Megatron's)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  opt("--lr-warmup-samples", t.lr.warmup_samples, "warmup samples (with --train-samples)");
  c->add_option("--lr-decay-samples", t.lr.decay_samples,
                "decay samples (with --train-samples; default: --train-samples)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  opt("--weight-decay", t.adam.weight_decay, "AdamW weight decay (not on norms)");
  opt("--weight-decay-incr-style", t.lr.wd_style,
      "constant (--weight-decay) | linear | cosine (--start-weight-decay to --end-weight-decay "
      "over the run)");
  c->add_option("--start-weight-decay", t.lr.start_wd,
                "weight decay at the start (with --weight-decay-incr-style linear or cosine)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  c->add_option("--end-weight-decay", t.lr.end_wd,
                "weight decay at the end of the run (with --weight-decay-incr-style linear or "
                "cosine)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  opt("--adam-beta1", t.adam.beta1, "AdamW beta1");
  opt("--adam-beta2", t.adam.beta2, "AdamW beta2");
  opt("--adam-eps", t.adam.eps, "AdamW epsilon");
  opt("--clip-grad", t.clip_grad, "global grad-norm clip (0: off)");
  c->add_flag("--eod-mask-loss", t.eod_mask_loss,
              "leave the positions whose input token is the tokenizer's end of document out of "
              "the loss (each microbatch's mean over the rest, as Megatron's)");
  c->add_flag("--allow-ambiguous-pad-tokens", a->allow_ambiguous_pad_tokens,
              "keep masking the labels equal to the tokenizer's pad where the pad id is also the "
              "end of document (Megatron's; without it such a pad masks nothing)");
  c->add_flag("--calculate-per-token-loss", t.calculate_per_token_loss,
              "every counted token of a step weighs the same (Megatron's; without "
              "--eod-mask-loss it differs from the default only in the MTP depths' weight)");
  t.check_for_nan = true;  // Megatron's default on the command line (TrainConfig's is off)
  c->add_flag("--check-for-nan-in-loss-and-grad,!--no-check-for-nan-in-loss-and-grad",
              t.check_for_nan,
              "stop at the first non-finite loss or gradient, naming the iteration and the first "
              "parameter (Megatron's default); --no-check-for-nan-in-loss-and-grad skips such a "
              "step and counts it");
  opt("--max-skipped-iterations", t.max_skipped_iterations,
      "stop, saving nothing, after K consecutive skipped (non-finite) iterations (0: never)");
  opt("--exp-avg-dtype", a->exp_avg_dtype, "fp32 | bf16 (with --use-precision-aware-optimizer)");
  opt("--exp-avg-sq-dtype", a->exp_avg_sq_dtype,
      "fp32 | bf16 (with --use-precision-aware-optimizer)");
  c->add_flag("--use-precision-aware-optimizer", t.adam.precision_aware,
              "keep gradients in a decoupled fp32 buffer beside the master weights");
  c->add_flag("--grad-reduce-in-bf16", a->grad_reduce_in_bf16,
              "with --bf16: accumulate, reduce and keep the gradients in bf16 (the update "
              "computes in fp32)");
  opt("--decoder-first-pipeline-num-layers", t.first_stage_layers,
      "layers on the first stage (-1: even split)");
  opt("--decoder-last-pipeline-num-layers", t.last_stage_layers,
      "layers on the last stage (-1: even split)");
  c->add_flag("--account-for-embedding-in-pipeline-split", a->account_for_embedding,
              "count the embedding as a layer when splitting layers into stages: the first "
              "stage holds one layer fewer");
  c->add_flag("--account-for-loss-in-pipeline-split", a->account_for_loss,
              "count the output layer and loss as a layer: the last stage holds one fewer");
  opt("--device", t.device, "cpu | cuda");
  opt("--log-jsonl", t.log_jsonl, "append one JSON object per iteration to FILE");
  t.log_interval = 100;  // Megatron's default (TrainConfig's own is 1, for library users)
  opt("--log-interval", t.log_interval,
      "print a line every N iterations (and at the first): the interval's mean losses and time");
  opt("--tensorboard-dir", t.tensorboard_dir, "write TensorBoard event files into DIR (rank 0)");
  opt("--tensorboard-log-interval", t.tensorboard_log_interval,
      "write TensorBoard scalars every N iterations");
  opt("--peak-tflops", t.peak_tflops,
      "peak TFLOP/s per device for MFU (-1: 989 for --device cuda --bf16, else no MFU; 0: none)");
  opt("--save", t.save, "directory to save checkpoints into");
  opt("--save-interval,--persistent-save-interval", t.save_interval,
      "save every K iterations (0: only at the end and on exit; --persistent-save-interval: "
      "Megatron's other name)");
  opt("--load", t.load, "directory to load the latest checkpoint from");
  c->add_flag("--use-checkpoint-args", a->use_checkpoint_args,
              "model flags not given take the values recorded in the --load checkpoint");
  a->app = c;
  opt("--ckpt-step", t.ckpt_step, "load this iteration instead of the latest (-1: latest)");
  c->add_flag("--async-save", t.async_save,
              "write checkpoints on a background thread; training stalls only for the copy");
  c->add_flag("--exit-on-save-failure,!--no-exit-on-save-failure", t.exit_on_save_failure,
              "a failed checkpoint save ends the job non-zero (default), or warns and trains on");
  c->add_flag("--finetune", t.finetune,
              "with --load: model weights only (any layout); iteration 0, fresh optimizer, no "
              "data position (e.g. a checkpoint from `weft ckpt import`)");
  c->add_flag("--exit-on-missing-checkpoint", t.exit_on_missing_checkpoint,
              "with --load: exit (code 2) when it holds no checkpoint, also where --load is "
              "--save (which otherwise starts from scratch)");
  c->add_flag("--no-load-optim", t.no_load_optim,
              "with --load: do not load the optimizer state (moments, step count, hence the "
              "learning-rate schedule restarts); the model weights (the float32 masters rebuilt "
              "from them, as Megatron), iteration and data position are loaded");
  c->add_flag("--no-load-rng", t.no_load_rng,
              "with --load: do not restore the saved generator states");
  c->add_flag("--override-opt_param-scheduler,--override-opt-param-scheduler",
              t.override_opt_param_scheduler,
              "with --load: train with the flags' learning-rate schedule where it differs from "
              "the checkpoint's (refused by default, as Megatron)");
  c->add_flag("--use-checkpoint-opt_param-scheduler,--use-checkpoint-opt-param-scheduler",
              t.use_checkpoint_opt_param_scheduler,
              "with --load: take the checkpoint's learning-rate schedule (rates, style, warmup "
              "and decay lengths) instead of the flags'");
  c->add_option("--dump-first-batch", t.dump_first_batch,
                "write the first global batch's tokens and labels as .npy int64 [2, batch, seq]")
      ->group("");  // hidden: for reference checks (tests/gpu/hf_llama_check.py)
  opt("--dist-ckpt-strictness", t.strictness,
      "Megatron's: assume_ok_unexpected (default) and raise_unexpected refuse a checkpoint that "
      "lacks a key the model expects, log_unexpected warns and leaves it initialised; raise_all "
      "and log_all also refuse / warn about checkpoint keys nothing loads; ignore_all; "
      "return_all and return_unexpected log as log_all and log_unexpected");
  opt("--exit-interval", t.exit_interval, "save and exit when iteration % N == 0 (0: off)");
  opt("--exit-duration-in-mins", t.exit_duration_mins,
      "save and exit after the first iteration ending this many minutes after the process "
      "started (0: off)");
  opt("--distributed-timeout-minutes", t.distributed_timeout_minutes,
      "abort the job when a communication call waits longer than this (fractions allowed)");
  opt("--distributed-backend", a->backend,
      "auto | mpi | nccl | gloo (auto: nccl for --device cuda when every rank has its own GPU; "
      "gloo, Megatron's CPU backend, runs as mpi)");
  c->add_flag("--deterministic,--deterministic-mode", a->deterministic,
              "deterministic kernels (cuBLAS workspace, ATen deterministic algorithms)");
  c->add_flag("--profile", t.profile.enabled,
              "profile iterations --profile-step-start..--profile-step-end (CUDA build): an "
              "nsys capture range (cudaProfilerStart/Stop), or with --use-pytorch-profiler a "
              "Kineto trace per rank in --profile-dir");
  c->add_flag("--use-pytorch-profiler", t.profile.pytorch,
              "with --profile: PyTorch's Kineto profiler, trace_rank<R>.json in --profile-dir");
  opt("--profile-step-start", t.profile.step_start,
      "profile from the iteration after this one (Megatron's: iterations start+1..end)");
  opt("--profile-step-end", t.profile.step_end, "last profiled iteration");
  c->add_option("--profile-ranks", t.profile.ranks, "ranks that profile (default: every rank)");
  opt("--profile-dir", t.profile.dir, "where trace_rank<R>.json files go");
  opt("--cuda-graph-impl", t.cuda_graph_impl,
      "none | local: after --cuda-graph-warmup-steps, replay each microbatch's forward and "
      "backward as one CUDA graph (--device cuda, pp 1, FSDP shard group of 1, no MoE)");
  opt("--cuda-graph-warmup-steps", t.cuda_graph_warmup_steps,
      "eager iterations of this run before the CUDA graph is captured");
  c->add_flag("--enable-cuda-graph", a->enable_cuda_graph,
              "deprecated name of --cuda-graph-impl local (Megatron's)");
  a->cuda_graph_impl_opt = c->get_option("--cuda-graph-impl");
  c->add_flag("--no-fused-kernels", a->no_fused,
              "run RMSNorm, SwiGLU and RoPE as ATen op chains instead of weft's fused CUDA kernels");
  opt("--threads", a->threads, "intra-op threads per rank (0: cores / ranks on this host)");
  c->add_flag("--mock-data", t.mock_data, "train on mock data (the default without --data-path)");
  c->add_option("--data-path", t.data_path,
                "dataset prefixes (P.bin/P.idx): W1 P1 W2 P2 ... blends by the weights, "
                "P1 P2 ... by the datasets' sizes (Megatron's)")
      ->expected(1, -1);
  opt("--split", t.split, "train,valid,test weights over each dataset's documents");
  const char* split_flags[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  for (int i = 0; i < 3; ++i)
    c->add_option(split_flags[i], t.split_data_path[i],
                  fmt::format("the {} split's dataset prefixes, all their documents (weighted or "
                              "by size, as --data-path), instead of --data-path and --split",
                              i == 0 ? "train" : i == 1 ? "valid" : "test"))
        ->expected(1, -1);
  opt("--data-args-path", a->data_args_path,
      "a file whose whitespace-separated words are --data-path's list");
  opt("--per-split-data-args-path", a->per_split_data_args_path,
      "a JSON file {\"train\": ..., \"valid\": ..., \"test\": ...} of the splits' blends");
  opt("--data-cache-path", t.data_cache_path, "where the sample index caches go (default: beside the data)");
  opt("--eval-interval", t.eval_interval, "evaluate on the valid split every N iterations (0: never)");
  opt("--eval-iters", t.eval_iters, "global batches per evaluation");
  opt("--eval-global-batch-size", t.eval_global_batch_size,
      "samples per evaluation iteration (default: --global-batch-size)");
  opt("--eval-micro-batch-size", t.eval_micro_batch_size,
      "samples per evaluation microbatch and rank (default: --micro-batch-size)");
  opt("--start-eval-at-iter", t.start_eval_at_iter,
      "the evaluations every --eval-interval begin at this iteration");
  c->add_flag("--full-validation", t.full_validation,
              "each validation reads every sample of one pass over each validation dataset "
              "(instead of --eval-iters batches)");
  c->add_flag("--multiple-validation-sets", t.multiple_validation_sets,
              "with --full-validation: each dataset of --valid-data-path is its own validation set");
  c->add_option("--validation-set-names", t.validation_set_names,
                "names of the --multiple-validation-sets sets (default 0, 1, ...)")
      ->expected(1, -1);
  c->add_flag("--skip-train", t.skip_train,
              "evaluate the valid and test splits once (from their first sample) instead of "
              "training; with --load, its model");
  add_tokenizer_flags(c, &a->tokenizer);
  opt("--make-vocab-size-divisible-by", a->vocab_divisible_by,
      "pad the tokenizer's vocabulary to a multiple of this");
  opt("--padded-vocab-size", a->padded_vocab_size,
      "the model's vocabulary exactly (at least the tokenizer's), instead of the padded one");
  c->add_flag("--no-pad-vocab-size", a->no_pad_vocab_size,
              "the model's vocabulary is the tokenizer's, unpadded");
  a->vocab_size_opt = c->get_option("--vocab-size");
  c->add_flag("--override-checkpoint-rope", t.override_checkpoint_rope,
              "load a checkpoint trained with another --rotary-base, --rotary-percent or RoPE "
              "scaling (context extension) instead of refusing it");
  c->add_flag("--override-tokenizer", t.override_tokenizer,
              "load a checkpoint trained with another tokenizer");
  add_layout_flags(c, &t.layout);
  add_recipe_flags(c, &a->recipe);
  add_megatron_flags(c, &a->megatron);
}

// --moe-router-load-balancing-type and --moe-aux-loss-coeff: Megatron takes a list of types
// with one coefficient each and adds their losses; weft runs one type, so a list of several is
// refused naming the flag.
void resolve_load_balancing(TrainArgs* a) {
  ModelConfig& m = a->cfg.model;
  const auto one = [](const char* flag, const auto& values) {
    if (values.size() > 1)
      fail_usage("{} takes one value in weft (got {}): Megatron's sum of several "
                 "load-balancing losses is not implemented", flag, values.size());
  };
  one("--moe-router-load-balancing-type", a->load_balancing_types);
  one("--moe-aux-loss-coeff", a->aux_loss_coeffs);
  if (!a->load_balancing_types.empty())
    m.moe_router_load_balancing_type = a->load_balancing_types[0];
  if (!a->aux_loss_coeffs.empty()) m.moe_aux_loss_coeff = a->aux_loss_coeffs[0];
}

// Whether --vocab-size sizes the model, as in Megatron: without a tokenizer (weft's mock data),
// and as NullTokenizer's V or TikTokenizer's ids; the other tokenizers size it themselves.
bool vocab_flag_sizes_model(const TokenizerFiles& f) {
  return !tokenizer_given(f) || f.type == "NullTokenizer" || f.type == "TikTokenizer";
}

// The tokenizer flags: loads the tokenizer, records its identity, and sizes the vocabulary as
// Megatron does: --padded-vocab-size, else with --use-checkpoint-args the checkpoint's (the
// tokenizer must fit in it), else the tokenizer's size padded to --make-vocab-size-divisible-by
// (unpadded with --no-pad-vocab-size). The tokenizer's size is
// NullTokenizer's --vocab-size V (V + 1 with --legacy-tokenizer), TikTokenizer's --vocab-size
// ids (default 2^17), or the tokenizer file's; there --vocab-size has no effect (a warning).
void resolve_tokenizer(TrainArgs* a) {
  TrainConfig& t = a->cfg;
  TokenizerFiles& f = a->tokenizer;
  if ((!f.vocab_file.empty() || !f.merge_file.empty()) && f.type != "GPT2BPETokenizer")
    fail_usage("--vocab-file and --merge-file are read by --tokenizer-type GPT2BPETokenizer "
               "only (got --tokenizer-type '{}')", f.type);
  if (a->padded_vocab_size < 0 || (a->padded_vocab_size == 0 &&
                                    a->app->get_option("--padded-vocab-size")->count() > 0))
    fail_usage("--padded-vocab-size must be >= 1 (got {})", a->padded_vocab_size);
  if (!tokenizer_given(f)) {
    if (a->padded_vocab_size > 0 && !a->vocab_from_checkpoint)
      t.model.vocab_size = static_cast<int>(a->padded_vocab_size);
    if (f.null_eod_id != -1 || f.null_pad_id != -1)
      fail_usage("{} is read by --tokenizer-type NullTokenizer, which is not given",
                 f.null_eod_id != -1 ? "--null-tokenizer-eod-id" : "--null-tokenizer-pad-id");
    if (!f.tiktoken_pattern.empty() || !f.special_tokens.empty())
      fail_usage("{} is read by --tokenizer-type {} with --tokenizer-model, which is not given",
                 f.tiktoken_pattern.empty() ? "--tokenizer-special-tokens" : "--tiktoken-pattern",
                 f.tiktoken_pattern.empty() ? "TikTokenizer, HuggingFaceTokenizer or GPT2BPETokenizer"
                                            : "TikTokenizer");
    if (!f.type.empty())
      fail_usage("--tokenizer-type {} needs {}", f.type,
                 f.type == "GPT2BPETokenizer" ? "--vocab-file and --merge-file"
                                              : "--tokenizer-model");
    return;
  }
  if (f.type.empty()) f.type = "SentencePieceTokenizer";
  if (a->vocab_divisible_by < 1)
    fail_usage("--make-vocab-size-divisible-by must be >= 1 (got {})", a->vocab_divisible_by);
  const bool null_tok = f.type == "NullTokenizer";
  const bool vocab_given = a->vocab_size_opt->count() > 0;
  // Tokenizers that --vocab-size sizes, as in Megatron: the model's vocabulary is theirs, padded.
  const bool sized_by_flag = vocab_flag_sizes_model(f);
  if (null_tok && !vocab_given)
    fail_usage("--tokenizer-type NullTokenizer needs --vocab-size (its ids are 0..V-1, the "
               "end of document V - 1)");
  if (sized_by_flag && vocab_given) f.vocab_size = t.model.vocab_size;
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(f);
  t.tokenizer_identity = tok->identity();
  const int64_t n = tok->vocab_size();
  const std::string name = null_tok ? "NullTokenizer" : !f.model.empty() ? f.model : f.vocab_file;
  if (vocab_given && !sized_by_flag)
    a->megatron_warnings.push_back(fmt::format(
        "--vocab-size {} has no effect with --tokenizer-type {}: the model's vocabulary is the "
        "tokenizer's {} tokens{} (Megatron reads --vocab-size for NullTokenizer and TikTokenizer "
        "only; --padded-vocab-size sets the vocabulary)", a->vocab_size_opt->as<int64_t>(), f.type, n,
        a->vocab_from_checkpoint ? ", in the checkpoint's vocabulary" : ", padded"));
  if (a->vocab_from_checkpoint) {
    if (n > t.model.vocab_size)
      fail_usage("the tokenizer ({}) has {} tokens, more than the checkpoint's vocabulary of {}",
                 name, n, t.model.vocab_size);
  } else if (a->padded_vocab_size > 0) {
    if (n > a->padded_vocab_size)
      fail_usage("the tokenizer ({}) has {} tokens, more than --padded-vocab-size {}", name, n,
                 a->padded_vocab_size);
    t.model.vocab_size = static_cast<int>(a->padded_vocab_size);
  } else {
    const int64_t d = a->no_pad_vocab_size ? 1 : a->vocab_divisible_by;
    t.model.vocab_size = static_cast<int>((n + d - 1) / d * d);
  }
}

// Megatron's GPTDataset masks the labels equal to the tokenizer's pad (and feeds pad ids to the
// model as 0), except where the pad is also the end of document: then, without
// --allow-ambiguous-pad-tokens, it warns and masks nothing (Megatron also checks the eos, which
// every weft tokenizer has as its eod).
void resolve_pad_token(TrainArgs* a) {
  TrainConfig& t = a->cfg;
  const nlohmann::json& id = t.tokenizer_identity;
  const int64_t pad = id.is_object() ? id.value("pad", int64_t{-1}) : -1;
  if (pad < 0) {
    if (a->allow_ambiguous_pad_tokens)
      a->megatron_warnings.push_back("--allow-ambiguous-pad-tokens changes nothing: the "
                                     "tokenizer has no pad");
    return;
  }
  if (pad == id.value("eod", int64_t{-1}) && !a->allow_ambiguous_pad_tokens) {
    a->megatron_warnings.push_back(fmt::format(
        "the tokenizer's pad id {} is also its end of document: labels equal to it stay in the "
        "loss (as Megatron's GPTDataset; --allow-ambiguous-pad-tokens masks them)", pad));
    return;
  }
  t.pad_token = pad;
  if (t.cuda_graph_impl != "none")
    fail_usage("--cuda-graph-impl {} with the tokenizer's pad id {}: labels equal to it leave the "
               "loss (as Megatron's GPTDataset) and the graph replays one microbatch without its "
               "loss mask; drop the graph, or use a tokenizer without a pad", t.cuda_graph_impl, pad);
}

// Megatron's activation recomputation flags (model/recompute.h), checked as Megatron does. A
// method, layer count or module list that the granularity does not read does nothing in Megatron
// either: accepted, with a warning.
void resolve_recompute(TrainArgs* a) {
  TrainConfig& t = a->cfg;
  parse_recompute_flags(a->recompute_activations, a->recompute_granularity, a->recompute_method,
                        a->recompute_num_layers, a->recompute_modules, a->moe_layer_recompute,
                        &t.model.recompute);
  const RecomputeConfig& r = t.model.recompute;
  const auto given = [&](const char* flag) { return a->app->get_option(flag)->count() > 0; };
  for (const char* flag : {"--recompute-method", "--recompute-num-layers", "--recompute-modules"})
    if (given(flag) && r.granularity.empty())
      a->megatron_warnings.push_back(fmt::format(
          "{} has no effect without --recompute-granularity (as in Megatron)", flag));
  if (given("--recompute-modules") && r.full())
    a->megatron_warnings.push_back("--recompute-modules has no effect with "
                                   "--recompute-granularity full: whole layers are recomputed");
  // Megatron's own warnings and refusal for these settings.
  if (a->moe_layer_recompute)
    a->megatron_warnings.push_back("--moe-layer-recompute is deprecated (as in Megatron): use "
                                   "--recompute-granularity selective --recompute-modules moe");
  if (r.selective() && r.core_attn)
    a->megatron_warnings.push_back(
        "--recompute-modules core_attn (the default of --recompute-activations) recomputes the "
        "fused attention, which keeps only its logsumexp: it saves little memory for a second "
        "attention forward (Megatron warns likewise); mlp or moe save more");
  if (r.full() && r.method == "block" && t.model.mtp_num_layers > 0)
    a->megatron_warnings.push_back("--recompute-method block does not recompute the MTP depths "
                                   "(as in Megatron)");
  if (r.selective() && r.shared_experts && given("--moe-shared-expert-overlap"))
    fail_usage("--recompute-modules shared_experts cannot be combined with "
               "--moe-shared-expert-overlap (as in Megatron)");
  if (!r.granularity.empty() && t.cuda_graph_impl != "none")
    fail_usage("--recompute-granularity {} with --cuda-graph-impl {}: weft's graph captures one "
               "microbatch's forward and backward without recomputation; drop one of the two",
               r.granularity, t.cuda_graph_impl);
}

// Megatron's --ffn-hidden-size default: with --swiglu (weft's default MLP) 8/3 of the hidden
// size, rounded down to a multiple of 64; otherwise (--squared-relu) 4 * hidden. Below
// --hidden-size 96 the SwiGLU default is 0: a model with a layer that uses it (a dense MLP, or
// routed experts without --moe-ffn-hidden-size) then needs the flag; one without keeps the
// unused value. The layout is the hybrid pattern's when there is one, else --num-experts and
// --moe-layer-freq's.
void default_ffn_hidden_size(ModelConfig* m, const std::string& pattern) {
  if (m->hidden_size <= 0) return;  // validation names --hidden-size
  const int ffn = m->squared_relu ? 4 * m->hidden_size
                                  : static_cast<int>((4.0 * m->hidden_size * 2 / 3) / 64) * 64;
  const auto& freq = m->moe_layer_pattern;
  const bool moe = pattern.empty() ? m->num_experts > 0 : pattern.find('E') != std::string::npos;
  const bool dense = pattern.empty()
                         ? m->num_experts == 0 || std::count(freq.begin(), freq.end(), 0) > 0
                         : pattern.find('-') != std::string::npos;
  if (ffn > 0) {
    m->ffn_hidden_size = ffn;
  } else if (dense || (moe && m->moe_ffn_hidden_size <= 0)) {
    fail_usage("--ffn-hidden-size is needed with --hidden-size {}: its default, int(4 * hidden "
               "* 2 / 3 / 64) * 64 as Megatron's with --swiglu, is {}", m->hidden_size, ffn);
  }
}

// Megatron's iteration-based and sample-based lengths exclude each other (its validate_args
// asserts the same): --train-iters with --lr-decay-iters and --lr-warmup-iters, or
// --train-samples with --lr-decay-samples and --lr-warmup-samples; --lr-warmup-fraction
// replaces either warmup.
void resolve_schedule_lengths(TrainArgs* a) {
  TrainConfig& t = a->cfg;
  const auto given = [&](const char* flag) { return a->app->get_option(flag)->count() > 0; };
  const bool samples = given("--train-samples");
  if (samples) {
    if (given("--train-iters"))
      fail_usage("--train-iters and --train-samples both give the run's length; give one");
    // Megatron asserts lr_decay_iters is None and lr_warmup_iters == 0 here.
    if (given("--lr-decay-iters"))
      fail_usage("--lr-decay-iters with --train-samples: the schedule counts samples there; "
                 "give --lr-decay-samples");
    if (t.lr.warmup_iters != 0)
      fail_usage("--lr-warmup-iters with --train-samples: the schedule counts samples there; "
                 "give --lr-warmup-samples");
    if (t.train_samples < 1) fail_usage("--train-samples must be >= 1 (got {})", t.train_samples);
  } else {
    // Megatron asserts lr_decay_samples is None and lr_warmup_samples == 0 here.
    if (given("--lr-decay-samples"))
      fail_usage("--lr-decay-samples needs --train-samples (sample-based training); with "
                 "--train-iters give --lr-decay-iters");
    if (t.lr.warmup_samples != 0)
      fail_usage("--lr-warmup-samples needs --train-samples (sample-based training); with "
                 "--train-iters give --lr-warmup-iters");
  }
  if (given("--lr-warmup-fraction")) {
    const char* other = samples ? "--lr-warmup-samples" : "--lr-warmup-iters";
    if ((samples ? t.lr.warmup_samples : t.lr.warmup_iters) != 0)  // Megatron asserts == 0
      fail_usage("--lr-warmup-fraction and {} both give the warmup; give one", other);
    if (!(t.lr.warmup_fraction >= 0 && t.lr.warmup_fraction <= 1))  // -1 means "not given"
      fail_usage("--lr-warmup-fraction must be in [0, 1] (got {})", t.lr.warmup_fraction);
  }
  t.lr.sample_based = samples;
}

// --account-for-embedding/loss-in-pipeline-split as Megatron splits: the embedding and the
// loss count as one layer each, (layers + those) / pp per stage, the first and last stages
// holding the embedding and the loss in place of a layer. weft's split is then the uneven one
// of --decoder-first/last-pipeline-num-layers.
void resolve_pipeline_split(TrainArgs* a, bool hybrid_pattern) {
  TrainConfig& t = a->cfg;
  if (!a->account_for_embedding && !a->account_for_loss) return;
  const char* flag = a->account_for_embedding ? "--account-for-embedding-in-pipeline-split"
                                              : "--account-for-loss-in-pipeline-split";
  if (hybrid_pattern)
    fail_usage("{} with --hybrid-layer-pattern: the stages are the pattern's ('|'), as Megatron "
               "requires", flag);
  if (t.first_stage_layers >= 0 || t.last_stage_layers >= 0)
    fail_usage("{} and --decoder-first/last-pipeline-num-layers both split the stages; give one",
               flag);
  const int pp = t.layout.pp;
  if (pp <= 1) return;  // one stage holds everything (Megatron: no effect either)
  const int units = t.model.num_layers + a->account_for_embedding + a->account_for_loss;
  if (units % pp != 0)
    fail_usage("{}: --num-layers {} plus {} is not divisible by --pipeline-model-parallel-size "
               "{}", flag, t.model.num_layers, units - t.model.num_layers, pp);
  const int per = units / pp;
  const int first = per - a->account_for_embedding, last = per - a->account_for_loss;
  if (first < 1 || last < 1)
    fail_usage("{}: {} layers per stage leave a stage without a layer, which weft does not "
               "build; use fewer stages", flag, per);
  t.first_stage_layers = first;
  t.last_stage_layers = last;
}

// Everything the callback of a command taking the train flags does before MPI starts: moment
// dtypes, the hybrid or MoE layer pattern, the tokenizer, the fused-kernel switch.
void resolve_train_args(TrainArgs* a) {
  TrainConfig& t = a->cfg;
  resolve_load_balancing(a);  // first: later checks read the model's type and weight
  read_data_args_files(a->data_args_path, a->per_split_data_args_path, &t);
  t.adam.exp_avg_dtype = moment_dtype("--exp-avg-dtype", a->exp_avg_dtype);
  t.adam.exp_avg_sq_dtype = moment_dtype("--exp-avg-sq-dtype", a->exp_avg_sq_dtype);
  // Megatron's OptimizerConfig asserts the same: narrower moments are the precision-aware
  // optimizer's.
  for (const auto& [flag, v] : {std::pair{"--exp-avg-dtype", a->exp_avg_dtype},
                                std::pair{"--exp-avg-sq-dtype", a->exp_avg_sq_dtype}})
    if (v != "fp32" && !t.adam.precision_aware)
      fail_usage("{} {} needs --use-precision-aware-optimizer (Megatron asserts the same: only "
                 "that optimizer keeps moments narrower than fp32)", flag, v);
  if (t.log_interval < 1) fail_usage("--log-interval must be >= 1");
  if (a->threads < 0) fail_usage("--threads must be >= 0 (got {})", a->threads);
  // Megatron's gloo is its collectives over host memory; weft's are MPI's (the same sums).
  if (a->backend == "gloo") a->backend = "mpi";
  if (!a->hybrid_pattern.empty() && !a->hybrid_override_pattern.empty() &&
      a->hybrid_pattern != a->hybrid_override_pattern)
    fail_usage("--hybrid-layer-pattern and its deprecated name --hybrid-override-pattern "
               "disagree; give one");
  // Megatron's --num-query-groups (default 1) applies only with --group-query-attention;
  // without it the attention has a key/value head per query head, and a given
  // --num-query-groups has no effect (a warning below). A checkpoint's groups, under
  // --use-checkpoint-args, replace these below unless both flags are given.
  const bool groups_given = a->app->get_option("--num-query-groups")->count() > 0;
  const bool query_groups_ignored = !a->group_query_attention && groups_given;
  const int ignored_groups = t.model.num_query_groups;
  if (!a->group_query_attention) t.model.num_query_groups = t.model.num_attention_heads;
  else if (!groups_given) t.model.num_query_groups = 1;
  // Megatron asserts both: MLA has a key and a value per head; the fused down projection is MLA's.
  if (t.model.multi_latent_attention && a->group_query_attention)
    fail_usage("--group-query-attention with --multi-latent-attention: MLA has a key and a value "
               "per attention head (Megatron refuses the two together)");
  if (!t.model.multi_latent_attention && a->app->get_option("--mla-down-proj-fusion")->count() > 0)
    fail_usage("--mla-down-proj-fusion needs --multi-latent-attention (as Megatron asserts)");
  t.model.position_embedding_type = a->recipe.position_embedding_type;  // checked below
  // Megatron's older flags: --use-rotary-position-embeddings sets rope; --no-position-embedding
  // is an error beside another type than rope.
  if (a->app->get_option("--use-rotary-position-embeddings")->count() > 0)
    t.model.position_embedding_type = "rope";
  if (a->app->get_option("--no-position-embedding")->count() > 0 &&
      t.model.position_embedding_type != "rope")
    fail_usage("--no-position-embedding is deprecated: use --position-embedding-type (Megatron "
               "refuses it beside --position-embedding-type {} too)",
               t.model.position_embedding_type);
  // --use-checkpoint-args first: the layer patterns below resolve against its layer count.
  bool moe_layers_from_checkpoint = false, model_from_checkpoint = false;
  if (a->use_checkpoint_args) {
    if (t.load.empty()) fail_usage("--use-checkpoint-args needs --load DIR");
    if (const auto saved = checkpoint_model(t.load, t.ckpt_step)) {
      // An import's seq_length is the model's context limit (max_position_embeddings, 131072
      // for Llama 3.1), not a length to train at: --seq-length keeps its own value there.
      // --vocab-size counts only where it sizes the model (vocab_flag_sizes_model), and
      // --padded-vocab-size counts as it (Megatron takes the checkpoint's padded vocabulary
      // unless that flag is given).
      const auto given = [&](const char* flag) {
        if (std::string(flag) == "--vocab-size")
          return a->padded_vocab_size > 0 ||
                 (a->app->get_option(flag)->count() > 0 && vocab_flag_sizes_model(a->tokenizer));
        // The groups count as given only with both flags: Megatron forces the checkpoint's
        // groups and --group-query-attention under --use-checkpoint-args; weft compares a given
        // count (a mismatch is refused, naming the flag).
        if (std::string(flag) == "--num-query-groups")
          return a->group_query_attention && groups_given;
        return a->app->get_option(flag)->count() > 0 ||
               (saved->imported && std::string(flag) == "--seq-length");
      };
      moe_layers_from_checkpoint = take_checkpoint_model_args(&t.model, saved->model, given);
      a->vocab_from_checkpoint = !given("--vocab-size");
      model_from_checkpoint = true;
    }  // else no tracker: the --load check (check_train_paths) refuses it, naming --load
  }
  // --swiglu beside --squared-relu: Megatron asserts; under --use-checkpoint-args it takes the
  // activation from the checkpoint instead, and so does weft (with a warning below).
  bool swiglu_ignored = false;
  if (t.model.squared_relu && a->app->get_option("--swiglu")->count() > 0) {
    if (a->app->get_option("--squared-relu")->count() > 0 || !model_from_checkpoint)
      fail_usage("--swiglu and --squared-relu both given: the MLP is one or the other (Megatron "
                 "asserts the same)");
    swiglu_ignored = true;
  }
  std::string layers_ignored;  // a warning
  std::string pattern = a->hybrid_pattern.empty() ? a->hybrid_override_pattern : a->hybrid_pattern;
  // Megatron's hybrid stack (pretrain_mamba.py, --is-hybrid-model) without a pattern allocates
  // its layers from the ratios, all Mamba-2 when both are 0; given ratios mean that stack too.
  const bool by_ratio = a->hybrid_attention_ratio != 0 || a->hybrid_mlp_ratio != 0;
  const bool pattern_given = !pattern.empty();
  if (!pattern_given && (by_ratio || a->is_hybrid_model || spec_names_hybrid_stack(a->megatron)) &&
      !(model_from_checkpoint && t.model.hybrid())) {
    pattern = allocate_hybrid_layers(t.model.num_layers, a->hybrid_attention_ratio,
                                     a->hybrid_mlp_ratio);
  }
  if (!pattern.empty()) {
    // The pattern defines the layers (and its 'E' symbols the MoE layers): a --moe-layer-freq
    // beside it is refused rather than ignored, as Megatron asserts; a --num-layers of another
    // count is ignored with a warning, as Megatron does.
    if (a->moe_layer_freq_opt->count() > 0)
      fail_usage("--moe-layer-freq and {} both place MoE layers; give the MoE layers as 'E' in "
                 "--hybrid-layer-pattern", pattern_given ? "--hybrid-layer-pattern"
                                                         : "Megatron's Mamba stack (--spec, "
                                                           "--is-hybrid-model or the hybrid ratios)");
    const int given_layers = t.model.num_layers;
    apply_hybrid_layer_pattern(pattern, &t.model);  // checks the symbols first
    if (pattern_given)
      check_pattern_against_ratios(pattern, a->hybrid_attention_ratio, a->hybrid_mlp_ratio);
    // Megatron warns and takes the pattern's count (a --num-layers beside the pattern is often
    // an older script's or the checkpoint's under --use-checkpoint-args).
    if (a->num_layers_opt->count() > 0 && given_layers != t.model.num_layers)
      layers_ignored = fmt::format("--num-layers {} is ignored: --hybrid-layer-pattern '{}' has "
                                   "{} layers, which the model takes (as Megatron)",
                                   given_layers, pattern, t.model.num_layers);
    if (t.first_stage_layers >= 0 || t.last_stage_layers >= 0)
      if (!t.model.hybrid_stage_layers.empty())
        fail_usage("--decoder-first/last-pipeline-num-layers and '|' in --hybrid-layer-pattern "
                   "both split the stages; give one");
  } else if (!moe_layers_from_checkpoint &&
             (t.model.num_experts > 0 || a->moe_layer_freq_opt->count() > 0)) {
    if (t.model.num_layers < 1) fail_usage("--num-layers must be >= 1 (got {})", t.model.num_layers);
    t.model.moe_layer_pattern = parse_moe_layer_freq(a->moe_layer_freq, t.model.num_layers);
  }
  if (a->app->get_option("--rotary-seq-len-interpolation-factor")->count() > 0 &&
      t.model.rotary_seq_len_interpolation_factor < 1)
    fail_usage("--rotary-seq-len-interpolation-factor must be >= 1 (got {})",
               t.model.rotary_seq_len_interpolation_factor);
  // A factor of 1 rotates as without one (Megatron's seq *= 1): the same model, recorded so.
  if (t.model.rotary_seq_len_interpolation_factor == 1)
    t.model.rotary_seq_len_interpolation_factor = 0;
  if (a->rope_scaling_factor_opt->count() > 0 && !t.model.use_rope_scaling)
    fail_usage("--rope-scaling-factor {} is given without --use-rope-scaling, which it belongs "
               "to; add --use-rope-scaling or drop the factor", t.model.rope_scaling_factor);
  if (a->enable_cuda_graph) {
    if (a->cuda_graph_impl_opt->count() > 0)
      fail_usage("--enable-cuda-graph (the older name of --cuda-graph-impl local) and "
                 "--cuda-graph-impl both given; give one");
    t.cuda_graph_impl = "local";
  }
  if (a->app->get_option("--ffn-hidden-size")->count() == 0 && !model_from_checkpoint)
    default_ffn_hidden_size(&t.model, pattern);
  a->global_batch_given = a->app->get_option("--global-batch-size")->count() > 0;
  if (t.per_split_data() && a->app->get_option("--split")->count() > 0)
    fail_usage("--split with --train/valid/test-data-path: each split reads all of its own "
               "datasets; drop --split (Megatron refuses both too)");
  if (a->app->get_option("--step-batch-size-schedule")->count() > 0) {
    if (a->global_batch_given)
      fail_usage("--step-batch-size-schedule and --global-batch-size both give the training "
                 "batch; give one (Megatron refuses both too)");
    if (t.step_batch_size_schedule.empty())
      fail_usage("--step-batch-size-schedule is empty; give at least \"0:BATCH_SIZE\"");
  }
  check_recipe_flags(a->recipe, t.model.seq_length);
  a->megatron_warnings = check_megatron_flags(a->megatron);
  if (!layers_ignored.empty()) a->megatron_warnings.push_back(layers_ignored);
  // Megatron reads --grad-reduce-in-bf16 only under --bf16 (gradients otherwise take the float32
  // parameters' dtype).
  if (a->grad_reduce_in_bf16 && !t.model.bf16)
    a->megatron_warnings.push_back("--grad-reduce-in-bf16 has no effect without --bf16: the "
                                   "gradients are float32, as in Megatron");
  else if (a->grad_reduce_in_bf16 && t.adam.precision_aware)
    fail_usage("--grad-reduce-in-bf16 is not implemented with --use-precision-aware-optimizer in "
               "weft: that optimizer's decoupled gradient is float32");
  else if (a->grad_reduce_in_bf16)
    t.adam.grad_dtype = at::kBFloat16;
  // Megatron's --skip-train reads no optimizer state (it warns likewise).
  if (t.skip_train && !t.load.empty() && !t.no_load_optim) {
    t.no_load_optim = true;
    a->megatron_warnings.push_back("--skip-train: enabling --no-load-optim (as Megatron)");
  }
  if (t.skip_train && !t.save.empty()) {  // kept: a --load equal to it may hold nothing yet
    a->megatron_warnings.push_back("--save has no effect with --skip-train: nothing trains, "
                                   "nothing is saved (as in Megatron)");
    t.save_interval = 0;
    t.async_save = false;
  }
  if (query_groups_ignored && ignored_groups != a->cfg.model.num_query_groups)
    a->megatron_warnings.push_back(
        model_from_checkpoint
            ? fmt::format("--num-query-groups {} has no effect without --group-query-attention "
                          "(as in Megatron): the attention has the checkpoint's {} key/value "
                          "heads", ignored_groups, a->cfg.model.num_query_groups)
            : fmt::format("--num-query-groups {} has no effect without --group-query-attention "
                          "(as in Megatron): the attention has one key/value head per attention "
                          "head; add --group-query-attention for {} key/value heads",
                          ignored_groups, ignored_groups));
  if (swiglu_ignored)
    a->megatron_warnings.push_back("--swiglu is ignored: --use-checkpoint-args takes the "
                                   "checkpoint's --squared-relu (as Megatron forces its "
                                   "activation from the checkpoint)");
  resolve_schedule_lengths(a);
  resolve_pipeline_split(a, t.model.hybrid());
  resolve_tokenizer(a);
  resolve_pad_token(a);
  if (t.eod_mask_loss) {
    const nlohmann::json& id = t.tokenizer_identity;
    if (!id.is_object() || id.value("eod", int64_t{-1}) < 0)
      fail_usage("--eod-mask-loss needs the tokenizer's end-of-document id: give the tokenizer "
                 "(--tokenizer-type with --tokenizer-model, --vocab-file/--merge-file, or "
                 "NullTokenizer with --vocab-size)");
    t.eod_token = id["eod"].get<int64_t>();
    if (t.cuda_graph_impl != "none")
      fail_usage("--eod-mask-loss with --cuda-graph-impl {}: the graph replays one microbatch "
                 "without its loss mask; drop one of the two", t.cuda_graph_impl);
  }
  // Megatron's TransformerConfig refuses the same: the softmax over one chosen expert is 1.
  const ModelConfig& m = t.model;
  if (m.moe() && m.moe_router_topk == 1 && m.moe_router_score_function == "softmax" &&
      !m.moe_router_pre_softmax)
    fail_usage("--moe-router-topk 1 with the softmax router needs --moe-router-pre-softmax: the "
               "softmax over the one chosen expert is 1 and gives the router no gradient "
               "(Megatron refuses it too)");
  resolve_recompute(a);
  fused::set_enabled(!a->no_fused);
}

// Flags that were given but change nothing in this run, one line each (rank 0 prints them):
// a run that looks configured one way and trains another is worse than a refusal, but these
// are Megatron-valid combinations, so weft says so instead of refusing them.
std::vector<std::string> ignored_flag_warnings(const TrainConfig& t) {
  const ModelConfig& m = t.model;
  const bool any_moe = m.num_moe_layers() > 0;
  std::vector<std::string> out;
  if (m.moe() && !any_moe)
    out.push_back(m.hybrid() ? fmt::format("--num-experts {} is given, but --hybrid-layer-pattern "
                                           "'{}' has no 'E' layer: the model has no experts",
                                           m.num_experts, m.layer_symbols)
                             : fmt::format("--num-experts {} is given, but --moe-layer-freq "
                                           "makes no layer MoE: the model has no experts",
                                           m.num_experts));
  if (!any_moe && m.moe_shared_expert_intermediate_size > 0)
    out.push_back("--moe-shared-expert-intermediate-size has no effect: the model has no MoE "
                  "layer (--num-experts)");
  if (m.moe_grouped_gemm && any_moe &&
      (!WEFT_HAS_GROUPED_MM || t.device != "cuda" || !m.bf16))
    out.push_back("--moe-grouped-gemm has no effect here: it needs --device cuda, --bf16 and a "
                  "libtorch with torch._grouped_mm (>= 2.8); the experts run one GEMM chain each");
  if (t.full_validation && t.per_split_data() && t.split_data_path[1].empty())
    out.push_back("--full-validation has no effect without --valid-data-path: with per-split "
                  "paths a split without its own is not evaluated");
  if (t.full_validation && t.eval_interval == 0 && !t.skip_train)
    out.push_back("--full-validation has no effect with --eval-interval 0: weft never validates "
                  "then (Megatron validates once at the end)");
  if (t.start_eval_at_iter >= 0 && t.eval_interval == 0)
    out.push_back("--start-eval-at-iter has no effect with --eval-interval 0");
  if (t.load.empty() && (t.no_load_optim || t.no_load_rng))
    out.push_back(fmt::format("{} has no effect without --load",
                              t.no_load_optim ? "--no-load-optim" : "--no-load-rng"));
  if (!m.rotary() && m.use_rope_scaling)
    out.push_back("--use-rope-scaling has no effect with --position-embedding-type none");
  if (!m.rotary() && m.rotary_seq_len_interpolation_factor > 0)
    out.push_back("--rotary-seq-len-interpolation-factor has no effect with "
                  "--position-embedding-type none");
  if (t.load.empty() && t.exit_on_missing_checkpoint)
    out.push_back("--exit-on-missing-checkpoint has no effect without --load");
  if (any_moe && m.moe_router_pre_softmax && m.moe_router_score_function != "softmax")
    out.push_back(fmt::format("--moe-router-pre-softmax has no effect with "
                              "--moe-router-score-function {} (as in Megatron)",
                              m.moe_router_score_function));
  if (any_moe && !m.bf16 && m.moe_router_dtype == "fp32")
    out.push_back("--moe-router-dtype fp32 has no effect without --bf16: the router's GEMM is in "
                  "float32 already");
  if (!any_moe && m.moe_router_enable_expert_bias)
    out.push_back("--moe-router-enable-expert-bias has no effect without MoE layers");
  if (any_moe && !m.moe_router_enable_expert_bias && m.moe_router_bias_update_rate != 1e-3)
    out.push_back("--moe-router-bias-update-rate has no effect without "
                  "--moe-router-enable-expert-bias");
  if (m.hybrid() && m.mtp_num_layers > 0 && m.mtp_layer_symbols.empty())
    out.push_back(fmt::format("--mtp-num-layers {} with --hybrid-layer-pattern '{}', which has no "
                              "MTP pattern: each MTP depth has its projection and norms but no "
                              "layer (as in Megatron); give the layers after '/', e.g. '{}/*-'",
                              m.mtp_num_layers, m.layer_symbols, m.layer_symbols));
  return out;
}

}  // namespace

void add_train_command(CLI::App* app, int* argc, char*** argv) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* c = app->add_subcommand("train", "pretrain a model on Megatron indexed datasets or mock data");
  add_flags(c, a.get());
  c->callback([a, argc, argv] {
    MpiRuntime mpi(argc, argv);
    set_error_rank(mpi.world_rank());
    // Phase 1, local on every rank: every flag and path is checked before any collective of
    // the trainer; a config error seen by any rank ends every rank with that rank's one line.
    check_on_every_rank(mpi, [&] {
      resolve_train_args(a.get());
      if (!a->global_batch_given) default_global_batch_size(&a->cfg, mpi.world_size());
      resolve_train_samples(&a->cfg);
      prepare_training(a->cfg, a->backend, mpi);
    });
    if (mpi.world_rank() == 0) {
      for (const std::string& w : a->megatron_warnings)
        std::fprintf(stderr, "weft train: warning: %s\n", w.c_str());
      for (const std::string& w : ignored_flag_warnings(a->cfg))
        std::fprintf(stderr, "weft train: warning: %s\n", w.c_str());
    }
    // Phase 2, collective: an error here may be raised by every rank (agreed through a
    // collective, e.g. a bad checkpoint, or found from the same state, e.g. a NaN gradient
    // with --check-for-nan-in-loss-and-grad) or by some ranks only (their peers then wait in
    // a collective). The handler tells them apart by a timed barrier on a communicator of its
    // own: when every rank arrives, each exits with the code and rank 0 alone prints its line;
    // otherwise this rank prints its line and aborts the job, so that no peer waits forever.
    try {
      run_training(a->cfg, a->threads, a->backend, a->deterministic, mpi);
    } catch (const std::exception& e) {
      const bool usage = dynamic_cast<const UsageError*>(&e) != nullptr;
      const char* kind = usage ? "error" : "fatal";
      if (mpi.world_size() > 1 && !mpi.all_ranks_failed_within(kErrorAgreeSeconds)) {
        std::fprintf(stderr, "weft: %s: %s\n", kind, e.what());
        MpiRuntime::abort(usage ? 2 : 1);
      }
      if (mpi.world_rank() == 0) std::fprintf(stderr, "weft: %s: %s\n", kind, e.what());
      throw CLI::RuntimeError(usage ? 2 : 1);
    }
  });
}

// The train config for this world and --distributed-backend (gloo was mapped to mpi when the
// flags were resolved). Local: no collective.
static void validate_train_and_backend(const TrainConfig& t, const std::string& backend_flag,
                                       int world_size) {
  validate_train_config(t, world_size);
  if (backend_flag != "auto" && backend_flag != "mpi" && backend_flag != "nccl")
    fail_usage("--distributed-backend must be auto, mpi or nccl (or gloo, which runs as mpi; "
               "got '{}')", backend_flag);
  if (backend_flag == "nccl" && t.device != "cuda")
    fail_usage("--distributed-backend nccl needs --device cuda");
}

void prepare_training(TrainConfig& t, const std::string& backend_flag, MpiRuntime& mpi) {
  validate_train_and_backend(t, backend_flag, mpi.world_size());
  if (t.device == "cuda") set_cuda_device(mpi.local_rank());  // clear message without CUDA
  check_train_paths(t, mpi.world_rank());
}

void run_training(TrainConfig& t, int threads, const std::string& backend_flag,
                  bool deterministic, MpiRuntime& mpi) {
  {
    const Backend backend = start_runtime(t, threads, backend_flag, deterministic, mpi);
    LayoutConfig layout = t.layout;
    layout.world_size = mpi.world_size();
    Mesh mesh(layout);
    ProcessGroups groups(mesh, backend);
    Trainer trainer(t, groups);
    trainer.train();
  }
}

namespace {

// Two ranks that compute on one GPU: the lowest such pair {a, b} over the job (the same on every
// rank, from one all-gather of host name and PCI address), or {-1, -1}. NCCL refuses two ranks
// of one communicator on one GPU ("duplicate GPU"); CUDA_VISIBLE_DEVICES may hide the sharing
// (every rank sees its "device 0"), the PCI address does not.
std::pair<int, int> ranks_sharing_a_gpu(const MpiRuntime& mpi) {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string where = std::string(host) + "|" + cuda_device_pci_id();
  if (where.back() == '|')  // no PCI address: the device index this rank chose
    where += std::to_string(mpi.local_rank() % std::max(1, cuda_device_count()));
  const uint64_t mine = fnv1a64(where);
  std::vector<uint64_t> all(static_cast<size_t>(mpi.world_size()));
  MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b)
      if (all[a] == all[b]) return {static_cast<int>(a), static_cast<int>(b)};
  return {-1, -1};
}

}  // namespace

void check_on_every_rank(MpiRuntime& mpi, const std::function<void()>& check) {
  std::string error;  // the exit code ('2' usage, '1' other) and then the message
  try {
    check();
  } catch (const UsageError& e) {
    error = std::string("2") + e.what();
  } catch (const std::exception& e) {
    error = std::string("1") + e.what();
  }
  std::string first;
  if (mpi.first_failure(!error.empty(), error, &first) >= 0) {
    const bool usage = first[0] == '2';
    if (mpi.world_rank() == 0)
      std::fprintf(stderr, "weft: %s: %s\n", usage ? "error" : "fatal", first.c_str() + 1);
    throw CLI::RuntimeError(usage ? 2 : 1);
  }
}

Backend start_runtime(const TrainConfig& t, int threads, const std::string& backend_flag,
                      bool deterministic, MpiRuntime& mpi) {
  {
    // Every rank validates the same flags before the first collective.
    validate_train_and_backend(t, backend_flag, mpi.world_size());
    if (deterministic) set_deterministic_mode();
    Backend backend = Backend::kMpi;
    if (t.device == "cuda") {
      set_cuda_device(mpi.local_rank());  // fails with a clear message without CUDA
      const auto [a, b] = ranks_sharing_a_gpu(mpi);  // the same on every rank
      const bool own_gpu = a < 0;
      if (backend_flag == "nccl" && !own_gpu)
        fail_usage("--distributed-backend nccl needs a GPU per rank: ranks {} and {} compute on "
                   "the same GPU (same host and PCI address); use --distributed-backend mpi (or "
                   "auto) to share a GPU", a, b);
      if (backend_flag == "nccl" || (backend_flag == "auto" && nccl_available() && own_gpu))
        backend = Backend::kNccl;
    }
    mpi.start_watchdog(t.distributed_timeout_minutes * 60);  // before any group exists
    if (threads <= 0) threads = mpi.threads_per_rank();
    at::set_num_threads(threads);
    return backend;
  }
}

int data_parallel_size(const LayoutConfig& l, int world_size) {
  const int64_t per_replica = static_cast<int64_t>(l.tp) * l.cp * l.pp;
  if (per_replica <= 0 || world_size <= 0 || world_size % per_replica != 0) return 0;
  return static_cast<int>(world_size / per_replica);
}

void default_global_batch_size(TrainConfig* t, int world_size) {
  // A layout that does not divide the world keeps the value; validation names the flags.
  if (const int dp = data_parallel_size(t->layout, world_size); dp > 0)
    t->global_batch_size = t->micro_batch_size * dp;
}

void resolve_train_samples(TrainConfig* t) {
  if (t->train_samples < 0 || t->global_batch_size < 1) return;  // validation names the batch
  if (t->train_samples < t->global_batch_size && t->step_batch_size_schedule.empty())
    fail_usage("--train-samples {} is less than one global batch (--global-batch-size {})",
               t->train_samples, t->global_batch_size);
  // Megatron's: train_samples / the batch, or the steps a schedule takes to reach it.
  const int64_t iters = train_batches(*t).iterations_for(t->train_samples);
  if (iters > std::numeric_limits<int>::max())
    fail_usage("--train-samples {} gives {} iterations, more than weft counts", t->train_samples,
               iters);
  t->train_iters = static_cast<int>(iters);
}

ParsedTrainFlags add_train_flags(CLI::App* c) {
  auto a = std::make_shared<TrainArgs>();
  add_flags(c, a.get());
  return [a] {
    resolve_train_args(a.get());
    TrainFlags f{a->cfg, a->threads, a->backend, a->deterministic, !a->no_fused,
                 a->global_batch_given, a->megatron_warnings};
    for (std::string& w : ignored_flag_warnings(a->cfg)) f.warnings.push_back(std::move(w));
    return f;
  };
}

}  // namespace weft::app
