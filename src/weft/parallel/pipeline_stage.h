// One pipeline stage of the model: the FSDP units this rank holds and how one microbatch runs
// forward and backward through them.
//
// The first stage owns the embedding, the last stage the final norm, the output layer and the
// loss; every layer unit carries its global layer number in its parameter names. With tied
// embeddings and pp > 1, the last stage holds a separate unit for its copy of
// embedding.word_embeddings.weight, with the same shard boundaries as the first stage's (same
// shape, same shard-group size), so the two gradient shards can be summed over the embedding
// group. With pp = 1 the output layer uses the embedding unit itself.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "weft/comm/communicator.h"
#include "weft/model/config.h"
#include "weft/model/transformer.h"
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
  bool prefetch = true;   // --overlap-param-gather / --no-overlap-param-gather
  bool overlap_grad_reduce = true;  // --overlap-grad-reduce / --no-overlap-grad-reduce
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
  // The unit of embedding.word_embeddings.weight (first stage) or null.
  FsdpUnit* embedding_unit() const { return embedding_; }
  // The last stage's copy of the tied embedding (tied, pp > 1) or null.
  FsdpUnit* tied_output_unit() const { return tied_output_; }
  // True for a unit whose parameters are copies of another stage's (not counted twice in the
  // grad norm, not stored twice in checkpoints).
  bool is_tied_copy(const FsdpUnit* u) const { return u == tied_output_; }

  // Loads every unit's shard from init_param(spec, cfg, seed): invariant 5.
  void init_parameters(uint64_t seed);

  // Runs microbatch `mb` forward. First stage: `input` is tokens [b, s] int64; otherwise the
  // activation [b, s, h] received from the previous stage (a leaf requiring grad). Returns the
  // activation to send on, or on the last stage loss_sum(labels) * loss_scale.
  at::Tensor forward(int mb, const at::Tensor& input, const at::Tensor& labels, double loss_scale);
  // Runs microbatch `mb` backward from `output` (the value forward returned) with `grad`
  // (undefined on the last stage, where output is the loss).
  void backward(int mb, const at::Tensor& output, const at::Tensor& grad);
  // Shape of the activations passed between stages.
  std::vector<int64_t> activation_shape(int micro_batch_size) const;

 private:
  void set_microbatch(int mb);

  ModelConfig cfg_;
  StageOptions opt_;
  int stage_, num_stages_, first_layer_ = 0, num_layers_ = 0;
  std::vector<std::unique_ptr<FsdpUnit>> units_;
  GradReductionQueue reduce_queue_{2};  // reduce-scatters in flight during backward
  FsdpUnit* embedding_ = nullptr;
  FsdpUnit* tied_output_ = nullptr;
  FsdpUnit* final_norm_ = nullptr;
  FsdpUnit* output_ = nullptr;            // the unit holding the output weight (may be embedding_)
  std::vector<FsdpUnit*> layers_;
  std::vector<FsdpUnit*> forward_order_;  // units in the order forward first uses them
  RotaryTables rope_;
};

}  // namespace weft
