// Megatron-style mock data: deterministic token sequences generated from (seed, sample index),
// so every layout sees exactly the same samples and a resumed run continues the same stream.
//
// The sequences are learnable rather than uniform noise, so the loss visibly decreases: each
// sample follows t[i+1] = (a * t[i] + b) mod V with one (a, b) drawn from the seed, and with
// probability 1/8 a token is replaced by a uniformly random one.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "weft/data/token_dataset.h"

namespace weft {

class MockDataset : public TokenDataset {
 public:
  MockDataset(uint64_t seed, int vocab_size, int seq_length);
  // `count` consecutive samples starting at `first`: tokens [count, seq] and labels [count, seq]
  // (labels are the tokens shifted by one), int64 on the CPU.
  void batch(int64_t first, int count, at::Tensor* tokens, at::Tensor* labels) const override;
  int64_t size() const override { return -1; }  // unbounded

 private:
  uint64_t seed_;
  int vocab_, seq_;
};

}  // namespace weft
