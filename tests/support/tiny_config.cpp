// The tiny model and run of tiny_config.h.
#include "support/tiny_config.h"

#include <utility>

#include "support/job.h"

namespace weft::test {

ModelConfig tiny_model(int num_layers) {
  ModelConfig m;
  m.num_layers = num_layers;
  m.hidden_size = 32;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.ffn_hidden_size = 48;
  m.seq_length = 16;
  m.vocab_size = 64;
  return m;
}

TrainConfig tiny_config(const TinyRun& r) {
  TrainConfig c;
  c.model = tiny_model(r.num_layers);
  c.micro_batch_size = 2;
  c.global_batch_size = r.global_batch_size;
  c.train_iters = r.train_iters;
  c.lr.lr = 1e-2;
  c.lr.min_lr = 1e-3;
  c.lr.warmup_iters = 1;
  c.seed = r.seed;
  c.device = test_device();
  return c;
}

void apply_tiny_moe(std::vector<int> moe_layer_pattern, ModelConfig* m) {
  m->num_experts = 4;
  m->moe_router_topk = 2;
  m->moe_ffn_hidden_size = 24;
  m->moe_shared_expert_intermediate_size = 16;
  m->moe_aux_loss_coeff = 0.01;
  m->moe_layer_pattern = std::move(moe_layer_pattern);
  m->mtp_num_layers = 2;
}

}  // namespace weft::test
