// GPT sampling arithmetic (see gpt_sampling.h and docs/data-sampling.md). Floating-point steps
// (split bounds, blend errors) repeat Megatron-Core's double operations in the same order, so
// their results are bit-identical to Megatron's.
#include "weft/data/gpt_sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "weft/core/error.h"
#include "weft/core/hash.h"

namespace weft {

uint64_t SamplingRng::next() { return splitmix64_next(&state_); }

uint64_t SamplingRng::below(uint64_t n) {
  WEFT_CHECK(n > 0, "below(0)");
  const uint64_t reject = (0 - n) % n;  // 2^64 mod n: outputs under it would bias r % n
  for (;;) {
    const uint64_t r = next();
    if (r >= reject) return r % n;
  }
}

uint64_t sampling_seed(uint64_t seed, SamplingStream stream, int split, int64_t dataset,
                       int64_t epoch) {
  uint64_t z = seed;
  for (uint64_t w : {static_cast<uint64_t>(stream), static_cast<uint64_t>(split),
                     static_cast<uint64_t>(dataset), static_cast<uint64_t>(epoch)}) {
    z = splitmix64_mix(z ^ splitmix64(w));
  }
  return z;
}

void sampling_fisher_yates(int64_t* a, int64_t n, SamplingRng& rng) {
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(a[i], a[j]);
  }
}

std::array<std::pair<int64_t, int64_t>, 3> sampling_split_ranges(
    const std::array<double, 3>& weights, int64_t num_documents) {
  std::array<double, 3> v = weights;
  const double sum = v[0] + v[1] + v[2];
  WEFT_CHECK(sum > 0, "split weights sum to {}", sum);
  // parse_split already normalised (once, as Megatron); normalising again could move a bound
  // by an ulp, so a vector that sums to 1 is taken as it is.
  if (std::abs(sum - 1.0) > 1e-12) {
    for (double& x : v) x = x / sum;
  }
  const std::array<double, 4> bound = {0.0, v[0], v[0] + v[1], v[0] + v[1] + v[2]};
  const double n = static_cast<double>(num_documents);
  std::array<std::pair<int64_t, int64_t>, 3> out;
  for (int s = 0; s < 3; ++s) {
    // std::nearbyint rounds half to even in the default rounding mode, as Python's round.
    int64_t b = static_cast<int64_t>(std::nearbyint(bound[s] * n));
    int64_t e = static_cast<int64_t>(std::nearbyint(bound[s + 1] * n));
    b = std::clamp<int64_t>(b, 0, num_documents);
    e = std::clamp<int64_t>(e, b, num_documents);
    out[s] = {b, e};
  }
  return out;
}

int64_t sampling_block_begin(int64_t epoch, int64_t tokens_per_epoch, int seq_length) {
  return (epoch * tokens_per_epoch + seq_length - 1) / seq_length;
}

int64_t sampling_epochs_for(int64_t num_samples, int64_t tokens_per_epoch, int seq_length) {
  if (num_samples <= 0) return 0;
  return (num_samples - 1) * seq_length / tokens_per_epoch + 1;
}

std::vector<int64_t> sampling_document_order(int64_t doc_begin, int64_t doc_end, uint64_t seed,
                                             int split, int64_t dataset, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(doc_end - doc_begin));
  std::iota(order.begin(), order.end(), doc_begin);
  SamplingRng rng(sampling_seed(seed, SamplingStream::kDocuments, split, dataset, epoch));
  sampling_fisher_yates(order.data(), static_cast<int64_t>(order.size()), rng);
  return order;
}

std::vector<int64_t> sampling_sample_order(int64_t count, uint64_t seed, int split, int64_t dataset,
                                           int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t{0});
  SamplingRng rng(sampling_seed(seed, SamplingStream::kSamples, split, dataset, epoch));
  sampling_fisher_yates(order.data(), count, rng);
  return order;
}

GptSamplingIndices sampling_build_gpt_indices(const GptSamplingSpec& spec,
                                              const std::vector<int64_t>& doc_lengths) {
  const int64_t docs = spec.doc_end - spec.doc_begin;
  const int64_t seq = spec.seq_length;
  WEFT_CHECK(static_cast<int64_t>(doc_lengths.size()) == docs, "{} lengths for {} documents",
             doc_lengths.size(), docs);
  WEFT_CHECK(spec.tokens_per_epoch > seq, "{} tokens per epoch for seq_length {}",
             spec.tokens_per_epoch, seq);
  GptSamplingIndices out;
  out.document_index.reserve(static_cast<size_t>((spec.epochs + 1) * docs));
  for (int64_t e = 0; e <= spec.epochs; ++e) {
    const auto order = sampling_document_order(spec.doc_begin, spec.doc_end, spec.seed, spec.split,
                                               spec.dataset, e);
    out.document_index.insert(out.document_index.end(), order.begin(), order.end());
  }

  // Sample k starts at stream token k * seq: walk the document index once.
  const int64_t samples = sampling_block_begin(spec.epochs, spec.tokens_per_epoch, spec.seq_length);
  out.sample_index.resize(static_cast<size_t>(2 * samples));
  int64_t pos = 0, before = 0;  // document-index position and the stream tokens before it
  for (int64_t k = 0; k < samples; ++k) {
    const int64_t start = k * seq;
    while (before + doc_lengths[out.document_index[pos] - spec.doc_begin] <= start) {
      before += doc_lengths[out.document_index[pos] - spec.doc_begin];
      ++pos;
    }
    out.sample_index[2 * k] = pos;
    out.sample_index[2 * k + 1] = start - before;
  }

  out.shuffle_index.resize(static_cast<size_t>(samples));
  for (int64_t e = 0; e < spec.epochs; ++e) {
    const int64_t first = sampling_block_begin(e, spec.tokens_per_epoch, spec.seq_length);
    const int64_t last = sampling_block_begin(e + 1, spec.tokens_per_epoch, spec.seq_length);
    const auto order = sampling_sample_order(last - first, spec.seed, spec.split, spec.dataset, e);
    for (int64_t j = 0; j < last - first; ++j) out.shuffle_index[first + j] = first + order[j];
  }
  return out;
}

int64_t sampling_blend_request(double normalized_weight, int64_t n) {
  return static_cast<int64_t>(
      std::ceil(std::ceil(static_cast<double>(n) * normalized_weight) * (1 + 0.005)));
}

void sampling_build_blending_index(const std::vector<double>& weights, int64_t n,
                                   int64_t* dataset_index, int64_t* dataset_sample_index) {
  const size_t d = weights.size();
  WEFT_CHECK(d > 0, "blend of no dataset");
  std::vector<int64_t> taken(d, 0);
  for (int64_t i = 0; i < n; ++i) {
    // Megatron's error term, max(i, 1) included, evaluated in the same order.
    const double x = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * x - static_cast<double>(taken[0]);
    for (size_t j = 1; j < d; ++j) {
      const double error = weights[j] * x - static_cast<double>(taken[j]);
      if (error > best_error) {
        best_error = error;
        best = j;
      }
    }
    dataset_index[i] = static_cast<int64_t>(best);
    dataset_sample_index[i] = taken[best]++;
  }
}

}  // namespace weft
