// The core layer's tests (src/weft/core): the one FNV-1a and splitmix64 (core/hash.h) that
// seeds, data order, group digests and watchdog ids depend on.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "weft/core/hash.h"

namespace weft {
namespace {

// core/hash.h against the published FNV-1a and splitmix64 vectors and against values of the
// copies it replaced (parameter-init seeds in transformer.cpp, the group digests of
// process_groups.cpp, watchdog ids), computed with those copies before the switch.
TEST(Hash, MatchesTheReplacedCopies) {
  static_assert(fnv1a64("") == 0xcbf29ce484222325ull);
  static_assert(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  static_assert(fnv1a64("foobar") == 0x85944171f73967e8ull);
  static_assert(splitmix64(0) == 0xe220a8397b1dcdafull);
  EXPECT_EQ(fnv1a64("embedding.word_embeddings.weight"), 0x68f4c17a49c27e4full);
  EXPECT_EQ(fnv1a64(kFnv1a64Offset, "foobar", 6), fnv1a64("foobar"));
  EXPECT_EQ(splitmix64(1), 0x910a2dec89025cc1ull);
  EXPECT_EQ(splitmix64(1234), 0xbb0cf61b2f181cdbull);
  EXPECT_EQ(splitmix64(~0ull), 0xe4d971771b652c20ull);
  uint64_t state = 0;
  EXPECT_EQ(splitmix64_next(&state), 0xe220a8397b1dcdafull);
  EXPECT_EQ(splitmix64_next(&state), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(splitmix64_next(&state), 0x06c45d188009454full);
  // transformer.cpp's parameter generator seed: both 32-bit halves folded.
  auto param_seed = [](uint64_t seed, const char* name) {
    const uint64_t h = splitmix64(splitmix64(seed) ^ fnv1a64(name));
    return (h ^ (h >> 32)) & 0xffffffffull;
  };
  EXPECT_EQ(param_seed(1234, "embedding.word_embeddings.weight"), 0xf8c43501ull);
  EXPECT_EQ(param_seed(0, "decoder.layers.3.mlp.linear_fc1.weight"), 0x4af35f64ull);
  // process_groups.cpp's member digest: the size, then each rank, as 8 little-endian bytes.
  auto members = [](const std::vector<int>& g) {
    uint64_t h = fnv1a64_u64(kFnv1a64Offset, g.size());
    for (int r : g) h = fnv1a64_u64(h, static_cast<uint64_t>(static_cast<int64_t>(r)));
    return h;
  };
  EXPECT_EQ(members({0, 4}), 0x5336762a4f52cf43ull);
  EXPECT_EQ(members({1, 3, 5, 7}), 0x871921dabd864681ull);
  EXPECT_EQ(fnv1a64_u64(kFnv1a64Offset, static_cast<uint64_t>(int64_t{-2})), 0xfc1a35225397861cull);
  // watchdog.cpp's group id: the name's bytes, the world ranks' bytes, the instance's bytes.
  const std::string name = "dp";
  const std::vector<int> world = {0, 1, 2, 3};
  const int instance = 1;
  uint64_t h = fnv1a64(kFnv1a64Offset, name.data(), name.size());
  h = fnv1a64(h, world.data(), world.size() * sizeof(int));
  EXPECT_EQ(h, 0x625493062cf80759ull);
  EXPECT_EQ(fnv1a64(h, &instance, sizeof instance), 0x31e1cc16b318c8d8ull);
}

}  // namespace
}  // namespace weft
