// The index arithmetic of GPT sampling (docs/data-sampling.md), free of I/O: split ranges, the
// PRNG and Fisher-Yates shuffle, the epoch/block layout of samples, the document, sample and
// shuffle indices of one dataset split, and Megatron's greedy blending index.
//
// Invariant: every result is a pure function of its arguments, identical on every platform and
// standard library; epoch e's document order and block e's sample order depend on e and never
// on how many epochs are built, so building more never changes what was built before.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace weft {

// splitmix64 (core/hash.h): a 64-bit stream with a bounded draw free of modulo bias.
class SamplingRng {
 public:
  explicit SamplingRng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n);  // uniform in [0, n); n > 0

 private:
  uint64_t state_;
};

// The seed of one shuffle: stream 1 = document order, 2 = sample order.
enum class SamplingStream : uint64_t { kDocuments = 1, kSamples = 2 };
uint64_t sampling_seed(uint64_t seed, SamplingStream stream, int split, int64_t dataset,
                       int64_t epoch);

// In-place Fisher-Yates: for i = n-1 .. 1 swap a[i] with a[rng.below(i + 1)].
void sampling_fisher_yates(int64_t* a, int64_t n, SamplingRng& rng);

// Megatron's split matrix: documents [first, second) of each split for `num_documents`
// documents. `weights` need not be normalised; a vector summing to 1 (within 1e-12) is used
// as it is, so parse_split's output is not normalised twice.
std::array<std::pair<int64_t, int64_t>, 3> sampling_split_ranges(
    const std::array<double, 3>& weights, int64_t num_documents);

// F(e) = ceil(e * T / S): the first stream sample of block e.
int64_t sampling_block_begin(int64_t epoch, int64_t tokens_per_epoch, int seq_length);
// The smallest E with F(E) >= num_samples (0 for 0 samples).
int64_t sampling_epochs_for(int64_t num_samples, int64_t tokens_per_epoch, int seq_length);

// Epoch `epoch`'s document order: the ids [doc_begin, doc_end) shuffled.
std::vector<int64_t> sampling_document_order(int64_t doc_begin, int64_t doc_end, uint64_t seed,
                                             int split, int64_t dataset, int64_t epoch);
// Block `epoch`'s sample order: a permutation of [0, count).
std::vector<int64_t> sampling_sample_order(int64_t count, uint64_t seed, int split, int64_t dataset,
                                           int64_t epoch);

// The indices of one (dataset, split) with `epochs` blocks (docs/data-sampling.md, "Format").
struct GptSamplingSpec {
  int64_t doc_begin = 0, doc_end = 0;  // the split's documents
  int64_t tokens_per_epoch = 0;        // sum of doc_lengths
  int seq_length = 0;
  uint64_t seed = 0;
  int split = 0;
  int64_t dataset = 0;
  int64_t epochs = 0;
};
struct GptSamplingIndices {
  std::vector<int64_t> document_index;  // [(epochs + 1) * D]
  std::vector<int64_t> sample_index;    // [2 * F(epochs)]: (document-index position, offset)
  std::vector<int64_t> shuffle_index;   // [F(epochs)]
};
// doc_lengths[j] = tokens of document doc_begin + j.
GptSamplingIndices sampling_build_gpt_indices(const GptSamplingSpec& spec,
                                              const std::vector<int64_t>& doc_lengths);

// Megatron's mid-level request: ceil(ceil(n * w) * 1.005).
int64_t sampling_blend_request(double normalized_weight, int64_t n);
// Megatron's build_blending_indices for `n` samples over normalised weights.
void sampling_build_blending_index(const std::vector<double>& weights, int64_t n,
                                   int64_t* dataset_index, int64_t* dataset_sample_index);

}  // namespace weft
