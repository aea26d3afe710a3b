// Tests of GPT sampling (docs/data-sampling.md) against independent references: every token of
// every sample against a slow model that concatenates the split's documents and cuts samples;
// split bounds, blending indices and PRNG outputs against values computed with Megatron's
// formulas in Python (float64, round half to even); caches reused, rebuilt when corrupted and
// built concurrently; every bad input named by its flag or file.
#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "weft/core/error.h"
#include "weft/core/hash.h"
#include "weft/data/gpt_dataset.h"
#include "weft/data/gpt_sampling.h"
#include "weft/data/indexed_dataset.h"
#include "weft/data/mock_dataset.h"

namespace weft {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() / ("weft_gpt_dataset_test_" + std::to_string(::getpid()) +
                                        "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// Documents -> sequences -> tokens; the test's source of truth.
using Docs = std::vector<std::vector<std::vector<int32_t>>>;

// `docs` documents of 1..3 sequences of 0..10 tokens (a few empty sequences); every token is
// unique: base + a running counter.
Docs make_docs(int docs, int32_t base, uint64_t salt) {
  Docs out(docs);
  uint64_t s = salt;
  auto next = [&] { return (s = s * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  int32_t t = base;
  for (auto& d : out) {
    d.resize(1 + next() % 3);
    for (auto& q : d) {
      q.resize(next() % 11);
      for (auto& x : q) x = t++;
    }
    if (d.size() == 1 && d[0].empty()) d[0].push_back(t++);  // no empty document
  }
  return out;
}

void write_docs(const std::string& prefix, const Docs& docs) {
  IndexedDatasetBuilder b(prefix, IndexedDtype::kInt32);
  for (const auto& d : docs) {
    for (const auto& q : d) b.add_item(q);
    b.end_document();
  }
  b.finalize();
}

// The slow reference: the split's documents concatenated epoch after epoch in the document
// order of each epoch, samples cut at k * seq, then the block permutations applied.
std::vector<std::vector<int64_t>> reference_samples(const Docs& docs, int64_t begin, int64_t end,
                                                    int seq, uint64_t seed, int split,
                                                    int64_t dataset, int64_t count) {
  int64_t tokens = 0;
  for (int64_t d = begin; d < end; ++d)
    for (const auto& q : docs[d]) tokens += static_cast<int64_t>(q.size());
  std::vector<int64_t> stream;
  int64_t epochs = 0;
  auto need = [&](int64_t n) {
    while (static_cast<int64_t>(stream.size()) < n) {
      for (int64_t d : sampling_document_order(begin, end, seed, split, dataset, epochs++))
        for (const auto& q : docs[d]) stream.insert(stream.end(), q.begin(), q.end());
    }
  };
  auto block_begin = [&](int64_t e) { return (e * tokens + seq - 1) / seq; };  // ceil(e*T/S)
  std::vector<std::vector<int64_t>> out;
  int64_t e = 0;
  std::vector<int64_t> order;
  for (int64_t i = 0; i < count; ++i) {
    while (block_begin(e + 1) <= i) ++e, order.clear();
    if (order.empty())
      order = sampling_sample_order(block_begin(e + 1) - block_begin(e), seed, split, dataset, e);
    const int64_t k = block_begin(e) + order[i - block_begin(e)];
    need((k + 1) * seq + 1);
    out.emplace_back(stream.begin() + k * seq, stream.begin() + k * seq + seq + 1);
  }
  return out;
}

// Every sample of `ds` as seq + 1 tokens (tokens row + last label), read in batches of 7.
std::vector<std::vector<int64_t>> all_samples(const TokenDataset& ds, int seq, int64_t count = -1) {
  if (count < 0) count = ds.size();
  std::vector<std::vector<int64_t>> out;
  for (int64_t first = 0; first < count; first += 7) {
    const int n = static_cast<int>(std::min<int64_t>(7, count - first));
    at::Tensor tokens, labels;
    ds.batch(first, n, &tokens, &labels);
    EXPECT_EQ(tokens.scalar_type(), at::kLong);
    EXPECT_EQ(tokens.size(0), n);
    EXPECT_EQ(tokens.size(1), seq);
    const int64_t* t = tokens.data_ptr<int64_t>();
    const int64_t* l = labels.data_ptr<int64_t>();
    for (int r = 0; r < n; ++r) {
      std::vector<int64_t> s(t + r * seq, t + (r + 1) * seq);
      for (int c = 0; c + 1 < seq; ++c) EXPECT_EQ(l[r * seq + c], t[r * seq + c + 1]);
      s.push_back(l[r * seq + seq - 1]);
      out.push_back(std::move(s));
    }
  }
  return out;
}

template <typename F>
std::string usage_error(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a UsageError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected a UsageError, nothing thrown";
  return "";
}
#define EXPECT_MENTIONS(msg, text) \
  EXPECT_NE((msg).find(text), std::string::npos) << "message: " << (msg) << "\nlacks: " << (text)

std::vector<fs::path> cache_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".samples") out.push_back(e.path());
  return out;
}

// ---------------------------------------------------------------------------------------------
// PRNG, split bounds, blending index: fixed values from Python (docs/data-sampling.md formulas).

TEST(GptSampling, PrngMatchesPinnedValues) {
  SamplingRng r(0);
  EXPECT_EQ(r.next(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(r.next(), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(r.next(), 0x06c45d188009454full);
  EXPECT_EQ(sampling_document_order(0, 10, 1234, 0, 0, 0),
            (std::vector<int64_t>{0, 5, 1, 3, 4, 2, 9, 6, 7, 8}));
  EXPECT_EQ(sampling_sample_order(10, 1234, 1, 2, 3),
            (std::vector<int64_t>{5, 3, 7, 2, 1, 0, 9, 6, 4, 8}));
  // A permutation, and each of seed, split, dataset, epoch changes it.
  auto base = sampling_document_order(100, 300, 7, 0, 0, 0);
  auto sorted = base;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 200; ++i) ASSERT_EQ(sorted[i], 100 + i);
  EXPECT_NE(base, sampling_document_order(100, 300, 8, 0, 0, 0));
  EXPECT_NE(base, sampling_document_order(100, 300, 7, 1, 0, 0));
  EXPECT_NE(base, sampling_document_order(100, 300, 7, 0, 1, 0));
  EXPECT_NE(base, sampling_document_order(100, 300, 7, 0, 0, 1));
  // below(n) stays below n and reaches every value.
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t v = r.below(7);
    ASSERT_LT(v, 7u);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 7u);
}

// The mixers behind every shuffle and the mock data, pinned to values of the code as it stood
// before the hashes moved to core/hash.h: a changed bit here changes every run's data order.
TEST(GptSampling, SeedsAndMockDataArePinned) {
  EXPECT_EQ(splitmix64_mix(0), 0ull);
  EXPECT_EQ(splitmix64_mix(1), 0x5692161d100b05e5ull);
  EXPECT_EQ(splitmix64_mix(0xdeadbeef), 0x4e062702ec929eeaull);
  EXPECT_EQ(sampling_seed(1234, SamplingStream::kDocuments, 0, 0, 0), 0xff7c1a40267f4872ull);
  EXPECT_EQ(sampling_seed(7, SamplingStream::kSamples, 1, 2, 3), 0x4a3b98bd98976ae7ull);
  SamplingRng r(42);
  EXPECT_EQ(r.next(), 0xbdd732262feb6e95ull);
  EXPECT_EQ(r.next(), 0x28efe333b266f103ull);
  at::Tensor tokens, labels;
  MockDataset(3, 50, 8).batch(5, 2, &tokens, &labels);
  const std::vector<int64_t> want = {35, 16, 9, 38, 25, 36, 19, 18, 15,
                                     0,  11, 44, 43, 40, 31, 4,  23, 30};
  ASSERT_EQ(tokens.numel(), 16);
  ASSERT_EQ(labels.numel(), 16);
  const int64_t* t = tokens.data_ptr<int64_t>();  // [2, 8], contiguous
  const int64_t* l = labels.data_ptr<int64_t>();
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(t[k * 8 + i], want[k * 9 + i]) << "sample " << k << " token " << i;
      EXPECT_EQ(l[k * 8 + i], want[k * 9 + i + 1]) << "sample " << k << " label " << i;
    }
}


TEST(GptSampling, SplitBoundsMatchMegatronRounding) {
  struct Case {
    const char* split;
    int64_t n;
    int64_t train_end, valid_begin, valid_end, test_begin;
  };
  // Megatron-Core: bounds int(round(cumsum(normalize(w)) * n)), computed in Python.
  // clang-format off
  const Case cases[] = {
      {"969,30,1", 1, 1, 1, 1, 1},           {"969,30,1", 33, 32, 32, 33, 33},
      {"969,30,1", 100, 97, 97, 100, 100},   {"969,30,1", 101, 98, 98, 101, 101},
      {"969,30,1", 500, 484, 484, 500, 500}, {"969,30,1", 999, 968, 968, 998, 998},
      {"969,30,1", 1000, 969, 969, 999, 999}, {"969,30,1", 1001, 970, 970, 1000, 1000},
      {"969,30,1", 2001, 1939, 1939, 1999, 1999},
      {"969,30,1", 12345, 11962, 11962, 12333, 12333},
      {"969,30,1", 100000, 96900, 96900, 99900, 99900},
      {"98,2,0", 3, 3, 3, 3, 3},             {"98,2,0", 33, 32, 32, 33, 33},
      {"98,2,0", 100, 98, 98, 100, 100},     {"98,2,0", 101, 99, 99, 101, 101},
      {"98,2,0", 999, 979, 979, 999, 999},   {"98,2,0", 2001, 1961, 1961, 2001, 2001},
      {"98,2,0", 12345, 12098, 12098, 12345, 12345},
      // Half-way cases round to even, as Python's round: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
      {"1,1", 1, 0, 0, 1, 1},                {"1,1", 3, 2, 2, 3, 3},
      {"1,1", 5, 2, 2, 5, 5},                {"1,1", 101, 50, 50, 101, 101},
      {"80,10,10", 5, 4, 4, 4, 4},           {"80,10,10", 33, 26, 26, 30, 30},
      {"80,10,10", 999, 799, 799, 899, 899}, {"80,10,10", 12345, 9876, 9876, 11110, 11110},
  };
  // clang-format on
  for (const Case& c : cases) {
    for (const auto& w : {parse_split(c.split), std::array<double, 3>{}}) {
      std::array<double, 3> weights = w;
      if (weights[0] + weights[1] + weights[2] == 0) {  // the raw, unnormalised weights
        double a = 0, b = 0, d = 0;
        ASSERT_GE(std::sscanf(c.split, "%lf,%lf,%lf", &a, &b, &d), 2);
        weights = {a, b, d};
      }
      const auto r = sampling_split_ranges(weights, c.n);
      EXPECT_EQ(r[0], std::make_pair(int64_t{0}, c.train_end)) << c.split << " over " << c.n;
      EXPECT_EQ(r[1], std::make_pair(c.valid_begin, c.valid_end)) << c.split << " over " << c.n;
      EXPECT_EQ(r[2], std::make_pair(c.test_begin, c.n)) << c.split << " over " << c.n;
    }
  }
}

TEST(GptSampling, BlendingIndexMatchesMegatronGreedy) {
  auto run = [](std::vector<double> w, int64_t n) {
    double s = 0;
    for (double x : w) s += x;
    for (double& x : w) x /= s;
    std::vector<int64_t> d(n), j(n);
    sampling_build_blending_index(w, n, d.data(), j.data());
    return std::make_pair(d, j);
  };
  // Megatron's build_blending_indices, replayed in Python.
  auto [d1, j1] = run({0.3, 0.7}, 20);
  EXPECT_EQ(d1, (std::vector<int64_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(j1,
            (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 3, 7, 8, 9, 4, 10, 11, 5, 12, 13}));
  auto [d2, j2] = run({2, 1, 1}, 16);
  EXPECT_EQ(d2, (std::vector<int64_t>{0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2, 0}));
  EXPECT_EQ(j2, (std::vector<int64_t>{0, 0, 0, 1, 2, 1, 1, 3, 4, 2, 2, 5, 6, 3, 3, 7}));
  // The index is online: a longer run starts with the shorter one.
  auto [d3, j3] = run({0.3, 0.7}, 200);
  EXPECT_TRUE(std::equal(d1.begin(), d1.end(), d3.begin()));
  EXPECT_EQ(sampling_blend_request(0.3, 10000), 3015);
  EXPECT_EQ(sampling_blend_request(0.7, 10000), 7035);
  EXPECT_EQ(sampling_blend_request(1.0 / 3, 1000), 336);
  EXPECT_EQ(sampling_blend_request(0.5, 1), 2);
}

TEST(GptSampling, EpochCountIsTheSmallestThatSuffices) {
  for (int64_t tokens : {9, 10, 17, 100, 1001}) {
    for (int seq : {1, 2, 8}) {
      if (tokens <= seq) continue;
      for (int64_t n = 0; n < 300; ++n) {
        const int64_t e = sampling_epochs_for(n, tokens, seq);
        EXPECT_GE(sampling_block_begin(e, tokens, seq), n);
        if (e > 0) {
          EXPECT_LT(sampling_block_begin(e - 1, tokens, seq), n);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Datasets on files.

struct Fixture {
  TempDir dir;
  Docs docs = make_docs(60, 0, 11);
  std::string prefix = dir / "corpus";
  GptDataConfig cfg;
  Fixture() {
    write_docs(prefix, docs);
    cfg.blend = {{1.0, prefix}};
    cfg.split = parse_split("80,15,5");
    cfg.seq_length = 8;
    cfg.seed = 99;
  }
  std::pair<int64_t, int64_t> range(DataSplit s) const {
    return sampling_split_ranges(cfg.split, static_cast<int64_t>(docs.size()))[static_cast<int>(s)];
  }
};

TEST(GptDataset, EverySampleMatchesTheReference) {
  Fixture f;
  for (DataSplit split : {DataSplit::kTrain, DataSplit::kValid, DataSplit::kTest}) {
    for (int seq : {1, 5, 8}) {
      f.cfg.seq_length = seq;
      const auto [b, e] = f.range(split);
      int64_t tokens = 0;
      for (int64_t d = b; d < e; ++d)
        for (const auto& q : f.docs[d]) tokens += static_cast<int64_t>(q.size());
      const int64_t want = 3 * tokens / seq + 2;  // into a fourth epoch
      auto ds = make_gpt_dataset(f.cfg, split, want);
      ASSERT_GE(ds->size(), want);
      const auto got = all_samples(*ds, seq);
      const auto ref =
          reference_samples(f.docs, b, e, seq, f.cfg.seed, static_cast<int>(split), 0, ds->size());
      ASSERT_EQ(got.size(), ref.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], ref[i]) << "split " << static_cast<int>(split) << " seq " << seq
                                  << " sample " << i;
      }
    }
  }
}

TEST(GptDataset, OneEpochHoldsEveryTokenOfTheSplit) {
  Fixture f;
  const int seq = 8;
  const auto [b, e] = f.range(DataSplit::kTrain);
  std::set<int64_t> split_tokens;
  for (int64_t d = b; d < e; ++d)
    for (const auto& q : f.docs[d]) split_tokens.insert(q.begin(), q.end());
  const int64_t tokens = static_cast<int64_t>(split_tokens.size());
  const int64_t block0 = (tokens + seq - 1) / seq;  // the samples that start in epoch 0
  auto ds = make_gpt_dataset(f.cfg, DataSplit::kTrain, block0);
  ASSERT_EQ(ds->size(), block0);
  std::map<int64_t, int> count;
  for (const auto& s : all_samples(*ds, seq))
    for (int64_t t : s) ++count[t];
  // Every token of the split appears, nothing else does, and the only repeats are the one-token
  // overlaps of consecutive samples plus the tail read from the next epoch (< seq + 1 tokens).
  EXPECT_EQ(static_cast<int64_t>(count.size()), tokens);
  for (int64_t t : split_tokens) EXPECT_GE(count[t], 1) << "token " << t << " lost";
  int64_t repeats = 0;
  for (const auto& [t, c] : count) {
    EXPECT_TRUE(split_tokens.count(t)) << "token " << t << " is not in the split";
    repeats += c - 1;
  }
  const int64_t spill = block0 * seq + 1 - tokens;
  EXPECT_EQ(repeats, (block0 - 1) + spill);
  EXPECT_LE(spill, seq);
}

// --full-validation's pass: one_pass_samples windows read in order are the pass's tokens cut
// at k * seq, their labels tokens 1..(tokens - 1) of the pass and, past it, only the last
// window's tail from the next pass (fewer than seq labels); also where tokens = k * seq + 1,
// where a window starting at the pass's last token would hold labels of the next pass only.
TEST(GptDataset, OnePassInOrderLabelsEveryTokenOfTheSplitOnce) {
  Fixture f;
  f.cfg.in_order = true;
  const DataSplit split = DataSplit::kValid;
  const auto [b, e] = f.range(split);
  std::vector<int64_t> pass;  // epoch 0's document order, then epoch 1's for the tail
  for (int64_t epoch = 0; epoch < 2; ++epoch)
    for (int64_t d : sampling_document_order(b, e, f.cfg.seed, static_cast<int>(split), 0, epoch))
      for (const auto& q : f.docs[d]) pass.insert(pass.end(), q.begin(), q.end());
  const int64_t tokens = static_cast<int64_t>(pass.size()) / 2;
  ASSERT_GT(tokens, 10);
  for (int seq : {1, 5, 8, static_cast<int>(tokens - 1), static_cast<int>((tokens - 1) / 2)}) {
    f.cfg.seq_length = seq;
    const int64_t n = one_pass_samples(f.cfg, split);
    EXPECT_EQ(n, (tokens - 1 + seq - 1) / seq) << "seq " << seq;
    EXPECT_GE(n * seq, tokens - 1) << "seq " << seq << ": the last labels are missed";
    EXPECT_LT((n - 1) * seq, tokens - 1) << "seq " << seq << ": a window of next-pass labels";
    auto ds = make_gpt_dataset(f.cfg, split, n);
    const auto got = all_samples(*ds, seq, n);
    ASSERT_EQ(static_cast<int64_t>(got.size()), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(got[i], std::vector<int64_t>(pass.begin() + i * seq, pass.begin() + i * seq + seq + 1))
          << "seq " << seq << " window " << i;
  }
  f.cfg.seq_length = static_cast<int>(tokens);  // one token short of one sample
  EXPECT_EQ(one_pass_samples(f.cfg, split), 0);
}

TEST(GptDataset, SampleIDoesNotDependOnTheSampleCount) {
  Fixture f;
  auto small = make_gpt_dataset(f.cfg, DataSplit::kTrain, 10);
  auto large = make_gpt_dataset(f.cfg, DataSplit::kTrain, 5000);  // many more epochs
  const auto a = all_samples(*small, f.cfg.seq_length);
  const auto b = all_samples(*large, f.cfg.seq_length, small->size());
  EXPECT_EQ(a, b);
}

TEST(GptDataset, DeterministicAndSeeded) {
  Fixture f;
  TempDir other;
  auto a = make_gpt_dataset(f.cfg, DataSplit::kTrain, 300);
  GptDataConfig c2 = f.cfg;
  c2.cache_path = other.path.string();  // built again from scratch
  auto b = make_gpt_dataset(c2, DataSplit::kTrain, 300);
  EXPECT_EQ(all_samples(*a, 8), all_samples(*b, 8));
  c2.seed = f.cfg.seed + 1;
  auto c = make_gpt_dataset(c2, DataSplit::kTrain, 300);
  const auto sa = all_samples(*a, 8), sc = all_samples(*c, 8);
  EXPECT_NE(sa, sc);
  // Another document order, not only another sample order: the first samples hold other tokens.
  std::set<int64_t> ta, tc;
  for (int i = 0; i < 20; ++i)
    ta.insert(sa[i].begin(), sa[i].end()), tc.insert(sc[i].begin(), sc[i].end());
  EXPECT_NE(ta, tc);
}

TEST(GptDataset, CacheIsReusedAndACorruptOneRebuilt) {
  Fixture f;
  TempDir cache;
  f.cfg.cache_path = cache.path.string();
  const auto first = all_samples(*make_gpt_dataset(f.cfg, DataSplit::kTrain, 200), 8);
  auto files = cache_files(cache.path);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(files[0].filename().string().find("corpus.weft-train-"), std::string::npos);
  struct stat st1 {
  }, st2{};
  ASSERT_EQ(::stat(files[0].c_str(), &st1), 0);

  // Loaded, not rebuilt: the same inode (a rebuild renames a new file over it).
  EXPECT_EQ(all_samples(*make_gpt_dataset(f.cfg, DataSplit::kTrain, 200), 8), first);
  ASSERT_EQ(::stat(files[0].c_str(), &st2), 0);
  EXPECT_EQ(st1.st_ino, st2.st_ino);
  EXPECT_EQ(st1.st_mtim.tv_nsec, st2.st_mtim.tv_nsec);

  // One flipped payload byte: detected by the payload hash, rebuilt (a new inode), same samples.
  {
    std::fstream io(files[0], std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-20, std::ios::end);
    char c;
    io.read(&c, 1);
    c ^= 0x10;
    io.seekp(-20, std::ios::end);
    io.write(&c, 1);
  }
  EXPECT_EQ(all_samples(*make_gpt_dataset(f.cfg, DataSplit::kTrain, 200), 8), first);
  ASSERT_EQ(::stat(files[0].c_str(), &st2), 0);
  EXPECT_NE(st1.st_ino, st2.st_ino);

  // Truncated, then a garbage file of the right size: both rebuilt.
  fs::resize_file(files[0], fs::file_size(files[0]) / 2);
  EXPECT_EQ(all_samples(*make_gpt_dataset(f.cfg, DataSplit::kTrain, 200), 8), first);
  const auto size = fs::file_size(files[0]);
  { std::ofstream(files[0], std::ios::binary) << std::string(size, 'x'); }
  EXPECT_EQ(all_samples(*make_gpt_dataset(f.cfg, DataSplit::kTrain, 200), 8), first);
  EXPECT_EQ(cache_files(cache.path).size(), 1u);

  // Other inputs, other files; the default location is beside the data.
  f.cfg.seed = 5;
  make_gpt_dataset(f.cfg, DataSplit::kTrain, 200);
  EXPECT_EQ(cache_files(cache.path).size(), 2u);
  f.cfg.cache_path = "";
  make_gpt_dataset(f.cfg, DataSplit::kTrain, 200);
  EXPECT_EQ(cache_files(f.dir.path).size(), 1u);
}

TEST(GptDataset, ConcurrentBuildersAgree) {
  Fixture f;
  TempDir cache;
  f.cfg.cache_path = cache.path.string();
  std::vector<std::vector<std::vector<int64_t>>> got(6);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back(
        [&, t] { got[t] = all_samples(*make_gpt_dataset(f.cfg, DataSplit::kTrain, 3000), 8); });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 1; t < got.size(); ++t) EXPECT_EQ(got[t], got[0]);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(cache.path)) ++entries, (void)e;
  EXPECT_EQ(entries, 1u) << "temporary files left behind";
}

TEST(GptDataset, BatchOutsideTheBuiltRangeThrows) {
  Fixture f;
  auto ds = make_gpt_dataset(f.cfg, DataSplit::kTrain, 50);
  at::Tensor t, l;
  EXPECT_THROW(ds->batch(ds->size() - 1, 2, &t, &l), Error);
  EXPECT_THROW(ds->batch(-1, 1, &t, &l), Error);
  auto empty = make_gpt_dataset(f.cfg, DataSplit::kTrain, 0);
  EXPECT_EQ(empty->size(), 0);
}

// ---------------------------------------------------------------------------------------------
// Blends.

struct BlendFixture {
  TempDir dir;
  Docs a = make_docs(80, 0, 1), b = make_docs(50, 1000000, 2);
  std::string pa = dir / "a", pb = dir / "b";
  GptDataConfig cfg;
  BlendFixture() {
    write_docs(pa, a);
    write_docs(pb, b);
    cfg.blend = parse_data_path({"0.3 " + pa, "0.7", pb});
    cfg.split = parse_split("98,2,0");
    cfg.seq_length = 6;
    cfg.seed = 3;
  }
};

TEST(GptBlend, ProportionsAndPartsMatchMegatron) {
  BlendFixture f;
  const int64_t n = 10000;
  auto blend = make_gpt_dataset(f.cfg, DataSplit::kTrain, n);
  ASSERT_EQ(blend->size(), n);
  const auto got = all_samples(*blend, 6);
  // Tokens tell the dataset: a < 1e6 <= b. Megatron's greedy index keeps each count within one
  // sample of w * n: 3000 and 7000 here.
  int64_t from_a = 0;
  for (const auto& s : got) {
    const bool is_a = s[0] < 1000000;
    for (int64_t t : s) ASSERT_EQ(t < 1000000, is_a) << "a sample mixes datasets";
    from_a += is_a;
  }
  EXPECT_LE(std::abs(from_a - 3000), 1);

  // Blended sample i is sample dataset_sample_index[i] of its part. A zero weight keeps a
  // dataset's number, so "1 a 0 b" and "0 a 1 b" are the parts as the blend numbers them.
  GptDataConfig ca = f.cfg, cb = f.cfg;
  ca.blend = {{1, f.pa}, {0, f.pb}};
  cb.blend = {{0, f.pa}, {1, f.pb}};
  const auto sa = all_samples(*make_gpt_dataset(ca, DataSplit::kTrain, 3100), 6);
  const auto sb = all_samples(*make_gpt_dataset(cb, DataSplit::kTrain, 7100), 6);
  std::vector<int64_t> d(n), j(n);
  sampling_build_blending_index({0.3, 0.7}, n, d.data(), j.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], d[i] == 0 ? sa[j[i]] : sb[j[i]]) << "blended sample " << i;
  }
  // And part b agrees with the slow reference (dataset number 1 in its seeds).
  const auto [b0, b1] = sampling_split_ranges(f.cfg.split, 50)[0];
  EXPECT_EQ(sb,
            reference_samples(f.b, b0, b1, 6, f.cfg.seed, 0, 1, static_cast<int64_t>(sb.size())));
}

// "--data-path a b" without weights: Megatron's blend by size, each split weighing each dataset
// by the samples one epoch of its split holds, (tokens - 1) / seq_length.
TEST(GptBlend, UnweightedListBlendsBySizePerSplit) {
  BlendFixture f;
  bool weighted = true;
  f.cfg.blend = parse_data_path({f.pa + " " + f.pb}, &weighted);
  EXPECT_FALSE(weighted);
  f.cfg.blend_by_size = true;
  f.cfg.split = parse_split("90,10,0");
  auto epoch = [&](const Docs& docs, int split) {  // from the test's own documents
    const auto [d0, d1] =
        sampling_split_ranges(f.cfg.split, static_cast<int64_t>(docs.size()))[split];
    int64_t tokens = 0;
    for (int64_t d = d0; d < d1; ++d)
      for (const auto& q : docs[static_cast<size_t>(d)]) tokens += static_cast<int64_t>(q.size());
    return static_cast<double>((tokens - 1) / f.cfg.seq_length);
  };
  for (int split : {0, 1}) {
    const DataSplit which = split == 0 ? DataSplit::kTrain : DataSplit::kValid;
    const double wa = epoch(f.a, split), wb = epoch(f.b, split);
    ASSERT_GT(wa, 0);
    ASSERT_GT(wb, 0);
    ASSERT_NE(wa, wb) << "equal sizes would not tell a blend by size from equal weights";
    GptDataConfig explicit_weights = f.cfg;
    explicit_weights.blend_by_size = false;
    explicit_weights.blend = {{wa, f.pa}, {wb, f.pb}};
    const int64_t n = 500;
    const auto got = all_samples(*make_gpt_dataset(f.cfg, which, n), 6);
    EXPECT_EQ(got, all_samples(*make_gpt_dataset(explicit_weights, which, n), 6))
        << "split " << split;
    int64_t from_a = 0;
    for (const auto& smp : got) from_a += smp[0] < 1000000;
    EXPECT_LE(std::abs(static_cast<double>(from_a) - n * wa / (wa + wb)), 1.0) << "split " << split;
  }
  EXPECT_EQ(gpt_data_identity(f.cfg).value("blend_weights", ""), "samples of each split");
  GptDataConfig weighted_cfg = f.cfg;
  weighted_cfg.blend_by_size = false;
  EXPECT_FALSE(gpt_data_identity(weighted_cfg).contains("blend_weights"));
  // A weighted list, even of equal weights, is not blended by size.
  parse_data_path({"1 " + f.pa + " 1 " + f.pb}, &weighted);
  EXPECT_TRUE(weighted);
  // A dataset whose split holds no sample cannot be weighed: refused naming it.
  const std::string pc = f.dir / "tiny";
  write_docs(pc, Docs{{{7, 8}}});
  GptDataConfig with_tiny = f.cfg;
  with_tiny.blend.emplace_back(1.0, pc);
  try {
    make_gpt_dataset(with_tiny, DataSplit::kTrain, 10);
    ADD_FAILURE() << "a dataset of one token-pair blended by size";
  } catch (const EmptySplitError& e) {
    EXPECT_NE(std::string(e.what()).find(pc), std::string::npos) << e.what();
  }
}

TEST(GptBlend, StableWhenTheSampleCountGrowsAndCached) {
  BlendFixture f;
  auto small = make_gpt_dataset(f.cfg, DataSplit::kTrain, 100);
  auto large = make_gpt_dataset(f.cfg, DataSplit::kTrain, 4000);
  EXPECT_EQ(all_samples(*small, 6), all_samples(*large, 6, 100));
  size_t blends = 0;
  for (const auto& p : cache_files(f.dir.path))
    blends += p.filename().string().rfind("weft-blend-train-", 0) == 0;
  EXPECT_EQ(blends, 2u);
  EXPECT_EQ(all_samples(*make_gpt_dataset(f.cfg, DataSplit::kTrain, 4000), 6),
            all_samples(*large, 6));
}

// ---------------------------------------------------------------------------------------------
// Flags, identity, errors.

TEST(GptDataFlags, ParseDataPathAndSplit) {
  using V = std::vector<std::pair<double, std::string>>;
  EXPECT_EQ(parse_data_path({"/d/p"}), (V{{1, "/d/p"}}));
  EXPECT_EQ(parse_data_path({"/d/p /d/q"}), (V{{1, "/d/p"}, {1, "/d/q"}}));
  EXPECT_EQ(parse_data_path({"0.3", "A", "0.7 B"}), (V{{0.3, "A"}, {0.7, "B"}}));
  EXPECT_EQ(parse_data_path({"30 A 0 B"}), (V{{30, "A"}, {0, "B"}}));
  const auto s = parse_split("98,2,0");
  EXPECT_DOUBLE_EQ(s[0], 0.98);
  EXPECT_DOUBLE_EQ(s[1], 0.02);
  EXPECT_EQ(s[2], 0.0);
  EXPECT_EQ(parse_split("1"), (std::array<double, 3>{1, 0, 0}));
  EXPECT_EQ(parse_split("99/1"), parse_split("99,1,0"));
}

TEST(GptDataFlags, BadFlagsNameTheFlag) {
  for (const char* bad : {"", "0.3 A 0.7", "0.3 A B 0.7", "-1 A 2 B", "nan A 1 B", "inf A 1 B",
                          "0 A 0 B", "0.3 A x B 0.7 C"}) {
    EXPECT_MENTIONS(usage_error([&] { parse_data_path({bad}); }), "--data-path") << bad;
  }
  for (const char* bad : {"", "a,b", "1,2,3,4", "-1,2", "0,0,0", "nan", "1,,2", "inf,1"}) {
    EXPECT_MENTIONS(usage_error([&] { parse_split(bad); }), "--split") << bad;
  }
}

TEST(GptDataErrors, EachNamesTheFlagOrFile) {
  Fixture f;
  // Missing files.
  GptDataConfig c = f.cfg;
  c.blend = {{1, f.dir / "nothere"}};
  auto m = usage_error([&] { make_gpt_dataset(c, DataSplit::kTrain, 10); });
  EXPECT_MENTIONS(m, "--data-path");
  EXPECT_MENTIONS(m, f.dir / "nothere.idx");
  fs::copy_file(idx_path(f.prefix), f.dir / "halfdone.idx");
  c.blend = {{0.5, f.prefix}, {0.5, f.dir / "halfdone"}};
  EXPECT_MENTIONS(usage_error([&] { make_gpt_dataset(c, DataSplit::kTrain, 10); }),
                  f.dir / "halfdone.bin");
  EXPECT_MENTIONS(usage_error([&] { gpt_data_identity(c); }), f.dir / "halfdone.bin");

  // An empty split while samples are asked: names --split and the prefix.
  c = f.cfg;
  c.split = parse_split("100,0,0");
  m = usage_error([&] { make_gpt_dataset(c, DataSplit::kValid, 10); });
  EXPECT_MENTIONS(m, "--split");
  EXPECT_MENTIONS(m, f.prefix);
  EXPECT_EQ(make_gpt_dataset(c, DataSplit::kValid, 0)->size(), 0);  // not asked: fine

  // Fewer tokens than one sample.
  c = f.cfg;
  c.seq_length = 100000;
  m = usage_error([&] { make_gpt_dataset(c, DataSplit::kTrain, 1); });
  EXPECT_MENTIONS(m, "--seq-length");
  EXPECT_MENTIONS(m, f.prefix);
  c.seq_length = 0;
  EXPECT_MENTIONS(usage_error([&] { make_gpt_dataset(c, DataSplit::kTrain, 1); }), "--seq-length");

  // Weights and split given directly in the config are checked too.
  c = f.cfg;
  c.blend = {{0, f.prefix}};
  EXPECT_MENTIONS(usage_error([&] { make_gpt_dataset(c, DataSplit::kTrain, 1); }), "--data-path");
  c = f.cfg;
  c.split = {0, 0, 0};
  EXPECT_MENTIONS(usage_error([&] { make_gpt_dataset(c, DataSplit::kTrain, 1); }), "--split");

  // A cache directory that cannot be created.
  c = f.cfg;
  c.cache_path = f.dir / "corpus.bin/sub";  // under a regular file
  EXPECT_MENTIONS(usage_error([&] { make_gpt_dataset(c, DataSplit::kTrain, 1); }),
                  "--data-cache-path");
}

TEST(GptDataErrors, EmptyDatasetNamesTheFile) {
  TempDir dir;
  const std::string p = dir / "empty";
  {
    IndexedDatasetBuilder b(p, IndexedDtype::kUInt16);
    b.finalize();
  }
  GptDataConfig c;
  c.blend = {{1, p}};
  c.seq_length = 4;
  EXPECT_MENTIONS(usage_error([&] { make_gpt_dataset(c, DataSplit::kTrain, 1); }), idx_path(p));
}

TEST(GptDataIdentity, RecordsTheInputsAndTheIndexHash) {
  BlendFixture f;
  const auto id = gpt_data_identity(f.cfg);
  ASSERT_EQ(id["blend"].size(), 2u);
  EXPECT_EQ(id["blend"][0]["prefix"], f.pa);
  EXPECT_DOUBLE_EQ(id["blend"][1]["weight"].get<double>(), 0.7);
  EXPECT_EQ(id["blend"][0]["idx_bytes"].get<uint64_t>(), fs::file_size(idx_path(f.pa)));
  EXPECT_EQ(id["seq_length"], 6);
  EXPECT_EQ(id["seed"], 3u);
  EXPECT_DOUBLE_EQ(id["split"][0].get<double>(), 0.98);
  EXPECT_EQ(id, gpt_data_identity(f.cfg));
  // Other data under the same name: another hash.
  write_docs(f.pa, make_docs(80, 0, 77));
  const auto id2 = gpt_data_identity(f.cfg);
  EXPECT_NE(id2["blend"][0]["idx_hash"], id["blend"][0]["idx_hash"]);
  EXPECT_EQ(id2["blend"][1]["idx_hash"], id["blend"][1]["idx_hash"]);
}

}  // namespace
}  // namespace weft
