// SHA-256 (FIPS 180-4), small and dependency-free: the tokenizer identity records the sha256 of
// the model file so that a checkpoint names exactly the tokenizer it was trained with.
// Invariant: digests equal every other SHA-256 implementation's (tests check the FIPS vectors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex_digest();  // finishes the hash; call once

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const std::string& data);
// The digest of a file's bytes, read in pieces; throws UsageError naming an unreadable file.
std::string sha256_file_hex(const std::string& path);

}  // namespace weft
