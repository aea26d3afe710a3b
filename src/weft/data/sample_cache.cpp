// Sample index cache files (see sample_cache.h). POSIX I/O: open/write/fsync/rename for the
// atomic write, mmap for reading; the host must be little-endian (checked at compile time).
#include "weft/data/sample_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>

#include "weft/core/error.h"
#include "weft/core/hash.h"
#include "weft/data/gpt_sampling.h"

namespace weft {
namespace {

static_assert(std::endian::native == std::endian::little, "cache files are little-endian");

constexpr char kMagic[8] = {'W', 'E', 'F', 'T', 'S', 'M', 'P', 'L'};
constexpr uint32_t kVersion = 1;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Streaming form of data_hash64: whole words only until finish().
struct Hasher {
  uint64_t h;
  explicit Hasher(uint64_t seed, uint64_t bytes) : h(seed ^ (bytes * 0x9E3779B97F4A7C15ull)) {}
  void word(uint64_t w) { h = rotl(h ^ splitmix64_mix(w), 27) * 0xFF51AFD7ED558CCDull; }
  void words(const unsigned char* p, size_t n) {  // n % 8 == 0
    for (size_t i = 0; i < n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      word(w);
    }
  }
  uint64_t finish(const unsigned char* tail, size_t n) {  // n < 8
    if (n > 0) {
      uint64_t w = 0;
      std::memcpy(&w, tail, n);
      word(w);
    }
    return splitmix64_mix(h);
  }
};

std::string errno_text() { return std::strerror(errno); }

// Header: magic, version, kind, key, count, lengths[count], payload hash.
size_t header_bytes(size_t arrays) { return 8 + 4 + 4 + 8 + 8 + 8 * arrays + 8; }

uint64_t read_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// "" when the header at p matches; else what does not.
std::string header_problem(const unsigned char* p, SampleCacheKind kind, uint64_t key,
                           const std::vector<int64_t>& lengths) {
  uint32_t version, kind_code;
  std::memcpy(&version, p + 8, 4);
  std::memcpy(&kind_code, p + 12, 4);
  if (std::memcmp(p, kMagic, 8) != 0) return "bad magic";
  if (version != kVersion) return fmt::format("format version {}", version);
  if (kind_code != static_cast<uint32_t>(kind)) return "wrong kind";
  if (read_u64(p + 16) != key) return "key mismatch";
  if (read_u64(p + 24) != lengths.size()) return "array count mismatch";
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (read_u64(p + 32 + 8 * i) != static_cast<uint64_t>(lengths[i])) {
      return fmt::format("array {} length mismatch", i);
    }
  }
  return "";
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

uint64_t data_hash64(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  Hasher h(seed, bytes);
  const size_t whole = bytes / 8 * 8;
  h.words(p, whole);
  return h.finish(p + whole, bytes - whole);
}

uint64_t data_hash64_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_usage("dataset: cannot open {} ({})", path, errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail_usage("dataset: cannot stat {} ({})", path, errno_text());
  }
  // The cache key, the split datasets and the checkpoint identity all hash the same .idx: hash
  // each file version once per process (keyed by inode, size and modification time).
  static std::mutex memo_mutex;
  static std::map<std::string, uint64_t> memo;
  const std::string version =
      fmt::format("{}:{}:{}:{}.{}", st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec,
                  st.st_mtim.tv_nsec);
  {
    std::lock_guard<std::mutex> lock(memo_mutex);
    if (auto it = memo.find(version); it != memo.end()) {
      ::close(fd);
      return it->second;
    }
  }
  const uint64_t total = static_cast<uint64_t>(st.st_size);
  Hasher h(0, total);
  std::vector<unsigned char> buf(1 << 22);
  uint64_t done = 0;
  size_t have = 0;  // bytes in buf not yet hashed (< 8 between reads)
  while (done < total) {
    const ssize_t r = ::read(fd, buf.data() + have, buf.size() - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      fail_usage("dataset: read of {} failed ({})", path, r < 0 ? errno_text() : "short file");
    }
    done += static_cast<uint64_t>(r);
    have += static_cast<size_t>(r);
    const size_t whole = have / 8 * 8;
    h.words(buf.data(), whole);
    std::memmove(buf.data(), buf.data() + whole, have - whole);
    have -= whole;
  }
  ::close(fd);
  const uint64_t hash = h.finish(buf.data(), have);
  std::lock_guard<std::mutex> lock(memo_mutex);
  memo[version] = hash;
  return hash;
}

std::string data_hash_hex(uint64_t h) { return fmt::format("{:016x}", h); }

SampleCache::~SampleCache() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

std::unique_ptr<SampleCache> SampleCache::open(const std::string& path, SampleCacheKind kind,
                                               uint64_t key, const std::vector<int64_t>& lengths,
                                               std::string* why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = errno == ENOENT || errno == ENOTDIR ? "absent" : "cannot open: " + errno_text();
    return nullptr;
  }
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const size_t head = header_bytes(lengths.size());
  size_t expect = head;
  for (int64_t n : lengths) expect += 8 * static_cast<size_t>(n);
  if (!stat_ok || static_cast<size_t>(st.st_size) != expect) {
    ::close(fd);
    *why = fmt::format("size {} bytes, expected {}", stat_ok ? st.st_size : -1, expect);
    return nullptr;
  }
  void* map = ::mmap(nullptr, expect, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    *why = "mmap failed: " + errno_text();
    return nullptr;
  }
  std::unique_ptr<SampleCache> cache(new SampleCache());
  cache->map_ = map;
  cache->map_bytes_ = expect;
  const auto* p = static_cast<const unsigned char*>(map);
  *why = header_problem(p, kind, key, lengths);
  if (why->empty() && data_hash64(p + head, expect - head) != read_u64(p + head - 8)) {
    *why = "payload hash mismatch (corrupted)";
  }
  if (!why->empty()) return nullptr;
  size_t off = head;
  for (int64_t n : lengths) {
    cache->arrays_.push_back(reinterpret_cast<const int64_t*>(p + off));
    off += 8 * static_cast<size_t>(n);
  }
  return cache;
}

void SampleCache::write(const std::string& path, SampleCacheKind kind, uint64_t key,
                        const std::vector<const std::vector<int64_t>*>& arrays) {
  const std::filesystem::path target(path);
  const std::string dir = target.parent_path().string();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) {
    fail_usage(
        "--data-cache-path: cannot create the index cache directory {} ({}); pass a "
        "writable --data-cache-path",
        dir, ec.message());
  }
  // The payload hash first (the header precedes the payload in the file); every array is
  // whole words, so hashing them one after another equals hashing their concatenation.
  size_t payload = 0;
  for (const auto* a : arrays) payload += 8 * a->size();
  Hasher hasher(0, payload);
  for (const auto* a : arrays) {
    hasher.words(reinterpret_cast<const unsigned char*>(a->data()), 8 * a->size());
  }
  std::vector<unsigned char> head(header_bytes(arrays.size()));
  auto put = [&](size_t off, const void* v, size_t n) { std::memcpy(head.data() + off, v, n); };
  const uint32_t version = kVersion, kind_code = static_cast<uint32_t>(kind);
  const uint64_t count = arrays.size(), hash = hasher.finish(nullptr, 0);
  put(0, kMagic, 8);
  put(8, &version, 4);
  put(12, &kind_code, 4);
  put(16, &key, 8);
  put(24, &count, 8);
  for (size_t i = 0; i < arrays.size(); ++i) {
    const uint64_t n = arrays[i]->size();
    put(32 + 8 * i, &n, 8);
  }
  put(head.size() - 8, &hash, 8);

  std::random_device rd;
  const std::string tmp = fmt::format("{}.tmp.{}.{:08x}", path, ::getpid(), rd());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fail_usage(
        "--data-cache-path: cannot write the index cache in {} ({}); pass a writable "
        "--data-cache-path",
        dir.empty() ? "." : dir, errno_text());
  }
  bool ok = write_all(fd, head.data(), head.size());
  for (const auto* a : arrays) ok = ok && write_all(fd, a->data(), 8 * a->size());
  ok = ok && ::fsync(fd) == 0;
  const std::string err = ok ? "" : errno_text();
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = ok ? errno_text() : err;
    ::unlink(tmp.c_str());
    fail_usage(
        "--data-cache-path: writing the index cache {} failed ({}); pass a writable "
        "--data-cache-path",
        path, e);
  }
}

}  // namespace weft
