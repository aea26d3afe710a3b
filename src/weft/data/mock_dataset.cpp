// Mock dataset (see mock_dataset.h). A splitmix64 stream per sample keeps generation
// independent of libtorch's generators and of the order in which samples are requested.
#include "weft/data/mock_dataset.h"

#include <ATen/Functions.h>

#include <vector>

#include "weft/core/hash.h"

namespace weft {

MockDataset::MockDataset(uint64_t seed, int vocab_size, int seq_length)
    : seed_(seed), vocab_(vocab_size), seq_(seq_length) {}

void MockDataset::batch(int64_t first, int count, at::Tensor* tokens, at::Tensor* labels) const {
  std::vector<int64_t> buf(static_cast<size_t>(count) * (seq_ + 1));
  for (int k = 0; k < count; ++k) {
    const uint64_t v = static_cast<uint64_t>(vocab_);
    uint64_t rule = seed_;
    const uint64_t a = 1 + splitmix64_next(&rule) % 7, b = splitmix64_next(&rule) % v;
    uint64_t s = seed_ * 0x100000001B3ull ^ static_cast<uint64_t>(first + k) * 0xD6E8FEB86659FD93ull;
    uint64_t t = splitmix64_next(&s) % v;
    int64_t* row = buf.data() + static_cast<size_t>(k) * (seq_ + 1);
    for (int i = 0; i <= seq_; ++i) {
      row[i] = static_cast<int64_t>(t);
      uint64_t r = splitmix64_next(&s);
      t = (r % 8 == 0) ? (r >> 8) % v : (a * t + b) % v;
    }
  }
  at::Tensor all = at::tensor(buf, at::kLong).view({count, seq_ + 1});
  *tokens = all.narrow(1, 0, seq_).contiguous();
  *labels = all.narrow(1, 1, seq_).contiguous();
}

}  // namespace weft
