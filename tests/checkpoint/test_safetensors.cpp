// Reference tests for CRC-32C and the safetensors reader/writer. CRC-32C is checked against the
// published vectors (RFC 3720 B.4 and the "123456789" check value) and the SSE4.2 path against the
// portable one on random buffers of many lengths and alignments; safetensors against a file built
// byte by byte here from the specification, by round trips, and by a set of damaged files that
// the reader must refuse with a Status naming the file. Invariant under test: a file the writer
// reports ok reads back bit-exactly; the reader never accepts a header that points outside the
// file or disagrees with itself.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "weft/checkpoint/crc32c.h"
#include "weft/checkpoint/safetensors.h"

namespace weft::detail {
// Internal entry points of crc32c.cpp, declared here for the agreement test.
uint32_t crc32c_extend_sw(uint32_t crc, const void* data, size_t n);
bool crc32c_hw_available();
#if defined(__x86_64__)
uint32_t crc32c_extend_hw(uint32_t crc, const void* data, size_t n);
#endif
}  // namespace weft::detail

namespace weft {
namespace {

// ---------------------------------------------------------------------------------------------
// CRC-32C

using CrcFn = uint32_t (*)(uint32_t, const void*, size_t);

std::vector<std::pair<const char*, CrcFn>> crc_impls() {
  std::vector<std::pair<const char*, CrcFn>> v = {{"public", &crc32c_extend},
                                                  {"software", &detail::crc32c_extend_sw}};
#if defined(__x86_64__)
  if (detail::crc32c_hw_available()) v.push_back({"sse4.2", &detail::crc32c_extend_hw});
#endif
  return v;
}

TEST(Crc32c, KnownVectors) {
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<uint8_t>(i);
    dec[i] = static_cast<uint8_t>(31 - i);
  }
  for (const auto& [what, fn] : crc_impls()) {
    SCOPED_TRACE(what);
    EXPECT_EQ(fn(0, "123456789", 9), 0xE3069283u);
    EXPECT_EQ(fn(0, zeros.data(), 32), 0x8A9136AAu);
    EXPECT_EQ(fn(0, ones.data(), 32), 0x62A8AB43u);
    EXPECT_EQ(fn(0, inc.data(), 32), 0x46DD794Eu);
    EXPECT_EQ(fn(0, dec.data(), 32), 0x113FDB5Cu);
    EXPECT_EQ(fn(0, "", 0), 0u);
    EXPECT_EQ(fn(0, "a", 1), 0xC1D04330u);
  }
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
}

TEST(Crc32c, HardwareMatchesSoftware) {
  if (!detail::crc32c_hw_available()) GTEST_SKIP() << "no SSE4.2 on this CPU";
#if defined(__x86_64__)
  std::mt19937_64 rng(12345);
  std::vector<uint8_t> buf(70000 + 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (size_t n : {1023, 1024, 1025, 4095, 4096, 65535, 65536, 70000}) lengths.push_back(n);
  for (size_t align = 0; align < 16; ++align) {
    for (size_t n : lengths) {
      const uint8_t* p = buf.data() + align;
      const uint32_t seed = static_cast<uint32_t>(rng());
      ASSERT_EQ(detail::crc32c_extend_hw(0, p, n), detail::crc32c_extend_sw(0, p, n))
          << "align " << align << " length " << n;
      ASSERT_EQ(detail::crc32c_extend_hw(seed, p, n), detail::crc32c_extend_sw(seed, p, n))
          << "align " << align << " length " << n << " seed " << seed;
    }
  }
#endif
}

TEST(Crc32c, ExtendComposes) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(1000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (const auto& [what, fn] : crc_impls()) {
    SCOPED_TRACE(what);
    const uint32_t whole = fn(0, buf.data(), buf.size());
    for (size_t cut = 0; cut <= buf.size(); ++cut)
      ASSERT_EQ(fn(fn(0, buf.data(), cut), buf.data() + cut, buf.size() - cut), whole)
          << "cut " << cut;
    // Three pieces, with the middle one at an odd alignment.
    ASSERT_EQ(fn(fn(fn(0, buf.data(), 3), buf.data() + 3, 501), buf.data() + 504, 496), whole);
  }
}

// ---------------------------------------------------------------------------------------------
// safetensors helpers

// A fresh directory under TMPDIR for each test, removed with its files afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/weft_st_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override {
    for (const auto& f : created_) ::unlink(f.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string file(const std::string& name) {
    created_.push_back(dir_ + "/" + name);
    return created_.back();
  }
  std::string dir_;
  std::vector<std::string> created_;
};

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A safetensors file from its parts as the specification lays them out: u64 LE header length,
// the JSON header padded with spaces to a multiple of 8, then `data_bytes` bytes of data.
std::string make_file(const std::string& json, size_t data_bytes, bool pad = true) {
  std::string h = json;
  if (pad) h.append((8 - h.size() % 8) % 8, ' ');
  std::string data(data_bytes, '\0');
  for (size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<char>(i * 7 + 1);
  return le64(h.size()) + h + data;
}

bool exists(const std::string& path) {
  struct stat sb;
  return ::stat(path.c_str(), &sb) == 0;
}

// ---------------------------------------------------------------------------------------------
// safetensors: spec conformance and round trips

TEST(Safetensors, DtypeSizes) {
  EXPECT_EQ(safetensors_dtype_size("F64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("F32"), 4u);
  EXPECT_EQ(safetensors_dtype_size("F16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("BF16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("I64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("I32"), 4u);
  EXPECT_EQ(safetensors_dtype_size("I16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("I8"), 1u);
  EXPECT_EQ(safetensors_dtype_size("U8"), 1u);
  EXPECT_EQ(safetensors_dtype_size("BOOL"), 1u);
  EXPECT_EQ(safetensors_dtype_size("f32"), 0u);
  EXPECT_EQ(safetensors_dtype_size(""), 0u);
}

TEST_F(SafetensorsTest, ByteExactAgainstSpec) {
  const float a[2] = {1.0f, -2.5f};
  const uint8_t b[3] = {1, 2, 3};
  const std::string path = file("tiny.safetensors");
  ASSERT_TRUE(safetensors_write(path,
                                {{"a", "F32", {2}, a, sizeof a}, {"b", "U8", {3, 1}, b, sizeof b}},
                                {{"format", "pt"}})
                  .is_ok());

  // Built by hand: metadata first, then entries in the given order, data back to back.
  std::string json =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[3,1],"data_offsets":[8,11]}})";
  ASSERT_EQ(json.size(), 140u);
  json.append(4, ' ');  // N = 144: 8 + 144 = 152, a multiple of 8
  std::string expect;
  expect += std::string("\x90\0\0\0\0\0\0\0", 8);  // 144, little-endian
  expect += json;
  const unsigned char a_le[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0};  // 1.0f, -2.5f
  expect.append(reinterpret_cast<const char*>(a_le), 8);
  expect.append("\x01\x02\x03", 3);
  EXPECT_EQ(read_all(path), expect);
  EXPECT_EQ(read_all(path).size(), 8u + 144u + 11u);
}

TEST_F(SafetensorsTest, NoMetadataOmitsKeyAndPadsToEight) {
  const int64_t v = 5;
  const std::string path = file("nometa.safetensors");
  ASSERT_TRUE(safetensors_write(path, {{"x", "I64", {}, &v, 8}}, {}).is_ok());
  const std::string bytes = read_all(path);
  const std::string json = R"({"x":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})";
  std::string padded = json;
  padded.append((8 - padded.size() % 8) % 8, ' ');
  EXPECT_EQ(bytes, le64(padded.size()) + padded + std::string(reinterpret_cast<const char*>(&v), 8));
  EXPECT_EQ((bytes.size() - 8) % 8, 0u);
}

TEST_F(SafetensorsTest, RoundTripSeveralDtypes) {
  std::mt19937_64 rng(99);
  std::vector<double> f64(3 * 5);
  std::vector<float> f32(7 * 11 * 2);
  std::vector<uint16_t> bf16(33), f16(4);
  std::vector<int32_t> i32(9);
  std::vector<int8_t> i8(17);
  std::vector<uint8_t> boolean(6);
  for (auto& x : f64) x = std::uniform_real_distribution<double>(-1, 1)(rng);
  for (auto& x : f32) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (auto& x : bf16) x = static_cast<uint16_t>(rng());
  for (auto& x : f16) x = static_cast<uint16_t>(rng());
  for (auto& x : i32) x = static_cast<int32_t>(rng());
  for (auto& x : i8) x = static_cast<int8_t>(rng());
  for (auto& x : boolean) x = rng() & 1;

  // Not in name order, with an empty tensor in the middle and a scalar.
  const int64_t scalar = -42;
  std::vector<SafetensorsWriteEntry> entries = {
      {"z.f32", "F32", {7, 11, 2}, f32.data(), f32.size() * 4},
      {"a.f64", "F64", {3, 5}, f64.data(), f64.size() * 8},
      {"empty", "F32", {4, 0, 3}, nullptr, 0},
      {"m.bf16", "BF16", {33}, bf16.data(), bf16.size() * 2},
      {"m.f16", "F16", {2, 2}, f16.data(), f16.size() * 2},
      {"i32", "I32", {9}, i32.data(), i32.size() * 4},
      {"i8", "I8", {17}, i8.data(), i8.size()},
      {"bool", "BOOL", {6}, boolean.data(), boolean.size()},
      {"scalar", "I64", {}, &scalar, 8},
  };
  const std::map<std::string, std::string> metadata = {
      {"format", "weft-checkpoint"}, {"version", "1"}, {"chunks", R"([{"key": "w", "x": "\"q\""}])"},
      {"unicode", "gr\xc3\xbc\xc3\x9f"}};
  const std::string path = file("rt.safetensors");
  const Status st = safetensors_write(path, entries, metadata);
  ASSERT_TRUE(st.is_ok()) << st.message();

  SafetensorsHeader h;
  const Status hs = safetensors_read_header(path, &h);
  ASSERT_TRUE(hs.is_ok()) << hs.message();
  EXPECT_EQ(h.metadata, metadata);
  EXPECT_EQ(h.data_start % 8, 0u);
  EXPECT_EQ(h.file_size, static_cast<uint64_t>(read_all(path).size()));
  ASSERT_EQ(h.entries.size(), entries.size());
  uint64_t offset = 0;  // data back to back in the given order
  for (const auto& e : entries) {
    SCOPED_TRACE(e.name);
    ASSERT_TRUE(h.entries.count(e.name));
    const SafetensorsEntry& r = h.entries.at(e.name);
    EXPECT_EQ(r.dtype, e.dtype);
    EXPECT_EQ(r.shape, e.shape);
    EXPECT_EQ(r.begin, offset);
    EXPECT_EQ(r.end, offset + e.nbytes);
    offset += e.nbytes;
    std::vector<char> got(e.nbytes + 1, '\x5a');
    const Status rs = safetensors_read_entry(path, h, e.name, got.data(), e.nbytes);
    ASSERT_TRUE(rs.is_ok()) << rs.message();
    if (e.nbytes) {
      EXPECT_EQ(std::memcmp(got.data(), e.data, e.nbytes), 0);
    }
    EXPECT_EQ(got[e.nbytes], '\x5a');  // nothing written past the entry
  }
  EXPECT_EQ(h.data_start + offset, h.file_size);

  // Wrong buffer size and unknown names are refused, naming file and entry.
  float small[1];
  Status bad = safetensors_read_entry(path, h, "z.f32", small, sizeof small);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find(path), std::string::npos);
  EXPECT_NE(bad.message().find("z.f32"), std::string::npos);
  bad = safetensors_read_entry(path, h, "nope", small, sizeof small);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("nope"), std::string::npos);
}

TEST_F(SafetensorsTest, WriteTruncatesExistingFile) {
  const std::string path = file("over.safetensors");
  write_all(path, std::string(10000, 'x'));
  const uint8_t b = 9;
  ASSERT_TRUE(safetensors_write(path, {{"b", "U8", {1}, &b, 1}}, {}).is_ok());
  SafetensorsHeader h;
  ASSERT_TRUE(safetensors_read_header(path, &h).is_ok());
  EXPECT_EQ(h.file_size, h.data_start + 1);
}

TEST_F(SafetensorsTest, ReadsForeignLayout) {
  // Another writer may order entries differently, leave out padding and use whitespace; the
  // reader follows the offsets, not the order.
  const std::string path = file("foreign.safetensors");
  write_all(path, make_file(R"({ "b" : {"data_offsets":[0,2],"shape":[2],"dtype":"U8"},
                                 "a" : {"dtype":"I16","shape":[1],"data_offsets":[2,4]} })",
                            4, /*pad=*/false));
  SafetensorsHeader h;
  const Status st = safetensors_read_header(path, &h);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_TRUE(h.metadata.empty());
  uint8_t b[2];
  int16_t a;
  ASSERT_TRUE(safetensors_read_entry(path, h, "b", b, 2).is_ok());
  ASSERT_TRUE(safetensors_read_entry(path, h, "a", &a, 2).is_ok());
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[1], 8);
  EXPECT_EQ(a, static_cast<int16_t>(15 | (22 << 8)));
}

// ---------------------------------------------------------------------------------------------
// safetensors: writer refusals and failure cleanup

TEST_F(SafetensorsTest, WriterRefusesBadArgumentsWithoutTouchingFile) {
  const std::string path = file("keep.safetensors");
  write_all(path, "previous contents");
  const float f[4] = {};
  const std::vector<std::vector<SafetensorsWriteEntry>> bad = {
      {{"w", "F32", {3}, f, 16}},                         // nbytes != prod(shape) * 4
      {{"w", "F31", {4}, f, 16}},                         // unknown dtype
      {{"w", "F32", {-4}, f, 16}},                        // negative dimension
      {{"w", "F32", {4}, nullptr, 16}},                   // no data
      {{"w", "F32", {2}, f, 8}, {"w", "F32", {2}, f, 8}},  // duplicate name
      {{"__metadata__", "F32", {4}, f, 16}},              // reserved name
      {{"bad\xff", "F32", {4}, f, 16}},                   // not UTF-8
  };
  for (const auto& entries : bad) {
    const Status st = safetensors_write(path, entries, {});
    EXPECT_FALSE(st.is_ok()) << entries[0].name;
    EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
    EXPECT_EQ(read_all(path), "previous contents");
  }
}

TEST_F(SafetensorsTest, WriterReportsErrnoForMissingDirectory) {
  const std::string path = dir_ + "/no/such/dir/x.safetensors";
  const uint8_t b = 1;
  const Status st = safetensors_write(path, {{"b", "U8", {1}, &b, 1}}, {});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(std::strerror(ENOENT)), std::string::npos) << st.message();
}

TEST_F(SafetensorsTest, WriterRemovesPartialFileOnWriteError) {
  // Fault injection: a file size limit makes write() fail with EFBIG part way through the data.
  const std::string path = file("partial.safetensors");
  std::vector<uint8_t> big(1 << 20, 0xAB);
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto prev_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  const Status st = safetensors_write(path, {{"big", "U8", {1 << 20}, big.data(), big.size()}}, {});
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, prev_handler);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("big"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(std::strerror(EFBIG)), std::string::npos) << st.message();
  EXPECT_FALSE(exists(path));
}

// ---------------------------------------------------------------------------------------------
// safetensors: reader refusals. Each damaged file must be refused with the file in the message
// (and the entry, where one is at fault).

struct Damaged {
  const char* what;
  std::string bytes;
  const char* entry;  // expected in the message, or nullptr
};

TEST_F(SafetensorsTest, ReaderRefusesDamagedFiles) {
  const std::string good_json = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string good = make_file(good_json, 8);
  std::string huge_n = good;
  huge_n.replace(0, 8, le64(uint64_t{1} << 40));
  std::string long_n = good;
  long_n.replace(0, 8, le64(good.size()));  // 8 + N > file size, N < 100 MB

  const std::vector<Damaged> cases = {
      {"empty file", "", nullptr},
      {"shorter than the size field", std::string("\x08\0\0\0", 4), nullptr},
      {"header size past the limit", huge_n, nullptr},
      {"header size past the end of file", long_n, nullptr},
      {"header cut short", good.substr(0, 20), nullptr},
      {"data cut short", good.substr(0, good.size() - 1), "a"},
      {"bad JSON", make_file(R"({"a":{"dtype":"F32",)", 8), nullptr},
      {"JSON not an object", make_file("[1,2,3]", 0), nullptr},
      {"entry not an object", make_file(R"({"a":3})", 0), "a"},
      {"unknown dtype",
       make_file(R"({"a":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})", 8), "a"},
      {"missing dtype", make_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8), "a"},
      {"negative dimension",
       make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "a"},
      {"fractional dimension",
       make_file(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8), "a"},
      {"missing offsets", make_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "a"},
      {"one offset", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "a"},
      {"negative offset",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8), "a"},
      {"reversed offsets",
       make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8), "a"},
      {"offsets out of range",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8), "a"},
      {"offsets far out of range",
       make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,)"
                 R"(18446744073709551615]}})",
                 8),
       "a"},
      {"size/shape mismatch",
       make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 12), "a"},
      {"size/dtype mismatch",
       make_file(R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", 8), "a"},
      {"shape product overflows",
       make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                 0),
       "a"},
      {"overlapping entries",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 12),
       "b"},
      {"identical ranges",
       make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                 4),
       nullptr},
      {"duplicate name",
       make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                 8),
       "a"},
      {"metadata not a map", make_file(R"({"__metadata__":[1]})", 0), nullptr},
      {"metadata value not a string", make_file(R"({"__metadata__":{"v":1}})", 0), nullptr},
  };
  int i = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = file("bad" + std::to_string(i++) + ".safetensors");
    write_all(path, c.bytes);
    SafetensorsHeader h;
    const Status st = safetensors_read_header(path, &h);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
    if (c.entry) {
      EXPECT_NE(st.message().find(std::string("'") + c.entry + "'"), std::string::npos)
          << st.message();
    }
  }

  // Sanity: the undamaged file and legal edge cases are accepted.
  const std::vector<std::string> fine = {
      good,
      make_file("{}", 0),
      make_file(R"({"__metadata__":{}})", 0),
      // Empty entries may sit anywhere, even inside another entry's bytes.
      make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                8),
  };
  for (const auto& bytes : fine) {
    const std::string path = file("fine" + std::to_string(i++) + ".safetensors");
    write_all(path, bytes);
    SafetensorsHeader h;
    const Status st = safetensors_read_header(path, &h);
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
}

TEST_F(SafetensorsTest, ReaderNamesMissingFile) {
  const std::string path = dir_ + "/absent.safetensors";
  SafetensorsHeader h;
  const Status st = safetensors_read_header(path, &h);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(path), std::string::npos);
  EXPECT_NE(st.message().find(std::strerror(ENOENT)), std::string::npos) << st.message();
}

TEST_F(SafetensorsTest, EntryReadDetectsFileTruncatedAfterHeader) {
  const std::string path = file("shrunk.safetensors");
  std::vector<float> v(1000, 1.5f);
  ASSERT_TRUE(safetensors_write(path, {{"v", "F32", {1000}, v.data(), 4000}}, {}).is_ok());
  SafetensorsHeader h;
  ASSERT_TRUE(safetensors_read_header(path, &h).is_ok());
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(h.data_start + 100)), 0);
  std::vector<float> got(1000);
  const Status st = safetensors_read_entry(path, h, "v", got.data(), 4000);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(path), std::string::npos);
  EXPECT_NE(st.message().find("'v'"), std::string::npos) << st.message();
}

// The streamed writer: the bytes of safetensors_write for the same entries, and no file left
// when the data source fails or throws.
TEST_F(SafetensorsTest, StreamedWriterMatchesAndLeavesNoPartialFile) {
  std::vector<float> a(3000), b(777);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -1.0f * static_cast<float>(i);
  const std::vector<SafetensorsWriteEntry> entries = {{"a", "F32", {3000}, a.data(), 12000},
                                                      {"b", "F32", {7, 111}, b.data(), 3108}};
  const std::string whole = file("whole.safetensors"), streamed = file("streamed.safetensors");
  ASSERT_TRUE(safetensors_write(whole, entries, {{"format", "pt"}}).is_ok());
  auto source = [&](size_t i, size_t off, size_t, const void** p) {
    *p = static_cast<const char*>(entries[i].data) + off;
    return Status::ok();
  };
  auto meta = [](const std::vector<uint32_t>&) {
    return std::map<std::string, std::string>{{"format", "pt"}};
  };
  std::vector<uint32_t> crcs;
  ASSERT_TRUE(safetensors_write_streamed(streamed, entries, source, meta, 1000, &crcs).is_ok());
  EXPECT_EQ(read_all(streamed), read_all(whole));
  EXPECT_EQ(crcs[1], crc32c(b.data(), 3108));

  const std::string failed = file("failed.safetensors"), thrown = file("thrown.safetensors");
  auto failing = [&](size_t i, size_t off, size_t n, const void** p) {
    return i == 1 ? Status::error("no data") : source(i, off, n, p);
  };
  const Status st = safetensors_write_streamed(failed, entries, failing, meta, 1000, &crcs);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("no data"), std::string::npos) << st.message();
  EXPECT_FALSE(exists(failed));
  auto throwing = [&](size_t i, size_t off, size_t n, const void** p) -> Status {
    if (i == 1) throw std::runtime_error("source threw");
    return source(i, off, n, p);
  };
  EXPECT_THROW(safetensors_write_streamed(thrown, entries, throwing, meta, 1000, &crcs),
               std::runtime_error);
  EXPECT_FALSE(exists(thrown));
}

}  // namespace
}  // namespace weft
