// Megatron-LM flags that Megatron users' scripts carry beyond the architecture (recipe_flags.h):
// kernel fusions, logging switches, checkpoint and data-loader knobs, mixed-precision and
// recomputation settings. So that such a script runs unchanged or fails with a reason, each is
// one of:
// - accepted: weft does what the flag asks anyway (--log-throughput, --exit-signal-handler,
//   --accumulate-allreduce-grads-in-fp32), or it picks an implementation that computes the
//   same values (--no-masked-softmax-fusion, --attention-backend, --num-workers);
// - accepted with one warning line: it changes only what Megatron logs or where, and weft has
//   no such output (--log-params-norm, --wandb-project), or a memory layout weft does not offer
//   (--data-parallel-sharding-strategy no_shard: weft always shards; same results);
// - refused before anything starts, naming the flag and why: it changes the training, and weft
//   does not implement it (--fp16, --recompute-activations, --rampup-batch-size, ...).
// A flag absent from all three lists stays unknown to CLI11 ("not expected").
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace weft {

struct MegatronFlags {
  std::string ckpt_format = "torch_dist";    // --ckpt-format (Megatron's default)
  std::string dataloader_type = "single";    // --dataloader-type
  std::string optimizer = "adam";            // --optimizer
  std::string attention_backend = "auto";    // --attention-backend
  std::string dp_sharding = "optim_grads_params";  // --data-parallel-sharding-strategy
  std::string outer_dp_sharding = "no_shard";      // --outer-dp-sharding-strategy
  std::string rerun_mode = "validate_results";  // --rerun-mode (Megatron's default)
  std::string ce_fusion_impl = "native";     // --cross-entropy-fusion-impl
  std::string timing_log_option = "minmax";  // --timing-log-option
  int num_workers = 2, dataset_builder_threads = 1, tensorboard_queue_size = 1000;
  int timing_log_level = 0, empty_unused_memory_level = 0, logging_level = 0;
  int manual_gc_interval = 0;
  std::vector<std::string> spec;             // --spec MODULE NAME
  CLI::App* app = nullptr;  // to ask which flags were given
};

void add_megatron_flags(CLI::App* c, MegatronFlags* f);
// --spec names the layer spec of Megatron's Mamba/hybrid stack (pretrain_mamba.py's
// mamba_stack_spec, pretrain_hybrid.py's hybrid_stack_spec): weft's hybrid model.
bool spec_names_hybrid_stack(const MegatronFlags& f);
// Throws UsageError naming the first given flag that weft refuses, or a value it does not
// implement; returns one warning line per accepted flag that changes nothing in weft's output.
std::vector<std::string> check_megatron_flags(const MegatronFlags& f);

}  // namespace weft
