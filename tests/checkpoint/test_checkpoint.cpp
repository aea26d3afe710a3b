// Checkpoint tests under 8 MPI ranks (invariants 1-4, 9):
// - bitwise restart: 3 iterations saving at 2, versus 2 iterations, save, restart, 1 more; the
//   third iteration's loss and grad norm and the final checkpoints are bitwise equal, for
//   pp1 dp1, pp2 dp4, pp4 dp2 uneven and HSDP, tied, bf16 compute, fp32 and then bf16 moments;
// - every saved tensor is restored bitwise: load, save again at once, compare;
// - any-layout resume: a pp2 dp4 checkpoint continues on other layouts with fp32 parity, and a
//   matrix of other sources (uneven stages with bf16 moments, HSDP untied, empty shards);
// - refusals, each with its own message: missing keys, unexpected keys, a stage-local
//   (colliding) checkpoint, a truncated file, a flipped byte, a different model.
#include <gtest/gtest.h>

#include <ATen/Functions.h>

#include <filesystem>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

#include "ckpt_diff.h"
#include "support/job.h"
#include "support/tiny_config.h"
#include "weft/checkpoint/checkpoint.h"
#include "weft/checkpoint/format.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"
#include "weft/core/remove_tree.h"

namespace weft {
namespace {

using test::diff_checkpoints;
using test::run_job;
namespace fs = std::filesystem;

TrainConfig small_config() {
  return test::tiny_config(
      {.num_layers = 6, .global_batch_size = 16, .train_iters = 3, .seed = 11});
}

struct Layout {
  const char* name;
  int world, pp, outer, first, last;
};
const Layout kLayouts[] = {{"pp1_dp1", 1, 1, 1, -1, -1},
                           {"pp2_dp4", 8, 2, 1, -1, -1},
                           {"pp4_dp2_uneven", 8, 4, 1, 1, 1},
                           {"pp2_hsdp2x2", 8, 2, 2, -1, -1}};

TrainConfig with_layout(TrainConfig c, const Layout& l) {
  c.layout.pp = l.pp;
  c.layout.dp_outer = l.outer;
  c.first_stage_layers = l.first;
  c.last_stage_layers = l.last;
  return c;
}

class Restart : public ::testing::TestWithParam<bool> {};

TEST_P(Restart, BitwiseOnSameLayout) {
  const bool bf16_moments = GetParam();
  for (const Layout& l : kLayouts) {
    if (l.world > test::world_size()) continue;
    SCOPED_TRACE(l.name);
    const std::string dir = test::shared_temp_dir("restart");
    TrainConfig c = with_layout(small_config(), l);
    c.model.bf16 = true;
    if (bf16_moments) {
      c.adam.exp_avg_dtype = at::kBFloat16;
      c.adam.exp_avg_sq_dtype = at::kBFloat16;
    }
    // A: uninterrupted, saving at 2 and at the end.
    TrainConfig a = c;
    a.save = dir + "/a";
    a.save_interval = 2;
    auto sa = run_job(a, l.world);
    // B: 2 iterations (exit), then resume for the third.
    TrainConfig b1 = c;
    b1.save = dir + "/b";
    b1.exit_interval = 2;
    run_job(b1, l.world);
    TrainConfig b2 = c;
    b2.load = b2.save = dir + "/b";
    auto sb = run_job(b2, l.world);
    if (test::world_rank() < l.world) {
      ASSERT_EQ(sa.size(), 3u);
      ASSERT_EQ(sb.size(), 1u);
      EXPECT_EQ(sb[0].iteration, 3);
      EXPECT_EQ(sa[2].lm_loss, sb[0].lm_loss) << "third loss not bitwise equal";
      EXPECT_EQ(sa[2].grad_norm, sb[0].grad_norm) << "third grad norm not bitwise equal";
    }
    EXPECT_EQ(diff_checkpoints(dir + "/a/iter_0000003", dir + "/b/iter_0000003"), "");
    EXPECT_EQ(diff_checkpoints(dir + "/a/iter_0000002", dir + "/b/iter_0000002"), "");
    // Everything saved is restored bitwise: load iteration 2 and save it again at once.
    EXPECT_EQ(test::diff_resaved(c, l.world, dir + "/b", 2, dir + "/c"), "");
    if (test::world_rank() == 0) (void)weft::remove_tree(dir);
  }
}

INSTANTIATE_TEST_SUITE_P(Moments, Restart, ::testing::Bool(), [](const auto& info) {
  return std::string(info.param ? "bf16_moments" : "fp32_moments");
});

// A pp2 dp4 checkpoint resumes on other layouts; fp32 losses match the uninterrupted run.
TEST(Reshard, AnyLayoutResume) {
  if (test::world_size() < 8) GTEST_SKIP() << "needs 8 ranks";
  const std::string dir = test::shared_temp_dir("reshard");
  TrainConfig c = with_layout(small_config(), kLayouts[1]);
  c.train_iters = 4;
  TrainConfig a = c;
  auto ref = run_job(a, 8);
  TrainConfig b = c;
  b.save = dir;
  b.exit_interval = 2;
  run_job(b, 8);
  const Layout targets[] = {{"pp1_dp1", 1, 1, 1, -1, -1},
                            {"pp4_dp2_uneven", 8, 4, 1, 1, 1},
                            {"pp3_dp2", 6, 3, 1, -1, -1},
                            {"pp1_hsdp2x2", 4, 1, 2, -1, -1}};
  for (const Layout& l : targets) {
    SCOPED_TRACE(l.name);
    TrainConfig r = with_layout(c, l);
    r.load = dir;
    auto got = run_job(r, l.world);
    if (test::world_rank() < l.world) {
      ASSERT_EQ(got.size(), 2u);
      for (int i = 0; i < 2; ++i) {
        EXPECT_NEAR(got[i].lm_loss, ref[2 + i].lm_loss, 1e-5 * ref[2 + i].lm_loss);
        EXPECT_NEAR(got[i].grad_norm, ref[2 + i].grad_norm, 1e-5 * ref[2 + i].grad_norm);
      }
    }
  }
  if (test::world_rank() == 0) (void)weft::remove_tree(dir);
}

// Resharding from more than one kind of source: each source layout and setting saves at
// iteration 2 of 4 and resumes on two other layouts, whose iterations 3 and 4 must match the
// source's uninterrupted run (fp32 compute, so 1e-5 covers the layouts' summation orders):
// uneven stages with bf16 moments, HSDP with untied embeddings, and dp 8 over a model of hidden
// 4, whose 1-D weights (4 rows) leave half of the ranks with empty shards.
TEST(Reshard, MatrixOfSources) {
  if (test::world_size() < 8) GTEST_SKIP() << "needs 8 ranks";
  struct Source {
    const char* name;
    Layout layout;
    bool bf16_moments, untied, hidden4;
    Layout targets[2];
  };
  const Source sources[] = {
      {"pp4_dp2_uneven_bf16_moments", kLayouts[2], true, false, false,
       {{"pp1_dp1", 1, 1, 1, -1, -1}, {"pp3_dp2", 6, 3, 1, -1, -1}}},
      {"pp2_hsdp2x2_untied", kLayouts[3], false, true, false,
       {{"pp4_dp2_uneven", 8, 4, 1, 1, 1}, {"pp1_dp4", 4, 1, 1, -1, -1}}},
      {"pp1_dp8_empty_shards", {"pp1_dp8", 8, 1, 1, -1, -1}, false, false, true,
       {{"pp2_dp4", 8, 2, 1, -1, -1}, {"pp1_dp1", 1, 1, 1, -1, -1}}},
  };
  for (const Source& src : sources) {
    SCOPED_TRACE(src.name);
    const std::string dir = test::shared_temp_dir(std::string("matrix_") + src.name);
    TrainConfig c = with_layout(small_config(), src.layout);
    c.train_iters = 4;
    if (src.bf16_moments) {
      c.adam.exp_avg_dtype = at::kBFloat16;
      c.adam.exp_avg_sq_dtype = at::kBFloat16;
    }
    c.model.untie_embeddings_and_output_weights = src.untied;
    if (src.hidden4) {
      c.model.hidden_size = 4;
      c.model.num_attention_heads = 1;
      c.model.num_query_groups = 1;
      c.model.ffn_hidden_size = 6;
    }
    const auto ref = run_job(c, src.layout.world);
    TrainConfig save = c;
    save.save = dir;
    save.exit_interval = 2;
    run_job(save, src.layout.world);
    for (const Layout& l : src.targets) {
      SCOPED_TRACE(l.name);
      TrainConfig r = with_layout(c, l);
      r.load = dir;
      const auto got = run_job(r, l.world);
      if (test::world_rank() >= l.world) continue;
      ASSERT_EQ(got.size(), 2u);
      for (int i = 0; i < 2; ++i) {
        EXPECT_NEAR(got[i].lm_loss, ref[2 + i].lm_loss, 1e-5 * ref[2 + i].lm_loss) << "iteration " << 3 + i;
        EXPECT_NEAR(got[i].grad_norm, ref[2 + i].grad_norm, 1e-5 * ref[2 + i].grad_norm) << "iteration " << 3 + i;
      }
    }
    if (test::world_rank() == 0) (void)weft::remove_tree(dir);
  }
}

// Flips one bit of the byte 3 from the end of `file` (inside the last tensor's data).
void flip_byte_near_end(const std::string& file) {
  std::fstream s(file, std::ios::in | std::ios::out | std::ios::binary);
  s.seekg(-3, std::ios::end);
  char ch;
  s.read(&ch, 1);
  ch ^= 0x10;
  s.seekp(-3, std::ios::end);
  s.write(&ch, 1);
}

// diff_checkpoints itself can fail: a flipped byte (the chunk no longer reads), a changed
// optimizer step count in the metadata, a missing key, and a checkpoint compared with itself.
TEST(DiffCheckpoints, FailsOnPlantedDifferences) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::shared_temp_dir("diff");
  TrainConfig c = small_config();
  c.train_iters = 1;
  c.save = dir + "/a";
  run_job(c, 2);
  const std::string a = dir + "/a/iter_0000001";
  if (test::world_rank() == 0) {
    EXPECT_EQ(diff_checkpoints(a, a), "");
    fs::copy(dir + "/a", dir + "/flip", fs::copy_options::recursive);
    flip_byte_near_end(dir + "/flip/iter_0000001/shard_00001.safetensors");
    EXPECT_NE(diff_checkpoints(a, dir + "/flip/iter_0000001").find("unreadable in B"),
              std::string::npos);

    fs::copy(dir + "/a", dir + "/meta", fs::copy_options::recursive);
    const std::string m = dir + "/meta/iter_0000001/metadata.json";
    nlohmann::json j = nlohmann::json::parse(std::ifstream(m));
    j["optimizer"]["steps"] = 7;
    std::ofstream(m) << j.dump();
    EXPECT_NE(diff_checkpoints(a, dir + "/meta/iter_0000001").find("metadata differs: optimizer"),
              std::string::npos);

    nlohmann::json k = nlohmann::json::parse(std::ifstream(m));
    k["optimizer"]["steps"] = 1;
    k["tensors"].erase("decoder.final_layernorm.weight");
    std::ofstream(m) << k.dump();
    EXPECT_NE(diff_checkpoints(a, dir + "/meta/iter_0000001")
                  .find("missing in B: decoder.final_layernorm.weight"),
              std::string::npos);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) (void)weft::remove_tree(dir);
}

// Runs a load of `dir` with config `c` on `world` ranks; returns the error every member saw.
std::string load_error(TrainConfig c, int world, const std::string& dir) {
  c.load = dir;
  c.train_iters = 0;
  std::string err;
  run_job(c, world, false, nullptr, &err);
  return err;
}

void expect_refused(const std::string& err, const std::string& needle) {
  if (test::world_rank() == 0 || !err.empty()) {
    EXPECT_NE(err.find(needle), std::string::npos) << "error was: '" << err << "'";
  }
}

TEST(Refusals, EachWithItsOwnMessage) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::shared_temp_dir("refuse");
  TrainConfig c = small_config();
  c.train_iters = 1;
  c.save = dir + "/good";
  run_job(c, 2);
  const std::string good = dir + "/good";
  TrainConfig more = c, fewer = c, wider = c;
  more.model.num_layers = 8;
  fewer.model.num_layers = 4;
  wider.model.hidden_size = 64;
  expect_refused(load_error(more, 2, good), "expects are not in it: decoder.layers.6");
  TrainConfig fewer_strict = fewer;
  fewer_strict.strictness = "raise_all";
  expect_refused(load_error(fewer_strict, 2, good),
                 "key(s) that nothing in this model loads: decoder.layers.4");
  expect_refused(load_error(wider, 2, good), "has shape [64,32], the model expects [64,64]");
  // The default (Megatron's assume_ok_unexpected) loads the overlapping layers of a larger
  // checkpoint.
  EXPECT_EQ(load_error(fewer, 2, good), "");

  // Stage-local names: two stages write layer 0; the save itself refuses, and a checkpoint
  // forced past that check is refused on load.
  TrainConfig pp = c;
  pp.layout.pp = 2;
  pp.save = "";
  pp.train_iters = 0;
  std::string save_err;
  run_job(pp, 2, false, nullptr, nullptr, [&](Trainer& t, const ProcessGroups& g) {
    SaveRequest req;
    req.dir = dir + "/local";
    req.iteration = 1;
    req.debug_stage_local_names = true;
    try {
      ckpt_save(req, t.stage(), t.optimizer(), g);
    } catch (const Error& e) {
      save_err = e.what();
    }
    req.debug_skip_coverage_check = true;
    ckpt_save(req, t.stage(), t.optimizer(), g);
  });
  if (test::world_rank() < 2) {
    EXPECT_NE(save_err.find("overlap"), std::string::npos) << save_err;
  }
  expect_refused(load_error(fewer, 2, dir + "/local"), "overlap");

  // Corruption: a flipped byte in a tensor, then a truncated file.
  if (test::world_rank() == 0) {
    fs::copy(good, dir + "/flip", fs::copy_options::recursive);
    fs::copy(good, dir + "/trunc", fs::copy_options::recursive);
    flip_byte_near_end(dir + "/flip/iter_0000001/shard_00001.safetensors");
    const std::string t = dir + "/trunc/iter_0000001/shard_00000.safetensors";
    fs::resize_file(t, fs::file_size(t) / 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_refused(load_error(c, 2, dir + "/flip"), "checksum mismatch for key");
  expect_refused(load_error(c, 2, dir + "/flip"), "shard_00001.safetensors");
  expect_refused(load_error(c, 2, dir + "/trunc"), "shard_00000.safetensors");
  // Missing checkpoint step.
  TrainConfig step = c;
  step.ckpt_step = 7;
  expect_refused(load_error(step, 2, good), "iter_0000007/metadata.json: not found");
  if (test::world_rank() == 0) (void)weft::remove_tree(dir);
}

// Strictness modes (checkpoint.h): a 6-layer checkpoint loaded by an 8-layer model (missing
// keys) and by a 4-layer model (unexpected keys) raises or loads as each mode documents, and
// logs (rank 0, stderr) exactly where the mode says so.
TEST(Strictness, EachModeRaisesOrLoadsAsDocumented) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::shared_temp_dir("strict");
  TrainConfig c = small_config();
  c.train_iters = 1;
  c.save = dir;
  run_job(c, 2);
  TrainConfig more = c, fewer = c;
  more.model.num_layers = 8;   // decoder.layers.6-7 missing from the checkpoint
  fewer.model.num_layers = 4;  // decoder.layers.4-5 unexpected
  more.save = fewer.save = "";
  more.eval_interval = fewer.eval_interval = 0;  // a load that succeeds would evaluate at exit
  struct Mode {
    const char* name;
    bool raise_missing, log_missing, raise_unexpected, log_unexpected;
  };
  // Megatron's words (checkpoint.h): the 8-layer model's keys absent from the checkpoint are
  // "unexpected" (here `missing`), the 4-layer model's unused checkpoint keys "missing".
  const Mode modes[] = {{"raise_all", true, false, true, false},
                        {"raise_unexpected", true, false, false, false},
                        {"log_all", false, true, false, true},
                        {"return_all", false, true, false, true},
                        {"log_unexpected", false, true, false, false},
                        {"return_unexpected", false, true, false, false},
                        {"assume_ok_unexpected", true, false, false, false},
                        {"ignore_all", false, false, false, false}};
  for (const Mode& m : modes) {
    for (bool missing : {true, false}) {
      SCOPED_TRACE(::testing::Message() << m.name << (missing ? ", missing keys" : ", unexpected keys"));
      TrainConfig t = missing ? more : fewer;
      t.strictness = m.name;
      const bool raise = missing ? m.raise_missing : m.raise_unexpected;
      const bool log = missing ? m.log_missing : m.log_unexpected;
      ::testing::internal::CaptureStderr();
      const std::string err = load_error(t, 2, dir);
      const std::string logged = ::testing::internal::GetCapturedStderr();
      if (test::world_rank() >= 2) continue;
      if (raise) {
        EXPECT_NE(err.find(missing ? "key(s) the model expects are not in it: decoder.layers.6"
                                   : "key(s) that nothing in this model loads: decoder.layers.4"),
                  std::string::npos)
            << "error was: '" << err << "'";
      } else {
        EXPECT_EQ(err, "");
        if (test::world_rank() == 0) {
          EXPECT_EQ(logged.find(missing ? "left at their initial values: decoder.layers.6"
                                        : "left unused: decoder.layers.4") !=
                        std::string::npos,
                    log)
              << "stderr was: '" << logged << "'";
        }
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) (void)weft::remove_tree(dir);
}

// One rank failing during a distributed save (an injected write error on rank 1 at iteration
// 2, see core/fault.h): every rank throws the same message naming rank 1, nothing new is
// listed (no iter_0000002, no temporary directory left), the tracker still names iteration 1,
// and that checkpoint loads.
TEST(SaveFailure, OneRankFailsEveryRankRefusesAndTheLatestStays) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::shared_temp_dir("savefail");
  TrainConfig c = small_config();
  c.train_iters = 2;
  c.save = dir;
  c.save_interval = 1;
  setenv("WEFT_FAULT", "checkpoint.shard_write:1:2:error", 1);
  std::string err;
  run_job(c, 2, false, nullptr, &err);
  unsetenv("WEFT_FAULT");
  // Rank 0's message, known to every rank.
  int n = static_cast<int>(err.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string err0(static_cast<size_t>(n), '\0');
  if (test::world_rank() == 0) err0 = err;
  MPI_Bcast(err0.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  // Messages open with the thrower's "[rank N] "; the rest must be the same everywhere.
  auto body = [](const std::string& e) { return e.substr(std::min(e.size(), e.find("] ") + 2)); };
  if (test::world_rank() < 2) {
    EXPECT_NE(err.find("checkpoint save failed, nothing was listed: rank 1: "), std::string::npos)
        << "error was: '" << err << "'";
    EXPECT_NE(err.find("injected write error"), std::string::npos) << err;
    EXPECT_EQ(body(err), body(err0)) << "rank " << test::world_rank() << " saw another message";
  }
  if (test::world_rank() == 0) {
    std::set<std::string> listed;
    for (const auto& e : fs::directory_iterator(dir)) listed.insert(e.path().filename().string());
    EXPECT_EQ(listed, (std::set<std::string>{"iter_0000001", "latest_checkpointed_iteration.txt"}));
    std::ifstream tracker(dir + "/latest_checkpointed_iteration.txt");
    std::string latest;
    tracker >> latest;
    EXPECT_EQ(latest, "1");
  }
  TrainConfig r = c;
  r.load = dir;
  r.save = "";
  r.train_iters = 1;
  r.save_interval = 0;
  int loaded = -1;
  std::string load_err;
  run_job(r, 2, false, nullptr, &load_err, [&](Trainer& t, const ProcessGroups&) { loaded = t.iteration(); });
  if (test::world_rank() < 2) {
    EXPECT_EQ(load_err, "");
    EXPECT_EQ(loaded, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) (void)weft::remove_tree(dir);
}

// The RNG streams are restored, observably: each rank seeds its generator differently and draws
// (as dropout would) before the save, draws X right after it; a run that loads the checkpoint
// after re-seeding every generator must draw the same X, rank by rank. (weft's training itself
// draws nothing from the default generator, so without the draws a broken restore would pass.)
TEST(RngRestore, EachRankDrawsWhatItWouldHaveDrawnAfterTheSave) {
  if (test::world_size() < 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = test::shared_temp_dir("rng");
  TrainConfig c = with_layout(small_config(), {"pp2_dp2", 4, 2, 1, -1, -1});
  c.train_iters = 1;
  c.save = dir;
  at::Tensor x, y;
  run_job(c, 4, false, nullptr, nullptr, [&](Trainer& t, const ProcessGroups&) {
    at::manual_seed(100 + test::world_rank());
    (void)at::rand({5}, at::kDouble);
    t.save();
    x = at::rand({4}, at::kDouble);
  });
  TrainConfig r = c;
  r.load = dir;
  r.save = "";
  at::manual_seed(999);  // a generator state that no rank saved
  run_job(r, 4, false, nullptr, nullptr,
          [&](Trainer&, const ProcessGroups&) { y = at::rand({4}, at::kDouble); });
  // The streams differ by rank, so a restore that hands every rank rank 0's state fails too.
  at::Tensor x0 = test::world_rank() == 0 ? x.clone() : at::zeros({4}, at::kDouble);
  MPI_Bcast(x0.data_ptr(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (test::world_rank() < 4) {
    ASSERT_TRUE(x.defined() && y.defined());
    EXPECT_TRUE(at::equal(x, y)) << "rank " << test::world_rank() << " drew " << y << " not " << x;
    if (test::world_rank() != 0) {
      EXPECT_FALSE(at::equal(x, x0));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) (void)weft::remove_tree(dir);
}

}  // namespace
}  // namespace weft
