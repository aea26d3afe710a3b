// Test support: the tiny model and training run that the engine tests share, so that a test
// states only what it varies. The values here are part of tests that compare against stored
// numbers and of bitwise restart tests: changing one changes every test built on it.
#pragma once

#include <cstdint>
#include <vector>

#include "weft/model/config.h"
#include "weft/train/trainer.h"

namespace weft::test {

// The tiny dense transformer: `num_layers` layers of hidden 32, 4 attention heads in 2 query
// groups (head dim 8), SwiGLU FFN 48, sequence 16, vocabulary 64; every other field at
// ModelConfig's default (fp32 compute, tied embeddings, init std 0.02).
ModelConfig tiny_model(int num_layers);

// What the tests' runs of the tiny model differ in. Name all four (designated initializers):
// there are no defaults, and -Wmissing-field-initializers reports one left out.
struct TinyRun {
  int num_layers;
  int global_batch_size;
  int train_iters;
  uint64_t seed;
};

// A run of tiny_model(r.num_layers): micro-batch 2, lr 1e-2 warming up over 1 iteration and
// decaying (cosine) to 1e-3, on test_device(); every other field at TrainConfig's default
// (one rank, mock data, clip 1.0). Tests set what else they vary after the call.
TrainConfig tiny_config(const TinyRun& r);

// Makes `m` the tiny mixture of experts: 4 experts with top-2 routing, expert FFN 24, a shared
// expert of 16, aux-loss coefficient 0.01, and 2 MTP depths; `moe_layer_pattern` has one entry
// per decoder layer (1: MoE, 0: dense).
void apply_tiny_moe(std::vector<int> moe_layer_pattern, ModelConfig* m);

}  // namespace weft::test
