// One pipeline stage of the model: the FSDP units this rank holds and how one microbatch runs
// forward and backward through them.
//
// The first stage owns the embedding, the last stage the final norm, the output layer, the MTP
// block and the losses; every layer unit carries its global layer number in its parameter
// names. An MoE layer is two units: its own parameters (attention, norms, router, shared
// experts) sharded over fsdp_shard, and this ep rank's block of routed experts sharded over
// expert_fsdp_shard, run through the alltoall dispatcher over the ep group.
//
// With pp > 1, the last stage needs the embedding when the output layer is tied to it or when
// MTP embeds its shifted tokens: it then holds a separate unit for its copy of
// embedding.word_embeddings.weight, with the same shard boundaries as the first stage's (same
// shape, same shard-group size), so the two gradient shards can be summed over the embedding
// group (invariant 8). With pp = 1 the output layer and MTP use the embedding unit itself.
//
// Losses: the last stage returns the microbatch's objective, lm + mtp_loss_scaling_factor * mtp
// + moe_aux_loss_coeff * aux + moe_z_loss_coeff * z, each term weighted so that the sum over the
// step's microbatches and ranks is the step's mean; other stages keep their MoE layers' aux and
// z objective and include it in their backward. losses() holds the logged values [lm, aux, mtp,
// z] of the microbatches run since reset_losses(), weighted the same way (aux, z: the unweighted
// load-balancing loss and router z-loss averaged over MoE layers; mtp: the cross-entropy
// averaged over depths).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <vector>

#include "weft/comm/communicator.h"
#include "weft/comm/process_groups.h"
#include "weft/model/config.h"
#include "weft/model/moe.h"
#include "weft/model/transformer.h"
#include "weft/parallel/expert_parallel.h"
#include "weft/parallel/fsdp_unit.h"

namespace weft {

// Layers per stage. Without first/last (values < 0) layers split evenly; with Megatron's
// --decoder-first/last-pipeline-num-layers the rest split evenly over the middle stages.
// Throws UsageError naming the flag when the split is impossible.
std::vector<int> split_layers(int num_layers, int pp, int first_stage_layers,
                              int last_stage_layers);

struct StageOptions {
  c10::ScalarType dtype = at::kFloat;     // compute dtype
  c10::Device device = c10::Device("cpu");
  int first_stage_layers = -1;
  int last_stage_layers = -1;
  // Gather the next unit's weights before computing the current one (forward), and the
  // previous layer's when a layer's backward starts. With NCCL the gathers run on the
  // communicator's stream and overlap compute; with MPI they are only issued earlier.
  bool overlap_param_gather = false;  // --overlap-param-gather (Megatron's default: off)
  bool overlap_grad_reduce = false;  // --overlap-grad-reduce (Megatron's default: off)
};

// How the last stage weighs its losses (Megatron's loss function and schedule).
// - mask (--eod-mask-loss): [b, s] float32 on the device, 0 where the input token is the end of
//   document; those positions leave the loss, and an MTP depth d leaves out the positions whose
//   label (t+d) is masked (the mask shifted by d). The logged lm loss is then the masked sum
//   times log_scale, 1 / the step's (or evaluation's) unmasked positions over all ranks:
//   Megatron's reported per-token mean.
// - Without per_token (Megatron's default): each microbatch's loss is its sum over its counted
//   positions (at least 1), weighted by micro batch / global batch; each MTP depth likewise,
//   averaged over the depths.
// - per_token (--calculate-per-token-loss): every counted position of the step weighs the same,
//   1 / the step's counted positions (log_scale with a mask, else loss_scale); each MTP depth's
//   sum takes that weight too (over the depths), and the aux losses take the microbatch's
//   positions times it (Megatron scales them by its tokens before dividing every gradient by
//   the step's). The logged MTP loss stays the microbatch means.
struct LossOptions {
  at::Tensor mask;
  double log_scale = 0;
  bool per_token = false;
};

class PipelineStage {
 public:
  // `groups` must outlive the stage.
  PipelineStage(const ModelConfig& cfg, const ProcessGroups& groups, const StageOptions& opt);
  ~PipelineStage();

  int stage() const { return stage_; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == num_stages_ - 1; }
  int first_layer() const { return first_layer_; }
  int num_layers() const { return num_layers_; }
  const ModelConfig& model_config() const { return cfg_; }
  const StageOptions& options() const { return opt_; }

  // Every unit of this stage, in forward order.
  const std::vector<std::unique_ptr<FsdpUnit>>& units() const { return units_; }
  // Lazy gradient zeroing for every unit (FsdpUnit::zero_grad); the end of each microbatch's
  // backward zeroes what it left unwritten.
  void set_lazy_grad_zeroing(bool on) {
    for (auto& u : units_) u->set_lazy_grad_zeroing(on);
  }
  // The unit of embedding.word_embeddings.weight (first stage) or null.
  FsdpUnit* embedding_unit() const { return embedding_; }
  // Whether the first and the last stage each hold the embedding (pp > 1 with a tied output
  // layer or MTP): their gradients are then summed over the embedding group.
  bool has_embedding_copy() const {
    return num_stages_ > 1 && (cfg_.tied() || cfg_.mtp_num_layers > 0);
  }
  // The last stage's copy of the embedding (see has_embedding_copy) or null.
  FsdpUnit* embedding_copy_unit() const { return embedding_copy_; }
  // True for a unit whose parameters are copies of another stage's (not counted twice in the
  // grad norm, not stored twice in checkpoints).
  bool is_embedding_copy(const FsdpUnit* u) const { return u == embedding_copy_; }
  // Whether `u` holds routed experts (sharded over the expert groups).
  bool is_expert_unit(const FsdpUnit* u) const;

  // Loads every unit's shard from init_param(spec, cfg, seed): invariant 5.
  void init_parameters(uint64_t seed);

  // The routers' expert biases of this stage's MoE layers (--moe-router-enable-expert-bias),
  // with their checkpoint names (router_bias_name), in forward order; every rank of the stage
  // holds the same values. Empty without the flag.
  const std::vector<std::pair<std::string, RouterBias*>>& router_biases() const {
    return router_biases_;
  }
  // Megatron's aux-loss-free update at the end of a step's backward (updated_expert_bias): the
  // pairs routed in this step, summed over tp_dp_cp (every rank of the stage), move each bias by
  // --moe-router-bias-update-rate; the pairs restart at zero. Collective over tp_dp_cp when
  // the stage has expert biases; nothing otherwise.
  void update_router_biases();
  // Whether this rank stores the stage's router biases in checkpoints (rank 0 of tp_dp_cp; the
  // others hold the same values).
  bool writes_router_biases() const;

  // Runs microbatch `mb` forward. First stage: `input` is tokens [b, s] int64; otherwise the
  // activation [b, s, h] received from the previous stage (a leaf requiring grad). Returns the
  // activation to send on, or on the last stage loss_sum(labels) * loss_scale.
  // `loss_scale` is 1 / (global batch * seq_length): lm_loss_sum(...) * loss_scale summed over
  // the step is the mean loss.
  // `loss` (LossOptions) masks and weighs the losses as Megatron does.
  at::Tensor forward(int mb, const at::Tensor& input, const at::Tensor& labels, double loss_scale,
                     const LossOptions& loss = {});
  // Runs microbatch `mb` backward from `output` (the value forward returned) with `grad`
  // (undefined on the last stage, where output is the loss).
  void backward(int mb, const at::Tensor& output, const at::Tensor& grad);
  // Shape of the activations passed between stages.
  std::vector<int64_t> activation_shape(int micro_batch_size) const;

  // [lm, aux, mtp, z] float64 on the stage's device (see the file comment); reset_losses() zeroes.
  const at::Tensor& losses() const { return losses_; }
  void reset_losses();

 private:
  // A decoder layer's or an MTP depth's units: its own parameters, and the routed experts of
  // each of its MoE layers, with their handles (fixed at construction).
  struct Block {
    FsdpUnit* dense = nullptr;
    std::vector<FsdpUnit*> experts;                        // one per MoE layer
    std::vector<std::unique_ptr<ExpertParallel>> dispatch;  // same order
    std::vector<std::unique_ptr<RouterBias>> biases;       // same order (expert bias)
    LayerHandles layer;                                     // decoder layers
    MtpHandles mtp;                                         // MTP depths
  };
  void set_microbatch(int mb);
  // Calls `f` (reshard, unshard) on the block's units.
  static void for_units(const Block& b, void (FsdpUnit::*f)());
  // A unit over `specs`, and one expert unit per prefix in `moe_prefixes`.
  Block make_block(const std::string& name, const std::vector<ParamSpec>& specs,
                   const std::vector<std::string>& moe_prefixes);
  // Adds the MoE losses [aux, z] of one microbatch to losses() at `weight` (its share of the
  // step) and returns their objective at `objective_weight` (undefined when none applies).
  at::Tensor account_aux(const at::Tensor& aux, double weight, double objective_weight);

  ModelConfig cfg_;
  StageOptions opt_;
  int stage_, num_stages_, first_layer_ = 0, num_layers_ = 0;
  std::vector<std::unique_ptr<FsdpUnit>> units_;
  GradReductionQueue reduce_queue_{2};  // reduce-scatters in flight during backward
  const ProcessGroups& groups_;
  FsdpUnit* embedding_ = nullptr;
  FsdpUnit* embedding_copy_ = nullptr;
  FsdpUnit* final_norm_ = nullptr;
  FsdpUnit* output_ = nullptr;            // the unit holding the output weight (may be embedding_)
  FsdpUnit* mtp_embedding_ = nullptr;     // the embedding MTP looks its tokens up in
  std::vector<Block> layers_;
  std::vector<Block> mtp_;                // MTP depths (last stage)
  std::vector<FsdpUnit*> forward_order_;  // units in the order forward first uses them
  std::vector<std::pair<std::string, RouterBias*>> router_biases_;  // owned by the blocks
  std::map<int, at::Tensor> aux_objective_;  // microbatch -> aux objective awaiting backward
  at::Tensor losses_;
  RotaryTables rope_;
};

}  // namespace weft
