// --async-save and save failures (issues 13, 14), under 2 MPI ranks:
// - the snapshot: an asynchronous save whose background write is held back until the live
//   state has trained one more step writes the same files, byte for byte, as a synchronous save
//   of the same iteration;
// - through the trainer: a run saving every iteration asynchronously, stopped at 2 and resumed,
//   writes every checkpoint byte for byte like a synchronous uninterrupted run, and its losses
//   and grad norms after the resume are bitwise equal;
// - a disk-full (ENOSPC) or EIO error on rank 1 while writing, sync or async: with
//   --exit-on-save-failure every rank throws naming the error and nothing new is listed; with
//   --no-exit-on-save-failure training goes on and later saves are listed; either way the
//   listed checkpoint loads and trains.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "ckpt_diff.h"
#include "support/job.h"
#include "support/tiny_config.h"
#include "weft/checkpoint/async_save.h"
#include "weft/checkpoint/checkpoint.h"
#include "weft/comm/process_groups.h"
#include "weft/core/remove_tree.h"

namespace weft {
namespace {

using test::diff_checkpoints;
using test::run_job;
namespace fs = std::filesystem;

// The tiny model on 2 layers in bf16.
TrainConfig small_config() {
  TrainConfig c =
      test::tiny_config({.num_layers = 2, .global_batch_size = 8, .train_iters = 4, .seed = 5});
  c.model.bf16 = true;
  return c;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// "" when directories a and b hold the same file names with the same bytes (rank 0 looks).
std::string diff_files(const std::string& a, const std::string& b) {
  if (test::world_rank() != 0) return "";
  auto names = [](const std::string& d) {
    std::set<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec)) out.insert(e.path().filename().string());
    return out;
  };
  const auto na = names(a), nb = names(b);
  if (na.empty()) return "no files in " + a;
  if (na != nb) return "different file names in " + a + " and " + b;
  std::string out;
  for (const auto& n : na)
    if (file_bytes(fs::path(a) / n) != file_bytes(fs::path(b) / n)) out += "differs: " + n + "\n";
  return out;
}

std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

TEST(AsyncSave, SnapshotWritesWhatASyncSaveWrites) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::shared_temp_dir("asyncsnap");
  TrainConfig c = small_config();
  c.layout.pp = 2;
  c.train_iters = 3;
  std::unique_ptr<AsyncCheckpointSaver> saver;
  std::atomic<bool> release{false};
  std::atomic<bool> writing{false};
  auto request = [&](const std::string& sub, Trainer& t) {
    SaveRequest req;
    req.dir = dir + "/" + sub;
    req.iteration = t.iteration();
    req.meta = {{"consumed_samples", t.consumed_samples()}};
    return req;
  };
  run_job(c, 2, false, [&](Trainer& t, const ProcessGroups& g) {
    if (t.iteration() == 2) {
      ckpt_save(request("sync", t), t.stage(), t.optimizer(), g);
      saver = std::make_unique<AsyncCheckpointSaver>(g);
      // Hold the background write back until the live state has taken step 3.
      saver->debug_before_write = [&] {
        writing = true;
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      };
      saver->start(request("async", t), t.stage(), t.optimizer());
      EXPECT_TRUE(saver->pending());
      EXPECT_EQ(saver->poll(), -1);  // held back: not committed
    } else if (t.iteration() == 3) {
      EXPECT_TRUE(writing.load());
      release = true;
      EXPECT_EQ(saver->finish(), 2);
      EXPECT_FALSE(saver->pending());
      saver.reset();
    }
  });
  EXPECT_EQ(diff_files(dir + "/sync/iter_0000002", dir + "/async/iter_0000002"), "");
  EXPECT_EQ(diff_checkpoints(dir + "/sync/iter_0000002", dir + "/async/iter_0000002"), "");
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) (void)weft::remove_tree(dir);
}

TEST(AsyncSave, ResumeIsBitwiseLikeSyncSave) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::shared_temp_dir("asyncresume");
  TrainConfig c = small_config();
  c.layout.pp = 2;
  c.save_interval = 1;
  TrainConfig a = c;  // synchronous, uninterrupted
  a.save = dir + "/sync";
  auto sa = run_job(a, 2);
  TrainConfig b1 = c;  // asynchronous, stopped after 2 and resumed
  b1.save = dir + "/async";
  b1.async_save = true;
  b1.exit_interval = 2;
  run_job(b1, 2);
  TrainConfig b2 = b1;
  b2.exit_interval = 0;
  b2.load = b1.save;
  auto sb = run_job(b2, 2);
  if (test::world_rank() < 2) {
    ASSERT_EQ(sa.size(), 4u);
    ASSERT_EQ(sb.size(), 2u);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(sa[2 + k].lm_loss, sb[k].lm_loss) << "iteration " << 3 + k;
      EXPECT_EQ(sa[2 + k].grad_norm, sb[k].grad_norm) << "iteration " << 3 + k;
    }
  }
  for (int it = 1; it <= 4; ++it) {
    const std::string name = ckpt_iter_dir_name(it);
    EXPECT_EQ(diff_files(a.save + "/" + name, b1.save + "/" + name), "") << name;
  }
  if (test::world_rank() == 0) {
    EXPECT_EQ(file_bytes(b1.save + "/latest_checkpointed_iteration.txt"), "4\n");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) (void)weft::remove_tree(dir);
}

struct FailureCase {
  bool async, exit_on_failure;
  const char* err;      // WEFT_FAULT suffix
  const char* message;  // strerror of it
};

void PrintTo(const FailureCase& c, std::ostream* os) {
  *os << (c.async ? "async" : "sync") << (c.exit_on_failure ? " exit " : " go on ") << c.err;
}

class SaveFailure : public ::testing::TestWithParam<FailureCase> {};

TEST_P(SaveFailure, PreviousStaysListedAndLoads) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const FailureCase& p = GetParam();
  const std::string dir = test::shared_temp_dir("savefail");
  TrainConfig c = small_config();
  c.train_iters = 3;
  c.save = dir;
  c.save_interval = 1;
  c.async_save = p.async;
  c.exit_on_save_failure = p.exit_on_failure;
  setenv("WEFT_FAULT", (std::string("checkpoint.shard_write:1:2:") + p.err).c_str(), 1);
  std::string err;
  auto stats = run_job(c, 2, false, nullptr, &err);
  unsetenv("WEFT_FAULT");
  const int latest = p.exit_on_failure ? 1 : 3;
  if (test::world_rank() < 2) {
    if (p.exit_on_failure) {
      EXPECT_NE(err.find("checkpoint save failed, nothing was listed: rank 1: "), std::string::npos)
          << err;
      EXPECT_NE(err.find(p.message), std::string::npos) << err;
      EXPECT_EQ(stats.size(), 0u);
    } else {
      EXPECT_EQ(err, "");
      EXPECT_EQ(stats.size(), 3u);
    }
  }
  if (test::world_rank() == 0) {
    std::set<std::string> want = {"iter_0000001", "latest_checkpointed_iteration.txt"};
    if (!p.exit_on_failure) want.insert("iter_0000003");
    EXPECT_EQ(listing(dir), want);  // no iter_0000002, no temporary directory
    EXPECT_EQ(file_bytes(dir + "/latest_checkpointed_iteration.txt"), fmt::format("{}\n", latest));
  }
  TrainConfig r = c;  // the listed checkpoint loads and trains
  r.load = dir;
  r.save = "";
  r.async_save = false;
  r.save_interval = 0;
  r.train_iters = latest + 1;
  std::string load_err;
  auto resumed = run_job(r, 2, false, nullptr, &load_err);
  if (test::world_rank() < 2) {
    EXPECT_EQ(load_err, "");
    ASSERT_EQ(resumed.size(), 1u);
    EXPECT_EQ(resumed[0].iteration, latest + 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) (void)weft::remove_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, SaveFailure,
    ::testing::Values(FailureCase{false, true, "enospc", "No space left on device"},
                      FailureCase{false, false, "eio", "Input/output error"},
                      FailureCase{true, true, "eio", "Input/output error"},
                      FailureCase{true, false, "enospc", "No space left on device"},
                      FailureCase{true, true, "enospc", "No space left on device"},
                      FailureCase{false, false, "enospc", "No space left on device"}),
    [](const auto& info) {
      return fmt::format("{}_{}_{}", info.param.async ? "async" : "sync",
                         info.param.exit_on_failure ? "exit" : "goon", info.param.err);
    });

}  // namespace
}  // namespace weft
