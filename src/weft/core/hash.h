// The two non-cryptographic hashes weft uses, each written once: FNV-1a (64 bit) for names and
// member lists, splitmix64 for seeds and the data shuffles' random streams.
//
// Invariant: outputs are bit-identical to the published algorithms (FNV-1a: offset basis
// 0xcbf29ce484222325, prime 0x100000001b3; splitmix64: Steele, Lea and Flood's increment and
// output function), on every platform. Parameter initialisation, every shuffle of the data and
// the mock data depend on them: a change here changes every run (tests/data/test_gpt_dataset.cpp
// pins values).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace weft {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;
inline constexpr uint64_t kFnv1a64Prime = 0x100000001b3ull;

// FNV-1a of `n` bytes at `data`, continuing from `h` (kFnv1a64Offset to start).
inline uint64_t fnv1a64(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnv1a64Prime;
  }
  return h;
}

// FNV-1a of the characters of `s`, from the offset basis.
constexpr uint64_t fnv1a64(std::string_view s) {
  uint64_t h = kFnv1a64Offset;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= kFnv1a64Prime;
  }
  return h;
}

// FNV-1a of the 8 bytes of `v`, least significant first (whatever the host's byte order),
// continuing from `h`.
constexpr uint64_t fnv1a64_u64(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= kFnv1a64Prime;
  }
  return h;
}

// splitmix64's increment (the golden ratio in 64-bit fixed point).
inline constexpr uint64_t kSplitmix64Gamma = 0x9e3779b97f4a7c15ull;

// splitmix64's output function: a bijective 64-bit mixer.
constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The next output of the splitmix64 stream whose state is `*state` (advanced by the call).
constexpr uint64_t splitmix64_next(uint64_t* state) {
  *state += kSplitmix64Gamma;
  return splitmix64_mix(*state);
}

// The first output of the splitmix64 stream seeded with `x`: a one-shot 64-bit hash of x.
constexpr uint64_t splitmix64(uint64_t x) { return splitmix64_mix(x + kSplitmix64Gamma); }

}  // namespace weft
