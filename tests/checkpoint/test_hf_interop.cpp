// Hugging Face export/import (docs/hf-interop.md) and `--finetune`, on 4 ranks.
//
// Checks, each against values or computations written here rather than the exporter's own:
// weights survive export -> import bitwise for checkpoints saved on 1 rank and on pp2 x dp2;
// export -> import -> export gives byte-identical files; config.json and the safetensors header
// field by field against literals; the QKV and gate/up splits against slicing by the documented
// interleave; a sharded export holds the same tensors; `--finetune` from the import gives the
// same iteration-1 loss on pp2 x dp2 as on 1 rank and as from the original checkpoint; every
// refused input names its key or tensor and leaves nothing at OUT.
#include <gtest/gtest.h>
#include <mpi.h>

#include <ATen/Functions.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/job.h"
#include "support/tiny_config.h"
#include "weft/checkpoint/full_read.h"
#include "weft/checkpoint/hf_config.h"
#include "weft/checkpoint/hf_deepseek_v3.h"
#include "weft/checkpoint/hf_export.h"
#include "weft/checkpoint/hf_import.h"
#include "weft/checkpoint/safetensors.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"
#include "weft/model/hybrid.h"
#include "weft/model/transformer.h"
#include "weft/train/config_json.h"
#include "weft/train/hf_convert.h"

namespace weft {
namespace {

namespace fs = std::filesystem;
using test::run_job;

// The tiny model on 4 layers: hidden 32, 4 heads in 2 query groups (r = 2, hd = 8), ffn 48,
// vocab 64, seq 16; micro-batch 1, on the CPU whatever WEFT_TEST_DEVICE says.
TrainConfig tiny(bool untied = false) {
  TrainConfig c =
      test::tiny_config({.num_layers = 4, .global_batch_size = 4, .train_iters = 2, .seed = 5});
  c.model.untie_embeddings_and_output_weights = untied;
  c.micro_batch_size = 1;
  c.device = "cpu";
  return c;
}

TrainConfig pp2dp2(TrainConfig c) {
  c.layout.pp = 2;
  return c;
}

bool rank0() { return test::world_rank() == 0; }
void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

std::map<std::string, at::Tensor> weights_of(const std::string& ckpt) {
  std::string iter;
  EXPECT_TRUE(ckpt_resolve_iter_dir(ckpt, -1, &iter).is_ok()) << ckpt;
  FullCheckpoint fc;
  Status s = ckpt_read_full_weights(iter, &fc);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return fc.weights;
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(file_bytes(path)); }

// The safetensors header of `path` as raw JSON (8-byte little-endian length, then JSON).
nlohmann::json raw_header(const std::string& path) {
  const std::string b = file_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  return nlohmann::json::parse(b.substr(8, n));
}

at::Tensor hf_tensor(const std::string& file, const std::string& name) {
  SafetensorsHeader h;
  EXPECT_TRUE(safetensors_read_header(file, &h).is_ok());
  const SafetensorsEntry& e = h.entries.at(name);
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype == "BF16" ? at::kBFloat16
                                                                                  : at::kFloat));
  EXPECT_TRUE(safetensors_read_entry(file, h, name, t.data_ptr(), e.end - e.begin).is_ok());
  return t;
}

void expect_same_weights(const std::map<std::string, at::Tensor>& a,
                         const std::map<std::string, at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, t] : a) {
    ASSERT_TRUE(b.count(k)) << k;
    EXPECT_TRUE(at::equal(t.to(at::kFloat), b.at(k).to(at::kFloat))) << k;
  }
}

// Every file of two directories byte-identical.
void expect_same_files(const std::string& a, const std::string& b) {
  std::set<std::string> na, nb;
  for (const auto& e : fs::directory_iterator(a)) na.insert(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(b)) nb.insert(e.path().filename().string());
  EXPECT_EQ(na, nb);
  for (const std::string& n : na)
    EXPECT_TRUE(file_bytes(a + "/" + n) == file_bytes(b + "/" + n)) << n << " differs";
}

// The tiny model trained 2 iterations on `layout`, saved to a fresh directory.
std::string trained(const TrainConfig& cfg, int world, const std::string& tag) {
  TrainConfig c = cfg;
  c.save = test::shared_temp_dir(tag);
  run_job(c, world);
  return c.save;
}

TEST(HfInterop, RoundTripBitwiseOnOneRankAndPp2Dp2) {
  struct Case {
    TrainConfig cfg;
    int world;
  };
  for (const Case& k : {Case{tiny(false), 1}, Case{pp2dp2(tiny(true)), 4}}) {
    SCOPED_TRACE(k.world);
    const std::string ck = trained(k.cfg, k.world, "hfrt");
    if (rank0()) [&] {
      hf_export_checkpoint(ck, ck + "/ex", {});
      hf_import_checkpoint(ck + "/ex", ck + "/im");
      expect_same_weights(weights_of(ck), weights_of(ck + "/im"));
      hf_export_checkpoint(ck + "/im", ck + "/ex2", {});
      expect_same_files(ck + "/ex", ck + "/ex2");
      EXPECT_EQ(read_json(ck + "/ex/config.json")["tie_word_embeddings"], k.world == 1);
    }();
    barrier();
  }
}

TEST(HfInterop, ConfigAndHeaderFieldByField) {
  const std::string ck = trained(tiny(), 1, "hfcfg");
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    const nlohmann::json c = read_json(ck + "/ex/config.json");
    EXPECT_EQ(c["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(c["model_type"], "llama");
    EXPECT_EQ(c["hidden_size"], 32);
    EXPECT_EQ(c["intermediate_size"], 48);
    EXPECT_EQ(c["num_hidden_layers"], 4);
    EXPECT_EQ(c["num_attention_heads"], 4);
    EXPECT_EQ(c["num_key_value_heads"], 2);
    EXPECT_EQ(c["head_dim"], 8);
    EXPECT_EQ(c["rms_norm_eps"], 1e-5);
    EXPECT_EQ(c["rope_theta"], 10000.0);
    EXPECT_EQ(c["rope_parameters"], nlohmann::json({{"rope_type", "default"}, {"rope_theta", 10000.0}}));
    EXPECT_TRUE(c["rope_scaling"].is_null());
    EXPECT_EQ(c["vocab_size"], 64);
    EXPECT_EQ(c["max_position_embeddings"], 16);
    EXPECT_EQ(c["tie_word_embeddings"], true);
    EXPECT_EQ(c["torch_dtype"], "float32");
    EXPECT_EQ(c["hidden_act"], "silu");
    EXPECT_EQ(c["attention_bias"], false);
    EXPECT_EQ(c["mlp_bias"], false);
    EXPECT_EQ(c["initializer_range"], 0.02);
    EXPECT_FALSE(c.contains("bos_token_id"));  // mock data: no tokenizer identity

    const std::string file = ck + "/ex/model.safetensors";
    const nlohmann::json h = raw_header(file);
    EXPECT_EQ(h["__metadata__"], nlohmann::json({{"format", "pt"}}));
    EXPECT_EQ(h.size(), 1u + 1 + 4 * 9 + 1);  // metadata, embedding, 4 layers of 9, final norm
    EXPECT_FALSE(h.contains("lm_head.weight"));
    const std::map<std::string, std::vector<int64_t>> shapes = {
        {"model.embed_tokens.weight", {64, 32}},
        {"model.layers.3.input_layernorm.weight", {32}},
        {"model.layers.3.self_attn.q_proj.weight", {32, 32}},
        {"model.layers.3.self_attn.k_proj.weight", {16, 32}},
        {"model.layers.3.self_attn.v_proj.weight", {16, 32}},
        {"model.layers.3.self_attn.o_proj.weight", {32, 32}},
        {"model.layers.3.post_attention_layernorm.weight", {32}},
        {"model.layers.3.mlp.gate_proj.weight", {48, 32}},
        {"model.layers.3.mlp.up_proj.weight", {48, 32}},
        {"model.layers.3.mlp.down_proj.weight", {32, 48}},
        {"model.norm.weight", {32}}};
    for (const auto& [name, shape] : shapes) {
      ASSERT_TRUE(h.contains(name)) << name;
      EXPECT_EQ(h[name]["dtype"], "F32") << name;
      EXPECT_EQ(h[name]["shape"].get<std::vector<int64_t>>(), shape) << name;
    }
    // Offsets tile the data region back to back.
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (const auto& [name, e] : h.items())
      if (name != "__metadata__") spans.push_back(e["data_offsets"].get<std::pair<int64_t, int64_t>>());
    std::sort(spans.begin(), spans.end());
    int64_t at = 0;
    for (auto [b, e] : spans) {
      EXPECT_EQ(b, at);
      at = e;
    }
    uint64_t n = 0;
    std::memcpy(&n, file_bytes(file).data(), 8);
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(file) - 8 - n), at);

    // bf16: the fp32 master rounded.
    HfExportOptions bf;
    bf.dtype = "bf16";
    hf_export_checkpoint(ck, ck + "/exbf", bf);
    EXPECT_EQ(read_json(ck + "/exbf/config.json")["torch_dtype"], "bfloat16");
    const nlohmann::json hb = raw_header(ck + "/exbf/model.safetensors");
    EXPECT_EQ(hb["model.norm.weight"]["dtype"], "BF16");
    const auto w = weights_of(ck);
    EXPECT_TRUE(at::equal(hf_tensor(ck + "/exbf/model.safetensors", "model.embed_tokens.weight"),
                          w.at("embedding.word_embeddings.weight").to(at::kBFloat16)));
  }();
  barrier();
}

// The model config a checkpoint's metadata.json records.
ModelConfig model_of(const std::string& ckpt) {
  std::string iter;
  EXPECT_TRUE(ckpt_resolve_iter_dir(ckpt, -1, &iter).is_ok()) << ckpt;
  return model_config_from_json(read_json(iter + "/metadata.json")["config"]["model"]);
}

// Llama 3.x RoPE scaling (--use-rope-scaling) goes out as rope_type llama3 in both of
// transformers' keys and comes back from either.
TEST(HfInterop, Llama3RopeScalingBothWays) {
  TrainConfig cfg = tiny();
  cfg.model.rotary_base = 500000;
  cfg.model.use_rope_scaling = true;
  cfg.model.rope_scaling_factor = 32;
  const std::string ck = trained(cfg, 1, "hfrope");
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    const nlohmann::json c = read_json(ck + "/ex/config.json");
    const nlohmann::json scaling = {{"rope_type", "llama3"},
                                    {"factor", 32.0},
                                    {"low_freq_factor", 1.0},
                                    {"high_freq_factor", 4.0},
                                    {"original_max_position_embeddings", 8192}};
    EXPECT_EQ(c["rope_scaling"], scaling);
    EXPECT_TRUE(c["rope_scaling"]["original_max_position_embeddings"].is_number_integer());
    nlohmann::json params = scaling;
    params["rope_theta"] = 500000.0;
    EXPECT_EQ(c["rope_parameters"], params);
    EXPECT_EQ(c["rope_theta"], 500000.0);

    hf_import_checkpoint(ck + "/ex", ck + "/im");
    const ModelConfig m = model_of(ck + "/im");
    EXPECT_TRUE(m.use_rope_scaling);
    EXPECT_EQ(m.rope_scaling_factor, 32.0);
    EXPECT_EQ(m.rotary_base, 500000.0);
    expect_same_weights(weights_of(ck), weights_of(ck + "/im"));

    // A Mistral config of the same model (no sliding window) imports as the same model.
    nlohmann::json mistral = c;
    mistral["model_type"] = "mistral";
    mistral["architectures"] = {"MistralForCausalLM"};
    mistral["sliding_window"] = nullptr;
    const ModelConfig mm = hf_model_config_from_json(mistral);
    EXPECT_FALSE(mm.moe());
    EXPECT_TRUE(model_mismatches(mm, m).empty());
    EXPECT_EQ(mm.num_layers, m.num_layers);
    mistral["sliding_window"] = 4096;
    EXPECT_THROW(hf_model_config_from_json(mistral), UsageError);
    mistral.erase("sliding_window");  // transformers' Mistral default: a window of 4096
    EXPECT_THROW(hf_model_config_from_json(mistral), UsageError);

    // transformers 4's form alone: rope_theta and rope_scaling (with the older "type" key).
    nlohmann::json v4 = c;
    v4.erase("rope_parameters");
    v4["rope_scaling"] = {{"type", "llama3"}, {"factor", 8}, {"low_freq_factor", 1},
                          {"high_freq_factor", 4}, {"original_max_position_embeddings", 8192}};
    EXPECT_TRUE(hf_model_config_from_json(v4).use_rope_scaling);
    EXPECT_EQ(hf_model_config_from_json(v4).rope_scaling_factor, 8.0);
    v4["rope_scaling"] = nullptr;
    EXPECT_FALSE(hf_model_config_from_json(v4).use_rope_scaling);
  }();
  barrier();
}

// Linear position interpolation (--rotary-seq-len-interpolation-factor) goes out as rope_type
// linear in both of transformers' keys and comes back from either; a fractional factor, one
// together with llama3 scaling and a disagreement between the keys are refused.
TEST(HfInterop, LinearRopeInterpolationBothWays) {
  TrainConfig cfg = tiny();
  cfg.model.rotary_seq_len_interpolation_factor = 4;
  const std::string ck = trained(cfg, 1, "hflinear");
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    const nlohmann::json c = read_json(ck + "/ex/config.json");
    const nlohmann::json scaling = {{"rope_type", "linear"}, {"factor", 4.0}};
    EXPECT_EQ(c["rope_scaling"], scaling);
    nlohmann::json params = scaling;
    params["rope_theta"] = 10000.0;
    EXPECT_EQ(c["rope_parameters"], params);

    hf_import_checkpoint(ck + "/ex", ck + "/im");
    const ModelConfig m = model_of(ck + "/im");
    EXPECT_EQ(m.rotary_seq_len_interpolation_factor, 4);
    EXPECT_FALSE(m.use_rope_scaling);
    expect_same_weights(weights_of(ck), weights_of(ck + "/im"));

    auto refuses = [](auto fn, const std::string& needle) {
      try {
        fn();
        ADD_FAILURE() << "not refused; expected a message naming " << needle;
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    };
    nlohmann::json v4 = c;  // transformers 4's form, the older "type" key
    v4.erase("rope_parameters");
    v4["rope_scaling"] = {{"type", "linear"}, {"factor", 2}};
    EXPECT_EQ(hf_model_config_from_json(v4).rotary_seq_len_interpolation_factor, 2);
    v4["rope_scaling"]["factor"] = 1.0;  // no interpolation
    EXPECT_EQ(hf_model_config_from_json(v4).rotary_seq_len_interpolation_factor, 0);
    nlohmann::json one = v4;  // ... so the default RoPE in the other key agrees with it
    one["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
    EXPECT_EQ(hf_model_config_from_json(one).rotary_seq_len_interpolation_factor, 0);
    v4["rope_scaling"]["factor"] = 2.5;
    refuses([&] { hf_model_config_from_json(v4); }, "rope_scaling.factor is 2.5");
    v4["rope_scaling"] = {{"type", "linear"}};
    refuses([&] { hf_model_config_from_json(v4); }, "rope_scaling.factor is missing");
    nlohmann::json both = c;
    both["rope_scaling"]["factor"] = 2.0;  // rope_parameters says 4
    refuses([&] { hf_model_config_from_json(both); }, "describe different RoPE scalings");

    ModelConfig with_llama3 = m;
    with_llama3.use_rope_scaling = true;
    refuses([&] { hf_model_type(with_llama3); }, "one rope_type");
  }();
  barrier();
}

// A head dim other than hidden / heads (--kv-channels; transformers' head_dim): 4 heads of 16 at
// hidden 32, so q_proj is [64, 32] and o_proj [32, 64]; out and back bitwise, on pp2 x dp2.
TEST(HfInterop, KvChannelsRoundTrip) {
  TrainConfig cfg = pp2dp2(tiny());
  cfg.model.kv_channels = 16;
  const std::string ck = trained(cfg, 4, "hfkv");
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    const nlohmann::json c = read_json(ck + "/ex/config.json");
    EXPECT_EQ(c["head_dim"], 16);
    EXPECT_EQ(c["hidden_size"], 32);
    const nlohmann::json h = raw_header(ck + "/ex/model.safetensors");
    EXPECT_EQ(h["model.layers.0.self_attn.q_proj.weight"]["shape"], nlohmann::json({64, 32}));
    EXPECT_EQ(h["model.layers.0.self_attn.k_proj.weight"]["shape"], nlohmann::json({32, 32}));
    EXPECT_EQ(h["model.layers.0.self_attn.o_proj.weight"]["shape"], nlohmann::json({32, 64}));
    hf_import_checkpoint(ck + "/ex", ck + "/im");
    EXPECT_EQ(model_of(ck + "/im").head_dim(), 16);
    expect_same_weights(weights_of(ck), weights_of(ck + "/im"));
  }();
  barrier();
}

// --qk-layernorm goes out as Qwen3 (q_norm, k_norm over the head dim) and back, bitwise; a
// Qwen3 config with a sliding window in use is refused, one with it off is not.
TEST(HfInterop, Qwen3RoundTrip) {
  TrainConfig cfg = pp2dp2(tiny());
  cfg.model.qk_layernorm = true;
  cfg.model.kv_channels = 16;
  const std::string ck = trained(cfg, 4, "hfqwen3");
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    nlohmann::json c = read_json(ck + "/ex/config.json");
    EXPECT_EQ(c["model_type"], "qwen3");
    EXPECT_EQ(c["architectures"], nlohmann::json::array({"Qwen3ForCausalLM"}));
    EXPECT_EQ(c["head_dim"], 16);
    EXPECT_EQ(c["use_sliding_window"], false);
    const nlohmann::json h = raw_header(ck + "/ex/model.safetensors");
    EXPECT_EQ(h["model.layers.2.self_attn.q_norm.weight"]["shape"], nlohmann::json({16}));
    EXPECT_EQ(h["model.layers.2.self_attn.k_norm.weight"]["shape"], nlohmann::json({16}));
    EXPECT_EQ(h.size(), 1u + 1 + 4 * 11 + 1);  // metadata, embedding, 4 layers of 11, norm
    hf_import_checkpoint(ck + "/ex", ck + "/im");
    const ModelConfig m = model_of(ck + "/im");
    EXPECT_TRUE(m.qk_layernorm);
    EXPECT_EQ(m.head_dim(), 16);
    const auto w = weights_of(ck);
    expect_same_weights(w, weights_of(ck + "/im"));
    // The norms were trained away from their initial ones, so the mapping is really tested.
    EXPECT_FALSE(at::equal(w.at("decoder.layers.2.self_attention.q_layernorm.weight"),
                           w.at("decoder.layers.2.self_attention.k_layernorm.weight")));
    c["sliding_window"] = 4096;  // present but unused: Qwen3 applies it only when switched on
    EXPECT_TRUE(hf_model_config_from_json(c).qk_layernorm);
    c["use_sliding_window"] = true;
    EXPECT_THROW(hf_model_config_from_json(c), UsageError);
  }();
  barrier();
}

// --add-qkv-bias goes out as Qwen2 (q_proj, k_proj, v_proj biases split by the QKV weight's
// interleave) and back, bitwise; Qwen2 configs with a sliding window, sliding layer types or an
// attention_bias are refused, and so are exports Qwen2 cannot hold.
TEST(HfInterop, Qwen2RoundTrip) {
  TrainConfig cfg = pp2dp2(tiny());
  cfg.model.add_qkv_bias = true;
  const std::string ck = trained(cfg, 4, "hfqwen2");
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    nlohmann::json c = read_json(ck + "/ex/config.json");
    EXPECT_EQ(c["model_type"], "qwen2");
    EXPECT_EQ(c["architectures"], nlohmann::json::array({"Qwen2ForCausalLM"}));
    EXPECT_EQ(c["head_dim"], 8);
    EXPECT_FALSE(c.contains("attention_bias"));
    EXPECT_EQ(c["use_sliding_window"], false);
    const std::string f = ck + "/ex/model.safetensors";
    const nlohmann::json h = raw_header(f);
    EXPECT_EQ(h["model.layers.1.self_attn.q_proj.bias"]["shape"], nlohmann::json({32}));
    EXPECT_EQ(h["model.layers.1.self_attn.k_proj.bias"]["shape"], nlohmann::json({16}));
    EXPECT_EQ(h["model.layers.1.self_attn.v_proj.bias"]["shape"], nlohmann::json({16}));
    EXPECT_FALSE(h.contains("model.layers.1.self_attn.o_proj.bias"));
    EXPECT_EQ(h.size(), 1u + 1 + 4 * 12 + 1);  // metadata, embedding, 4 layers of 12, norm
    const auto w = weights_of(ck);
    const int64_t ng = 2, r = 2, hd = 8;  // tiny(): 4 heads in 2 groups of head dim 8
    for (int l : {0, 3}) {
      const at::Tensor b = w.at(fmt::format("decoder.layers.{}.self_attention.linear_qkv.bias", l));
      EXPECT_GT(b.abs().max().item<double>(), 0.0) << "trained away from zero";
      const std::string p = fmt::format("model.layers.{}.self_attn.", l);
      const at::Tensor q = hf_tensor(f, p + "q_proj.bias"), k = hf_tensor(f, p + "k_proj.bias");
      const at::Tensor v = hf_tensor(f, p + "v_proj.bias");
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t base = g * (r + 2) * hd;
        EXPECT_TRUE(at::equal(q.narrow(0, g * r * hd, r * hd), b.narrow(0, base, r * hd)));
        EXPECT_TRUE(at::equal(k.narrow(0, g * hd, hd), b.narrow(0, base + r * hd, hd)));
        EXPECT_TRUE(at::equal(v.narrow(0, g * hd, hd), b.narrow(0, base + (r + 1) * hd, hd)));
      }
    }
    hf_import_checkpoint(ck + "/ex", ck + "/im");
    const ModelConfig m = model_of(ck + "/im");
    EXPECT_TRUE(m.add_qkv_bias);
    EXPECT_FALSE(m.qk_layernorm);
    expect_same_weights(w, weights_of(ck + "/im"));
    c["sliding_window"] = 32768;  // present but unused, as in Qwen2.5's configs
    c["max_window_layers"] = 21;
    c["layer_types"] = nlohmann::json::array(
        {"full_attention", "full_attention", "full_attention", "full_attention"});
    EXPECT_TRUE(hf_model_config_from_json(c).add_qkv_bias);
    nlohmann::json bad = c;
    bad["use_sliding_window"] = true;
    EXPECT_THROW(hf_model_config_from_json(bad), UsageError);
    bad = c;
    bad["layer_types"][2] = "sliding_attention";
    EXPECT_THROW(hf_model_config_from_json(bad), UsageError);
    bad = c;
    bad["attention_bias"] = true;
    EXPECT_THROW(hf_model_config_from_json(bad), UsageError);
    bad = c;
    bad.erase("num_key_value_heads");  // Qwen2Config's default is not num_attention_heads
    EXPECT_THROW(hf_model_config_from_json(bad), UsageError);
    bad["num_key_value_heads"] = nullptr;  // but null is: one key/value head per head
    EXPECT_EQ(hf_model_config_from_json(bad).num_query_groups, 4);
    // Llama's attention_bias puts a bias on o_proj too: still refused.
    nlohmann::json llama = c;
    llama["model_type"] = "llama";
    llama["attention_bias"] = true;
    EXPECT_THROW(hf_model_config_from_json(llama), UsageError);
    ModelConfig both = m;
    both.qk_layernorm = true;
    EXPECT_THROW(hf_model_type(both), UsageError);
    ModelConfig moe = m;
    moe.num_experts = 4;
    EXPECT_THROW(hf_model_type(moe), UsageError);
  }();
  barrier();
}

TEST(HfInterop, QkvAndGateUpSplitByTheDocumentedInterleave) {
  const std::string ck = trained(tiny(), 1, "hfqkv");
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    const auto w = weights_of(ck);
    const std::string f = ck + "/ex/model.safetensors";
    const int64_t ng = 2, r = 2, hd = 8, ffn = 48;
    for (int l : {0, 3}) {
      const at::Tensor qkv = w.at(fmt::format("decoder.layers.{}.self_attention.linear_qkv.weight", l));
      const std::string p = fmt::format("model.layers.{}.", l);
      const at::Tensor q = hf_tensor(f, p + "self_attn.q_proj.weight");
      const at::Tensor k = hf_tensor(f, p + "self_attn.k_proj.weight");
      const at::Tensor v = hf_tensor(f, p + "self_attn.v_proj.weight");
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t base = g * (r + 2) * hd;  // group g: r query heads, its key, its value
        for (int64_t i = 0; i < r; ++i)
          EXPECT_TRUE(at::equal(q.narrow(0, (g * r + i) * hd, hd), qkv.narrow(0, base + i * hd, hd)))
              << "layer " << l << " query head " << g * r + i;
        EXPECT_TRUE(at::equal(k.narrow(0, g * hd, hd), qkv.narrow(0, base + r * hd, hd)));
        EXPECT_TRUE(at::equal(v.narrow(0, g * hd, hd), qkv.narrow(0, base + (r + 1) * hd, hd)));
      }
      const at::Tensor fc1 = w.at(fmt::format("decoder.layers.{}.mlp.linear_fc1.weight", l));
      EXPECT_TRUE(at::equal(hf_tensor(f, p + "mlp.gate_proj.weight"), fc1.narrow(0, 0, ffn)));
      EXPECT_TRUE(at::equal(hf_tensor(f, p + "mlp.up_proj.weight"), fc1.narrow(0, ffn, ffn)));
    }
  }();
  barrier();
}

TEST(HfInterop, ShardedExportHoldsTheSameTensors) {
  EXPECT_EQ(hf_parse_shard_size("5GB"), 5'000'000'000);
  EXPECT_EQ(hf_parse_shard_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(hf_parse_shard_size("1000"), 1000);
  EXPECT_THROW(hf_parse_shard_size("5 parsecs"), UsageError);
  EXPECT_THROW(hf_parse_shard_size("99999999999999999999GB"), UsageError);  // no overflow
  const std::string ck = trained(tiny(true), 1, "hfshard");
  if (rank0()) [&] {
    HfExportOptions o;
    o.max_shard_bytes = 20000;  // embedding 8192 B, each layer ~23 KB: several shards
    hf_export_checkpoint(ck, ck + "/sh", o);
    const nlohmann::json index = read_json(ck + "/sh/model.safetensors.index.json");
    const auto& map = index["weight_map"];
    EXPECT_EQ(map.size(), 1u + 4 * 9 + 1 + 1);  // lm_head too (untied)
    std::set<std::string> files;
    for (const auto& [name, file] : map.items()) files.insert(file.get<std::string>());
    EXPECT_GT(files.size(), 2u);
    const std::string last = fmt::format("model-{:05d}-of-{:05d}.safetensors", files.size(), files.size());
    EXPECT_TRUE(files.count(last)) << last;
    EXPECT_FALSE(fs::exists(ck + "/sh/model.safetensors"));
    int64_t total = 0;
    for (const std::string& file : files) {
      const nlohmann::json h = raw_header(ck + "/sh/" + file);
      int64_t bytes = 0;
      for (const auto& [name, e] : h.items())
        if (name != "__metadata__") {
          EXPECT_EQ(map[name], file) << name;
          bytes += e["data_offsets"][1].get<int64_t>() - e["data_offsets"][0].get<int64_t>();
        }
      EXPECT_LE(bytes, 20000) << file;
      total += bytes;
    }
    EXPECT_EQ(index["metadata"]["total_size"], total);
    hf_import_checkpoint(ck + "/sh", ck + "/im");
    expect_same_weights(weights_of(ck), weights_of(ck + "/im"));
  }();
  barrier();
}

TEST(HfInterop, FinetuneOnPp2Dp2MatchesOneRank) {
  const std::string ck = trained(tiny(), 1, "hfft");
  const std::string im = ck + "/im";
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    hf_import_checkpoint(ck + "/ex", im);
  }();
  barrier();
  TrainConfig ft = tiny();
  ft.load = im;
  ft.finetune = true;
  const auto one = run_job(ft, 1);
  const auto four = run_job(pp2dp2(ft), 4);
  TrainConfig from_ck = ft;
  from_ck.load = ck;  // the full original checkpoint: its fp32 master, its optimizer ignored
  const auto orig = run_job(from_ck, 1);
  const auto fresh = run_job(tiny(), 1);
  if (rank0()) [&] {  // a lambda: a failed ASSERT must not skip the collectives below
    ASSERT_EQ(one.size(), 2u);
    ASSERT_EQ(four.size(), 2u);
    ASSERT_EQ(orig.size(), 2u);
    ASSERT_EQ(fresh.size(), 2u);
    EXPECT_EQ(one[0].iteration, 1);
    EXPECT_EQ(one[0].consumed_samples, 4);
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(four[i].lm_loss, one[i].lm_loss, 1e-6 * one[i].lm_loss) << "iteration " << i + 1;
      EXPECT_EQ(orig[i].lm_loss, one[i].lm_loss) << "iteration " << i + 1;
    }
    EXPECT_GT(std::abs(fresh[0].lm_loss - one[0].lm_loss), 1e-3);  // the weights were loaded
  }();
  // The weights --finetune loads on pp2 x dp2 are the imported ones, bitwise.
  TrainConfig zero = pp2dp2(ft);
  zero.train_iters = 0;
  zero.save = test::shared_temp_dir("hfft0");
  run_job(zero, 4, false, nullptr, nullptr, [](Trainer& t, const ProcessGroups&) { t.save(); });
  if (rank0()) {
    expect_same_weights(weights_of(im), weights_of(zero.save));
  }
  // Without --finetune a weights-only checkpoint is refused naming the flag.
  TrainConfig plain = pp2dp2(tiny());
  plain.load = im;
  std::string error;
  run_job(plain, 4, false, nullptr, &error);
  if (rank0()) [&] {
    EXPECT_NE(error.find("--finetune"), std::string::npos) << error;
  }();
  // A model that the tensors cannot tell apart, refused naming each flag: twice the heads and
  // groups at the same width (the same QKV rows), another RoPE base, Llama 3 scaling.
  TrainConfig other = pp2dp2(ft);
  other.model.num_attention_heads = 8;
  other.model.num_query_groups = 4;
  other.model.rotary_base = 500000;
  other.model.use_rope_scaling = true;
  error.clear();
  run_job(other, 4, false, nullptr, &error);
  if (rank0()) [&] {
    for (const char* needle : {"--num-attention-heads 8 (checkpoint: 4)",
                               "--num-query-groups 4 (checkpoint: 2)",
                               "--rotary-base 500000 (checkpoint: 10000)",
                               "--use-rope-scaling true (checkpoint: false)"})
      EXPECT_NE(error.find(needle), std::string::npos) << error;
  }();
  TrainConfig eps = ft;
  eps.model.norm_epsilon = 1e-6;
  error.clear();
  run_job(eps, 1, false, nullptr, &error);
  if (rank0()) [&] {
    EXPECT_NE(error.find("--norm-epsilon 1e-06 (checkpoint: 1e-05)"), std::string::npos) << error;
  }();
  barrier();
}

// Expects `fn` to throw UsageError mentioning `needle`, with nothing left at `out` or beside it.
template <typename Fn>
void expect_refused(Fn fn, const std::string& needle, const std::string& out) {
  try {
    fn();
    ADD_FAILURE() << "not refused; expected a message naming " << needle;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out)) << out;
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path()))
    EXPECT_EQ(e.path().filename().string().find(fs::path(out).filename().string() + ".tmp-"),
              std::string::npos) << e.path();
}

// `weft ckpt import --dtype`: "source" keeps a bf16 model's bytes (half of float32's) and
// trains exactly as the float32 import, on one rank and on pp2 x dp2 (the loader converts the
// bf16 chunks, row-sliced, into the float32 master); "bf16" rounds float32 files; export of
// either gives back the bf16 files byte for byte.
TEST(HfInterop, ImportDtypeSourceAndBf16) {
  const std::string ck = trained(tiny(), 1, "hfdt");
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    HfExportOptions bf;
    bf.dtype = "bf16";
    hf_export_checkpoint(ck, ck + "/exbf", bf);
    hf_import_checkpoint(ck + "/exbf", ck + "/im32");
    const HfImportStats src = hf_import_checkpoint(ck + "/exbf", ck + "/imsrc", "source");
    hf_import_checkpoint(ck + "/ex", ck + "/imbf", "bf16");  // float32 files rounded
    EXPECT_EQ(src.bytes, 2 * src.parameters);
    const std::string shard = "/iter_0000000/shard_00000.safetensors";
    EXPECT_LT(fs::file_size(ck + "/imsrc" + shard), fs::file_size(ck + "/im32" + shard) * 60 / 100);
    for (const auto& [name, t] : read_json(ck + "/imsrc/iter_0000000/metadata.json")["tensors"].items())
      EXPECT_EQ(t["dtype"], "BF16") << name;
    expect_same_weights(weights_of(ck + "/imsrc"), weights_of(ck + "/im32"));
    EXPECT_TRUE(file_bytes(ck + "/imsrc" + shard) == file_bytes(ck + "/imbf" + shard));
    hf_export_checkpoint(ck + "/imsrc", ck + "/ex2", bf);
    expect_same_files(ck + "/exbf", ck + "/ex2");
    expect_refused([&] { hf_import_checkpoint(ck + "/exbf", ck + "/bad", "fp16"); }, "--dtype",
                   ck + "/bad");
  }();
  barrier();
  for (int world : {1, 4}) {
    std::vector<IterationStats> runs[2];
    for (int k = 0; k < 2; ++k) {
      TrainConfig ft = world == 1 ? tiny() : pp2dp2(tiny());
      ft.load = ck + (k == 0 ? "/im32" : "/imsrc");
      ft.finetune = true;
      runs[k] = run_job(ft, world);
    }
    if (rank0()) [&] {
      ASSERT_EQ(runs[0].size(), 2u);
      ASSERT_EQ(runs[1].size(), 2u);
      for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(runs[1][i].lm_loss, runs[0][i].lm_loss) << "world " << world << " it " << i + 1;
        EXPECT_EQ(runs[1][i].grad_norm, runs[0][i].grad_norm) << "world " << world << " it " << i + 1;
      }
    }();
  }
  barrier();
}

// Writes `tensors` (name -> tensor) as dir/model.safetensors.
void write_model(const std::string& dir, const std::map<std::string, at::Tensor>& tensors) {
  std::vector<SafetensorsWriteEntry> entries;
  for (const auto& [name, t] : tensors)
    entries.push_back({name, "F32", t.sizes().vec(), t.data_ptr(),
                       static_cast<size_t>(t.numel()) * 4});
  ASSERT_TRUE(safetensors_write(dir + "/model.safetensors", entries, {{"format", "pt"}}).is_ok());
}

TEST(HfInterop, BadInputNamesTheKey) {
  const std::string ck = trained(tiny(), 1, "hfbad");
  if (rank0()) [&] {
    const std::string good = ck + "/ex";
    hf_export_checkpoint(ck, good, {});
    const nlohmann::json config = read_json(good + "/config.json");
    std::map<std::string, at::Tensor> tensors;
    SafetensorsHeader h;
    ASSERT_TRUE(safetensors_read_header(good + "/model.safetensors", &h).is_ok());
    for (const auto& [name, e] : h.entries) tensors[name] = hf_tensor(good + "/model.safetensors", name);
    int n = 0;
    auto variant = [&](const nlohmann::json& cfg, const std::map<std::string, at::Tensor>& t) {
      const std::string d = fmt::format("{}/bad{}", ck, n++);
      fs::create_directories(d);
      std::ofstream(d + "/config.json") << cfg.dump();
      write_model(d, t);
      return d;
    };
    const std::string out = ck + "/out";
    auto refused_config = [&](const char* key, const nlohmann::json& value, const std::string& needle) {
      nlohmann::json c = config;
      if (value.is_discarded()) c.erase(key);
      else c[key] = value;
      const std::string d = variant(c, tensors);
      expect_refused([&] { hf_import_checkpoint(d, out); }, needle, out);
    };
    const nlohmann::json erase = nlohmann::json::value_t::discarded;
    refused_config("hidden_size", erase, "'hidden_size'");
    refused_config("rms_norm_eps", erase, "'rms_norm_eps'");
    refused_config("rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}, "rope_scaling");
    refused_config("rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 5e5}}, "rope_type");
    const nlohmann::json llama3 = {{"rope_type", "llama3"}, {"factor", 8.0},
                                   {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                   {"original_max_position_embeddings", 8192}};
    // llama3 with `key` set to `value` (erased when discarded).
    auto llama3_with = [&](const char* key, const nlohmann::json& value) {
      nlohmann::json r = llama3;
      if (value.is_discarded()) r.erase(key);
      else r[key] = value;
      return r;
    };
    const nlohmann::json gone = nlohmann::json::value_t::discarded;
    refused_config("rope_parameters", llama3_with("factor", gone), "rope_parameters.factor is missing");
    refused_config("rope_parameters", llama3_with("low_freq_factor", 2.0),
                   "rope_parameters.low_freq_factor is 2.0");
    refused_config("rope_scaling", llama3_with("original_max_position_embeddings", 4096),
                   "rope_scaling.original_max_position_embeddings is 4096");
    refused_config("rope_parameters", llama3_with("attention_factor", 1.5),
                   "rope_parameters.attention_factor");
    refused_config("rope_parameters", llama3_with("factor", 0.5), "rope_parameters.factor is 0.5");
    refused_config("rope_parameters", llama3_with("type", "default"),
                   "rope_parameters.type 'default' and rope_parameters.rope_type 'llama3' disagree");
    refused_config("rope_scaling", llama3, "describe different RoPE scalings");  // vs default
    refused_config("num_hidden_layers", 4294967300ULL, "'num_hidden_layers' is 4294967300, out of range");
    refused_config("attention_bias", true, "attention_bias");
    refused_config("partial_rotary_factor", 0.5, "partial_rotary_factor");
    refused_config("mlp_bias", true, "mlp_bias");
    refused_config("hidden_act", "gelu", "hidden_act");
    refused_config("head_dim", 16, "has shape");  // a head dim the tensors do not have
    refused_config("head_dim", 7, "head_dim");     // odd: no RoPE
    refused_config("num_key_value_heads", 3, "num_key_value_heads");
    refused_config("sliding_window", 4096, "sliding_window");
    refused_config("model_type", "gpt2", "model_type");
    refused_config("hidden_size", "32", "hidden_size");  // wrong type

    auto refused_tensors = [&](std::map<std::string, at::Tensor> t, const std::string& needle) {
      const std::string d = variant(config, t);
      expect_refused([&] { hf_import_checkpoint(d, out); }, needle, out);
    };
    auto t = tensors;
    t["model.layers.1.self_attn.k_proj.weight"] = at::zeros({8, 32});
    refused_tensors(t, "'model.layers.1.self_attn.k_proj.weight' has shape [8,32]");
    t = tensors;
    t.erase("model.norm.weight");
    refused_tensors(t, "'model.norm.weight' is missing");
    t = tensors;
    t["model.layers.0.mlp.extra.weight"] = at::zeros({2});
    refused_tensors(t, "unknown tensor 'model.layers.0.mlp.extra.weight'");
    t = tensors;
    t["lm_head.weight"] = at::zeros({64, 32});  // tied, but differs from the embedding
    refused_tensors(t, "lm_head.weight");
    t = tensors;
    t["lm_head.weight"] = tensors.at("model.embed_tokens.weight").clone();  // tied and equal: ok
    const std::string ok = variant(config, t);
    hf_import_checkpoint(ok, ck + "/ok");
    expect_same_weights(weights_of(ck), weights_of(ck + "/ok"));

    // Existing non-empty OUT: refused for both directions, and left as it was.
    fs::create_directories(ck + "/full");
    std::ofstream(ck + "/full/keep") << "x";
    auto still_there = [&] { EXPECT_TRUE(fs::exists(ck + "/full/keep")); };
    try {
      hf_import_checkpoint(good, ck + "/full");
      ADD_FAILURE() << "import into a non-empty OUT";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
    }
    still_there();
    EXPECT_THROW(hf_export_checkpoint(ck, ck + "/full", {}), UsageError);
    still_there();

    // Models with no Hugging Face layout.
    ModelConfig hybrid = tiny().model;
    hybrid.layer_symbols = "M*M*";
    // A hybrid with rotary attention: NemotronH's attention has no positional encoding.
    expect_refused([&] { hf_model_type(hybrid); }, "--position-embedding-type rope", ck + "/none");
    ModelConfig shared = tiny().model;
    shared.num_experts = 4;
    shared.moe_shared_expert_intermediate_size = 16;
    expect_refused([&] { hf_model_type(shared); }, "--moe-shared-expert-intermediate-size", ck + "/none");
    ModelConfig mixed = tiny().model;
    mixed.num_experts = 4;
    mixed.moe_layer_pattern = {0, 1, 1, 1};
    expect_refused([&] { hf_model_type(mixed); }, "--moe-layer-freq", ck + "/none");
    ModelConfig partial = tiny().model;
    partial.rotary_percent = 0.5;  // transformers' Llama rotates whole heads
    expect_refused([&] { hf_model_type(partial); }, "--rotary-percent 0.5", ck + "/none");
    ModelConfig on_input = tiny().model;  // Qwen3-MoE's layer otherwise (top 1, pre-softmax)
    on_input.num_experts = 4;
    on_input.moe_router_topk = 1;
    on_input.moe_router_pre_softmax = true;
    on_input.qk_layernorm = true;
    EXPECT_EQ(hf_model_type(on_input), "qwen3_moe");
    on_input.moe_apply_probs_on_input = true;
    expect_refused([&] { hf_model_type(on_input); }, "--moe-apply-probs-on-input", ck + "/none");
  }();
  barrier();
}

// A Nemotron 3 shaped hybrid (Mamba, squared-ReLU MLP, attention without positions, an MoE
// layer with a sigmoid router, scaling, a shared expert and trained expert biases, MTP),
// trained on pp 2 x ep 2, exported as NemotronH: config.json and the header against literals,
// the tensors against the weft ones they copy (the MTP depth dropped), import back bitwise
// (the expert biases found from the files), export again byte-identical; bf16 keeps the bias in
// float32; a tied model writes lm_head as the embedding, untied (transformers' NemotronH never
// ties), and imports untied with the same values.
TrainConfig nemotron(bool untied) {
  TrainConfig c = tiny(untied);
  ModelConfig& m = c.model;
  m.squared_relu = true;
  m.position_embedding_type = "none";
  m.num_experts = 4;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = 24;
  m.moe_shared_expert_intermediate_size = 16;
  m.moe_router_score_function = "sigmoid";
  m.moe_router_topk_scaling_factor = 2.5;
  m.moe_router_enable_expert_bias = true;
  m.moe_router_bias_update_rate = 0.01;
  m.mamba_state_dim = 8;
  m.mamba_head_dim = 8;
  m.mamba_num_groups = 2;
  apply_hybrid_layer_pattern("M-*|EM/*E", &m);  // the stage cut is not part of the model
  c.layout.pp = 2;
  c.layout.ep = 2;
  return c;
}

TEST(HfInterop, NemotronHRoundTripNamesAndConfig) {
  for (bool untied : {true, false}) {
    SCOPED_TRACE(untied ? "untied" : "tied");
    const std::string ck = trained(nemotron(untied), 4, "hfnemo");
    if (rank0()) [&] {
      hf_export_checkpoint(ck, ck + "/ex", {});
      const nlohmann::json cfg = read_json(ck + "/ex/config.json");
      EXPECT_EQ(cfg["model_type"], "nemotron_h");
      EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"NemotronHForCausalLM"}));
      EXPECT_EQ(cfg["hybrid_override_pattern"], "M-*EM");
      EXPECT_FALSE(cfg.contains("layers_block_type"));  // read-only in NVIDIA's and vLLM's code
      EXPECT_EQ(cfg["mlp_hidden_act"], "relu2");
      EXPECT_EQ(cfg["n_routed_experts"], 4);
      EXPECT_EQ(cfg["num_experts_per_tok"], 2);
      EXPECT_EQ(cfg["norm_topk_prob"], true);
      EXPECT_EQ(cfg["routed_scaling_factor"], 2.5);
      EXPECT_EQ(cfg["moe_intermediate_size"], 24);
      EXPECT_EQ(cfg["moe_shared_expert_intermediate_size"], 16);
      EXPECT_EQ(cfg["head_dim"], 8);
      EXPECT_EQ(cfg["mamba_num_heads"], 8);  // 2 * 32 / 8
      EXPECT_EQ(cfg["mamba_head_dim"], 8);
      EXPECT_EQ(cfg["ssm_state_size"], 8);
      EXPECT_EQ(cfg["n_groups"], 2);
      EXPECT_EQ(cfg["layer_norm_epsilon"], 1e-5);
      EXPECT_EQ(cfg["tie_word_embeddings"], false);
      const std::string f = ck + "/ex/model.safetensors";
      const nlohmann::json h = raw_header(f);
      const auto w = weights_of(ck);
      auto same = [&](const std::string& hf, const std::string& weft) {
        ASSERT_TRUE(h.contains(hf)) << hf;
        EXPECT_TRUE(at::equal(hf_tensor(f, hf), w.at(weft))) << hf << " vs " << weft;
      };
      same("backbone.embeddings.weight", "embedding.word_embeddings.weight");
      same("backbone.layers.0.norm.weight", "decoder.layers.0.mixer.in_proj.layer_norm_weight");
      same("backbone.layers.0.mixer.in_proj.weight", "decoder.layers.0.mixer.in_proj.weight");
      same("backbone.layers.0.mixer.A_log", "decoder.layers.0.mixer.A_log");
      same("backbone.layers.1.norm.weight", "decoder.layers.1.pre_mlp_layernorm.weight");
      same("backbone.layers.1.mixer.up_proj.weight", "decoder.layers.1.mlp.linear_fc1.weight");
      EXPECT_EQ(h["backbone.layers.1.mixer.up_proj.weight"]["shape"], nlohmann::json({48, 32}));
      same("backbone.layers.2.norm.weight", "decoder.layers.2.input_layernorm.weight");
      same("backbone.layers.2.mixer.o_proj.weight", "decoder.layers.2.self_attention.linear_proj.weight");
      EXPECT_EQ(h["backbone.layers.2.mixer.k_proj.weight"]["shape"], nlohmann::json({16, 32}));
      same("backbone.layers.3.mixer.gate.weight", "decoder.layers.3.mlp.router.weight");
      same("backbone.layers.3.mixer.gate.e_score_correction_bias",
           "decoder.layers.3.mlp.router.expert_bias");
      EXPECT_GT(w.at("decoder.layers.3.mlp.router.expert_bias").abs().sum().item<double>(), 0.0)
          << "the biases did not train";
      same("backbone.layers.3.mixer.experts.1.up_proj.weight",
           "decoder.layers.3.mlp.experts.1.linear_fc1.weight");
      same("backbone.layers.3.mixer.experts.1.down_proj.weight",
           "decoder.layers.3.mlp.experts.1.linear_fc2.weight");
      same("backbone.layers.3.mixer.shared_experts.down_proj.weight",
           "decoder.layers.3.mlp.shared_experts.linear_fc2.weight");
      same("backbone.norm_f.weight", "decoder.final_layernorm.weight");
      same("lm_head.weight", untied ? "output_layer.weight" : "embedding.word_embeddings.weight");
      for (const auto& [name, e] : h.items()) EXPECT_EQ(name.find("mtp"), std::string::npos) << name;

      hf_import_checkpoint(ck + "/ex", ck + "/im");
      std::map<std::string, at::Tensor> main;  // the checkpoint less its MTP depth, untied
      for (const auto& [k, t] : w)
        if (k.rfind("mtp.", 0) != 0) main[k] = t;
      if (!untied) main["output_layer.weight"] = w.at("embedding.word_embeddings.weight");
      expect_same_weights(main, weights_of(ck + "/im"));
      EXPECT_EQ(model_of(ck + "/im").moe_router_enable_expert_bias, true);
      EXPECT_EQ(model_of(ck + "/im").tied(), false);
      EXPECT_EQ(model_of(ck + "/im").moe_router_dtype, "fp32");
      hf_export_checkpoint(ck + "/im", ck + "/ex2", {});
      expect_same_files(ck + "/ex", ck + "/ex2");

      HfExportOptions bf16;
      bf16.dtype = "bf16";
      hf_export_checkpoint(ck, ck + "/ex16", bf16);
      const nlohmann::json h16 = raw_header(ck + "/ex16/model.safetensors");
      EXPECT_EQ(h16["backbone.layers.3.mixer.gate.e_score_correction_bias"]["dtype"], "F32");
      EXPECT_EQ(h16["backbone.layers.3.mixer.gate.weight"]["dtype"], "BF16");
      // import --dtype bf16 / source of those files: the expert bias stays float32, and the
      // re-export gives the same files back.
      for (const char* dt : {"bf16", "source"}) {
        const std::string im = ck + "/im16" + dt;
        hf_import_checkpoint(ck + "/ex16", im, dt);
        const nlohmann::json t = read_json(im + "/iter_0000000/metadata.json")["tensors"];
        EXPECT_EQ(t["decoder.layers.3.mlp.router.expert_bias"]["dtype"], "F32") << dt;
        EXPECT_EQ(t["decoder.layers.3.mlp.router.weight"]["dtype"], "BF16") << dt;
        hf_export_checkpoint(im, im + "ex", bf16);
        expect_same_files(ck + "/ex16", im + "ex");
      }
    }();
    barrier();
  }
}

// The hybrid models NemotronH cannot hold are refused naming the flag; the config.json fields
// weft cannot compute are refused naming the key.
TEST(HfInterop, NemotronHRefusals) {
  if (!rank0()) return;
  auto refused = [](const ModelConfig& m, const std::string& needle) {
    try {
      hf_tensor_maps(m);
      ADD_FAILURE() << "not refused: " << needle;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const ModelConfig ok = nemotron(true).model;
  EXPECT_NO_THROW(hf_tensor_maps(ok));
  ModelConfig m = ok;
  m.position_embedding_type = "rope";
  refused(m, "--position-embedding-type rope");
  m = ok;
  m.squared_relu = false;
  refused(m, "--squared-relu");
  m = ok;
  m.moe_router_score_function = "softmax";
  m.moe_router_enable_expert_bias = false;
  refused(m, "--moe-router-score-function softmax");
  m = ok;
  m.moe_shared_expert_intermediate_size = 0;
  refused(m, "--moe-shared-expert-intermediate-size");
  m = ok;
  m.norm_epsilon = 1e-6;
  refused(m, "--norm-epsilon");

  const nlohmann::json good = hf_config_from_model(ok, "float32", {});
  EXPECT_EQ(hf_model_config_from_json(good).layer_symbols, "M-*EM");
  auto bad = [&](const char* key, const nlohmann::json& v, const std::string& needle) {
    nlohmann::json j = good;
    j[key] = v;
    try {
      hf_model_config_from_json(j);
      ADD_FAILURE() << key << " " << v.dump() << " not refused";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad("mlp_hidden_act", "gelu", "mlp_hidden_act");
  {  // group-limited routing: transformers' groups score their top 2, weft's their top k / g
    nlohmann::json j = good;  // top k 2: n_group 2 with topk_group 1 scores top 2 in both
    j["n_group"] = 2;
    j["topk_group"] = 1;
    const ModelConfig grouped = hf_model_config_from_json(j);
    EXPECT_EQ(grouped.moe_router_num_groups, 2);
    EXPECT_EQ(grouped.moe_router_group_topk, 1);
    const nlohmann::json back = hf_config_from_model(grouped, "float32", {});
    EXPECT_EQ(back["n_group"], 2);
    EXPECT_EQ(back["topk_group"], 1);
    j["num_experts_per_tok"] = 1;  // top 1 of 1 group: weft would score the top 1
    j["norm_topk_prob"] = false;
    EXPECT_THROW(hf_model_config_from_json(j), UsageError);
    ModelConfig m3 = grouped;  // export of a group score other than the top 2 is refused
    m3.moe_router_num_groups = 4;
    m3.moe_router_group_topk = 2;
    m3.moe_router_topk = 6;
    try {
      hf_config_from_model(m3, "float32", {});
      ADD_FAILURE() << "a group score of the top 3 exported";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--moe-router-group-topk 2 with --moe-router-topk 6"),
                std::string::npos) << e.what();
    }
    EXPECT_EQ(hf_model_config_from_json(good).moe_router_group_topk, 0);  // n_group 1: none
  }
  bad("norm_topk_prob", false, "norm_topk_prob");
  bad("time_step_limit", nlohmann::json::array({0.001, 0.1}), "time_step_limit");
  bad("layer_norm_epsilon", 1e-6, "layer_norm_epsilon");
  bad("conv_kernel", 3, "conv_kernel");
  bad("use_conv_bias", false, "use_conv_bias");
  bad("layers_block_type", nlohmann::json::array({"mamba", "mlp", "attention", "moe", "mlp"}),
      "disagree");
  bad("moe_shared_expert_intermediate_size", 0, "hf import: config.json moe_shared_expert");
  bad("mamba_dt_limit", nlohmann::json::array({0.0, 0.1}), "mamba_dt_limit");
  // dt unclamped, as transformers 4, transformers 5 and converters write it: accepted.
  for (const nlohmann::json& limit :
       {nlohmann::json::array({0.0, 1e308}), nlohmann::json::parse(R"([0.0, {"__float__": "Infinity"}])"),
        nlohmann::json::array({0.0, 1e20})}) {
    nlohmann::json j = good;
    j["time_step_limit"] = limit;
    EXPECT_NO_THROW(hf_model_config_from_json(j)) << limit.dump();
  }
  // Python's bare Infinity in a config.json file parses (the files are checked next).
  const std::string dir = fs::temp_directory_path() / "weft-nemotron-inf";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string text = good.dump();
  text.insert(text.size() - 1, R"(,"time_step_limit": [0.0, Infinity], "note": "NaN Infinity")");
  std::ofstream(dir + "/config.json") << text;
  try {
    hf_read_model(dir);
    ADD_FAILURE() << "no safetensors, yet imported";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("has neither model.safetensors"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
  // Without --moe-router-enable-expert-bias the export writes zero biases (vLLM requires the
  // tensors) and the import leaves the flag off.
  ModelConfig unbiased = ok;
  unbiased.moe_router_enable_expert_bias = false;
  unbiased.untie_embeddings_and_output_weights = true;
  unbiased.mtp_num_layers = 0;
  unbiased.mtp_layer_symbols.clear();
  std::map<std::string, at::Tensor> init;
  for (const ParamSpec& s : all_param_specs(unbiased)) init[s.name] = init_param(s, unbiased, 3);
  const std::string hf = fs::temp_directory_path() / "weft-nemotron-unbiased";
  fs::remove_all(hf);
  hf_export(unbiased, init, {}, hf, {});
  EXPECT_TRUE(at::equal(hf_tensor(hf + "/model.safetensors",
                                  "backbone.layers.3.mixer.gate.e_score_correction_bias"),
                        at::zeros({4})));
  const HfModel back = hf_read_model(hf);
  EXPECT_FALSE(back.model.moe_router_enable_expert_bias);
  expect_same_weights(init, back.weights);
  fs::remove_all(hf);
  // Non-zero expert biases in one MoE layer and none in another: refused before anything is
  // written, naming the missing tensor.
  ModelConfig two = unbiased;
  two.moe_router_enable_expert_bias = true;
  apply_hybrid_layer_pattern("M-*EE", &two);
  init.clear();
  for (const ParamSpec& s : all_param_specs(two)) init[s.name] = init_param(s, two, 3);
  init["decoder.layers.3.mlp.router.expert_bias"] = at::full({4}, 0.25);  // a buffer, no spec
  init["decoder.layers.4.mlp.router.expert_bias"] = at::zeros({4});
  hf_export(two, init, {}, hf, {});
  std::map<std::string, at::Tensor> kept;
  SafetensorsHeader h;
  ASSERT_TRUE(safetensors_read_header(hf + "/model.safetensors", &h).is_ok());
  for (const auto& [name, e] : h.entries)
    if (name != "backbone.layers.4.mixer.gate.e_score_correction_bias")
      kept[name] = hf_tensor(hf + "/model.safetensors", name).to(at::kFloat).contiguous();
  write_model(hf, kept);
  try {
    hf_read_model(hf);
    ADD_FAILURE() << "one layer's expert bias missing, yet imported";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'backbone.layers.4.mixer.gate.e_score_correction_bias' "
                                         "is missing while other layers' expert biases are "
                                         "non-zero"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(hf);
  bad("moe_latent_size", 64, "moe_latent_size");
  bad("layers_block_type", nlohmann::json::array({"mamba", "conv"}), "'conv'");
}

TEST(HfInterop, MixtralRoundTrip) {
  TrainConfig c = tiny();
  c.model.num_experts = 4;
  c.model.moe_router_topk = 2;
  c.model.moe_ffn_hidden_size = 24;
  c.layout.ep = 2;
  const std::string ck = trained(c, 4, "hfmoe");  // ep 2 x dp 4 (edp 2)
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    const nlohmann::json cfg = read_json(ck + "/ex/config.json");
    EXPECT_EQ(cfg["model_type"], "mixtral");
    EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"MixtralForCausalLM"}));
    EXPECT_EQ(cfg["num_local_experts"], 4);
    EXPECT_EQ(cfg["num_experts_per_tok"], 2);
    EXPECT_EQ(cfg["intermediate_size"], 24);
    const nlohmann::json h = raw_header(ck + "/ex/model.safetensors");
    EXPECT_EQ(h["model.layers.2.block_sparse_moe.gate.weight"]["shape"], nlohmann::json({4, 32}));
    EXPECT_EQ(h["model.layers.2.block_sparse_moe.experts.3.w1.weight"]["shape"], nlohmann::json({24, 32}));
    EXPECT_EQ(h["model.layers.2.block_sparse_moe.experts.3.w3.weight"]["shape"], nlohmann::json({24, 32}));
    EXPECT_EQ(h["model.layers.2.block_sparse_moe.experts.3.w2.weight"]["shape"], nlohmann::json({32, 24}));
    const auto w = weights_of(ck);
    const at::Tensor fc1 = w.at("decoder.layers.2.mlp.experts.3.linear_fc1.weight");
    const std::string f = ck + "/ex/model.safetensors";
    EXPECT_TRUE(at::equal(hf_tensor(f, "model.layers.2.block_sparse_moe.experts.3.w1.weight"), fc1.narrow(0, 0, 24)));
    EXPECT_TRUE(at::equal(hf_tensor(f, "model.layers.2.block_sparse_moe.experts.3.w3.weight"), fc1.narrow(0, 24, 24)));
    hf_import_checkpoint(ck + "/ex", ck + "/im");
    expect_same_weights(w, weights_of(ck + "/im"));
  }();
  barrier();
}

// A DeepSeek-V3-shaped model (multi-latent attention with a query latent and the latent norms,
// YaRN with mscales, a dense first layer, a sigmoid router with trained expert biases over 2
// groups, 2 shared experts, a routing scale, an MTP depth; pipeline 2 x expert 2) goes out as
// DeepseekV3ForCausalLM and back, bitwise but for the MTP depth, which transformers has no
// layout for; its hub-style config.json (transformers 4's rope_scaling) reads as the same
// model; what DeepSeek-V3 cannot hold is refused naming the key.
TrainConfig deepseek() {
  TrainConfig c = tiny(true);
  ModelConfig& m = c.model;
  m.multi_latent_attention = true;
  m.q_lora_rank = 16;
  m.kv_lora_rank = 12;
  m.qk_head_dim = 8;
  m.qk_pos_emb_head_dim = 8;
  m.v_head_dim = 6;
  m.qk_layernorm = true;
  m.norm_epsilon = 1e-6;
  m.rotary_scaling_factor = 40;
  m.mscale = 0.9;
  m.mscale_all_dim = 0.5;
  m.num_experts = 4;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = 24;
  m.moe_shared_expert_intermediate_size = 48;
  m.moe_layer_pattern = {0, 1, 1, 1};
  m.moe_router_score_function = "sigmoid";
  m.moe_router_enable_expert_bias = true;
  m.moe_router_bias_update_rate = 0.01;
  m.moe_router_num_groups = 2;
  m.moe_router_group_topk = 1;
  m.moe_router_topk_scaling_factor = 2.5;
  m.mtp_num_layers = 1;
  c.layout.pp = 2;
  c.layout.ep = 2;
  return c;
}

TEST(HfInterop, DeepSeekV3RoundTrip) {
  const std::string ck = trained(deepseek(), 4, "hfdsv3");
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    const nlohmann::json cfg = read_json(ck + "/ex/config.json");
    EXPECT_EQ(cfg["model_type"], "deepseek_v3");
    EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"DeepseekV3ForCausalLM"}));
    EXPECT_EQ(cfg["q_lora_rank"], 16);
    EXPECT_EQ(cfg["kv_lora_rank"], 12);
    EXPECT_EQ(cfg["qk_nope_head_dim"], 8);
    EXPECT_EQ(cfg["qk_rope_head_dim"], 8);
    EXPECT_EQ(cfg["v_head_dim"], 6);
    EXPECT_EQ(cfg["num_key_value_heads"], 4);
    EXPECT_EQ(cfg["first_k_dense_replace"], 1);
    EXPECT_EQ(cfg["n_routed_experts"], 4);
    EXPECT_EQ(cfg["n_shared_experts"], 2);
    EXPECT_EQ(cfg["moe_intermediate_size"], 24);
    EXPECT_EQ(cfg["intermediate_size"], 48);
    EXPECT_EQ(cfg["n_group"], 2);
    EXPECT_EQ(cfg["topk_group"], 1);
    EXPECT_EQ(cfg["norm_topk_prob"], true);
    EXPECT_EQ(cfg["routed_scaling_factor"], 2.5);
    EXPECT_EQ(cfg["rope_interleave"], true);
    EXPECT_EQ(cfg["rope_parameters"]["rope_type"], "yarn");
    EXPECT_EQ(cfg["rope_parameters"]["factor"], 40.0);
    EXPECT_EQ(cfg["rope_parameters"]["mscale_all_dim"], 0.5);
    EXPECT_EQ(cfg["rope_parameters"]["original_max_position_embeddings"], 4096);
    EXPECT_EQ(cfg["max_position_embeddings"], 40 * 4096);  // transformers 4 derives the factor
    const double m9 = 0.09 * std::log(40.0) + 1, m5 = 0.05 * std::log(40.0) + 1;
    EXPECT_NEAR(cfg["rope_parameters"]["attention_factor"].get<double>(), m9 / m5, 1e-15);
    const std::string f = ck + "/ex/model.safetensors";
    const nlohmann::json h = raw_header(f);
    const auto w = weights_of(ck);
    auto same = [&](const std::string& hf, const std::string& weft) {
      ASSERT_TRUE(h.contains(hf)) << hf;
      EXPECT_TRUE(at::equal(hf_tensor(f, hf), w.at(weft))) << hf << " vs " << weft;
    };
    const std::string a = "decoder.layers.2.self_attention.";
    same("model.layers.2.self_attn.q_a_proj.weight", a + "linear_q_down_proj.weight");
    same("model.layers.2.self_attn.q_a_layernorm.weight", a + "q_layernorm.weight");
    same("model.layers.2.self_attn.q_b_proj.weight", a + "linear_q_up_proj.weight");
    same("model.layers.2.self_attn.kv_a_proj_with_mqa.weight", a + "linear_kv_down_proj.weight");
    same("model.layers.2.self_attn.kv_a_layernorm.weight", a + "kv_layernorm.weight");
    same("model.layers.2.self_attn.kv_b_proj.weight", a + "linear_kv_up_proj.weight");
    same("model.layers.2.self_attn.o_proj.weight", a + "linear_proj.weight");
    EXPECT_EQ(h["model.layers.2.self_attn.kv_b_proj.weight"]["shape"], nlohmann::json({4 * 14, 12}));
    same("model.layers.2.post_attention_layernorm.weight", "decoder.layers.2.pre_mlp_layernorm.weight");
    same("model.layers.2.mlp.gate.weight", "decoder.layers.2.mlp.router.weight");
    same("model.layers.2.mlp.gate.e_score_correction_bias", "decoder.layers.2.mlp.router.expert_bias");
    EXPECT_EQ(h["model.layers.2.mlp.gate.e_score_correction_bias"]["dtype"], "F32");
    double biases = 0;  // a layer's may stay zero (balanced counts), not all of them
    for (int l = 1; l < 4; ++l)
      biases += w.at(fmt::format("decoder.layers.{}.mlp.router.expert_bias", l)).abs().sum().item<double>();
    EXPECT_GT(biases, 0.0) << "the biases did not train";
    same("model.layers.2.mlp.experts.3.down_proj.weight", "decoder.layers.2.mlp.experts.3.linear_fc2.weight");
    const at::Tensor fc1 = w.at("decoder.layers.2.mlp.experts.3.linear_fc1.weight");
    EXPECT_TRUE(at::equal(hf_tensor(f, "model.layers.2.mlp.experts.3.gate_proj.weight"), fc1.narrow(0, 0, 24)));
    EXPECT_TRUE(at::equal(hf_tensor(f, "model.layers.2.mlp.experts.3.up_proj.weight"), fc1.narrow(0, 24, 24)));
    const at::Tensor sfc1 = w.at("decoder.layers.2.mlp.shared_experts.linear_fc1.weight");
    EXPECT_TRUE(at::equal(hf_tensor(f, "model.layers.2.mlp.shared_experts.up_proj.weight"), sfc1.narrow(0, 48, 48)));
    EXPECT_EQ(h["model.layers.0.mlp.gate_proj.weight"]["shape"], nlohmann::json({48, 32}));
    EXPECT_FALSE(h.contains("model.layers.0.mlp.gate.weight"));
    same("lm_head.weight", "output_layer.weight");
    for (const auto& [name, e] : h.items()) EXPECT_EQ(name.find("mtp"), std::string::npos) << name;

    hf_import_checkpoint(ck + "/ex", ck + "/im");
    std::map<std::string, at::Tensor> main;  // the checkpoint less its MTP depth
    for (const auto& [k, t] : w)
      if (k.rfind("mtp.", 0) != 0) main[k] = t;
    expect_same_weights(main, weights_of(ck + "/im"));
    const ModelConfig m = model_of(ck + "/im");
    EXPECT_TRUE(m.mla() && m.yarn() && m.qk_layernorm && m.moe_router_enable_expert_bias);
    EXPECT_EQ(m.q_lora_rank, 16);
    EXPECT_EQ(m.v_head_dim, 6);
    EXPECT_EQ(m.mscale, 0.9);
    EXPECT_EQ(m.mscale_all_dim, 0.5);
    EXPECT_EQ(m.moe_layer_pattern, (std::vector<int>{0, 1, 1, 1}));
    EXPECT_EQ(m.moe_shared_expert_intermediate_size, 48);
    EXPECT_EQ(m.moe_router_num_groups, 2);
    EXPECT_EQ(m.moe_router_group_topk, 1);
    EXPECT_EQ(m.moe_router_topk_scaling_factor, 2.5);
    EXPECT_EQ(m.moe_router_dtype, "fp32");
    hf_export_checkpoint(ck + "/im", ck + "/ex2", {});
    expect_same_files(ck + "/ex", ck + "/ex2");

    // The hub's form: transformers 4's rope_scaling with its "type", mscale 1 and 1, no
    // attention_factor; q_lora_rank null is linear_q_proj; the MTP layers past the main ones.
    nlohmann::json hub = cfg;
    hub.erase("rope_parameters");
    hub["rope_scaling"] = {{"type", "yarn"}, {"factor", 40}, {"mscale", 1.0},
                           {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096},
                           {"beta_fast", 32}, {"beta_slow", 1}};
    hub["q_lora_rank"] = nullptr;
    const ModelConfig hm = hf_model_config_from_json(hub);
    EXPECT_EQ(hm.q_lora_rank, 0);
    EXPECT_EQ(hm.mscale, 1.0);
    EXPECT_EQ(hm.mscale_all_dim, 1.0);
    EXPECT_NEAR(attention_softmax_scale(hm), std::pow(0.1 * std::log(40.0) + 1, 2) / 4.0, 1e-15);
    hub["rope_scaling"].erase("mscale");  // transformers: mscale(f, 1), Megatron's M = 1 over
    hub["rope_scaling"]["mscale_all_dim"] = 0;
    EXPECT_EQ(hf_model_config_from_json(hub).mscale, 1.0);
    hub["rope_scaling"] = nullptr;
    EXPECT_EQ(hf_model_config_from_json(hub).rope_type, "rope");
    EXPECT_TRUE(hf_deepseek_v3_mtp_tensor("model.layers.4.eh_proj.weight", 4, 1));
    EXPECT_FALSE(hf_deepseek_v3_mtp_tensor("model.layers.5.eh_proj.weight", 4, 1));
    EXPECT_FALSE(hf_deepseek_v3_mtp_tensor("model.layers.4.eh_proj.weight", 4, 0));
    EXPECT_FALSE(hf_deepseek_v3_mtp_tensor("model.layers.3.mlp.gate.weight", 4, 1));
    EXPECT_FALSE(hf_deepseek_v3_mtp_tensor("model.norm.weight", 4, 1));
    auto refused = [&](const char* key, nlohmann::json value, const std::string& needle) {
      nlohmann::json bad = cfg;
      bad[key] = value;
      try {
        hf_model_config_from_json(bad);
        ADD_FAILURE() << "accepted " << key << " = " << value.dump();
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    };
    refused("rope_interleave", false, "rope_interleave");
    refused("rms_norm_eps", 1e-5, "rms_norm_eps");
    refused("num_key_value_heads", 2, "num_key_value_heads");
    refused("n_group", 3, "n_group");
    refused("norm_topk_prob", false, "norm_topk_prob");
    refused("hidden_act", "gelu", "hidden_act");
    refused("n_shared_experts", 0, "n_shared_experts");
    nlohmann::json long_ctx = cfg["rope_parameters"];
    long_ctx["original_max_position_embeddings"] = 8192;
    refused("rope_scaling", long_ctx, "original_max_position_embeddings");  // preferred
    // What DeepSeek-V3 cannot hold is refused on export, naming the flag.
    auto unexportable = [](ModelConfig c, const std::string& needle) {
      try {
        hf_model_type(c);
        ADD_FAILURE() << "exported: " << needle;
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    };
    ModelConfig base = deepseek().model;
    ASSERT_EQ(hf_model_type(base), "deepseek_v3");
    auto with = [&](auto change) { ModelConfig x = base; change(x); return x; };
    unexportable(with([](ModelConfig& x) { x.qk_layernorm = false; }), "--qk-layernorm");
    unexportable(with([](ModelConfig& x) { x.norm_epsilon = 1e-5; }), "--norm-epsilon");
    unexportable(with([](ModelConfig& x) { x.moe_shared_expert_intermediate_size = 36; }),
                 "--moe-shared-expert-intermediate-size");
    unexportable(with([](ModelConfig& x) { x.moe_layer_pattern = {1, 0, 1, 1}; }),
                 "--moe-layer-freq");
    unexportable(with([](ModelConfig& x) {
                   x.moe_router_score_function = "softmax";
                   x.moe_router_enable_expert_bias = false;
                 }),
                 "--moe-router-score-function");
  }();
  barrier();
}

// An MoE model with --qk-layernorm goes out as Qwen3-MoE and back, bitwise: a dense first layer
// (--moe-layer-freq) becomes mlp_only_layers, the router mlp.gate, each expert
// mlp.experts.{e}.gate_proj/up_proj/down_proj; --moe-router-pre-softmax is norm_topk_prob
// false. The config's sparsity keys read back into the same pattern, decoder_sparse_step too.
TEST(HfInterop, Qwen3MoeRoundTrip) {
  TrainConfig c = tiny();
  c.model.num_experts = 4;
  c.model.moe_router_topk = 2;
  c.model.moe_ffn_hidden_size = 24;
  c.model.moe_layer_pattern = {0, 1, 1, 1};
  c.model.moe_router_pre_softmax = true;
  c.model.qk_layernorm = true;
  c.layout.ep = 2;
  const std::string ck = trained(c, 4, "hfqwen3moe");  // ep 2 x dp 4 (edp 2)
  if (rank0()) [&] {
    hf_export_checkpoint(ck, ck + "/ex", {});
    nlohmann::json cfg = read_json(ck + "/ex/config.json");
    EXPECT_EQ(cfg["model_type"], "qwen3_moe");
    EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"Qwen3MoeForCausalLM"}));
    EXPECT_EQ(cfg["num_experts"], 4);
    EXPECT_EQ(cfg["num_experts_per_tok"], 2);
    EXPECT_EQ(cfg["moe_intermediate_size"], 24);
    EXPECT_EQ(cfg["intermediate_size"], 48);
    EXPECT_EQ(cfg["norm_topk_prob"], false);
    EXPECT_EQ(cfg["decoder_sparse_step"], 1);
    EXPECT_EQ(cfg["mlp_only_layers"], nlohmann::json::array({0}));
    const std::string f = ck + "/ex/model.safetensors";
    const nlohmann::json h = raw_header(f);
    EXPECT_EQ(h["model.layers.0.mlp.gate_proj.weight"]["shape"], nlohmann::json({48, 32}));
    EXPECT_FALSE(h.contains("model.layers.0.mlp.gate.weight"));
    EXPECT_EQ(h["model.layers.2.mlp.gate.weight"]["shape"], nlohmann::json({4, 32}));
    EXPECT_EQ(h["model.layers.2.mlp.experts.3.gate_proj.weight"]["shape"], nlohmann::json({24, 32}));
    EXPECT_EQ(h["model.layers.2.mlp.experts.3.down_proj.weight"]["shape"], nlohmann::json({32, 24}));
    EXPECT_EQ(h["model.layers.2.self_attn.q_norm.weight"]["shape"], nlohmann::json({8}));
    // metadata, embedding, norm; layer 0: 11 (Qwen3's); layers 1-3: 8 + gate + 4 x 3 experts
    EXPECT_EQ(h.size(), 1u + 1 + 1 + 11 + 3 * (8 + 1 + 12));
    const auto w = weights_of(ck);
    const at::Tensor fc1 = w.at("decoder.layers.2.mlp.experts.3.linear_fc1.weight");
    EXPECT_TRUE(at::equal(hf_tensor(f, "model.layers.2.mlp.experts.3.gate_proj.weight"), fc1.narrow(0, 0, 24)));
    EXPECT_TRUE(at::equal(hf_tensor(f, "model.layers.2.mlp.experts.3.up_proj.weight"), fc1.narrow(0, 24, 24)));
    hf_import_checkpoint(ck + "/ex", ck + "/im");
    const ModelConfig m = model_of(ck + "/im");
    EXPECT_TRUE(m.qk_layernorm);
    EXPECT_TRUE(m.moe_router_pre_softmax);
    EXPECT_EQ(m.moe_layer_pattern, (std::vector<int>{0, 1, 1, 1}));
    EXPECT_EQ(m.expert_ffn(), 24);
    EXPECT_EQ(m.ffn_hidden_size, 48);
    expect_same_weights(w, weights_of(ck + "/im"));
    // The sparsity keys as transformers reads them: (index + 1) % step, minus mlp_only_layers.
    cfg["mlp_only_layers"] = nlohmann::json::array({3});
    cfg["decoder_sparse_step"] = 2;
    EXPECT_EQ(hf_model_config_from_json(cfg).moe_layer_pattern, (std::vector<int>{0, 1, 0, 0}));
    cfg["mlp_only_layers"] = nlohmann::json::array();
    cfg["decoder_sparse_step"] = 1;
    cfg["norm_topk_prob"] = true;
    const ModelConfig all = hf_model_config_from_json(cfg);
    EXPECT_TRUE(all.moe_layer_pattern.empty());  // every layer MoE
    EXPECT_FALSE(all.moe_router_pre_softmax);
    cfg.erase("norm_topk_prob");  // Qwen3MoeConfig's default: false
    EXPECT_TRUE(hf_model_config_from_json(cfg).moe_router_pre_softmax);
    nlohmann::json bad = cfg;
    bad["decoder_sparse_step"] = 0;
    EXPECT_THROW(hf_model_config_from_json(bad), UsageError);
    bad = cfg;
    bad["mlp_only_layers"] = "0";
    EXPECT_THROW(hf_model_config_from_json(bad), UsageError);
    bad = cfg;
    bad.erase("moe_intermediate_size");
    EXPECT_THROW(hf_model_config_from_json(bad), UsageError);
    bad = cfg;
    bad["num_key_value_heads"] = nullptr;  // Qwen3MoeConfig has no fallback for null
    EXPECT_THROW(hf_model_config_from_json(bad), UsageError);
    bad = cfg;
    bad["num_experts_per_tok"] = 1;
    bad["norm_topk_prob"] = true;  // the expert weighs 1: weft's router needs pre-softmax there
    EXPECT_THROW(hf_model_config_from_json(bad), UsageError);
    bad["norm_topk_prob"] = false;
    EXPECT_TRUE(hf_model_config_from_json(bad).moe_router_pre_softmax);
    nlohmann::json alias = cfg;  // transformers' attribute name, and out-of-range dense indices
    alias.erase("num_experts");
    alias["num_local_experts"] = 4;
    alias["mlp_only_layers"] = nlohmann::json::array({4294967298LL, -1, 9, 1});  // 2^32 + 2 is not layer 2
    const ModelConfig a = hf_model_config_from_json(alias);
    EXPECT_EQ(a.num_experts, 4);
    EXPECT_EQ(a.moe_layer_pattern, (std::vector<int>{1, 0, 1, 1}));
    // What Qwen3-MoE cannot hold is refused on export, naming the flag.
    ModelConfig shared = m;
    shared.moe_shared_expert_intermediate_size = 16;
    EXPECT_THROW(hf_model_type(shared), UsageError);
    ModelConfig sigmoid = m;
    sigmoid.moe_router_score_function = "sigmoid";
    EXPECT_THROW(hf_model_type(sigmoid), UsageError);
  }();
  barrier();
}

}  // namespace
}  // namespace weft
