// Index cache files of GPT sampling (docs/data-sampling.md, "Index cache files"): a header
// with a key and a payload hash, then int64 arrays; written under a temporary name and renamed,
// read through a read-only memory map.
//
// Invariant: a SampleCache exists only for a file whose magic, version, kind, key, array
// lengths, size and payload hash all matched; a file is never visible under its final name
// before it is complete, so concurrent builders and readers never see half a cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weft {

// weft's 64-bit content hash (not cryptographic); stable across platforms.
uint64_t data_hash64(const void* data, size_t bytes, uint64_t seed = 0);
// data_hash64 of a whole file, read in chunks; throws UsageError naming the file.
uint64_t data_hash64_file(const std::string& path);
// 16 lowercase hex digits.
std::string data_hash_hex(uint64_t h);

enum class SampleCacheKind : uint32_t { kDataset = 1, kBlend = 2 };

class SampleCache {
 public:
  ~SampleCache();
  SampleCache(const SampleCache&) = delete;
  SampleCache& operator=(const SampleCache&) = delete;

  // The validated cache at `path`, or nullptr with `*why` set when it is absent or does not
  // match (`lengths`: the expected element count of every array).
  static std::unique_ptr<SampleCache> open(const std::string& path, SampleCacheKind kind,
                                           uint64_t key, const std::vector<int64_t>& lengths,
                                           std::string* why);
  // Writes the arrays atomically to `path` (temporary file, fsync, rename). Throws UsageError
  // naming --data-cache-path and the directory when it cannot be written.
  static void write(const std::string& path, SampleCacheKind kind, uint64_t key,
                    const std::vector<const std::vector<int64_t>*>& arrays);

  // Array `i`; valid while this object lives.
  const int64_t* array(size_t i) const { return arrays_[i]; }

 private:
  SampleCache() = default;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::vector<const int64_t*> arrays_;
};

}  // namespace weft
