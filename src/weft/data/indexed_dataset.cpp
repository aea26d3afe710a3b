// Megatron's indexed dataset (PREFIX.bin + PREFIX.idx): the streaming builder and the validating,
// memory-mapped reader. docs/data-format.md is the specification this file implements.
//
// Invariant: for the same token ids the builder writes the same bytes as Megatron-LM's
// IndexedDatasetBuilder (add_item / end_document / add_index / finalize), and a dataset the
// reader accepts has every sequence inside .bin and document indices running from 0 to the
// sequence count without going back. Files appear under their final names only at finalize().
#include "weft/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <limits>

#include "weft/core/error.h"

namespace weft {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, S, D+1

bool valid_dtype_code(uint8_t c) { return c >= 1 && c <= 8; }

// Whole-file reads and writes over POSIX descriptors; errors name the file.
int64_t file_size_or_fail(const std::string& path, const std::string& prefix) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    fail_usage("{}: cannot open ({}); an indexed dataset needs both {} and {}", path,
               std::strerror(errno), idx_path(prefix), bin_path(prefix));
  return static_cast<int64_t>(st.st_size);
}

std::vector<uint8_t> read_whole(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_usage("{}: cannot open ({})", path, std::strerror(errno));
  struct stat st{};
  ::fstat(fd, &st);
  std::vector<uint8_t> buf(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t r = ::pread(fd, buf.data() + done, buf.size() - done, static_cast<off_t>(done));
    if (r <= 0) {
      ::close(fd);
      fail_usage("{}: read failed ({})", path, r < 0 ? std::strerror(errno) : "unexpected end");
    }
    done += static_cast<size_t>(r);
  }
  ::close(fd);
  return buf;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("{}: write failed ({})", path, std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// The parsed, validated .idx: arrays copied out of the file, because they sit at unaligned
// offsets (the header is 34 bytes).
struct Index {
  IndexedDtype dtype{};
  std::vector<int32_t> sizes;
  std::vector<int64_t> pointers;
  std::vector<int64_t> document_indices;
};

// Validates everything the .idx says against itself and against `bin_bytes`.
Index parse_index(const std::string& path, int64_t bin_bytes, const std::string& bin) {
  std::vector<uint8_t> b = read_whole(path);
  const int64_t n = static_cast<int64_t>(b.size());
  if (n < kHeaderBytes)
    fail_usage("{}: truncated index ({} bytes, the header alone is {})", path, n, kHeaderBytes);
  if (std::memcmp(b.data(), kMagic, 9) != 0)
    fail_usage("{}: not a Megatron indexed dataset index (bad magic, expected \"MMIDIDX\\0\\0\")",
               path);
  uint64_t version = load<uint64_t>(b.data() + 9);
  if (version != kVersion)
    fail_usage("{}: unsupported index version {} (weft reads version {})", path, version, kVersion);
  uint8_t code = b[17];
  if (!valid_dtype_code(code))
    fail_usage("{}: unknown dtype code {} (known: 1..8, see docs/data-format.md)", path, code);
  uint64_t s = load<uint64_t>(b.data() + 18);
  uint64_t d = load<uint64_t>(b.data() + 26);
  // Bounded first so that the size arithmetic below cannot overflow.
  const uint64_t cap = static_cast<uint64_t>(n);
  if (s > cap || d > cap)
    fail_usage("{}: sequence count {} / document count {} disagree with the file size {}", path,
               s, d, n);
  const int64_t expected = kHeaderBytes + static_cast<int64_t>(s) * 12 + static_cast<int64_t>(d) * 8;
  if (n == expected + static_cast<int64_t>(s) && s > 0)
    fail_usage("{}: multimodal index (per-sequence modes) is not supported", path);
  if (n != expected)
    fail_usage("{}: {} sequences and {} document indices need {} bytes, the file has {}", path, s,
               d, expected, n);
  if (d < 1) fail_usage("{}: no document indices (there must be at least the leading 0)", path);

  Index ix;
  ix.dtype = static_cast<IndexedDtype>(code);
  ix.sizes.resize(s);
  ix.pointers.resize(s);
  ix.document_indices.resize(d);
  const uint8_t* p = b.data() + kHeaderBytes;
  std::memcpy(ix.sizes.data(), p, s * 4);
  std::memcpy(ix.pointers.data(), p + s * 4, s * 8);
  std::memcpy(ix.document_indices.data(), p + s * 12, d * 8);

  const int64_t item = indexed_dtype_size(ix.dtype);
  for (uint64_t i = 0; i < s; ++i) {
    int64_t sz = ix.sizes[i], ptr = ix.pointers[i];
    if (sz < 0) fail_usage("{}: sequence {} has negative size {}", path, i, sz);
    if (ptr < 0 || ptr > bin_bytes || sz * item > bin_bytes - ptr)
      fail_usage("{}: sequence {} ({} tokens at byte {}) lies beyond the end of {} ({} bytes); "
                 "the .bin is truncated or belongs to another index",
                 path, i, sz, ptr, bin, bin_bytes);
  }
  const auto& di = ix.document_indices;
  if (di[0] != 0) fail_usage("{}: document_indices[0] is {}, must be 0", path, di[0]);
  for (uint64_t k = 1; k < d; ++k)
    if (di[k] < di[k - 1])
      fail_usage("{}: document indices go back at document {} ({} after {})", path, k - 1, di[k],
                 di[k - 1]);
  if (di[d - 1] != static_cast<int64_t>(s))
    fail_usage("{}: the last document index is {}, must equal the sequence count {}", path,
               di[d - 1], s);
  return ix;
}

bool fits(IndexedDtype d, int32_t v) {
  switch (d) {
    case IndexedDtype::kUInt8: return v >= 0 && v <= 255;
    case IndexedDtype::kInt8: return v >= -128 && v <= 127;
    case IndexedDtype::kInt16: return v >= -32768 && v <= 32767;
    case IndexedDtype::kUInt16: return v >= 0 && v <= 65535;
    case IndexedDtype::kFloat32: return v >= -(1 << 24) && v <= (1 << 24);  // exact in float
    default: return true;
  }
}

// Appends `n` ids converted to dtype `d` to `out` (little-endian hosts only, as Megatron).
void encode_ids(IndexedDtype d, const int32_t* ids, int64_t n, std::vector<uint8_t>* out) {
  const size_t item = static_cast<size_t>(indexed_dtype_size(d));
  out->resize(static_cast<size_t>(n) * item);
  uint8_t* o = out->data();
  auto put = [&](auto cast) {
    using T = decltype(cast);
    for (int64_t i = 0; i < n; ++i) {
      T v = static_cast<T>(ids[i]);
      std::memcpy(o + i * sizeof(T), &v, sizeof(T));
    }
  };
  switch (d) {
    case IndexedDtype::kUInt8: put(uint8_t{}); break;
    case IndexedDtype::kInt8: put(int8_t{}); break;
    case IndexedDtype::kInt16: put(int16_t{}); break;
    case IndexedDtype::kInt32: put(int32_t{}); break;
    case IndexedDtype::kInt64: put(int64_t{}); break;
    case IndexedDtype::kFloat64: put(double{}); break;
    case IndexedDtype::kFloat32: put(float{}); break;
    case IndexedDtype::kUInt16: put(uint16_t{}); break;
  }
}

}  // namespace

int indexed_dtype_size(IndexedDtype d) {
  switch (d) {
    case IndexedDtype::kUInt8:
    case IndexedDtype::kInt8: return 1;
    case IndexedDtype::kInt16:
    case IndexedDtype::kUInt16: return 2;
    case IndexedDtype::kInt32:
    case IndexedDtype::kFloat32: return 4;
    case IndexedDtype::kInt64:
    case IndexedDtype::kFloat64: return 8;
  }
  fail("unknown indexed dtype code {}", static_cast<int>(d));
}

IndexedDtype optimal_indexed_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDtype::kUInt16 : IndexedDtype::kInt32;
}

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

// ---------------------------------------------------------------------------------------------
// Builder

struct IndexedDatasetBuilder::Impl {
  std::string prefix, bin_tmp, idx_tmp;
  IndexedDtype dtype;
  int fd = -1;
  std::vector<int32_t> sizes;
  std::vector<int64_t> document_indices{0};
  std::vector<uint8_t> scratch;
  int64_t bytes = 0;
  bool finalized = false;

  std::vector<uint8_t> pending;  // .bin bytes not yet written, flushed at 1 MiB

  void write(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    pending.insert(pending.end(), c, c + n);
    bytes += static_cast<int64_t>(n);
    if (pending.size() >= (1u << 20)) flush();
  }
  void flush() {
    write_all(fd, pending.data(), pending.size(), bin_tmp);
    pending.clear();
  }
};

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& prefix, IndexedDtype dtype)
    : impl_(std::make_unique<Impl>()) {
  if (!valid_dtype_code(static_cast<uint8_t>(dtype)))
    fail_usage("{}: unknown dtype code {}", bin_path(prefix), static_cast<int>(dtype));
  impl_->prefix = prefix;
  impl_->dtype = dtype;
  impl_->bin_tmp = bin_path(prefix) + ".tmp";
  impl_->idx_tmp = idx_path(prefix) + ".tmp";
  impl_->fd = ::open(impl_->bin_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (impl_->fd < 0)
    fail_usage("{}: cannot create ({}); check --output-prefix", impl_->bin_tmp,
               std::strerror(errno));
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!impl_ || impl_->finalized) return;
  if (impl_->fd >= 0) ::close(impl_->fd);
  ::unlink(impl_->bin_tmp.c_str());
  ::unlink(impl_->idx_tmp.c_str());
}

void IndexedDatasetBuilder::add_item(const int32_t* ids, int64_t n) {
  Impl& m = *impl_;
  WEFT_CHECK(!m.finalized, "{}: add_item after finalize", m.prefix);
  if (n > std::numeric_limits<int32_t>::max())
    fail_usage("{}: a sequence of {} tokens exceeds the int32 size field", bin_path(m.prefix), n);
  for (int64_t i = 0; i < n; ++i)
    if (!fits(m.dtype, ids[i]))
      fail_usage("{}: token id {} does not fit the dataset dtype (code {})", bin_path(m.prefix),
                 ids[i], static_cast<int>(m.dtype));
  encode_ids(m.dtype, ids, n, &m.scratch);
  m.write(m.scratch.data(), m.scratch.size());
  m.sizes.push_back(static_cast<int32_t>(n));
}

void IndexedDatasetBuilder::end_document() {
  impl_->document_indices.push_back(static_cast<int64_t>(impl_->sizes.size()));
}

void IndexedDatasetBuilder::add_index(const std::string& other_prefix) {
  Impl& m = *impl_;
  const std::string obin = bin_path(other_prefix), oidx = idx_path(other_prefix);
  int64_t obytes = file_size_or_fail(obin, other_prefix);
  file_size_or_fail(oidx, other_prefix);
  Index ix = parse_index(oidx, obytes, obin);
  if (ix.dtype != m.dtype)
    fail_usage("{}: dtype code {} differs from the builder's {}", oidx,
               static_cast<int>(ix.dtype), static_cast<int>(m.dtype));
  // Megatron recomputes pointers from sizes, so the data must be back to back from byte 0.
  const int64_t item = indexed_dtype_size(m.dtype);
  int64_t expect = 0;
  for (size_t i = 0; i < ix.sizes.size(); ++i) {
    if (ix.pointers[i] != expect)
      fail_usage("{}: sequence {} is not stored right after the previous one; add_index needs "
                 "contiguous data", oidx, i);
    expect += ix.sizes[i] * item;
  }
  const int64_t offset = static_cast<int64_t>(m.sizes.size());
  m.sizes.insert(m.sizes.end(), ix.sizes.begin(), ix.sizes.end());
  for (size_t k = 1; k < ix.document_indices.size(); ++k)
    m.document_indices.push_back(offset + ix.document_indices[k]);
  // Copy the data in 4 MiB pieces: never the whole .bin in memory.
  int in = ::open(obin.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) fail_usage("{}: cannot open ({})", obin, std::strerror(errno));
  std::vector<uint8_t> buf(4 << 20);
  for (int64_t done = 0; done < expect;) {
    size_t want = static_cast<size_t>(std::min<int64_t>(expect - done, buf.size()));
    ssize_t r = ::pread(in, buf.data(), want, static_cast<off_t>(done));
    if (r <= 0) {
      ::close(in);
      fail_usage("{}: read failed at byte {}", obin, done);
    }
    m.write(buf.data(), static_cast<size_t>(r));  // flushes at once: r is up to 4 MiB
    done += r;
  }
  ::close(in);
}

void IndexedDatasetBuilder::finalize() {
  Impl& m = *impl_;
  WEFT_CHECK(!m.finalized, "{}: finalize called twice", m.prefix);
  m.flush();
  if (::fsync(m.fd) != 0) fail("{}: fsync failed ({})", m.bin_tmp, std::strerror(errno));
  ::close(m.fd);
  m.fd = -1;

  const uint64_t s = m.sizes.size(), d = m.document_indices.size();
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(kHeaderBytes + s * 12 + d * 8));
  auto put = [&](const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    out.insert(out.end(), c, c + n);
  };
  put(kMagic, 9);
  put(&kVersion, 8);
  uint8_t code = static_cast<uint8_t>(m.dtype);
  put(&code, 1);
  put(&s, 8);
  put(&d, 8);
  put(m.sizes.data(), s * 4);
  const int64_t item = indexed_dtype_size(m.dtype);
  int64_t ptr = 0;
  for (int32_t sz : m.sizes) {
    put(&ptr, 8);
    ptr += sz * item;
  }
  put(m.document_indices.data(), d * 8);

  int fd = ::open(m.idx_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_usage("{}: cannot create ({})", m.idx_tmp, std::strerror(errno));
  write_all(fd, out.data(), out.size(), m.idx_tmp);
  if (::fsync(fd) != 0) fail("{}: fsync failed ({})", m.idx_tmp, std::strerror(errno));
  ::close(fd);
  // .bin first, .idx last: a complete .idx under its final name means the pair is complete.
  if (std::rename(m.bin_tmp.c_str(), bin_path(m.prefix).c_str()) != 0)
    fail("{}: rename to {} failed ({})", m.bin_tmp, bin_path(m.prefix), std::strerror(errno));
  if (std::rename(m.idx_tmp.c_str(), idx_path(m.prefix).c_str()) != 0)
    fail("{}: rename to {} failed ({})", m.idx_tmp, idx_path(m.prefix), std::strerror(errno));
  m.finalized = true;
}

int64_t IndexedDatasetBuilder::sequences() const { return static_cast<int64_t>(impl_->sizes.size()); }
int64_t IndexedDatasetBuilder::bytes_written() const { return impl_->bytes; }

// ---------------------------------------------------------------------------------------------
// Reader

struct IndexedDataset::Impl {
  std::string prefix;
  Index ix;
  const uint8_t* bin = nullptr;  // mapped read-only; nullptr when .bin is empty
  size_t bin_bytes = 0;
};

IndexedDataset::IndexedDataset(const std::string& prefix) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.prefix = prefix;
  const std::string idx = idx_path(prefix), bin = bin_path(prefix);
  file_size_or_fail(idx, prefix);
  int64_t bin_bytes = file_size_or_fail(bin, prefix);
  m.ix = parse_index(idx, bin_bytes, bin);
  if (m.ix.sizes.empty())
    fail_usage("{}: the dataset has no sequences (nothing to read); was the input empty?", idx);
  m.bin_bytes = static_cast<size_t>(bin_bytes);
  if (m.bin_bytes > 0) {
    int fd = ::open(bin.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail_usage("{}: cannot open ({})", bin, std::strerror(errno));
    void* p = ::mmap(nullptr, m.bin_bytes, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) fail_usage("{}: mmap failed ({})", bin, std::strerror(errno));
    m.bin = static_cast<const uint8_t*>(p);
  }
}

IndexedDataset::~IndexedDataset() {
  if (impl_ && impl_->bin) ::munmap(const_cast<uint8_t*>(impl_->bin), impl_->bin_bytes);
}

const std::string& IndexedDataset::prefix() const { return impl_->prefix; }
IndexedDtype IndexedDataset::dtype() const { return impl_->ix.dtype; }
int64_t IndexedDataset::num_sequences() const { return static_cast<int64_t>(impl_->ix.sizes.size()); }
int64_t IndexedDataset::num_documents() const {
  return static_cast<int64_t>(impl_->ix.document_indices.size()) - 1;
}
const int32_t* IndexedDataset::sizes() const { return impl_->ix.sizes.data(); }
const int64_t* IndexedDataset::pointers() const { return impl_->ix.pointers.data(); }
const int64_t* IndexedDataset::document_indices() const {
  return impl_->ix.document_indices.data();
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t length, int64_t* out) const {
  const Impl& m = *impl_;
  WEFT_CHECK(i >= 0 && i < num_sequences(), "{}: sequence {} of {}", m.prefix, i, num_sequences());
  WEFT_CHECK(offset >= 0 && length >= 0 && offset + length <= m.ix.sizes[i],
             "{}: tokens [{}, {}) of sequence {} (size {})", m.prefix, offset, offset + length, i,
             m.ix.sizes[i]);
  if (length == 0) return;
  const int64_t item = indexed_dtype_size(m.ix.dtype);
  const uint8_t* p = m.bin + m.ix.pointers[i] + offset * item;
  auto get = [&](auto cast) {
    using T = decltype(cast);
    for (int64_t k = 0; k < length; ++k) {
      const T v = load<T>(p + k * sizeof(T));
      if constexpr (std::is_floating_point_v<T>) {
        // Token ids stored as floats (dtype codes 6, 7) must be whole numbers: 3.7 or NaN is
        // not an id (and converting NaN to an integer is undefined).
        if (!(v >= T(-9.2e18) && v <= T(9.2e18)) || v != std::trunc(v))
          fail_usage("{}: sequence {} holds {} at token {}, not a token id (a float dataset "
                     "must hold whole numbers)", bin_path(m.prefix), i, static_cast<double>(v),
                     offset + k);
      }
      out[k] = static_cast<int64_t>(v);
    }
  };
  switch (m.ix.dtype) {
    case IndexedDtype::kUInt8: get(uint8_t{}); break;
    case IndexedDtype::kInt8: get(int8_t{}); break;
    case IndexedDtype::kInt16: get(int16_t{}); break;
    case IndexedDtype::kInt32: get(int32_t{}); break;
    case IndexedDtype::kInt64: get(int64_t{}); break;
    case IndexedDtype::kFloat64: get(double{}); break;
    case IndexedDtype::kFloat32: get(float{}); break;
    case IndexedDtype::kUInt16: get(uint16_t{}); break;
  }
}

std::vector<int64_t> IndexedDataset::sequence(int64_t i) const {
  WEFT_CHECK(i >= 0 && i < num_sequences(), "{}: sequence {} of {}", impl_->prefix, i,
             num_sequences());
  std::vector<int64_t> v(static_cast<size_t>(impl_->ix.sizes[i]));
  read(i, 0, static_cast<int64_t>(v.size()), v.data());
  return v;
}

}  // namespace weft
