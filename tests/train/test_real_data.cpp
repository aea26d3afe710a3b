// The trainer on real data (4 MPI ranks): Megatron indexed datasets written here with
// IndexedDatasetBuilder, read through GPTDataset sampling. Checks:
// - every rank, and a rank that builds its own index caches, reads the same samples; train
//   samples come only from train documents and valid samples only from valid ones;
// - the sample stream does not depend on the layout: fp32 losses and grad norms of 1 rank,
//   pp2 x dp2 and dp4 agree to 1e-5, for one dataset and for a blend;
// - resume in the middle of an epoch (the run covers ~3 epochs): bitwise on the same layout,
//   to 1e-5 on other layouts;
// - validation: the same value on every layout, equal to an independent computation (the first
//   training loss on a dataset holding only the valid document), deterministic, and without
//   effect on training;
// - a checkpoint trained with another tokenizer is refused naming --tokenizer-model, unless
//   override_tokenizer.
// Dataset A: 9 train documents (token ids 4..63, 272 tokens: 17 samples of seq 16 per epoch)
// and, with --split 90,10,0, one valid document of exactly 64 = 4 x 16 tokens (ids 64..127).
// With a single valid document whose length is a multiple of seq_length, every epoch yields
// the same 4 windows, so the mean loss over 8k valid samples is the mean over those windows in
// any order: the same as the first training loss on dataset V (that document alone), whose
// train split has the same windows.
#include <gtest/gtest.h>

#include <ATen/Functions.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "support/job.h"
#include "support/tiny_config.h"
#include "weft/comm/process_groups.h"
#include "weft/core/remove_tree.h"
#include "weft/data/indexed_dataset.h"
#include "weft/train/train_data.h"

namespace weft {
namespace {

using test::run_job;

constexpr int kVocab = 128;
constexpr int kSeq = 16;
constexpr int kValidLo = 64;  // valid documents use ids [64, 128), train documents [4, 64)

struct Data {
  std::string dir, a, blend_other, valid_only;
};

std::vector<int32_t> random_ids(std::mt19937& g, int n, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Rank 0 writes the datasets; every rank gets the paths after a barrier.
const Data& data() {
  static Data d = [] {
    Data x;
    x.dir = test::shared_temp_dir("realdata");
    x.a = x.dir + "/a";
    x.blend_other = x.dir + "/c";
    x.valid_only = x.dir + "/v";
    if (test::world_rank() == 0) {
      std::mt19937 g(2024);
      const std::vector<int32_t> valid_doc = random_ids(g, 4 * kSeq, kValidLo, kVocab);
      {
        IndexedDatasetBuilder b(x.a, IndexedDtype::kUInt16);
        const int lengths[] = {12, 40, 23, 7, 55, 31, 18, 60, 26};  // 272 tokens
        for (int n : lengths) {
          if (n > 30) {  // some documents of two sequences
            b.add_item(random_ids(g, n / 2, 4, kValidLo));
            b.add_item(random_ids(g, n - n / 2, 4, kValidLo));
          } else {
            b.add_item(random_ids(g, n, 4, kValidLo));
          }
          b.end_document();
        }
        b.add_item(valid_doc);
        b.end_document();
        b.finalize();
      }
      {
        IndexedDatasetBuilder b(x.blend_other, IndexedDtype::kUInt16);
        for (int n : {33, 9, 47, 21, 14}) {
          b.add_item(random_ids(g, n, 4, kValidLo));
          b.end_document();
        }
        b.add_item(random_ids(g, 40, kValidLo, kVocab));
        b.end_document();
        b.finalize();
      }
      {
        IndexedDatasetBuilder b(x.valid_only, IndexedDtype::kUInt16);
        b.add_item(valid_doc);
        b.end_document();
        b.finalize();
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return x;
  }();
  return d;
}

TrainConfig base_config() {
  TrainConfig c =
      test::tiny_config({.num_layers = 4, .global_batch_size = 8, .train_iters = 5, .seed = 11});
  c.model.seq_length = kSeq;
  c.model.vocab_size = kVocab;
  c.clip_grad = 1.0;
  c.data_path = {data().a};
  c.split = "90,10,0";
  c.eval_interval = 0;
  c.eval_iters = 0;
  return c;
}

TrainConfig pp2dp2(TrainConfig c) {
  c.layout.pp = 2;
  return c;
}

// The single-rank run, on rank 0 only; its stats are broadcast to every rank.
std::vector<IterationStats> run_single(const TrainConfig& c) {
  std::vector<IterationStats> s = run_job(c, 1);
  int n = static_cast<int>(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<double> v(3 * n);
  if (test::world_rank() == 0)
    for (int i = 0; i < n; ++i) v[3 * i] = s[i].lm_loss, v[3 * i + 1] = s[i].grad_norm,
                                v[3 * i + 2] = static_cast<double>(s[i].consumed_samples);
  MPI_Bcast(v.data(), 3 * n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  s.resize(n);
  for (int i = 0; i < n; ++i) {
    s[i].lm_loss = v[3 * i];
    s[i].grad_norm = v[3 * i + 1];
    s[i].consumed_samples = static_cast<int64_t>(v[3 * i + 2]);
  }
  return s;
}

double broadcast(double x) {
  MPI_Bcast(&x, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return x;
}

void expect_close(const std::vector<IterationStats>& got, const std::vector<IterationStats>& ref,
                  size_t ref_offset, double rtol, const std::string& what) {
  ASSERT_EQ(got.size() + ref_offset, ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const IterationStats& r = ref[i + ref_offset];
    EXPECT_EQ(got[i].consumed_samples, r.consumed_samples) << what << " iteration " << i + 1;
    if (rtol == 0) {
      EXPECT_EQ(got[i].lm_loss, r.lm_loss) << what << " iteration " << r.consumed_samples / 8;
      EXPECT_EQ(got[i].grad_norm, r.grad_norm) << what << " iteration " << r.consumed_samples / 8;
    } else {
      EXPECT_NEAR(got[i].lm_loss, r.lm_loss, rtol * r.lm_loss)
          << what << " iteration " << r.consumed_samples / 8 << " loss";
      EXPECT_NEAR(got[i].grad_norm, r.grad_norm, rtol * r.grad_norm)
          << what << " iteration " << r.consumed_samples / 8 << " grad norm";
    }
  }
}

// A checksum of samples [first, first + count) of a stream, position-weighted.
int64_t checksum(const TrainData& d, bool valid, int64_t first, int count) {
  at::Tensor t, l;
  d.fetch(valid ? DataSplit::kValid : DataSplit::kTrain, first, count,
          c10::Device(c10::DeviceType::CPU), &t, &l);
  const at::Tensor w = at::arange(1, t.numel() + 1, at::kLong).reshape(t.sizes());
  return at::mul(t, w).sum().item<int64_t>() + 7 * at::mul(l, w).sum().item<int64_t>();
}

// Direct: TrainData on every rank of a 4-rank world (rank 0 builds the caches, the others load
// them) and on each rank alone with its own cache directory read the same samples; labels are
// the tokens shifted by one; train samples hold only train-document ids, valid samples only
// valid-document ids.
TEST(RealData, EveryRankReadsTheSameSamplesAndSplitsDoNotMix) {
  TrainConfig c = base_config();
  c.train_iters = 6;
  c.eval_interval = 1;
  c.eval_iters = 2;
  c.layout.world_size = test::world_size();
  Mesh mesh(c.layout);
  ProcessGroups groups(mesh, Backend::kMpi);
  TrainData shared(c, groups.control(), groups.rank());
  ASSERT_TRUE(shared.has_valid());
  const std::string own_cache = data().dir + "/cache-" + std::to_string(test::world_rank());
  TrainConfig c1 = c;
  c1.layout.world_size = 1;
  c1.data_cache_path = own_cache;
  Mesh mesh1(c1.layout);
  ProcessGroups self(mesh1, Backend::kMpi, MPI_COMM_SELF);
  TrainData alone(c1, self.control(), 0);
  const c10::Device cpu(c10::DeviceType::CPU);
  for (bool valid : {false, true}) {
    const int n = valid ? 16 : 48;
    at::Tensor t, l, t1, l1;
    shared.fetch(valid ? DataSplit::kValid : DataSplit::kTrain, 0, n, cpu, &t, &l);
    alone.fetch(valid ? DataSplit::kValid : DataSplit::kTrain, 0, n, cpu, &t1, &l1);
    ASSERT_EQ(t.sizes(), (at::IntArrayRef{n, kSeq}));
    EXPECT_TRUE(at::equal(t, t1) && at::equal(l, l1))
        << (valid ? "valid" : "train") << " samples differ between shared and own caches";
    EXPECT_TRUE(at::equal(t.narrow(1, 1, kSeq - 1), l.narrow(1, 0, kSeq - 1)));
    const int64_t lo = t.min().item<int64_t>(), hi = t.max().item<int64_t>();
    if (valid) {
      EXPECT_GE(lo, kValidLo) << "a valid sample holds a train-document token";
    } else {
      EXPECT_LT(hi, kValidLo) << "a train sample holds a valid-document token";
    }
    // Sample i is the same whatever the count fetched with it (what a microbatch asks for).
    for (int i = 0; i < n; i += 5) {
      at::Tensor ti, li;
      shared.fetch(valid ? DataSplit::kValid : DataSplit::kTrain, i, 1, cpu, &ti, &li);
      EXPECT_TRUE(at::equal(ti[0], t[i])) << "sample " << i;
    }
  }
  // Every rank's stream is rank 0's.
  for (bool valid : {false, true}) {
    int64_t mine = checksum(shared, valid, 0, valid ? 16 : 48);
    int64_t root = mine;
    MPI_Bcast(&root, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    EXPECT_EQ(mine, root) << (valid ? "valid" : "train") << " stream differs from rank 0's";
  }
  // The train stream covers several epochs and does not repeat its first epoch's order.
  EXPECT_NE(checksum(shared, false, 0, 17), checksum(shared, false, 17, 17));
}

// The sample stream is layout-independent: 1 rank, pp2 x dp2 and dp4 read the same global
// batches, so their fp32 losses and grad norms agree (one dataset, and a 0.3/0.7 blend).
TEST(RealData, LayoutsReadTheSameSamples) {
  if (test::world_size() < 4) GTEST_SKIP() << "needs 4 ranks";
  for (bool blend : {false, true}) {
    TrainConfig c = base_config();
    if (blend) c.data_path = {"0.3", data().a, "0.7", data().blend_other};
    const std::string what = blend ? "blend " : "one dataset ";
    auto ref = run_single(c);
    ASSERT_EQ(ref.size(), 5u);
    auto a = run_job(pp2dp2(c), 4);
    if (test::world_rank() < 4) expect_close(a, ref, 0, 1e-5, what + "pp2 x dp2");
    auto b = run_job(c, 4);
    if (test::world_rank() < 4) expect_close(b, ref, 0, 1e-5, what + "dp4");
  }
}

// Resume mid-epoch (iteration 3 = 24 samples, an epoch is 17): on the same layout the resumed
// iterations equal the uninterrupted run bitwise; on other layouts to 1e-5.
TEST(RealData, ResumeMidEpoch) {
  if (test::world_size() < 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = data().dir + "/resume";
  TrainConfig c = pp2dp2(base_config());
  c.train_iters = 6;
  TrainConfig a = c;
  a.save = dir + "/a";
  a.save_interval = 3;
  auto full = run_job(a, 4);
  TrainConfig b = c;
  b.save = dir + "/b";
  b.exit_interval = 3;
  auto first = run_job(b, 4);
  TrainConfig b2 = c;
  b2.load = b2.save = dir + "/b";
  auto rest = run_job(b2, 4);
  if (test::world_rank() < 4) {
    ASSERT_EQ(full.size(), 6u);
    ASSERT_EQ(first.size(), 3u);
    EXPECT_EQ(rest.front().consumed_samples, 32);
    expect_close(rest, full, 3, 0.0, "same-layout resume");
  }
  // The uninterrupted pp2 x dp2 run's losses, known to every rank.
  std::vector<IterationStats> ref(6);
  for (int i = 0; i < 6; ++i) {
    ref[i].lm_loss = broadcast(full.empty() ? 0 : full[i].lm_loss);
    ref[i].grad_norm = broadcast(full.empty() ? 0 : full[i].grad_norm);
    ref[i].consumed_samples = 8 * (i + 1);
  }
  TrainConfig one = base_config();
  one.train_iters = 6;
  one.load = dir + "/a";
  one.ckpt_step = 3;
  auto got1 = run_job(one, 1);
  if (test::world_rank() == 0) expect_close(got1, ref, 3, 1e-5, "resume on 1 rank");
  auto got4 = run_job(one, 4);
  if (test::world_rank() < 4) expect_close(got4, ref, 3, 1e-5, "resume on dp4");
}

// evaluate() at initialisation (before any step, with a train stream of its own) on the first
// `world` ranks, broadcast from rank 0.
double initial_valid_loss(TrainConfig c, int world) {
  MPI_Comm base;
  const bool member = test::world_rank() < world;
  MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, test::world_rank(), &base);
  double v = 0;
  if (member) {
    c.layout.world_size = world;
    c.quiet = true;
    {
      Mesh mesh(c.layout);
      ProcessGroups groups(mesh, Backend::kMpi, base);
      Trainer t(c, groups);
      v = t.evaluate();
    }
    MPI_Comm_free(&base);
  }
  return broadcast(v);
}

// Validation reads the valid split: the same value on every layout, equal to the first train
// loss on a dataset holding only the valid document (independent of evaluate's code path),
// the same when repeated, and leaving training untouched.
TEST(RealData, ValidationLoss) {
  if (test::world_size() < 4) GTEST_SKIP() << "needs 4 ranks";
  TrainConfig c = base_config();
  c.eval_interval = 2;
  c.eval_iters = 2;
  const double e1 = initial_valid_loss(c, 1);
  const double e22 = initial_valid_loss(pp2dp2(c), 4);
  const double e4 = initial_valid_loss(c, 4);
  EXPECT_NEAR(e22, e1, 1e-6 * e1) << "pp2 x dp2";
  EXPECT_NEAR(e4, e1, 1e-6 * e1) << "dp4";
  TrainConfig v = base_config();
  v.data_path = {data().valid_only};
  v.split = "1";
  v.train_iters = 1;
  auto first = run_single(v);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_NEAR(e1, first[0].lm_loss, 1e-6 * e1)
      << "evaluate() differs from the loss over the valid document's samples";

  // Repeated evaluation is deterministic and changes nothing in training.
  TrainConfig t = pp2dp2(c);
  t.train_iters = 3;
  std::vector<double> evals;
  auto with_eval = run_job(t, 4, false, [&](Trainer& tr, const ProcessGroups&) {
    const double x = tr.evaluate();
    EXPECT_EQ(tr.evaluate(), x) << "evaluate() is not deterministic";
    evals.push_back(x);
  });
  auto without = run_job(t, 4, false, [](Trainer&, const ProcessGroups&) {});
  if (test::world_rank() < 4) {
    expect_close(with_eval, without, 0, 0.0, "training with evaluate() between steps");
    ASSERT_EQ(evals.size(), 3u);
    EXPECT_NE(evals[0], evals[2]) << "the valid loss does not follow training";
  }
  // train() evaluates at --eval-interval and at the end: its last value is the final model's,
  // on the valid samples after the two evaluations' (Megatron's consumed_valid_samples), the
  // third batch of a split sized (5 / 2 + 1) x eval_iters x global batch.
  t.train_iters = 5;
  double reported = -1, again = -2;
  run_job(t, 4, false, nullptr, nullptr, [&](Trainer& tr, const ProcessGroups&) {
    reported = tr.last_validation_loss();
    EXPECT_EQ(tr.consumed_valid_samples(), 2 * t.eval_iters * t.global_batch_size);
    again = tr.evaluate(DataSplit::kValid, tr.consumed_valid_samples());
  });
  if (test::world_rank() < 4) {
    EXPECT_EQ(reported, again);
  }
}

nlohmann::json tokenizer(const std::string& sha, int eod = 2) {
  return {{"type", "SentencePieceTokenizer"}, {"model_file", "tok.model"}, {"sha256", sha},
          {"vocab_size", 100}, {"eod", eod}, {"bos", 1}, {"pad", 3}};
}

// A checkpoint trained with tokenizer A loads with A (another file name is the same
// tokenizer), is refused with B or with other special ids naming --tokenizer-model, and loads
// with B under override_tokenizer.
TEST(RealData, TokenizerIdentityOnLoad) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = data().dir + "/tok";
  TrainConfig c = base_config();
  c.train_iters = 1;
  c.tokenizer_identity = tokenizer("aaaa");
  c.save = dir;
  run_job(c, 2);
  TrainConfig r = c;
  r.save = "";
  r.load = dir;
  r.train_iters = 2;
  struct Case {
    const char* what;
    nlohmann::json identity;
    bool override_, refused;
  } cases[] = {
      {"same tokenizer", tokenizer("aaaa"), false, false},
      {"same tokenizer, another file name",
       [] { auto j = tokenizer("aaaa"); j["model_file"] = "copy.model"; return j; }(), false,
       false},
      {"another tokenizer", tokenizer("bbbb"), false, true},
      {"another eod id", tokenizer("aaaa", 0), false, true},
      {"another tokenizer, overridden", tokenizer("bbbb"), true, false},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    r.tokenizer_identity = k.identity;
    r.override_tokenizer = k.override_;
    std::string err;
    auto got = run_job(r, 2, false, nullptr, &err);
    if (test::world_rank() >= 2) continue;
    if (k.refused) {
      EXPECT_NE(err.find("--tokenizer-model"), std::string::npos) << err;
      EXPECT_NE(err.find("--override-tokenizer"), std::string::npos) << err;
      EXPECT_TRUE(got.empty());
    } else {
      EXPECT_EQ(err, "");
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].consumed_samples, 16);
    }
  }
}

// Last: remove the data.
TEST(RealData, ZCleanup) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) (void)remove_tree(data().dir);
}

}  // namespace
}  // namespace weft
