// CRC-32C (Castagnoli): the checksum stored with every checkpoint chunk. Two implementations of
// the same function: a portable slicing-by-8 table walk, and on x86-64 the SSE4.2 crc32
// instruction, chosen once at run time with __builtin_cpu_supports so the file builds without
// -msse4.2 and runs on any x86-64. Invariant: both paths compute the reflected CRC with
// polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF, so they agree bit for bit on
// every input (tests/checkpoint/test_safetensors.cpp checks this), and crc32c_extend is
// composable: crc32c_extend(crc32c_extend(0, a), b) == crc32c(a ++ b).
#include "weft/checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace weft {
namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

// kTables[k][b] is the CRC register after feeding byte b followed by k zero bytes, so eight
// bytes can be folded in with eight independent lookups (slicing-by-8).
using Crc32cTables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Crc32cTables crc32c_make_tables() {
  Crc32cTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (kCrc32cPoly & (0u - (c & 1u)));
    t[0][b] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}

constexpr Crc32cTables kTables = crc32c_make_tables();

inline uint64_t crc32c_load_le64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

}  // namespace

namespace detail {

// Portable path; exposed for the agreement test.
uint32_t crc32c_extend_sw(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    const uint64_t v = crc32c_load_le64(p) ^ c;
    c = kTables[7][v & 0xFF] ^ kTables[6][(v >> 8) & 0xFF] ^ kTables[5][(v >> 16) & 0xFF] ^
        kTables[4][(v >> 24) & 0xFF] ^ kTables[3][(v >> 32) & 0xFF] ^
        kTables[2][(v >> 40) & 0xFF] ^ kTables[1][(v >> 48) & 0xFF] ^ kTables[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
  return ~c;
}

#if defined(__x86_64__)

// SSE4.2 path; callers must check crc32c_hw_available() first. Exposed for the agreement test.
__attribute__((target("sse4.2"))) uint32_t crc32c_extend_hw(uint32_t crc, const void* data,
                                                            size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  // Bytes up to an 8-byte boundary, so the main loop reads aligned words.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  while (n--) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}

bool crc32c_hw_available() {
  static const bool has = [] {
    __builtin_cpu_init();  // needed if we are first called from a static initializer
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return has;
}

#else

bool crc32c_hw_available() { return false; }

#endif

}  // namespace detail

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (detail::crc32c_hw_available()) return detail::crc32c_extend_hw(crc, data, n);
#endif
  return detail::crc32c_extend_sw(crc, data, n);
}

}  // namespace weft
