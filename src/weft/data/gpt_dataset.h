// Megatron GPTDataset semantics over indexed datasets (docs/data-sampling.md specifies them, the
// cache files and the deviations from Megatron):
//   - --split "969,30,1" cuts each dataset's documents into contiguous train/valid/test ranges
//     (weights normalised; bounds rint(cumulative weight * documents), half to even, as
//     Megatron-Core's split matrix);
//   - within a split, documents are concatenated (the EOD tokens are in the data, from
//     `weft data preprocess --append-eod`), a sample is seq_length + 1 consecutive tokens, and
//     the next sample starts at the previous one's last token; as many epochs as the requested
//     sample count needs are added, each with its own shuffled document order, and the samples
//     that start in each epoch are shuffled among themselves;
//   - --data-path "0.3 P1 0.7 P2" blends datasets: weights normalised, each dataset asked for
//     ceil(ceil(w * N) * 1.005) samples, and sample i taken from the dataset furthest below its
//     share, w * max(i, 1) - taken (Megatron's BlendedDataset and build_blending_indices);
//   - --data-path "P1 P2" (no weights) blends them by size, as Megatron: each split weighs each
//     dataset by the samples one epoch of its split holds, (tokens - 1) / seq_length;
//   - --train-data-path, --valid-data-path, --test-data-path: each split's own blend, with the
//     split weights of that split alone (all of its documents; the trainer's gpt_config).
// Sample i is a function of (files, weights, split, seq_length, seed, i): never of the layout,
// and never of the sample count asked for (a resume with another --train-iters reads the same
// samples; asking for more only appends). Shuffles use weft's own fixed PRNG and Fisher-Yates
// (not std::shuffle, whose algorithm differs between standard libraries), so orders are the
// same on every platform.
// The document, sample and shuffle indices are cached next to the data (or under
// --data-cache-path), in files named by a hash of their inputs and written atomically.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "weft/core/error.h"
#include "weft/data/token_dataset.h"

namespace weft {

// --data-path: "P" | "P1 P2 ..." (weight 1 each, *weighted false: blended by size) |
// "W1 P1 W2 P2 ..." (one token per element of `args`, or whitespace-separated inside one
// element). Throws UsageError naming --data-path for a weight that does not parse, is negative
// or not finite, or weights that sum to zero. A zero weight is allowed: that dataset's files
// are checked, but it is never sampled.
std::vector<std::pair<double, std::string>> parse_data_path(const std::vector<std::string>& args,
                                                            bool* weighted = nullptr,
                                                            const std::string& flag = "--data-path");
// --split "969,30,1" (also "98,2,0", "1", "99,1"): normalised to three weights; throws
// UsageError naming --split.
std::array<double, 3> parse_split(const std::string& value);

enum class DataSplit { kTrain = 0, kValid = 1, kTest = 2 };

// A split that holds no document, or fewer tokens than one sample, while samples are asked of
// it (a UsageError naming --split or --seq-length). The trainer skips a test split that is too
// small on this error alone; every other error ends the run.
class EmptySplitError : public UsageError {
 public:
  using UsageError::UsageError;
};

struct GptDataConfig {
  std::vector<std::pair<double, std::string>> blend;  // --data-path
  // --data-path without weights, several prefixes: Megatron's blend by size, each split
  // weighing each dataset by one epoch's samples of its split (the weights above unused).
  bool blend_by_size = false;
  std::array<double, 3> split = {969, 30, 1};          // --split
  int seq_length = 0;                                  // --seq-length
  uint64_t seed = 1234;                                // --seed
  std::string cache_path;                              // --data-cache-path ("" = beside the data)
  std::string flag = "--data-path";  // the flag that gave the blend, for error messages
  // A one-dataset config's samples in their order within each pass (the sample shuffle not
  // applied; the documents keep their shuffled order): --full-validation reads a pass's first
  // one_pass_samples samples, which are then exactly those whose labels cover the pass.
  bool in_order = false;
};

// The dataset of one split, asked for at least `num_samples` samples (epochs are added until
// it has them). Builds or loads the index caches. Throws UsageError naming the file or flag
// for an unreadable dataset, an empty dataset, or a split left empty while num_samples > 0.
std::unique_ptr<TokenDataset> make_gpt_dataset(const GptDataConfig& cfg, DataSplit split,
                                               int64_t num_samples);

// The samples of one pass over the documents of `split` of the one dataset of `cfg` whose labels
// cover the pass: ceil((tokens - 1) / seq_length), in order (GptDataConfig::in_order) the
// windows from token 0 on whose labels are tokens 1.. of the pass, the last one's tail read from
// the next pass; 0 where the split holds fewer tokens than one sample (seq_length + 1). What
// --full-validation evaluates of each validation dataset (Megatron's one-epoch dataset holds
// (tokens - 1) // seq_length and leaves the last partial window's labels out).
int64_t one_pass_samples(const GptDataConfig& cfg, DataSplit split);

// What the checkpoint records about the data: every prefix with its weight, the .idx sizes and
// a hash of each .idx, split, seq_length, seed.
nlohmann::json gpt_data_identity(const GptDataConfig& cfg);

}  // namespace weft
