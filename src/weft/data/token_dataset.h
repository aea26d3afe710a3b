// What the trainer reads: an endless, layout-independent stream of samples. Sample i is a
// function of the dataset's inputs (files, seed, split, blend) and i only, so any layout and
// any resume at consumed-sample count i reads the same sample.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace weft {

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  // `count` consecutive samples starting at global sample index `first`: tokens [count, seq]
  // and labels [count, seq] (tokens shifted by one), int64 on the CPU.
  virtual void batch(int64_t first, int count, at::Tensor* tokens, at::Tensor* labels) const = 0;
  // Samples available before the stream repeats or ends (-1: unbounded, as mock data).
  virtual int64_t size() const = 0;
};

}  // namespace weft
