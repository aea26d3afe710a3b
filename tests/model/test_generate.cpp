// Incremental decoding (model/generate.h) against the training forward, in float64: for a dense,
// a MoE (with an MTP depth, which generation ignores) and a hybrid model (M * - E layers, an SSD
// chunk of 4 so that the prompt and the generation cross several chunks), the cached logits of
// every position equal the full forward's to 1e-10, whether the sequence is fed as a prompt and
// single tokens or cut into uneven pieces; greedy generation equals the argmax of repeated full
// forwards; seeded sampling is reproducible and depends on the seed; top-k 1 is greedy; and the
// sampling filters apply temperature, then top-k, then top-p; in bf16 the cached logits stay
// within bf16 rounding of the full forward's. The reference forward here is
// built independently of InferenceModel: its own FullParams, layer_handles and decoder_layer.
//
// Also the checkpoint config round trip (train/config_json.h): train_config_to_json's "model"
// part read back gives the same config for a dense, a MoE and a hybrid model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "support/tiny_config.h"
#include "weft/core/compat.h"
#include "weft/core/error.h"
#include "weft/model/full_params.h"
#include "weft/model/generate.h"
#include "weft/model/hybrid.h"
#include "weft/model/moe.h"
#include "weft/model/transformer.h"
#include "weft/train/config_json.h"
#include "weft/train/trainer.h"

namespace weft {
namespace {

constexpr uint64_t kSeed = 11;

ModelConfig dense_config() { return test::tiny_model(3); }

// Qwen3-like: query/key norms before RoPE (--qk-layernorm), heads wider than hidden / heads.
ModelConfig qk_config() {
  ModelConfig c = dense_config();
  c.qk_layernorm = true;
  c.kv_channels = 2 * c.head_dim();
  return c;
}

// --rotary-percent 0.5: half of each head rotates (the tables are half as wide).
ModelConfig partial_rotary_config() {
  ModelConfig c = dense_config();
  c.rotary_percent = 0.5;
  return c;
}

// DeepSeek-like multi-latent attention: a query latent, the latent norms, YaRN with mscales
// (tables and softmax scale), values narrower than queries, an MoE layer and MTP.
ModelConfig mla_config() {
  ModelConfig c = dense_config();
  c.multi_latent_attention = true;
  c.q_lora_rank = 12;
  c.kv_lora_rank = 10;
  c.qk_head_dim = 6;
  c.qk_pos_emb_head_dim = 8;
  c.v_head_dim = 4;
  c.qk_layernorm = true;
  c.rotary_scaling_factor = 40;
  c.mscale = 0.9;
  c.mscale_all_dim = 0.5;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 24;
  c.moe_layer_pattern = {0, 1, 1};
  c.mtp_num_layers = 1;
  return c;
}

ModelConfig moe_config() {
  ModelConfig c = dense_config();
  c.untie_embeddings_and_output_weights = true;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 24;
  c.moe_shared_expert_intermediate_size = 16;
  c.moe_layer_pattern = {0, 1, 1};
  c.mtp_num_layers = 1;
  return c;
}

ModelConfig hybrid_config() {
  ModelConfig c = dense_config();
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.mamba_state_dim = 8;
  c.mamba_head_dim = 8;
  c.mamba_num_groups = 2;
  c.mamba_chunk_size = 4;
  apply_hybrid_layer_pattern("M*-EM*", &c);
  return c;
}

// A Nemotron 3 shaped hybrid: squared-ReLU MLP and experts, attention without positions, a
// sigmoid router with a scaling factor and expert biases (non-zero below, so that they choose).
ModelConfig nemotron_config() {
  ModelConfig c = hybrid_config();
  c.squared_relu = true;
  c.position_embedding_type = "none";
  c.moe_router_score_function = "sigmoid";
  c.moe_router_topk_scaling_factor = 2.5;
  c.moe_router_enable_expert_bias = true;
  c.moe_shared_expert_intermediate_size = 16;
  return c;
}

at::Tensor init_value(const ParamSpec& s, const ModelConfig& cfg) {
  if (s.name.size() > 11 && s.name.compare(s.name.size() - 11, 11, "expert_bias") == 0)
    return torch::linspace(0.3, -0.3, s.shape[0], torch::kDouble);  // a trained-looking bias
  return init_param(s, cfg, kSeed).to(torch::kDouble);
}

std::unique_ptr<InferenceModel> make_model(const ModelConfig& cfg) {
  return std::make_unique<InferenceModel>(
      cfg, [&](const ParamSpec& s) { return init_value(s, cfg); }, torch::kCPU, torch::kDouble);
}

// The training forward, built on its own: every decoder layer through decoder_layer.
struct Reference {
  ModelConfig cfg;
  FullParams params;
  std::vector<std::unique_ptr<LocalExperts>> experts;
  std::vector<std::unique_ptr<RouterBias>> biases;
  std::vector<LayerHandles> layers;
  ParamHandle emb, norm, out;

  explicit Reference(const ModelConfig& c) : cfg(c) {
    auto add = [&](const ParamSpec& s) { return params.add(s, init_value(s, cfg)); };
    emb = add(embedding_param_spec(cfg));
    for (int l = 0; l < cfg.num_layers; ++l) {
      const auto specs = layer_param_specs(cfg, l);
      const int first = params.size();
      for (const auto& s : specs) add(s);
      LocalExperts* ex = nullptr;
      if (cfg.is_moe_layer(l)) {
        std::vector<ParamHandle> fc1, fc2;
        for (const auto& s : expert_param_specs(cfg, layer_prefix(l), 0, cfg.num_experts))
          (s.name.find("linear_fc1") != std::string::npos ? fc1 : fc2).push_back(add(s));
        experts.push_back(std::make_unique<LocalExperts>(fc1, fc2, cfg.expert_mlp()));
        ex = experts.back().get();
      }
      layers.push_back(layer_handles(&params, first, specs, layer_prefix(l), ex));
      if (cfg.is_moe_layer(l) && cfg.moe_router_enable_expert_bias) {
        const ParamSpec b{router_bias_name(layer_prefix(l)), {cfg.num_experts}, InitKind::kZeros,
                          false};
        biases.push_back(
            std::make_unique<RouterBias>(make_router_bias(init_value(b, cfg).to(torch::kFloat))));
        layers.back().router_bias = biases.back().get();
      }
    }
    norm = add(final_norm_param_spec(cfg));
    out = cfg.tied() ? emb : add(output_param_spec(cfg));
  }

  torch::Tensor logits(const torch::Tensor& tokens) {
    torch::NoGradGuard no_grad;
    ModelConfig c = cfg;
    c.seq_length = std::max<int>(c.seq_length, static_cast<int>(tokens.size(1)));
    const RotaryTables rope = make_rotary_tables(c, torch::kCPU, torch::kDouble);
    torch::Tensor x = embed_tokens(tokens, emb);
    for (const auto& w : layers) x = decoder_layer(x, w, rope, cfg);
    return output_logits(final_norm(x, norm, cfg), out);
  }
};

double rel_err(const torch::Tensor& got, const torch::Tensor& want) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-30);
  return (got - want).abs().max().item<double>() / scale;
}

torch::Tensor random_tokens(int64_t b, int64_t s, int64_t vocab, uint64_t seed) {
  at::Generator g = compat::make_cpu_generator(seed);
  return torch::randint(vocab, {b, s}, g, torch::kLong);
}

// Feeds `tokens` [b, L] to a fresh DecodeState in pieces of the given lengths and returns the
// logits of every position [b, L, V].
torch::Tensor cached_logits(const InferenceModel& m, const torch::Tensor& tokens,
                            const std::vector<int64_t>& pieces) {
  DecodeState state(m, tokens.size(0), tokens.size(1));
  std::vector<torch::Tensor> outs;
  int64_t pos = 0;
  for (int64_t n : pieces) {
    outs.push_back(state.forward(tokens.narrow(1, pos, n)));
    pos += n;
  }
  EXPECT_EQ(pos, tokens.size(1));
  EXPECT_EQ(state.length(), pos);
  return torch::cat(outs, 1);
}

struct Case {
  const char* name;
  ModelConfig (*config)();
};
const Case kCases[] = {{"dense", dense_config},
                       {"qk-layernorm", qk_config},
                       {"partial-rotary", partial_rotary_config},
                       {"moe", moe_config},
                       {"mla", mla_config},
                       {"hybrid", hybrid_config},
                       {"nemotron", nemotron_config}};

TEST(Generate, CachedLogitsEqualFullForwardAtEveryPosition) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const ModelConfig cfg = c.config();
    auto model = make_model(cfg);
    Reference ref(cfg);
    const int64_t L = cfg.seq_length;
    const torch::Tensor tokens = random_tokens(2, L, cfg.vocab_size, 3);
    const torch::Tensor want = ref.logits(tokens);
    EXPECT_LT(rel_err(model->full_logits(tokens), want), 1e-12);
    // A prompt of 6 in one forward, then one token per step.
    std::vector<int64_t> steps = {6};
    for (int64_t t = 6; t < L; ++t) steps.push_back(1);
    const double e1 = rel_err(cached_logits(*model, tokens, steps), want);
    EXPECT_LT(e1, 1e-10);
    // Uneven pieces: several tokens at a time after the first call, too.
    const double e2 = rel_err(cached_logits(*model, tokens, {5, 4, 1, 3, 3}), want);
    EXPECT_LT(e2, 1e-10);
    std::printf("%s: cached vs full forward rel err %.2e (prompt + steps), %.2e (pieces)\n",
                c.name, e1, e2);
  }
}

// The expert biases change the routing: the Nemotron model's logits without them differ.
TEST(Generate, ExpertBiasesRoute) {
  const ModelConfig cfg = nemotron_config();
  ModelConfig unbiased = cfg;
  unbiased.moe_router_enable_expert_bias = false;
  const torch::Tensor tokens = random_tokens(2, cfg.seq_length, cfg.vocab_size, 3);
  EXPECT_GT(rel_err(make_model(unbiased)->full_logits(tokens), make_model(cfg)->full_logits(tokens)),
            1e-6);
}

TEST(Generate, PastSeqLengthMatchesFullForward) {
  const ModelConfig cfg = hybrid_config();
  auto model = make_model(cfg);
  Reference ref(cfg);
  const int64_t L = cfg.seq_length + 7;  // rotary rows past the training length
  const torch::Tensor tokens = random_tokens(1, L, cfg.vocab_size, 4);
  std::vector<int64_t> steps = {9};
  for (int64_t t = 9; t < L; ++t) steps.push_back(1);
  EXPECT_LT(rel_err(cached_logits(*model, tokens, steps), ref.logits(tokens)), 1e-10);
}

// bf16 models compute in bf16 as training does (the SSD state in float32): the cached path
// rounds differently from the full forward, by about bf16's resolution, not more.
TEST(Generate, Bf16CachedLogitsCloseToFullForward) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const ModelConfig cfg = c.config();
    InferenceModel m(cfg, [&](const ParamSpec& s) { return init_value(s, cfg); }, torch::kCPU,
                     torch::kBFloat16);
    const torch::Tensor tokens = random_tokens(1, cfg.seq_length, cfg.vocab_size, 5);
    std::vector<int64_t> steps = {6};
    for (int64_t t = 6; t < cfg.seq_length; ++t) steps.push_back(1);
    const double e = rel_err(cached_logits(m, tokens, steps).to(torch::kDouble),
                             m.full_logits(tokens).to(torch::kDouble));
    EXPECT_LT(e, 3e-2);
    std::printf("%s bf16: cached vs full forward rel err %.2e\n", c.name, e);
  }
}

TEST(Generate, GreedyEqualsArgmaxOfRepeatedFullForwards) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const ModelConfig cfg = c.config();
    auto model = make_model(cfg);
    Reference ref(cfg);
    const std::vector<int64_t> prompt = {5, 17, 3, 42};
    GenerateOptions opt;
    opt.max_new_tokens = 10;
    opt.sampling.temperature = 0;
    const GenerateResult got = generate(*model, prompt, opt);
    std::vector<int64_t> seq = prompt, want;
    for (int i = 0; i < 10; ++i) {
      const torch::Tensor l = ref.logits(torch::tensor(seq, torch::kLong).view({1, -1}));
      want.push_back(l[0][-1].argmax().item<int64_t>());
      seq.push_back(want.back());
    }
    EXPECT_EQ(got.tokens, want);
  }
}

TEST(Generate, SeededSamplingIsReproducibleAndTopK1IsGreedy) {
  const ModelConfig cfg = hybrid_config();
  auto model = make_model(cfg);
  const std::vector<int64_t> prompt = {1, 2, 3};
  GenerateOptions opt;
  opt.max_new_tokens = 12;
  opt.sampling.temperature = 1.5;
  opt.sampling.top_p = 0.95;
  opt.seed = 1;
  const auto a = generate(*model, prompt, opt).tokens;
  const auto b = generate(*model, prompt, opt).tokens;
  EXPECT_EQ(a, b);
  opt.seed = 2;
  EXPECT_NE(generate(*model, prompt, opt).tokens, a);

  GenerateOptions greedy = opt;
  greedy.sampling = SamplingOptions{0.0, 0, 1.0};
  GenerateOptions top1 = opt;
  top1.sampling.top_k = 1;
  EXPECT_EQ(generate(*model, prompt, top1).tokens, generate(*model, prompt, greedy).tokens);
}

TEST(Generate, StopTokenEndsGeneration) {
  const ModelConfig cfg = dense_config();
  auto model = make_model(cfg);
  GenerateOptions opt;
  opt.max_new_tokens = 8;
  opt.sampling.temperature = 0;
  const auto all = generate(*model, {4, 5}, opt).tokens;
  ASSERT_EQ(all.size(), 8u);
  opt.stop_token = all[2];
  const auto cut = generate(*model, {4, 5}, opt).tokens;
  const auto first = std::find(all.begin(), all.end(), all[2]) - all.begin();
  EXPECT_EQ(cut, std::vector<int64_t>(all.begin(), all.begin() + first + 1));
}

// Which ids a setting can draw, over many seeds.
std::set<int64_t> drawn(const torch::Tensor& logits, const SamplingOptions& o) {
  std::set<int64_t> ids;
  for (uint64_t s = 0; s < 300; ++s) {
    at::Generator g = compat::make_cpu_generator(s);
    ids.insert(sample_token(logits, o, g));
  }
  return ids;
}

TEST(Sampling, TemperatureThenTopKThenTopP) {
  // softmax([0, 1, 2, 3]) = [0.032, 0.087, 0.237, 0.644]
  const torch::Tensor l = torch::tensor({0.0, 1.0, 2.0, 3.0});
  EXPECT_EQ(drawn(l, {1.0, 0, 1.0}), (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(drawn(l, {1.0, 2, 1.0}), (std::set<int64_t>{2, 3}));
  EXPECT_EQ(drawn(l, {1.0, 0, 0.6}), (std::set<int64_t>{3}));
  EXPECT_EQ(drawn(l, {1.0, 0, 0.8}), (std::set<int64_t>{2, 3}));
  // Temperature first: at T = 0.5 the top token alone holds 0.865 >= 0.8.
  EXPECT_EQ(drawn(l, {0.5, 0, 0.8}), (std::set<int64_t>{3}));
  // Top-p renormalises after top-k: of {2, 3}, 3 holds 0.731 < 0.75.
  EXPECT_EQ(drawn(l, {1.0, 2, 0.75}), (std::set<int64_t>{2, 3}));
  EXPECT_EQ(drawn(l, {1.0, 2, 0.7}), (std::set<int64_t>{3}));
  // A vocabulary limit comes before everything (padding ids are never drawn).
  EXPECT_EQ(drawn(l, {1.0, 0, 1.0, 2}), (std::set<int64_t>{0, 1}));
  EXPECT_EQ(drawn(l, {0.0, 0, 1.0, 3}), (std::set<int64_t>{2}));
  // Greedy: argmax, ties to the lower id.
  at::Generator g = compat::make_cpu_generator(0);
  EXPECT_EQ(sample_token(torch::tensor({1.0, 5.0, 5.0, 2.0}), {0.0, 0, 1.0}, g), 1);
  EXPECT_THROW(check_sampling_options({-1.0, 0, 1.0}), UsageError);
  EXPECT_THROW(check_sampling_options({1.0, -2, 1.0}), UsageError);
  EXPECT_THROW(check_sampling_options({1.0, 0, -0.1}), UsageError);
  EXPECT_THROW(check_sampling_options({1.0, 0, 1.5}), UsageError);
  // top-p 0 is Megatron's "off" (--top_p 0.0, its default): every token, as top-p 1.
  EXPECT_EQ(drawn(l, {1.0, 0, 0.0}), (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(drawn(l, {1.0, 2, 0.0}), (std::set<int64_t>{2, 3}));
}

TEST(Generate, MissingOrMisshapenWeightIsNamed) {
  const ModelConfig cfg = dense_config();
  auto missing = [&](const ParamSpec& s) {
    return s.name == "decoder.layers.1.mlp.linear_fc2.weight" ? at::Tensor() : init_value(s, cfg);
  };
  try {
    InferenceModel m(cfg, missing, torch::kCPU, torch::kDouble);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("decoder.layers.1.mlp.linear_fc2.weight"),
              std::string::npos) << e.what();
  }
  auto wrong = [&](const ParamSpec& s) {
    return s.name == "decoder.final_layernorm.weight" ? torch::ones({7}) : init_value(s, cfg);
  };
  EXPECT_THROW(InferenceModel(cfg, wrong, torch::kCPU, torch::kDouble), UsageError);
}

// --- the checkpoint config round trip ---------------------------------------------------------

void expect_round_trip(const ModelConfig& m) {
  TrainConfig t;
  t.model = m;
  const nlohmann::json j = train_config_to_json(t)["model"];
  const ModelConfig r = model_config_from_json(j);
  t.model = r;
  EXPECT_EQ(train_config_to_json(t)["model"], j);
  // The fields that rebuild the model: the same parameters, names and shapes.
  const auto a = all_param_specs(m), b = all_param_specs(r);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].shape, b[i].shape);
  }
  for (int l = 0; l < m.num_layers; ++l) {
    EXPECT_EQ(m.layer_symbol(l), r.layer_symbol(l));
    EXPECT_EQ(m.is_moe_layer(l), r.is_moe_layer(l));
  }
  EXPECT_EQ(m.tied(), r.tied());
  EXPECT_EQ(m.rotary_base, r.rotary_base);
  EXPECT_EQ(m.rotary_percent, r.rotary_percent);
  EXPECT_EQ(m.norm_epsilon, r.norm_epsilon);
  EXPECT_EQ(m.bf16, r.bf16);
  EXPECT_EQ(m.moe_router_topk, r.moe_router_topk);
  EXPECT_EQ(m.moe_router_score_function, r.moe_router_score_function);
  EXPECT_EQ(m.expert_ffn(), r.expert_ffn());
  EXPECT_EQ(m.mamba_heads(), r.mamba_heads());
  EXPECT_EQ(m.mtp_num_layers, r.mtp_num_layers);
  EXPECT_EQ(m.squared_relu, r.squared_relu);
  EXPECT_EQ(m.moe_router_enable_expert_bias, r.moe_router_enable_expert_bias);
  EXPECT_EQ(m.moe_router_bias_update_rate, r.moe_router_bias_update_rate);
  EXPECT_EQ(m.moe_router_dtype, r.moe_router_dtype);
  EXPECT_EQ(m.moe_router_load_balancing_type, r.moe_router_load_balancing_type);
  EXPECT_EQ(m.position_embedding_type, r.position_embedding_type);
}

TEST(ConfigJson, RoundTripDenseMoeHybrid) {
  ModelConfig dense = dense_config();
  dense.rotary_base = 500000;
  dense.rotary_percent = 0.5;
  dense.norm_epsilon = 1e-6;
  dense.bf16 = true;
  expect_round_trip(dense);
  ModelConfig moe = moe_config();
  moe.moe_router_score_function = "sigmoid";
  expect_round_trip(moe);
  ModelConfig hyb = hybrid_config();
  hyb.mamba_chunk_size = 128;  // not in the JSON (weft train's fixed chunk)
  apply_hybrid_layer_pattern("M*E|-ME/*E", &hyb);
  expect_round_trip(hyb);
  ModelConfig nemo = nemotron_config();
  nemo.mamba_chunk_size = 128;
  nemo.moe_router_bias_update_rate = 0.01;
  nemo.moe_router_dtype = "fp32";
  nemo.moe_router_load_balancing_type = "seq_aux_loss";
  expect_round_trip(nemo);
  // MLA: its sizes and YaRN settings (keys written only for MLA models); the rope type as
  // resolved (unset: yarn).
  ModelConfig mla = mla_config();
  expect_round_trip(mla);
  TrainConfig t;
  t.model = mla;
  const ModelConfig back = model_config_from_json(train_config_to_json(t)["model"]);
  EXPECT_TRUE(back.mla() && back.yarn());
  EXPECT_EQ(back.q_lora_rank, 12);
  EXPECT_EQ(back.v_head_dim, 4);
  EXPECT_EQ(back.mscale_all_dim, 0.5);
  EXPECT_EQ(make_rotary_tables(back, torch::kCPU, torch::kDouble).cos.size(1), 8);
  t.model = dense_config();
  EXPECT_FALSE(train_config_to_json(t)["model"].contains("multi_latent_attention"));
}

TEST(ConfigJson, MissingKeyIsNamed) {
  TrainConfig t;
  t.model = dense_config();
  nlohmann::json j = train_config_to_json(t)["model"];
  j.erase("hidden_size");
  try {
    model_config_from_json(j);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("model.hidden_size"), std::string::npos) << e.what();
  }
  j = train_config_to_json(t)["model"];
  j["num_layers"] = "four";
  EXPECT_THROW(model_config_from_json(j), UsageError);
}

}  // namespace
}  // namespace weft
