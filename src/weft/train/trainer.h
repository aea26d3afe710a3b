// The pretraining loop: one step = 1F1B forward/backward over the microbatches, the HSDP
// replicate all-reduce, the tied-embedding all-reduce over the embedding group, the global
// grad norm and clipping, and one AdamW step. Same losses whatever the layout.
//
// Reduction order per step (all through grad_shard(), invariant 7):
//   1. per microbatch and unit: reduce-scatter (sum) over the unit's shard group: fsdp_shard
//      for dense units, expert_fsdp_shard for routed experts                  (FsdpUnit)
//   2. all-reduce (sum) over the unit's replicate group when dp_outer > 1      (HSDP)
//   3. all-reduce (sum) of the embedding copies (tied output layer, MTP) over the embedding
//      group, entered by every member even when its shard is only padding (invariant 6)
//   4. grad norm: one world all-reduce of the squared shards of each unit's main replica, the
//      embedding copy excluded, then clipping by the global norm.
// Losses are scaled by 1/(global batch tokens), so sums over microbatches and ranks are means.
// Routed experts see the tokens of their whole ep group through the dispatcher, so steps 1-2
// over the expert groups complete the sum over every data-parallel rank.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "weft/comm/communicator.h"
#include "weft/comm/process_groups.h"
#include "weft/model/config.h"
#include "weft/optim/adamw.h"
#include "weft/optim/lr_schedule.h"
#include "weft/parallel/pipeline_stage.h"
#include "weft/parallel/schedule.h"
#include "weft/train/batch_schedule.h"
#include "weft/train/profiler.h"
#include "weft/train/train_data.h"

namespace weft {

class AsyncCheckpointSaver;
class GraphedMicrobatches;

struct TrainConfig {
  ModelConfig model;
  LayoutConfig layout;
  AdamWConfig adam;
  LrScheduleConfig lr;
  int micro_batch_size = 2;     // --micro-batch-size
  int global_batch_size = 16;   // --global-batch-size (the evaluation's too, by default)
  // --step-batch-size-schedule (empty: none): the training batch by consumed samples
  // (batch_schedule.h); then --global-batch-size is not given and stays micro-batch x dp, the
  // evaluation's default batch, as in Megatron.
  std::string step_batch_size_schedule;
  int train_iters = 10;         // --train-iters
  // --train-samples (-1: not given): the run's length in samples, Megatron's sample-based
  // training; the commands set train_iters = train_samples / global_batch_size, or with a
  // --step-batch-size-schedule the steps that reach train_samples
  // (resolve_train_samples) and the schedule counts samples (lr.sample_based).
  int64_t train_samples = -1;
  uint64_t seed = 1234;         // --seed
  double clip_grad = 1.0;       // --clip-grad (0 disables)
  int first_stage_layers = -1;  // --decoder-first-pipeline-num-layers
  int last_stage_layers = -1;   // --decoder-last-pipeline-num-layers
  std::string device = "cpu";   // --device cpu|cuda
  bool overlap_param_gather = false;  // --overlap-param-gather (Megatron's default: off)
  bool overlap_grad_reduce = false;   // --overlap-grad-reduce (Megatron's default: off)
  std::string log_jsonl;        // --log-jsonl FILE
  int log_interval = 1;         // --log-interval
  std::string tensorboard_dir;       // --tensorboard-dir DIR (rank 0 writes event files)
  int tensorboard_log_interval = 1;  // --tensorboard-log-interval
  double peak_tflops = -1;           // --peak-tflops per device for MFU (-1: train/flops.h)
  bool quiet = false;           // no per-iteration lines (tests)
  // Checkpoints (docs/checkpoint-format.md).
  std::string save;             // --save DIR
  int save_interval = 0;        // --save-interval K (0: only at the end and on exit)
  std::string load;             // --load DIR
  int ckpt_step = -1;           // --ckpt-step N (-1: the tracker's latest)
  std::string strictness = "assume_ok_unexpected";  // --dist-ckpt-strictness (Megatron's default)
  bool finetune = false;        // --finetune: load model weights only; iteration 0, fresh optimizer
  bool exit_on_missing_checkpoint = false;  // --exit-on-missing-checkpoint (Megatron's)
  bool no_load_optim = false;   // --no-load-optim: weights, iteration, data; a fresh optimizer
  bool no_load_rng = false;     // --no-load-rng: leave the CPU generator as --seed seeded it
  // A resume's learning-rate schedule (train/schedule_resume.h): by default it must equal the
  // checkpoint's, as in Megatron; --override-opt_param-scheduler trains with the flags',
  // --use-checkpoint-opt_param-scheduler with the checkpoint's.
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
  // --dump-first-batch FILE (hidden, for reference checks): rank 0 writes the tokens and labels
  // of this run's first global batch as an .npy of int64 [2, global batch, seq].
  std::string dump_first_batch;
  int exit_interval = 0;        // --exit-interval N: save and exit when iteration % N == 0
  double exit_duration_mins = 0;  // --exit-duration-in-mins: save and exit after this long
  double distributed_timeout_minutes = 10;  // --distributed-timeout-minutes (collective watchdog)
  bool async_save = false;      // --async-save: write checkpoints on a background thread
  bool exit_on_save_failure = true;  // --exit-on-save-failure / --no-exit-on-save-failure
  ProfileConfig profile;        // --profile, --profile-step-start/-end, --profile-ranks, --profile-dir
  std::string moe_token_dispatcher_type = "allgather";  // --moe-token-dispatcher-type (Megatron)
  // Data (docs/data-format.md, docs/data-sampling.md): Megatron indexed datasets through
  // GPTDataset sampling when --data-path is given, else mock data.
  bool mock_data = false;              // --mock-data
  std::vector<std::string> data_path;  // --data-path [W1] P1 [W2 P2 ...]
  std::string split = "969,30,1";      // --split
  // --train-data-path, --valid-data-path, --test-data-path (Megatron's): each split from its
  // own blend, all of its documents, instead of --data-path and --split. [kTrain, kValid, kTest]
  std::array<std::vector<std::string>, 3> split_data_path;
  bool per_split_data() const {
    return !split_data_path[0].empty() || !split_data_path[1].empty() || !split_data_path[2].empty();
  }
  bool real_data() const { return !data_path.empty() || per_split_data(); }
  std::string data_cache_path;         // --data-cache-path ("": beside the data)
  int eval_interval = 1000;            // --eval-interval (0: never)
  int eval_iters = 100;                // --eval-iters (global batches per evaluation)
  // Megatron's ValidationConfig: the evaluation's own batch (-1: --global-batch-size and
  // --micro-batch-size; evaluate() reads eval_global_batch() samples per eval iteration);
  // --start-eval-at-iter N: the evaluations every --eval-interval begin at iteration N (-1: from
  // the first); --skip-train: no training, the valid and test splits evaluated once from their
  // first samples (Trainer::train).
  int eval_global_batch_size = -1;     // --eval-global-batch-size
  int eval_micro_batch_size = -1;      // --eval-micro-batch-size
  int start_eval_at_iter = -1;         // --start-eval-at-iter
  bool skip_train = false;             // --skip-train
  // --full-validation: each validation reads every sample of one pass over each validation
  // dataset (TrainData::full_valid_samples) instead of --eval-iters batches; with
  // --multiple-validation-sets each dataset of --valid-data-path is its own validation set,
  // named by --validation-set-names (default 0, 1, ...).
  bool full_validation = false;        // --full-validation
  bool multiple_validation_sets = false;  // --multiple-validation-sets
  std::vector<std::string> validation_set_names;  // --validation-set-names
  int eval_global_batch() const {
    return eval_global_batch_size > 0 ? eval_global_batch_size : global_batch_size;
  }
  int eval_micro_batch() const {
    return eval_micro_batch_size > 0 ? eval_micro_batch_size : micro_batch_size;
  }
  // Whether the evaluation due at `iteration` (a multiple of --eval-interval) runs.
  bool evaluates_at(int iteration) const {
    return eval_interval > 0 && iteration % eval_interval == 0 && iteration >= start_eval_at_iter;
  }
  // The evaluations every --eval-interval among iterations 1..iteration.
  int64_t evaluations_through(int iteration) const {
    if (eval_interval <= 0 || iteration < 1) return 0;
    const int first = std::max(start_eval_at_iter, 1);
    return std::max(0, iteration / eval_interval - (first - 1) / eval_interval);
  }
  // The tokenizer's identity (Tokenizer::identity(); null without --tokenizer-model), stored
  // in checkpoints; a load with another tokenizer is refused unless override_tokenizer.
  nlohmann::json tokenizer_identity;
  bool override_tokenizer = false;     // --override-tokenizer
  // --override-checkpoint-rope: load a checkpoint trained with another RoPE base or scaling
  // (context extension) instead of refusing it.
  bool override_checkpoint_rope = false;
  // Non-finite loss or gradients: skipped and counted by default. --check-for-nan-in-loss-and-grad
  // makes the first one an error naming the iteration and the first parameter (model order)
  // with a non-finite gradient; --max-skipped-iterations K ends the run, saving nothing, after
  // K consecutive skipped iterations (0: never).
  bool check_for_nan = false;          // --check-for-nan-in-loss-and-grad
  int max_skipped_iterations = 0;      // --max-skipped-iterations
  // CUDA graphs (Megatron's flags): with --cuda-graph-impl local, the forward and backward of
  // one microbatch is captured as a CUDA graph (parallel/graphed_schedule.h) after
  // --cuda-graph-warmup-steps eager iterations of this run, and replayed for every microbatch
  // from then on. Its scope is one microbatch (Megatron's per_microbatch); the gradient norm,
  // clipping and AdamW stay eager. Needs --device cuda, --pipeline-model-parallel-size 1, an
  // FSDP shard group of one rank (dp = --num-distributed-optimizer-instances) and no routed
  // experts: inside the graph no collective may run and no shape may depend on the data.
  std::string cuda_graph_impl = "none";  // --cuda-graph-impl none|local
  int cuda_graph_warmup_steps = 3;       // --cuda-graph-warmup-steps
  // --eod-mask-loss (Megatron's): the language-model and MTP losses leave out the positions
  // whose input token is the tokenizer's end of document `eod_token` (PipelineStage::forward
  // says how they are averaged and logged).
  bool eod_mask_loss = false;
  int64_t eod_token = -1;
  // Megatron's GPTDataset masks the loss where the label is the tokenizer's pad and feeds pad
  // tokens and labels to the model as id 0; pad_token is that pad (-1: none). A pad equal to the
  // end of document is dropped (-1) unless --allow-ambiguous-pad-tokens (as Megatron).
  int64_t pad_token = -1;
  // --calculate-per-token-loss (Megatron's): every counted position of a step weighs the same
  // (LossOptions in parallel/pipeline_stage.h).
  bool calculate_per_token_loss = false;
};

// The whole config as JSON (stored in checkpoints) and the layout part of it.
nlohmann::json train_config_to_json(const TrainConfig& cfg);
nlohmann::json layout_to_json(const Mesh& mesh, const TrainConfig& cfg);

class TrainLog;

struct IterationStats {
  int iteration = 0;
  int64_t consumed_samples = 0;
  int global_batch = 0;  // the samples of this step
  double lm_loss = 0;
  double aux_loss = 0;   // load-balancing loss, mean over MoE layers (without the coefficient)
  double z_loss = 0;     // router z-loss, mean over MoE layers (without the coefficient)
  double mtp_loss = 0;   // MTP cross-entropy, mean over depths (without the scaling factor)
  double grad_norm = 0;
  double lr = 0;
  double ms = 0;
  double tokens_per_sec = 0;
  bool skipped = false;
};

// One evaluation's result, as its validation block reports it: after `iteration` (the end of
// training's too), the valid split's (a --multiple-validation-sets set's: `set`) or the test's.
struct ValidationResult {
  int iteration = 0;
  bool test = false;
  std::string set;
  double loss = 0;
};

// The training batch per step: --step-batch-size-schedule, else --global-batch-size.
BatchSchedule train_batches(const TrainConfig& cfg);

// Throws UsageError naming the flag for anything the trainer cannot run. Local: no collectives.
void validate_train_config(const TrainConfig& cfg, int world_size);

class Trainer {
 public:
  // `groups` must outlive the trainer and match cfg.layout. Collective over the world.
  Trainer(const TrainConfig& cfg, const ProcessGroups& groups);
  ~Trainer();

  IterationStats train_step();
  // Runs until cfg.train_iters (or an exit condition: SIGTERM/SIGINT, --exit-interval,
  // --exit-duration-in-mins), printing, logging and saving; returns every iteration's stats.
  std::vector<IterationStats> train();
  // The mean lm loss over --eval-iters global batches of the valid (or test) split from sample
  // `first_sample` on (collective; no training state changes). Requires has_validation().
  double evaluate(DataSplit split = DataSplit::kValid, int64_t first_sample = 0);
  // The valid samples the evaluations every --eval-interval have read, Megatron's
  // consumed_valid_samples: the next one reads the --eval-iters batches from there. Saved in
  // checkpoints and continued on resume (a checkpoint without it: the evaluations its iteration
  // implies under this run's flags, Megatron's fallback). The evaluation at the end of training
  // reads from there too without counting; --full-validation reads no stream.
  int64_t consumed_valid_samples() const { return consumed_valid_samples_; }
  bool has_validation() const { return data_->has_valid(); }
  double last_validation_loss() const { return last_valid_loss_; }  // 0 before the first
  // Every evaluation this Trainer reported (train(), --skip-train), in order; on every rank.
  const std::vector<ValidationResult>& validations() const { return validations_; }
  // Saves the current state to cfg.save as this iteration (collective). With --async-save it
  // returns once the state is copied and the write goes on in the background (a pending save
  // is finished first); wait_for_save() or the end of train() commits it. A failed save throws
  // weft::Error with --exit-on-save-failure (the default), else warns and training goes on.
  void save();
  // With --async-save: waits for the pending save and commits it (collective); else nothing.
  void wait_for_save();
  int64_t consumed_samples() const { return consumed_samples_; }

  int iteration() const { return iteration_; }
  // Iterations skipped for a non-finite loss or gradient norm (Megatron's two log counters).
  int skipped_iterations() const { return skipped_iters_; }
  int nan_iterations() const { return nan_iters_; }
  // Whether --cuda-graph-impl local has captured its graph (the steps since replay it).
  bool cuda_graph_captured() const;
  PipelineStage& stage() { return *stage_; }
  ShardedAdamW& optimizer() { return *optimizer_; }
  // Startup summary (layout, groups, parameter counts, bytes per rank); rank 0 prints it.
  std::string summary() const;
  // Bytes this rank holds for dense units or for routed-expert units.
  struct StateBytes {
    int64_t weights = 0, grads = 0, optimizer = 0;
  };
  StateBytes state_bytes(bool experts) const;

 private:
  // Microbatch m of the current step: the prefetched one, else fetched now.
  Microbatch microbatch(int m) const;
  // Microbatch m of the step whose first sample (over all dp ranks) is `consumed`.
  Microbatch fetch_microbatch(int64_t consumed, int m) const;
  // The microbatches per data-parallel rank of the step that starts at `consumed` samples.
  int microbatches_at(int64_t consumed) const;
  // Microbatch b's LossOptions: --calculate-per-token-loss, and with --eod-mask-loss or a pad
  // (pad_token) its mask (from its tokens and labels; pad ids become 0) and the logged loss's
  // scale, 1 / the unmasked positions of the `count` samples from `first` (cached for the last
  // span). With the pad alone, a span where no token or label is the pad runs unmasked.
  void add_loss_mask(Microbatch* b, DataSplit split, int64_t first, int64_t count) const;
  // Fetches the microbatches of the step after iteration `it` (host reads, copies to the device
  // started), while the device still works on this one. None after the last iteration.
  void prefetch_next_step(int it);
  // --dump-first-batch: writes the next global batch's tokens and labels (rank 0 only).
  void dump_first_batch() const;
  // Refuses (on every rank) a checkpoint whose recorded model differs from this run's in a
  // setting the tensor shapes do not show (model_mismatches); RoPE differences only without
  // --override-checkpoint-rope, which prints them instead.
  void check_checkpoint_model(const nlohmann::json& meta) const;
  // Refuses a checkpoint trained with another tokenizer (unless --override-tokenizer).
  void check_tokenizer(const nlohmann::json& meta) const;
  // Warns (rank 0) when the checkpoint was trained on other data than this run's (another
  // --data-path, --split, --seq-length or --seed): allowed, as a change of data mid-training,
  // but the data position then continues in other data.
  void warn_if_other_data(const nlohmann::json& meta) const;
  // Evaluates, prints Megatron's validation block on rank 0 and appends it to the JSONL (one
  // per set with --multiple-validation-sets).
  void report_validation(const std::string& when, FILE* jsonl,
                         DataSplit split = DataSplit::kValid);
  // Rank 0: one validation block (console, TensorBoard unless --skip-train, JSONL); `set`: a
  // --multiple-validation-sets name ("validation-NAME").
  void print_validation(const std::string& when, FILE* jsonl, double loss, bool test,
                        const std::string& set) const;
  // --full-validation: every sample of validation set `set` (TrainData::full_valid_samples)
  // once, in rounds of the evaluation's batch; the rows past the last sample repeat it with
  // their loss masked out. Returns the mean lm loss over the positions the loss counts and
  // their number (collective).
  std::pair<double, int64_t> evaluate_full(int set);
  // evaluate_full of every set: each set's loss into `per_set` (if given), and the mean over all
  // their positions.
  double evaluate_full_sets(std::vector<double>* per_set);
  // Commits a pending asynchronous save: when every rank's writer is done, or after waiting
  // (`wait`). Collective.
  void finish_save(bool wait);
  // A save of `iteration` failed (the same on every rank): rethrows with
  // --exit-on-save-failure, else warns on rank 0. Call only inside the catch block.
  void on_save_failure(const std::exception& e, int iteration);
  // --save: the filesystem has room for one checkpoint (the bytes of every rank's shards, all
  // ranks assumed to share the filesystem, as the checkpoint directory requires). Collective.
  void check_save_space() const;
  // --check-for-nan-in-loss-and-grad: throws weft::Error on every rank naming iteration `it`
  // and the first parameter (lowest index in model order over all ranks) whose gradient holds
  // a NaN or Inf, or the loss when every gradient is finite. Collective.
  [[noreturn]] void fail_non_finite(const IterationStats& s) const;

  TrainConfig cfg_;
  const ProcessGroups& groups_;
  std::unique_ptr<PipelineStage> stage_;
  std::unique_ptr<ShardedAdamW> optimizer_;
  std::unique_ptr<TrainData> data_;
  BatchSchedule batches_ = BatchSchedule::constant(1);  // the training batch per step
  int64_t prefetched_for_ = -1;         // the consumed samples the prefetched step starts at
  mutable std::tuple<DataSplit, int64_t, int64_t> log_scale_span_{DataSplit::kTrain, -1, 0};
  mutable double log_scale_ = 0;        // add_loss_mask's for log_scale_span_
  mutable bool span_masked_ = false;    // and whether that span's loss is masked
  std::vector<Microbatch> prefetched_;  // its microbatches
  int steps_run_ = 0;                   // train_step calls in this process
  std::unique_ptr<GraphedMicrobatches> graphed_;  // with --cuda-graph-impl local
  int dp_rank_ = 0;
  int iteration_ = 0;
  int64_t consumed_samples_ = 0;
  int64_t consumed_valid_samples_ = 0;
  std::vector<int64_t> full_positions_;  // evaluate_full's positions per set (-1: not counted)
  // The learning-rate schedule's position, Megatron's num_steps: the samples of the updates
  // made (each adds its step's batch), counted on from a resumed checkpoint's, so that a
  // resume at another --global-batch-size continues it.
  int64_t scheduler_samples_ = 0;
  int skipped_iters_ = 0;
  int nan_iters_ = 0;
  int consecutive_skipped_ = 0;  // for --max-skipped-iterations
  int last_saved_ = -1;
  double last_valid_loss_ = 0;
  std::vector<ValidationResult> validations_;
  std::unique_ptr<AsyncCheckpointSaver> async_saver_;  // with --async-save
  std::unique_ptr<TrainLog> log_;  // MFU, ETA, TensorBoard (train_log.h); set by train()
};

// Set by SIGTERM/SIGINT while Trainer::train runs; checked once per iteration by every rank.
bool exit_signal_received();

}  // namespace weft
