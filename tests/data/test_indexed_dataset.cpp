// The .bin/.idx format against its specification (docs/data-format.md): a golden byte array
// written by hand from the spec, round trips for every dtype, add_index, and every malformed
// file the reader must refuse at open with a message naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "weft/core/error.h"
#include "weft/data/indexed_dataset.h"

namespace weft {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("weft_idx_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string prefix(const std::string& name) const { return (dir_ / name).string(); }

  // Two documents: {[1,2,3], [258]} and {[7]}.
  std::string write_small(const std::string& name, IndexedDtype dtype = IndexedDtype::kUInt16) {
    std::string p = prefix(name);
    IndexedDatasetBuilder b(p, dtype);
    b.add_item({1, 2, 3});
    b.add_item({258});
    b.end_document();
    b.add_item({7});
    b.end_document();
    b.finalize();
    return p;
  }

  // Expects opening `p` to throw UsageError whose message names `file` and contains `what`.
  void expect_refused(const std::string& p, const std::string& file, const std::string& what) {
    try {
      IndexedDataset ds(p);
      ADD_FAILURE() << "opened a bad dataset; expected: " << what;
    } catch (const UsageError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(file), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
  }

  fs::path dir_;
};

// Written from docs/data-format.md, byte by byte; not produced by the writer.
const std::vector<uint8_t> kGoldenIdx = {
    'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  // magic
    1, 0, 0, 0, 0, 0, 0, 0,                   // version 1
    8,                                        // dtype code 8 = uint16
    3, 0, 0, 0, 0, 0, 0, 0,                   // 3 sequences
    3, 0, 0, 0, 0, 0, 0, 0,                   // 3 document indices (2 documents + 1)
    3, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0,       // sizes int32 [3, 1, 1]
    0, 0, 0, 0, 0, 0, 0, 0,                   // pointers int64 [0, 6, 8]
    6, 0, 0, 0, 0, 0, 0, 0,
    8, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0,                   // document_indices int64 [0, 2, 3]
    2, 0, 0, 0, 0, 0, 0, 0,
    3, 0, 0, 0, 0, 0, 0, 0,
};
const std::vector<uint8_t> kGoldenBin = {1, 0, 2, 0, 3, 0, 2, 1, 7, 0};  // uint16 LE 1 2 3 258 7

TEST_F(IndexedDatasetTest, GoldenBytes) {
  std::string p = write_small("golden");
  EXPECT_EQ(slurp(idx_path(p)), kGoldenIdx);
  EXPECT_EQ(slurp(bin_path(p)), kGoldenBin);
  EXPECT_FALSE(fs::exists(idx_path(p) + ".tmp"));
  EXPECT_FALSE(fs::exists(bin_path(p) + ".tmp"));
}

TEST_F(IndexedDatasetTest, ReadsGoldenFiles) {
  std::string p = prefix("hand");
  spit(idx_path(p), kGoldenIdx);
  spit(bin_path(p), kGoldenBin);
  IndexedDataset ds(p);
  EXPECT_EQ(ds.dtype(), IndexedDtype::kUInt16);
  EXPECT_EQ(ds.num_sequences(), 3);
  EXPECT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.sequence(0), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ds.sequence(1), (std::vector<int64_t>{258}));
  EXPECT_EQ(ds.sequence(2), (std::vector<int64_t>{7}));
  int64_t two[2];
  ds.read(0, 1, 2, two);
  EXPECT_EQ(two[0], 2);
  EXPECT_EQ(two[1], 3);
  EXPECT_EQ(ds.pointers()[2], 8);
  EXPECT_EQ(ds.document_indices()[1], 2);
}

TEST_F(IndexedDatasetTest, RoundTripEveryDtype) {
  struct Case {
    IndexedDtype dtype;
    int32_t lo, hi;
  };
  const Case cases[] = {
      {IndexedDtype::kUInt8, 0, 255},           {IndexedDtype::kInt8, -128, 127},
      {IndexedDtype::kInt16, -32768, 32767},    {IndexedDtype::kInt32, INT32_MIN, INT32_MAX},
      {IndexedDtype::kInt64, INT32_MIN, INT32_MAX}, {IndexedDtype::kFloat64, -1000000, 1000000},
      {IndexedDtype::kFloat32, -(1 << 24), 1 << 24}, {IndexedDtype::kUInt16, 0, 65535},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.dtype));
    std::string p = prefix("dt" + std::to_string(static_cast<int>(c.dtype)));
    std::vector<std::vector<int32_t>> seqs = {{c.lo, c.hi, 0, 1}, {}, {c.hi}, {5, c.lo}};
    {
      IndexedDatasetBuilder b(p, c.dtype);
      b.add_item(seqs[0]);
      b.add_item(seqs[1]);
      b.end_document();
      b.add_item(seqs[2]);
      b.add_item(seqs[3]);
      b.end_document();
      b.finalize();
      EXPECT_EQ(b.sequences(), 4);
      EXPECT_EQ(b.bytes_written(), 7 * indexed_dtype_size(c.dtype));
    }
    IndexedDataset ds(p);
    EXPECT_EQ(ds.dtype(), c.dtype);
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(bin_path(p))), 7 * indexed_dtype_size(c.dtype));
    ASSERT_EQ(ds.num_sequences(), 4);
    EXPECT_EQ(ds.num_documents(), 2);
    for (int i = 0; i < 4; ++i) {
      std::vector<int64_t> want(seqs[i].begin(), seqs[i].end());
      EXPECT_EQ(ds.sequence(i), want);
    }
  }
}

// A float dataset (codes 6, 7) holding a value that is not a whole number, or NaN, is refused
// naming the .bin, instead of truncating 3.5 to 3 (or converting NaN, which is undefined).
TEST_F(IndexedDatasetTest, FloatThatIsNoTokenIdIsRefused) {
  for (const float bad : {3.5f, std::numeric_limits<float>::quiet_NaN()}) {
    const std::string p = prefix(std::isnan(bad) ? "fnan" : "ffrac");
    {
      IndexedDatasetBuilder b(p, IndexedDtype::kFloat32);
      b.add_item(std::vector<int32_t>{1, 2, 3});
      b.end_document();
      b.finalize();
    }
    {
      std::fstream f(bin_path(p), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(4);  // token 1 of sequence 0
      f.write(reinterpret_cast<const char*>(&bad), sizeof bad);
    }
    IndexedDataset ds(p);
    try {
      (void)ds.sequence(0);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("not a token id"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bin_path(p)), std::string::npos) << e.what();
    }
  }
}

TEST_F(IndexedDatasetTest, OptimalDtypeFollowsMegatron) {
  EXPECT_EQ(optimal_indexed_dtype(32000), IndexedDtype::kUInt16);
  EXPECT_EQ(optimal_indexed_dtype(65499), IndexedDtype::kUInt16);
  EXPECT_EQ(optimal_indexed_dtype(65500), IndexedDtype::kInt32);
  EXPECT_EQ(optimal_indexed_dtype(128256), IndexedDtype::kInt32);
}

TEST_F(IndexedDatasetTest, ManyDocumentsWithSeveralSequencesEach) {
  std::string p = prefix("many");
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int64_t> docs = {0};
  {
    IndexedDatasetBuilder b(p, IndexedDtype::kInt32);
    int32_t v = 0;
    for (int d = 0; d < 50; ++d) {
      for (int s = 0; s < 1 + d % 4; ++s) {
        std::vector<int32_t> seq(static_cast<size_t>(1 + (d * 7 + s) % 13));
        for (auto& x : seq) x = v++ * 1000;
        b.add_item(seq);
        seqs.push_back(seq);
      }
      b.end_document();
      docs.push_back(static_cast<int64_t>(seqs.size()));
    }
    b.finalize();
  }
  IndexedDataset ds(p);
  ASSERT_EQ(ds.num_sequences(), static_cast<int64_t>(seqs.size()));
  ASSERT_EQ(ds.num_documents(), 50);
  EXPECT_EQ(std::vector<int64_t>(ds.document_indices(), ds.document_indices() + 51), docs);
  int64_t ptr = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(ds.pointers()[i], ptr);
    EXPECT_EQ(ds.sizes()[i], static_cast<int32_t>(seqs[i].size()));
    ptr += static_cast<int64_t>(seqs[i].size()) * 4;
    EXPECT_EQ(ds.sequence(static_cast<int64_t>(i)),
              std::vector<int64_t>(seqs[i].begin(), seqs[i].end()));
  }
}

// add_index gives the same bytes as writing the concatenation directly.
TEST_F(IndexedDatasetTest, AddIndexEqualsDirectWrite) {
  std::string a = write_small("a");
  std::string empty = prefix("empty");
  {
    IndexedDatasetBuilder b(empty, IndexedDtype::kUInt16);
    b.finalize();
  }
  std::string merged = prefix("merged"), direct = prefix("direct");
  {
    IndexedDatasetBuilder b(merged, IndexedDtype::kUInt16);
    b.add_item({9, 9});
    b.end_document();
    b.add_index(a);
    b.add_index(empty);
    b.add_index(a);
    b.finalize();
  }
  {
    IndexedDatasetBuilder b(direct, IndexedDtype::kUInt16);
    b.add_item({9, 9});
    b.end_document();
    for (int k = 0; k < 2; ++k) {
      b.add_item({1, 2, 3});
      b.add_item({258});
      b.end_document();
      b.add_item({7});
      b.end_document();
    }
    b.finalize();
  }
  EXPECT_EQ(slurp(idx_path(merged)), slurp(idx_path(direct)));
  EXPECT_EQ(slurp(bin_path(merged)), slurp(bin_path(direct)));
  IndexedDataset ds(merged);
  EXPECT_EQ(ds.num_documents(), 5);
  EXPECT_EQ(ds.sequence(6), (std::vector<int64_t>{7}));
}

TEST_F(IndexedDatasetTest, AddIndexRefusesOtherDtype) {
  std::string a = write_small("a");
  IndexedDatasetBuilder b(prefix("b"), IndexedDtype::kInt32);
  try {
    b.add_index(a);
    ADD_FAILURE();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(idx_path(a)), std::string::npos) << e.what();
  }
}

TEST_F(IndexedDatasetTest, IdOutsideDtypeIsRefused) {
  IndexedDatasetBuilder b(prefix("r"), IndexedDtype::kUInt16);
  EXPECT_THROW(b.add_item({65536}), UsageError);
  EXPECT_THROW(b.add_item({-1}), UsageError);
}

TEST_F(IndexedDatasetTest, UnfinishedBuilderLeavesNothing) {
  std::string p = prefix("unfinished");
  {
    IndexedDatasetBuilder b(p, IndexedDtype::kUInt16);
    b.add_item({1, 2});
    EXPECT_TRUE(fs::exists(bin_path(p) + ".tmp"));
  }
  for (const auto& e : fs::directory_iterator(dir_)) ADD_FAILURE() << "left behind: " << e.path();
}

// --- malformed files ---------------------------------------------------------------------

TEST_F(IndexedDatasetTest, MissingFiles) {
  std::string p = write_small("m");
  fs::remove(bin_path(p));
  expect_refused(p, bin_path(p), "cannot open");
  p = write_small("m2");
  fs::remove(idx_path(p));
  expect_refused(p, idx_path(p), "cannot open");
}

TEST_F(IndexedDatasetTest, TruncatedBin) {
  std::string p = write_small("t");
  fs::resize_file(bin_path(p), kGoldenBin.size() - 1);
  expect_refused(p, idx_path(p), "beyond the end of " + bin_path(p));
}

TEST_F(IndexedDatasetTest, BadHeader) {
  std::string p = write_small("h");
  auto idx = kGoldenIdx;
  idx[0] = 'X';
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "bad magic");
  idx = kGoldenIdx;
  idx[9] = 2;  // version
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "version 2");
  idx = kGoldenIdx;
  idx[17] = 9;  // dtype code
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "dtype code 9");
  idx = kGoldenIdx;
  idx[17] = 0;
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "dtype code 0");
  spit(idx_path(p), std::vector<uint8_t>(kGoldenIdx.begin(), kGoldenIdx.begin() + 20));
  expect_refused(p, idx_path(p), "truncated index");
}

TEST_F(IndexedDatasetTest, CountsDisagreeWithFileSize) {
  std::string p = write_small("c");
  auto idx = kGoldenIdx;
  idx[18] = 4;  // claims 4 sequences
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "need");
  idx = kGoldenIdx;
  idx.push_back(0);  // one stray byte
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "need");
  idx = kGoldenIdx;
  idx[18 + 7] = 0x80;  // absurd count, must not overflow
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "disagree");
}

TEST_F(IndexedDatasetTest, PointerOrSizeBeyondBin) {
  std::string p = write_small("p");
  auto idx = kGoldenIdx;
  idx[34 + 12 + 16] = 9;  // pointers[2] = 9: 1 token at byte 9 of a 10-byte file
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "beyond the end");
  idx = kGoldenIdx;
  idx[34 + 8] = 2;  // sizes[2] = 2
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "beyond the end");
  idx = kGoldenIdx;
  idx[34 + 12 + 16 + 7] = 0xff;  // negative pointer
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "beyond the end");
}

TEST_F(IndexedDatasetTest, BadDocumentIndices) {
  std::string p = write_small("d");
  const size_t doc = 34 + 12 + 24;
  auto idx = kGoldenIdx;
  idx[doc + 8] = 4;  // [0, 4, 3]: goes back
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "go back");
  idx = kGoldenIdx;
  idx[doc] = 1;  // [1, 2, 3]
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "must be 0");
  idx = kGoldenIdx;
  idx[doc + 16] = 2;  // [0, 2, 2]: sequence 2 in no document
  spit(idx_path(p), idx);
  expect_refused(p, idx_path(p), "sequence count");
}

TEST_F(IndexedDatasetTest, EmptyDatasetIsRefusedAtOpen) {
  std::string p = prefix("empty");
  {
    IndexedDatasetBuilder b(p, IndexedDtype::kUInt16);
    b.end_document();
    b.finalize();
  }
  expect_refused(p, idx_path(p), "no sequences");
}

}  // namespace
}  // namespace weft
