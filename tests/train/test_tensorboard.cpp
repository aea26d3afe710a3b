// `weft train --tensorboard-dir` read back by an independent reader. The test runs the weft
// command (2 ranks, pipeline 2, a tiny MoE model with MTP, mock data with validation) and then
// parses the event file without weft's code or weft's .proto files: the TFRecord framing and
// both masked CRC-32Cs by hand, the Event and Summary messages with protobuf's UnknownFieldSet
// against the field numbers and wire types of TensorFlow's event.proto/summary.proto (Event:
// wall_time 1 double, step 2 int64, file_version 3 string, summary 5; Summary: value 1;
// Value: tag 1 string, simple_value 2 float). Every scalar is checked against the --log-jsonl
// of the same run. Bad --tensorboard-dir values exit 2 naming the flag, on every rank.
#include <google/protobuf/unknown_field_set.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "weft/checkpoint/crc32c.h"

namespace fs = std::filesystem;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

namespace {

uint32_t masked_crc(const void* p, size_t n) {
  const uint32_t c = weft::crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

uint64_t le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

uint32_t le32(const unsigned char* p) {
  return p[0] | p[1] << 8 | p[2] << 16 | uint32_t(p[3]) << 24;
}

// The records of a TFRecord file; sets *error on a bad CRC or a torn record.
std::vector<std::string> read_records(const std::string& bytes, std::string* error) {
  std::vector<std::string> out;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) return *error = "torn header", out;
    const uint64_t n = le64(p + at);
    if (le32(p + at + 8) != masked_crc(p + at, 8)) return *error = "length crc", out;
    if (bytes.size() - at - 12 < n + 4) return *error = "torn record", out;
    if (le32(p + at + 12 + n) != masked_crc(p + at + 12, n)) return *error = "data crc", out;
    out.push_back(bytes.substr(at + 12, n));
    at += 16 + n;
  }
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;
};

// Decodes an Event by field number; fails the test on a wire type the specification does not
// give that field.
Event decode(const std::string& record) {
  Event e;
  UnknownFieldSet ev;
  EXPECT_TRUE(ev.ParseFromString(record));
  for (int i = 0; i < ev.field_count(); ++i) {
    const UnknownField& f = ev.field(i);
    switch (f.number()) {
      case 1:
        EXPECT_EQ(f.type(), UnknownField::TYPE_FIXED64) << "wall_time is a double";
        {
          const uint64_t bits = f.fixed64();
          std::memcpy(&e.wall_time, &bits, 8);
        }
        break;
      case 2:
        EXPECT_EQ(f.type(), UnknownField::TYPE_VARINT) << "step is an int64";
        e.step = static_cast<int64_t>(f.varint());
        break;
      case 3:
        EXPECT_EQ(f.type(), UnknownField::TYPE_LENGTH_DELIMITED);
        e.file_version = f.length_delimited();
        break;
      case 5: {
        EXPECT_EQ(f.type(), UnknownField::TYPE_LENGTH_DELIMITED);
        UnknownFieldSet summary;
        EXPECT_TRUE(summary.ParseFromString(f.length_delimited()));
        for (int j = 0; j < summary.field_count(); ++j) {
          EXPECT_EQ(summary.field(j).number(), 1) << "Summary has only `repeated Value value = 1`";
          UnknownFieldSet value;
          EXPECT_TRUE(value.ParseFromString(summary.field(j).length_delimited()));
          std::string tag;
          float v = NAN;
          bool has_value = false;
          for (int k = 0; k < value.field_count(); ++k) {
            const UnknownField& g = value.field(k);
            if (g.number() == 1) tag = g.length_delimited();
            if (g.number() == 2) {
              EXPECT_EQ(g.type(), UnknownField::TYPE_FIXED32) << "simple_value is a float";
              const uint32_t bits = g.fixed32();
              std::memcpy(&v, &bits, 4);
              has_value = true;
            }
          }
          EXPECT_TRUE(has_value) << tag << " has no simple_value (a zero must be written too)";
          e.values.emplace_back(tag, v);
        }
        break;
      }
      default:
        ADD_FAILURE() << "unexpected Event field " << f.number();
    }
  }
  return e;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run(const std::string& cmd, const fs::path& log) {
  const int rc = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

const std::string kTrain = std::string(WEFT_MPIRUN_CMD) + " -np 2 " + WEFT_BIN +
                           " train --threads 1 --pipeline-model-parallel-size 2 "
                           "--num-layers 2 --hidden-size 32 --ffn-hidden-size 64 "
                           "--num-attention-heads 4 --group-query-attention --num-query-groups 2 "
                           "--seq-length 16 "
                           "--vocab-size 64 --micro-batch-size 2 --global-batch-size 4 ";

class TensorBoardRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("weft_tb_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string cmd = kTrain +
        "--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --moe-aux-loss-coeff 0.01 "
        "--mtp-num-layers 1 --train-iters 6 --eval-interval 3 --eval-iters 1 --peak-tflops 0.001 "
        "--tensorboard-log-interval 2 --tensorboard-dir " + (dir_ / "tb").string() +
        " --log-jsonl " + (dir_ / "run.jsonl").string();
    rc_ = run(cmd, dir_ / "train.log");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static fs::path dir_;
  static int rc_;
};
fs::path TensorBoardRun::dir_;
int TensorBoardRun::rc_ = -1;

TEST_F(TensorBoardRun, ScalarsMatchTheJsonl) {
  ASSERT_EQ(rc_, 0) << slurp(dir_ / "train.log");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir_ / "tb")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u) << "one event file, written by one rank";
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u) << files[0];

  std::string error;
  const std::vector<std::string> records = read_records(slurp(files[0]), &error);
  ASSERT_EQ(error, "");
  ASSERT_GT(records.size(), 1u);
  const Event first = decode(records[0]);
  EXPECT_EQ(first.file_version, "brain.Event:2");
  EXPECT_TRUE(first.values.empty());
  // (tag, step) -> value; each pair written once.
  std::map<std::pair<std::string, int64_t>, float> scalars;
  double last_wall = first.wall_time;
  EXPECT_GT(first.wall_time, 1.7e9);  // seconds since the epoch, a date after 2023
  for (size_t i = 1; i < records.size(); ++i) {
    const Event e = decode(records[i]);
    EXPECT_GE(e.wall_time, last_wall);
    last_wall = e.wall_time;
    ASSERT_EQ(e.values.size(), 1u);
    const auto& [tag, value] = e.values[0];
    EXPECT_TRUE(scalars.emplace(std::make_pair(tag, e.step), value).second)
        << tag << " at step " << e.step << " written twice";
  }
  auto at = [&](const std::string& tag, int64_t step) {
    auto it = scalars.find({tag, step});
    if (it == scalars.end()) {
      ADD_FAILURE() << "no '" << tag << "' at step " << step;
      return NAN;
    }
    return it->second;
  };
  auto near = [](double want) { return std::abs(want) * 1e-6 + 1e-30; };  // float storage

  std::ifstream jsonl(dir_ / "run.jsonl");
  std::string line;
  int iterations = 0, validations = 0;
  std::set<int64_t> logged;
  while (std::getline(jsonl, line)) {
    const auto j = nlohmann::json::parse(line);
    const int64_t it = j.at("iteration");
    if (j.contains("test_lm_loss")) continue;  // console and JSONL only, not TensorBoard
    if (j.contains("valid_lm_loss")) {
      ++validations;
      const double v = j.at("valid_lm_loss"), ppl = j.at("valid_lm_loss_ppl");
      EXPECT_NEAR(at("lm loss validation", it), v, near(v));
      EXPECT_NEAR(at("lm loss validation ppl", it), ppl, near(ppl));
      EXPECT_NEAR(at("lm loss validation vs samples", it * 4), v, near(v));
      continue;
    }
    ++iterations;
    if (it % 2 != 0) {  // --tensorboard-log-interval 2
      EXPECT_EQ(scalars.count({"lm loss", it}), 0u) << "iteration " << it << " logged";
      continue;
    }
    logged.insert(it);
    const int64_t samples = j.at("consumed_samples");
    EXPECT_EQ(samples, it * 4);
    for (auto [tag, key] : std::vector<std::pair<std::string, std::string>>{
             {"lm loss", "lm_loss"}, {"grad-norm", "grad_norm"}, {"learning-rate", "lr"},
             {"tokens-per-sec", "tokens_per_sec"}, {"mfu", "mfu"},
             {"load_balancing_loss", "aux_loss"}, {"mtp loss", "mtp_loss"}}) {
      const double want = j.at(key);
      EXPECT_NEAR(at(tag, it), want, near(want)) << tag << " at iteration " << it;
    }
    for (auto [tag, key] : std::vector<std::pair<std::string, std::string>>{
             {"lm loss vs samples", "lm_loss"}, {"grad-norm vs samples", "grad_norm"},
             {"learning-rate vs samples", "lr"}}) {
      const double want = j.at(key);
      EXPECT_NEAR(at(tag, samples), want, near(want)) << tag << " at " << samples << " samples";
    }
    const double ms = j.at("ms"), mfu = j.at("mfu");
    EXPECT_NEAR(at("iteration-time", it), ms / 1000, near(ms / 1000));
    EXPECT_NEAR(at("throughput", it), mfu * 0.001, near(mfu * 0.001));  // TFLOP/s per device
    EXPECT_EQ(at("batch-size", it), 4.0f);
    EXPECT_EQ(at("skipped-iterations", it), 0.0f);
    EXPECT_EQ(at("nan-iterations", it), 0.0f);
    EXPECT_GT(at("mem-max-allocated-bytes", it), 1e6);
  }
  EXPECT_EQ(iterations, 6);
  EXPECT_EQ(validations, 2);  // at iterations 3 and 6
  EXPECT_EQ(logged, (std::set<int64_t>{2, 4, 6}));
  std::set<std::string> tags;
  for (const auto& [key, v] : scalars) tags.insert(key.first);
  const std::set<std::string> want = {
      "learning-rate", "learning-rate vs samples", "batch-size", "batch-size vs samples",
      "lm loss", "lm loss vs samples", "load_balancing_loss", "mtp loss", "grad-norm",
      "grad-norm vs samples", "iteration-time", "throughput", "tokens-per-sec", "mfu",
      "mem-max-allocated-bytes", "skipped-iterations", "nan-iterations", "lm loss validation",
      "lm loss validation vs samples", "lm loss validation ppl"};
  EXPECT_EQ(tags, want);
}

// The reader's CRC checks can fail: one flipped byte in a copy of the file is found.
TEST_F(TensorBoardRun, ReaderFindsACorruptedByte) {
  ASSERT_EQ(rc_, 0);
  std::string bytes = slurp(fs::directory_iterator(dir_ / "tb")->path());
  std::string error;
  ASSERT_EQ(read_records(bytes, &error).size() > 1, true);
  bytes[bytes.size() / 2] ^= 0x01;
  read_records(bytes, &error);
  EXPECT_FALSE(error.empty());
}

// Bad --tensorboard-dir, --tensorboard-log-interval, --peak-tflops values: exit 2, one line
// naming the flag, from a 2-rank run (no hang).
TEST(TensorBoardFlags, BadInputExitsTwo) {
  const fs::path dir = fs::temp_directory_path() / ("weft_tb_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "file") << "not a directory";
  const fs::path log = dir / "log";
  const std::string under_a_file = (dir / "file" / "tb").string();
  EXPECT_EQ(run(kTrain + "--train-iters 1 --tensorboard-dir " + under_a_file, log), 2);
  EXPECT_NE(slurp(log).find("--tensorboard-dir"), std::string::npos) << slurp(log);
  EXPECT_EQ(run(kTrain + "--train-iters 1 --tensorboard-log-interval 0", log), 2);
  EXPECT_NE(slurp(log).find("--tensorboard-log-interval"), std::string::npos) << slurp(log);
  EXPECT_EQ(run(kTrain + "--train-iters 1 --peak-tflops -2", log), 2);
  EXPECT_NE(slurp(log).find("--peak-tflops"), std::string::npos) << slurp(log);
  fs::remove_all(dir);
}

}  // namespace
