// The numbers of the training log: model FLOPs per token (train/flops.h) against hand
// computations for a dense, an MoE-with-MTP and a hybrid Mamba model (the dense, MoE and hybrid
// values also equal bench/gpu/mfu.py's for the same shapes), the MFU and ETA of TrainLog, the
// ETA format, and TFRecord framing against the record layout written out by hand.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "weft/checkpoint/crc32c.h"
#include "weft/model/hybrid.h"
#include "weft/train/flops.h"
#include "weft/train/tensorboard.h"
#include "weft/train/train_log.h"

namespace weft {
namespace {

ModelConfig tiny() {  // h 64, 4 heads of 16, 2 query groups, ffn 172, vocab 128, seq 32
  ModelConfig m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.ffn_hidden_size = 172;
  m.vocab_size = 128;
  m.seq_length = 32;
  return m;
}

// Per token, per layer: attention 64*(4+2*2)*16 (qkv) + 4*16*64 (proj) + 64 (norm) = 12352
// weights and 6*32*64 = 12288 score FLOPs; dense MLP 3*64*172 + 64 = 33088; output 128*64 =
// 8192. 6 * (2*(12352+33088) + 8192) + 2*12288 = 619008 (mfu.py --layers 2 ... says the same).
TEST(Flops, DenseByHand) { EXPECT_DOUBLE_EQ(model_flops_per_token(tiny()), 619008.0); }

// MoE (4 experts, top 2, expert ffn 96): active MLP 2*3*64*96 + 64*4 (router) + 64 = 37184;
// 6 * (2*(12352+37184) + 8192) + 2*12288 = 668160 (mfu.py --experts 4 --topk 2 --moe-ffn 96).
// A shared expert of 64 adds 3*64*64 = 12288 weights per layer; one MTP depth adds eh_proj
// 2*64*64 = 8192, three norms 192, the output layer again 8192 and one MoE transformer layer
// 12352 + 49472, with its 12288 score FLOPs:
// 6 * (2*61824 + 8192 + 8192 + 192 + 8192 + 61824) + 3*12288 = 1298304.
TEST(Flops, MoeSharedExpertAndMtpByHand) {
  ModelConfig m = tiny();
  m.num_experts = 4;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = 96;
  EXPECT_DOUBLE_EQ(model_flops_per_token(m), 668160.0);
  m.moe_shared_expert_intermediate_size = 64;
  m.mtp_num_layers = 1;
  EXPECT_DOUBLE_EQ(model_flops_per_token(m), 1298304.0);
}

// "M*-" with state 16, head dim 16 (8 heads, inner 128), 2 groups, chunk min(128, 32) = 32:
// Mamba weights 64*(2*128 + 2*2*16 + 8) + 128*64 + 64 = 29248, SSD 3*8*(2*32*16 + 2*32*16 +
// 4*16*16) = 73728; 6 * (29248 + 12352 + 33088 + 8192) + 73728 + 12288 = 583296 (mfu.py
// --pattern "M*-" --state 16 --head-dim 16 --mamba-groups 2 says the same).
TEST(Flops, HybridMambaByHand) {
  ModelConfig m = tiny();
  m.mamba_state_dim = 16;
  m.mamba_head_dim = 16;
  m.mamba_num_groups = 2;
  apply_hybrid_layer_pattern("M*-", &m);
  EXPECT_DOUBLE_EQ(model_flops_per_token(m), 583296.0);
}

TEST(Flops, DefaultPeak) {
  EXPECT_DOUBLE_EQ(default_peak_flops("cuda", true), 989e12);
  EXPECT_DOUBLE_EQ(default_peak_flops("cpu", true), 0.0);
}

TEST(TrainLog, EtaFormat) {
  EXPECT_EQ(format_eta(3723.4), "1h02m03s");
  EXPECT_EQ(format_eta(59.6), "0h01m00s");
  EXPECT_EQ(format_eta(90061), "25h01m01s");
  EXPECT_EQ(format_eta(-3), "0h00m00s");
}

TEST(TrainLog, MfuAndEta) {
  TrainConfig cfg;
  cfg.model = tiny();
  cfg.train_iters = 100;
  cfg.peak_tflops = 2e-6;  // 2e6 FLOP/s per device
  TrainLog log(cfg, /*world_size=*/4, /*writer_rank=*/false);
  IterationStats s;
  s.tokens_per_sec = 1000;
  s.global_batch = 16;
  // 619008 FLOPs/token * 1000 tokens/s / (4 devices * 2e6 FLOP/s) = 77.376
  EXPECT_DOUBLE_EQ(log.mfu(s), 619008.0 * 1000 / 8e6);
  // The mean of the last 10 step times, times the iterations left.
  for (int it = 1; it <= 12; ++it) {
    s.iteration = it;
    s.consumed_samples = 16 * it;
    s.ms = it <= 2 ? 10000 : 100;  // two slow first steps fall out of the window
    log.record(s);
  }
  EXPECT_DOUBLE_EQ(log.eta_seconds(), 88 * 0.1);
  EXPECT_NE(log.line_fields(s).find("MFU: 7737.6% | ETA: 0h00m09s |"), std::string::npos)
      << log.line_fields(s);
  cfg.peak_tflops = -1;  // CPU, no peak given: no MFU
  TrainLog cpu(cfg, 1, false);
  EXPECT_LT(cpu.mfu(s), 0);
  EXPECT_EQ(cpu.line_fields(s).find("MFU"), std::string::npos);
  EXPECT_NE(cpu.jsonl_line(s).find("\"mfu\": null"), std::string::npos);
}

// A skipped iteration's non-finite values are written as null: every --log-jsonl line stays
// JSON (weft plot and Python's json read it), and finite values keep all 17 digits.
TEST(TrainLog, JsonlLineIsJsonWithNonFiniteValues) {
  TrainConfig cfg;
  cfg.model = tiny();
  cfg.train_iters = 10;
  TrainLog log(cfg, 1, false);
  IterationStats s;
  s.iteration = 3;
  s.consumed_samples = 24;
  s.lm_loss = std::numeric_limits<double>::infinity();
  s.grad_norm = -std::numeric_limits<double>::quiet_NaN();
  s.aux_loss = 0.1;
  s.lr = 3e-4;
  s.ms = 12.5;
  s.skipped = true;
  log.record(s);
  const std::string line = log.jsonl_line(s);
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(line)) << line;
  EXPECT_TRUE(j["lm_loss"].is_null()) << line;
  EXPECT_TRUE(j["grad_norm"].is_null()) << line;
  EXPECT_EQ(j["aux_loss"].get<double>(), 0.1);
  EXPECT_EQ(j["lr"].get<double>(), 3e-4);
  EXPECT_EQ(j["iteration"].get<int>(), 3);
  EXPECT_EQ(j["consumed_samples"].get<int>(), 24);
  EXPECT_TRUE(j["skipped"].get<bool>());
  EXPECT_EQ(jsonl_number(0.1), "0.10000000000000001");
}

// The console line at --log-interval 3, as Megatron's training_log: a line at the run's first
// iteration (5, a resume) and at 6 and 9; the loss is the mean of the interval's iterations that
// were not skipped, the time the mean of all of them, the skipped/nan counts the interval's, the
// grad norm and learning rate the iteration's. The first line (5) does not start an interval:
// 6's line covers 5 and 6. An interval with every iteration skipped (10..12) prints no loss.
TEST(TrainLog, ConsoleLineAveragesTheInterval) {
  TrainConfig cfg;
  cfg.model = tiny();
  cfg.train_iters = 12;
  cfg.log_interval = 3;
  cfg.global_batch_size = 4;
  TrainLog log(cfg, 1, false);
  auto line = [&](int it, double loss, double ms, bool skipped) {
    IterationStats s;
    s.iteration = it;
    s.global_batch = 4;
    s.lm_loss = skipped ? std::numeric_limits<double>::quiet_NaN() : loss;
    s.ms = ms;
    s.grad_norm = it;
    s.lr = it * 1e-4;
    s.skipped = skipped;
    log.record(s);
    return log.console_line(s, it == 5, 1.0);
  };
  auto field = [](const std::string& l, const std::string& key) {
    const size_t at = l.find(key);
    return at == std::string::npos ? std::string("<none>") : l.substr(at, l.find(" |", at) - at);
  };
  const std::string l5 = line(5, 2.0, 10, false);
  EXPECT_EQ(field(l5, "lm loss"), "lm loss: 2.000000E+00") << l5;
  const std::string l6 = line(6, 4.0, 20, false);
  EXPECT_EQ(field(l6, "lm loss"), "lm loss: 3.000000E+00") << l6;  // (2 + 4) / 2
  EXPECT_EQ(field(l6, "elapsed time per iteration (ms)"), "elapsed time per iteration (ms): 15.0");
  EXPECT_EQ(line(7, 1.0, 30, false), "");
  EXPECT_EQ(line(8, 0.0, 40, true), "");
  const std::string l9 = line(9, 5.0, 50, false);
  EXPECT_EQ(field(l9, "lm loss"), "lm loss: 3.000000E+00") << l9;  // (1 + 5) / 2, 8 skipped
  EXPECT_EQ(field(l9, "elapsed time per iteration (ms)"), "elapsed time per iteration (ms): 40.0");
  EXPECT_EQ(field(l9, "throughput (tokens/s)"), "throughput (tokens/s): 3200.0");  // 4*32/0.04
  EXPECT_EQ(field(l9, "number of skipped iterations"), "number of skipped iterations:   1");
  EXPECT_EQ(field(l9, "number of nan iterations"), "number of nan iterations:   1");
  EXPECT_EQ(field(l9, "grad norm"), "grad norm: 9.000");
  EXPECT_EQ(field(l9, "learning rate"), "learning rate: 9.000000E-04");
  EXPECT_EQ(l9.back(), '\n');
  // An interval of skipped iterations only: no loss to average, so none is printed (Megatron's
  // line prints a loss only where its mean is > 0), and the interval's three are counted.
  EXPECT_EQ(line(10, 0.0, 10, true), "");
  EXPECT_EQ(line(11, 0.0, 10, true), "");
  const std::string l12 = line(12, 0.0, 10, true);
  EXPECT_EQ(field(l12, "lm loss"), "<none>") << l12;
  EXPECT_EQ(field(l12, "number of skipped iterations"), "number of skipped iterations:   3");
  EXPECT_EQ(field(l12, "grad norm"), "grad norm: 12.000");
}

// TFRecord: uint64 LE length, masked crc32c of those 8 bytes, data, masked crc32c of the data,
// with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
TEST(TfRecord, FrameLayout) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  auto mask = [](uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; };
  const std::string data = "hello";
  const std::string rec = tfrecord_frame(data);
  ASSERT_EQ(rec.size(), 8 + 4 + 5 + 4u);
  const unsigned char len[8] = {5, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::memcmp(rec.data(), len, 8), 0);
  uint32_t c1, c2;
  std::memcpy(&c1, rec.data() + 8, 4);
  std::memcpy(&c2, rec.data() + 17, 4);
  EXPECT_EQ(c1, mask(crc32c(len, 8)));
  EXPECT_EQ(rec.substr(12, 5), data);
  EXPECT_EQ(c2, mask(crc32c(data.data(), 5)));
}

}  // namespace
}  // namespace weft
