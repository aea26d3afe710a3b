// `weft plan`: what a training config costs each rank, computed from the config alone (no MPI,
// no tensors): the bytes of the parameter shards and their optimizer state (exactly as
// PipelineStage and ShardedAdamW allocate them), the gathered weights and communication
// buffers, the activations 1F1B keeps for backward, the estimated peak, the checkpoint size,
// and the time per step at a given MFU.
//
// Exact: weight, gradient, master and moment shards (the FSDP row-block sharding with its
// padding, per unit, per rank). Estimated: activations (plan.cpp states the formula per piece),
// gathered weights, communication buffers and the backward's working set.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "weft/train/trainer.h"

namespace weft {

// Bytes one rank holds.
struct RankPlan {
  int rank = 0;
  int stage = 0;
  int64_t params = 0;          // elements of this rank's shards (padding included)
  int64_t weights = 0;         // compute-dtype weight shards (0 with fp32: the master is the weight)
  int64_t grads = 0;           // gradient shards (main or decoupled; bf16 main ones with
                               // --grad-reduce-in-bf16)
  int64_t master = 0;          // float32 master shards
  int64_t exp_avg = 0;         // first moments (--exp-avg-dtype)
  int64_t exp_avg_sq = 0;      // second moments (--exp-avg-sq-dtype)
  int64_t gathered = 0;        // full weights of the units gathered at once (FSDP all-gather)
  int64_t comm = 0;            // reduce-scatter buffers, pipeline send/recv, expert all-to-all
  int64_t act_per_microbatch = 0;  // activations one microbatch keeps for backward
  int inflight = 0;            // microbatches in flight at once under 1F1B
  int64_t activations = 0;     // inflight * act_per_microbatch
  int64_t backward_transient = 0;  // largest gradient working set of the backward (e.g. dlogits)
  // An evaluation (forward only under no-grad, microbatches of --eval-micro-batch-size): the
  // state, gathered weights, its pipeline buffers and one layer's tensors (bounded by what the
  // layer's training forward keeps) with the last stage's logits; 0 for a run that never
  // evaluates.
  int64_t eval_peak = 0;
  int64_t peak = 0;            // the training step's sum of all the above, or eval_peak if larger
  int64_t state() const { return weights + grads + master + exp_avg + exp_avg_sq; }
};

struct TrainPlan {
  std::vector<RankPlan> ranks;  // one per rank of the world
  int microbatches = 0;         // per step and data-parallel rank
  int64_t total_params = 0;     // in the model (all experts, MTP included)
  int64_t checkpoint_bytes = 0;  // model tensors + master + moments, each element once
  double flops_per_token = 0;   // forward + backward, as bench/gpu/mfu.py
  int64_t tokens_per_step = 0;
  double step_seconds = 0;      // at mfu * peak_tflops per GPU over the world
};

// Throws UsageError (naming the flag) for a config weft train would refuse. `fused`: weft's
// fused CUDA kernels run (the default for --device cuda in a CUDA build); otherwise the ATen
// op chains, whose saved tensors the activation estimate follows instead.
TrainPlan make_train_plan(const TrainConfig& cfg, int world_size, double mfu, double peak_tflops,
                          bool fused);

// Forward + backward FLOPs per token: bench/gpu/mfu.py's formula (6 * active matmul parameters
// incl. the output layer + 6 * s * h per attention layer + the Mamba SSD scan).
double plan_flops_per_token(const ModelConfig& m);

nlohmann::ordered_json train_plan_json(const TrainPlan& p);
// Human-readable report; ranks with identical plans are printed as one group.
std::string train_plan_text(const TrainPlan& p, const TrainConfig& cfg, double mfu,
                            double peak_tflops);

}  // namespace weft
