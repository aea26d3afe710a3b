// The checks that run before iteration 1 (train/preflight.h): writable directories are tested
// by writing (and left as found), --load must hold a checkpoint, the free-space check refuses what does not fit,
// and the checkpoint size it compares against (ckpt_bytes_on_rank) is what a save puts on
// disk, for fp32 and bf16 moments. Single rank, tiny model.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/expect_usage.h"
#include "support/tiny_config.h"
#include "weft/checkpoint/checkpoint.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"
#include "weft/train/preflight.h"
#include "weft/train/trainer.h"

namespace weft {
namespace {
namespace fs = std::filesystem;
using test::expect_usage;

std::string temp_dir() {
  char tmpl[] = "/tmp/weft-preflight-XXXXXX";
  return mkdtemp(tmpl);
}

TEST(Preflight, WritableDirLeavesNoTrace) {
  const std::string root = temp_dir();
  check_writable_dir(root + "/a/b/c", "--save");
  EXPECT_TRUE(fs::is_empty(root)) << "the directories it created were left behind";
  check_writable_dir(root, "--save");
  EXPECT_TRUE(fs::is_directory(root)) << "an existing directory was removed";
  EXPECT_TRUE(fs::is_empty(root)) << "the probe file was left behind";
  expect_usage([] { check_writable_dir("/proc/weft-x", "--save"); }, "--save /proc/weft-x");
  std::ofstream(root + "/file") << "x";
  expect_usage([&] { check_writable_dir(root + "/file", "--tensorboard-dir"); },
               "--tensorboard-dir " + root + "/file: exists and is not a directory");
  fs::remove_all(root);
}

TEST(Preflight, AppendableFileKeepsContent) {
  const std::string root = temp_dir();
  const std::string log = root + "/logs/run.jsonl";
  check_appendable_file(log, "--log-jsonl");
  EXPECT_TRUE(fs::is_empty(root)) << "the file or its directory were left behind";
  fs::create_directories(root + "/logs");
  std::ofstream(log) << "{\"iteration\": 1}\n";
  check_appendable_file(log, "--log-jsonl");
  EXPECT_EQ(fs::file_size(log), 17u);  // kept, not truncated
  expect_usage([&] { check_appendable_file(root, "--log-jsonl"); }, "is a directory");
  expect_usage([] { check_appendable_file("/proc/weft-x/log.jsonl", "--log-jsonl"); },
               "--log-jsonl /proc/weft-x/log.jsonl");
  fs::remove_all(root);
}

// One iteration of the tiny model on 2 layers (global batch 4, no evaluation) saving to `save`.
TrainConfig tiny(const std::string& save) {
  TrainConfig c;
  c.model = test::tiny_model(2);
  c.global_batch_size = 4;
  c.train_iters = 1;
  c.eval_interval = 0;
  c.quiet = true;
  c.save = save;
  return c;
}

// Tensor bytes on disk of one saved iteration: every safetensors file minus its header
// (8-byte length + JSON header).
int64_t data_bytes_on_disk(const std::string& iter_dir) {
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(iter_dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::ifstream f(e.path(), std::ios::binary);
    uint64_t header = 0;
    f.read(reinterpret_cast<char*>(&header), 8);
    total += static_cast<int64_t>(fs::file_size(e.path())) - 8 - static_cast<int64_t>(header);
  }
  return total;
}

TEST(Preflight, CheckpointBytesAreWhatASaveWrites) {
  const std::string root = temp_dir();
  LayoutConfig l;
  Mesh mesh(l);
  ProcessGroups groups(mesh, Backend::kMpi, MPI_COMM_SELF);
  int64_t fp32_bytes = 0;
  for (const char* moments : {"fp32", "bf16"}) {
    TrainConfig c = tiny(root + "/" + moments);
    if (std::string(moments) == "bf16") c.adam.exp_avg_dtype = c.adam.exp_avg_sq_dtype = at::kBFloat16;
    Trainer t(c, groups);
    const int64_t estimate = ckpt_bytes_on_rank(t.stage(), t.optimizer());
    t.train();
    const int64_t on_disk = data_bytes_on_disk(c.save + "/iter_0000001");
    EXPECT_EQ(estimate, on_disk) << moments << " moments";
    if (fp32_bytes == 0) {
      fp32_bytes = estimate;
    } else {
      // weights + master in fp32 (4 + 4 bytes) and two bf16 moments (2 + 2) instead of 4 + 4.
      EXPECT_EQ(estimate * 16, fp32_bytes * 12);
    }
  }
  fs::remove_all(root);
}

TEST(Preflight, FreeSpaceAndLoadDir) {
  const std::string root = temp_dir();
  const int64_t free = free_bytes(root);
  ASSERT_GT(free, 0);
  check_free_space(root, "--save", 1);
  expect_usage([&] { check_free_space(root, "--save", free + (int64_t{1} << 40)); },
               "--save " + root + ": one checkpoint needs");
  // A --save directory that the first save will create: its parent's filesystem counts.
  expect_usage([&] { check_free_space(root + "/not/yet", "--save", free + (int64_t{1} << 40)); },
               "--save " + root + "/not/yet: one checkpoint needs");

  expect_usage([&] { check_load_dir(root + "/none", -1, ""); },
               "--load " + root + "/none: no such directory");
  check_load_dir(root + "/none", -1, root + "/none");  // also --save: nothing saved yet
  expect_usage([&] { check_load_dir(root, -1, ""); }, "holds no checkpoint");
  // A real checkpoint of iteration 1: loads; another iteration does not.
  LayoutConfig l;
  Mesh mesh(l);
  ProcessGroups groups(mesh, Backend::kMpi, MPI_COMM_SELF);
  TrainConfig c = tiny(root + "/ck");
  Trainer(c, groups).train();
  check_load_dir(c.save, -1, "");
  check_load_dir(c.save, 1, "");
  expect_usage([&] { check_load_dir(c.save, 7, ""); }, "no checkpoint of iteration 7");
  std::ofstream(c.save + "/iter_0000001/metadata.json") << "{";
  expect_usage([&] { check_load_dir(c.save, -1, ""); }, "--load " + c.save + " (iteration 1)");
  fs::remove_all(root);
}

}  // namespace
}  // namespace weft
