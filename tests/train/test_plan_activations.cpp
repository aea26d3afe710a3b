// weft plan's activation estimate (train/plan.h) against a measurement: the bytes one
// microbatch's forward leaves for backward, measured on the CPU as the growth of the bytes malloc
// holds across the forward (one thread, so glibc's main arena and mmap see all of it), are within
// 5% of the plan's estimate for the ATen op chains, for dense fp32/bf16, MoE, MTP, MLA and
// hybrid Mamba-2 models. One rank.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include "support/job.h"
#include "weft/comm/process_groups.h"
#include "weft/model/hybrid.h"
#include "weft/train/plan.h"

namespace weft {
namespace {

TrainConfig base_config() {
  TrainConfig c;
  c.model.num_layers = 4;
  c.model.hidden_size = 256;
  c.model.ffn_hidden_size = 688;
  c.model.num_attention_heads = 8;
  c.model.num_query_groups = 4;
  c.model.seq_length = 128;
  c.model.vocab_size = 1024;
  c.micro_batch_size = 2;
  c.global_batch_size = 2;
  c.train_iters = 0;
  return c;
}

// Bytes malloc holds now (main arena + mmapped chunks; one thread allocates everything).
int64_t malloc_in_use() {
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

// Activation bytes one microbatch's forward leaves for backward on a single rank.
int64_t measured_activations(const TrainConfig& cfg) {
  int64_t grew = -1;
  test::run_job(cfg, 1, /*self_only=*/true, nullptr, nullptr, [&](Trainer& t, const ProcessGroups&) {
    const ModelConfig& m = cfg.model;
    const at::Tensor tokens = at::randint(m.vocab_size, {cfg.micro_batch_size, m.seq_length}, at::kLong);
    const at::Tensor labels = at::randint(m.vocab_size, {cfg.micro_batch_size, m.seq_length}, at::kLong);
    // A first microbatch warms up what libraries allocate once (kernel caches, workspaces).
    for (int mb = 0; mb < 2; ++mb) {
      const int64_t before = malloc_in_use();
      at::Tensor loss = t.stage().forward(mb, tokens, labels, 1.0 / tokens.numel());
      grew = malloc_in_use() - before;
      t.stage().backward(mb, loss, at::Tensor());
    }
  });
  return grew;
}

void expect_activations_close(const TrainConfig& cfg, const std::string& what) {
  const int64_t got = measured_activations(cfg);
  const int64_t want = make_train_plan(cfg, 1, 0.4, 989, false).ranks[0].act_per_microbatch;
  const double ratio = static_cast<double>(want) / static_cast<double>(got);
  std::printf("activations %s: measured %lld, plan %lld, plan/measured %.3f\n", what.c_str(),
              static_cast<long long>(got), static_cast<long long>(want), ratio);
  EXPECT_NEAR(ratio, 1.0, 0.05) << what;
}

TEST(Plan, ActivationEstimateMatchesMeasuredCpuForward) {
  at::set_num_threads(1);
  const TrainConfig c = base_config();
  expect_activations_close(c, "dense fp32");
  TrainConfig b = c;
  b.model.bf16 = true;
  expect_activations_close(b, "dense bf16");
  TrainConfig moe = b;
  moe.model.num_experts = 4;
  moe.model.moe_router_topk = 2;
  moe.model.moe_ffn_hidden_size = 256;
  expect_activations_close(moe, "MoE bf16");
  TrainConfig relu2 = moe;
  relu2.model.squared_relu = true;
  relu2.model.moe_layer_pattern = {0, 1, 0, 1};
  expect_activations_close(relu2, "squared-ReLU MLP and MoE bf16");
  TrainConfig mtp = b;
  mtp.model.mtp_num_layers = 1;
  expect_activations_close(mtp, "MTP bf16");
  TrainConfig hybrid = b;
  hybrid.model.mamba_state_dim = 16;
  hybrid.model.mamba_head_dim = 32;
  hybrid.model.mamba_num_groups = 2;
  hybrid.model.mamba_chunk_size = 32;  // 4 chunks: the inter-chunk terms too
  apply_hybrid_layer_pattern("M*M-", &hybrid.model);
  expect_activations_close(hybrid, "hybrid Mamba-2 bf16");
  TrainConfig hybrid32 = hybrid;
  hybrid32.model.bf16 = false;
  expect_activations_close(hybrid32, "hybrid Mamba-2 fp32");
}

// Multi-latent attention: the latents, their norms, the rotations and q, k, v of their own
// widths (values narrower than queries), with and without a query latent, and under selective
// core_attn recomputation.
TEST(Plan, MultiLatentActivationEstimateMatchesMeasuredCpuForward) {
  at::set_num_threads(1);
  TrainConfig m = base_config();
  m.model.bf16 = true;
  m.model.multi_latent_attention = true;
  m.model.q_lora_rank = 192;  // heads 3x and 1.5x as wide as the GQA model's 32, so that a
  m.model.kv_lora_rank = 128;  // GQA-shaped estimate fails
  m.model.qk_head_dim = 64;
  m.model.qk_pos_emb_head_dim = 32;
  m.model.v_head_dim = 48;
  m.model.qk_layernorm = true;
  m.model.rotary_scaling_factor = 40;
  expect_activations_close(m, "MLA bf16");
  TrainConfig plain = m;
  plain.model.bf16 = false;
  plain.model.q_lora_rank = 0;
  plain.model.qk_layernorm = false;
  expect_activations_close(plain, "MLA fp32, no query latent, no latent norms");
  TrainConfig sel = m;
  sel.model.recompute.granularity = "selective";
  sel.model.recompute.core_attn = true;
  expect_activations_close(sel, "MLA bf16, selective core_attn");
}

// Activation recomputation: what the recomputed pieces keep instead of their activations.
TEST(Plan, RecomputedActivationEstimateMatchesMeasuredCpuForward) {
  at::set_num_threads(1);
  TrainConfig b = base_config();
  b.model.bf16 = true;
  b.model.mtp_num_layers = 1;
  const auto with = [](TrainConfig c, const char* granularity, const char* method, int layers) {
    c.model.recompute.granularity = granularity;
    c.model.recompute.method = method;
    c.model.recompute.num_layers = layers;
    return c;
  };
  expect_activations_close(with(b, "full", "uniform", 1), "full uniform 1, MTP bf16");
  TrainConfig no_mtp = b;
  no_mtp.model.mtp_num_layers = 0;
  expect_activations_close(with(no_mtp, "full", "uniform", 3), "full uniform 3 bf16");
  expect_activations_close(with(b, "full", "block", 2), "full block 2, MTP bf16");
  TrainConfig sel = with(b, "selective", "", 0);
  sel.model.recompute.core_attn = true;
  expect_activations_close(sel, "selective core_attn bf16");
  sel.model.recompute.mlp = true;
  expect_activations_close(sel, "selective core_attn mlp bf16");
  TrainConfig moe = sel;
  moe.model.num_experts = 4;
  moe.model.moe_router_topk = 2;
  moe.model.moe_ffn_hidden_size = 256;
  moe.model.moe_shared_expert_intermediate_size = 128;
  moe.model.moe_layer_pattern = {0, 1, 0, 1};
  moe.model.recompute.core_attn = false;
  moe.model.recompute.shared_experts = true;
  expect_activations_close(moe, "selective mlp shared_experts, MoE bf16");
  moe.model.recompute.moe = true;
  expect_activations_close(moe, "selective mlp moe, MoE bf16");
  TrainConfig hybrid = with(b, "full", "uniform", 2);
  hybrid.model.mtp_num_layers = 0;
  hybrid.model.mamba_state_dim = 16;
  hybrid.model.mamba_head_dim = 32;
  hybrid.model.mamba_num_groups = 2;
  apply_hybrid_layer_pattern("M*M-", &hybrid.model);
  expect_activations_close(hybrid, "full uniform 2, hybrid Mamba-2 bf16");
}

}  // namespace
}  // namespace weft
