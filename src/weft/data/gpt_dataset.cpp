// GPT datasets and blends over indexed datasets (see gpt_dataset.h, docs/data-sampling.md):
// flag parsing, opening the files, building or loading the index caches, and reading samples.
//
// Invariant: a dataset object reads sample i through the cached indices only, and those are
// a function of the inputs named in the cache key; batch() never depends on earlier calls.
#include "weft/data/gpt_dataset.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "weft/core/error.h"
#include "weft/data/gpt_sampling.h"
#include "weft/data/indexed_dataset.h"
#include "weft/data/sample_cache.h"

namespace weft {
namespace {

constexpr int kSamplingVersion = 1;

const char* split_name(DataSplit s) {
  switch (s) {
    case DataSplit::kTrain:
      return "train";
    case DataSplit::kValid:
      return "valid";
    case DataSplit::kTest:
      return "test";
  }
  return "?";
}

// A whole-token parse of a finite or non-finite double; false if any character is left over.
bool parse_number(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE) return false;
  *out = v;
  return true;
}

void check_weights(const std::vector<double>& w, const char* flag, const std::string& value) {
  double sum = 0;
  for (double x : w) {
    if (!std::isfinite(x) || x < 0) {
      fail_usage("{} \"{}\": weight {} must be finite and >= 0", flag, value, x);
    }
    sum += x;
  }
  if (!(sum > 0))
    fail_usage("{} \"{}\": the weights sum to zero; give one a positive weight", flag, value);
  if (!std::isfinite(sum))
    fail_usage("{} \"{}\": the weights' sum is not finite; give smaller weights", flag, value);
}

void check_prefix_files(const std::string& prefix, const std::string& flag) {
  for (const std::string& f : {idx_path(prefix), bin_path(prefix)}) {
    if (!std::filesystem::exists(f)) {
      fail_usage("{}: {} does not exist (dataset prefix \"{}\" needs {} and {})", flag, f,
                 prefix, idx_path(prefix), bin_path(prefix));
    }
  }
}

std::array<double, 3> normalized_split(const std::array<double, 3>& split) {
  check_weights({split[0], split[1], split[2]}, "--split",
                fmt::format("{},{},{}", split[0], split[1], split[2]));
  const double sum = split[0] + split[1] + split[2];
  if (std::abs(sum - 1.0) <= 1e-12) return split;
  return {split[0] / sum, split[1] / sum, split[2] / sum};
}

std::string cache_dir(const GptDataConfig& cfg, const std::string& prefix) {
  if (!cfg.cache_path.empty()) return cfg.cache_path;
  const std::string dir = std::filesystem::path(prefix).parent_path().string();
  return dir.empty() ? "." : dir;
}

void warn(const std::string& msg) {
  if (error_rank() >= 0) {
    fmt::print(stderr, "[rank {}] weft: {}\n", error_rank(), msg);
  } else {
    fmt::print(stderr, "weft: {}\n", msg);
  }
}

// Opens the cache at `path`, or builds it with `build` (which returns the arrays), writes it
// atomically and opens what was written.
template <typename Build>
std::unique_ptr<SampleCache> open_or_build(const std::string& path, SampleCacheKind kind,
                                           uint64_t key, const std::vector<int64_t>& lengths,
                                           Build build) {
  std::string why;
  if (auto cache = SampleCache::open(path, kind, key, lengths, &why)) return cache;
  if (why != "absent") warn(fmt::format("rebuilding the index cache {} ({})", path, why));
  const std::vector<std::vector<int64_t>> arrays = build();
  std::vector<const std::vector<int64_t>*> ptrs;
  for (const auto& a : arrays) ptrs.push_back(&a);
  SampleCache::write(path, kind, key, ptrs);
  auto cache = SampleCache::open(path, kind, key, lengths, &why);
  if (!cache) fail("the index cache {} does not validate right after writing it: {}", path, why);
  return cache;
}

// Fills tokens/labels from any source with read_sample(i, int64_t* out[seq + 1]).
template <typename Source>
void fill_batch(const Source& src, int64_t size, int seq, int64_t first, int count,
                at::Tensor* tokens, at::Tensor* labels) {
  if (first < 0 || count < 0 || first + count > size) {
    fail(
        "data: samples [{}, {}) asked of a dataset built for {} samples; build it for at "
        "least first + count samples",
        first, first + count, size);
  }
  at::Tensor all = at::empty({count, seq + 1}, at::TensorOptions().dtype(at::kLong));
  int64_t* out = all.data_ptr<int64_t>();
  for (int j = 0; j < count; ++j)
    src.read_sample(first + j, out + static_cast<int64_t>(j) * (seq + 1));
  *tokens = all.narrow(1, 0, seq).contiguous();
  *labels = all.narrow(1, 1, seq).contiguous();
}

// One (dataset, split): the indexed dataset and its mapped indices.
class GptSplitDataset final : public TokenDataset {
 public:
  GptSplitDataset(std::shared_ptr<const IndexedDataset> data, std::unique_ptr<SampleCache> cache,
                  int seq, int64_t size, int64_t doc_index_length, uint64_t key,
                  bool in_order = false)
      : data_(std::move(data)),
        cache_(std::move(cache)),
        seq_(seq),
        size_(size),
        doc_index_length_(doc_index_length),
        key_(key),
        in_order_(in_order) {
    if (cache_) {
      doc_index_ = cache_->array(0);
      sample_index_ = cache_->array(1);
      shuffle_index_ = cache_->array(2);
    }
  }

  // Sample i (after the shuffle, unless in order): seq_ + 1 tokens into out.
  void read_sample(int64_t i, int64_t* out) const {
    const int64_t k = in_order_ ? i : shuffle_index_[i];
    int64_t pos = sample_index_[2 * k], offset = sample_index_[2 * k + 1];
    int64_t need = seq_ + 1;
    const int64_t* doc_seqs = data_->document_indices();
    const int32_t* sizes = data_->sizes();
    while (need > 0) {
      WEFT_CHECK(pos < doc_index_length_, "sample {} runs past the document index of {}", i,
                 data_->prefix());
      const int64_t doc = doc_index_[pos++];
      for (int64_t s = doc_seqs[doc]; s < doc_seqs[doc + 1] && need > 0; ++s) {
        const int64_t len = sizes[s];
        if (offset >= len) {
          offset -= len;
          continue;
        }
        const int64_t n = std::min(len - offset, need);
        data_->read(s, offset, n, out);
        out += n;
        need -= n;
        offset = 0;
      }
      offset = 0;
    }
  }

  void batch(int64_t first, int count, at::Tensor* tokens, at::Tensor* labels) const override {
    fill_batch(*this, size_, seq_, first, count, tokens, labels);
  }
  int64_t size() const override { return size_; }
  uint64_t key() const { return key_; }

 private:
  std::shared_ptr<const IndexedDataset> data_;
  std::unique_ptr<SampleCache> cache_;  // owns the memory the index pointers point into
  const int64_t* doc_index_ = nullptr;
  const int64_t* sample_index_ = nullptr;
  const int64_t* shuffle_index_ = nullptr;
  int seq_;
  int64_t size_, doc_index_length_;
  uint64_t key_;
  bool in_order_;  // GptDataConfig::in_order
};

class GptBlendDataset final : public TokenDataset {
 public:
  GptBlendDataset(std::vector<std::unique_ptr<GptSplitDataset>> parts,
                  std::unique_ptr<SampleCache> cache, int seq, int64_t size)
      : parts_(std::move(parts)), cache_(std::move(cache)), seq_(seq), size_(size) {
    if (cache_) {
      dataset_index_ = cache_->array(0);
      dataset_sample_index_ = cache_->array(1);
    }
  }
  void read_sample(int64_t i, int64_t* out) const {
    parts_[dataset_index_[i]]->read_sample(dataset_sample_index_[i], out);
  }
  void batch(int64_t first, int count, at::Tensor* tokens, at::Tensor* labels) const override {
    fill_batch(*this, size_, seq_, first, count, tokens, labels);
  }
  int64_t size() const override { return size_; }

 private:
  std::vector<std::unique_ptr<GptSplitDataset>> parts_;  // indexed by the blend's dataset index
  std::unique_ptr<SampleCache> cache_;
  const int64_t* dataset_index_ = nullptr;
  const int64_t* dataset_sample_index_ = nullptr;
  int seq_;
  int64_t size_;
};

// The documents [begin, end) of `split` in `data`.
std::pair<int64_t, int64_t> split_documents(const IndexedDataset& data,
                                            const std::array<double, 3>& split_weights,
                                            DataSplit split) {
  return sampling_split_ranges(split_weights, data.num_documents())[static_cast<int>(split)];
}

// The tokens of document d (all its sequences).
int64_t document_tokens(const IndexedDataset& data, int64_t d) {
  const int64_t* doc_seqs = data.document_indices();
  int64_t n = 0;
  for (int64_t s = doc_seqs[d]; s < doc_seqs[d + 1]; ++s) n += data.sizes()[s];
  return n;
}

// The tokens of the documents of the split of `prefix`.
int64_t split_tokens(const std::array<double, 3>& split_weights, DataSplit split,
                     const std::string& prefix, const std::string& flag) {
  check_prefix_files(prefix, flag);
  const IndexedDataset data(prefix);
  const auto [begin, end] = split_documents(data, split_weights, split);
  int64_t tokens = 0;
  for (int64_t d = begin; d < end; ++d) tokens += document_tokens(data, d);
  return tokens;
}

// The samples one epoch of the split of `prefix` holds, (tokens - 1) / seq_length: Megatron's
// GPTDataset length for one epoch, its weight in a blend by size.
int64_t epoch_samples(int seq_length, const std::array<double, 3>& split_weights, DataSplit split,
                      const std::string& prefix, const std::string& flag) {
  const int64_t tokens = split_tokens(split_weights, split, prefix, flag);
  return tokens > 0 ? (tokens - 1) / seq_length : 0;
}

// Dataset number `dataset` of the blend, split `split`, asked for `num_samples`.
std::unique_ptr<GptSplitDataset> make_split_dataset(const GptDataConfig& cfg,
                                                    const std::array<double, 3>& split_weights,
                                                    DataSplit split, int64_t dataset,
                                                    const std::string& prefix,
                                                    int64_t num_samples) {
  check_prefix_files(prefix, cfg.flag);
  auto data = std::make_shared<const IndexedDataset>(prefix);
  const int64_t all_docs = data->num_documents();
  if (all_docs == 0 || data->num_sequences() == 0) {
    fail_usage("{}: {} holds no documents (an empty dataset)", cfg.flag, idx_path(prefix));
  }
  const auto [begin, end] = split_documents(*data, split_weights, split);
  const int seq = cfg.seq_length;
  if (num_samples == 0) return std::make_unique<GptSplitDataset>(data, nullptr, seq, 0, 0, 0);
  if (begin == end) {
    if (cfg.flag != "--data-path")  // a split of its own: all of the dataset's documents
      fail_usage("{}: {} holds no documents, yet {} samples are asked of it", cfg.flag, prefix,
                 num_samples);
    throw EmptySplitError(fmt::format(
        "--split {},{},{}: the {} split of {} ({} documents) is empty, yet {} samples are "
        "asked of it; give the split a larger share",
        split_weights[0], split_weights[1], split_weights[2], split_name(split), prefix, all_docs,
        num_samples));
  }
  std::vector<int64_t> doc_lengths(static_cast<size_t>(end - begin));
  int64_t tokens = 0;
  for (int64_t d = begin; d < end; ++d) {
    doc_lengths[d - begin] = document_tokens(*data, d);
    tokens += doc_lengths[d - begin];
  }
  if (tokens < seq + 1) {
    if (cfg.flag != "--data-path")
      fail_usage("{}: {} holds {} tokens, fewer than one sample (seq_length + 1 = {}); use more "
                 "data or a shorter --seq-length", cfg.flag, prefix, tokens, seq + 1);
    throw EmptySplitError(fmt::format(
        "--seq-length {}: the {} split of {} holds {} tokens, fewer than one sample "
        "(seq_length + 1 = {}); use more data, a larger --split share or a shorter "
        "--seq-length",
        seq, split_name(split), prefix, tokens, seq + 1));
  }

  GptSamplingSpec spec;
  spec.doc_begin = begin;
  spec.doc_end = end;
  spec.tokens_per_epoch = tokens;
  spec.seq_length = seq;
  spec.seed = cfg.seed;
  spec.split = static_cast<int>(split);
  spec.dataset = dataset;
  spec.epochs = sampling_epochs_for(num_samples, tokens, seq);
  const int64_t samples = sampling_block_begin(spec.epochs, tokens, seq);
  const int64_t doc_index_length = (spec.epochs + 1) * (end - begin);

  const std::string idx = idx_path(prefix);
  const std::string key_text = fmt::format(
      "weft-gpt-samples\nversion={}\nprefix={}\nidx_bytes={}\nidx_hash={}\nsplit={}\n"
      "documents={},{}\nseq_length={}\nseed={}\ndataset={}\nepochs={}\n",
      kSamplingVersion, prefix, std::filesystem::file_size(idx),
      data_hash_hex(data_hash64_file(idx)), split_name(split), begin, end, seq, cfg.seed, dataset,
      spec.epochs);
  const uint64_t key = data_hash64(key_text.data(), key_text.size());
  const std::string path =
      (std::filesystem::path(cache_dir(cfg, prefix)) /
       fmt::format("{}.weft-{}-{}.samples", std::filesystem::path(prefix).filename().string(),
                   split_name(split), data_hash_hex(key)))
          .string();
  auto cache = open_or_build(
      path, SampleCacheKind::kDataset, key, {doc_index_length, 2 * samples, samples}, [&] {
        GptSamplingIndices ix = sampling_build_gpt_indices(spec, doc_lengths);
        return std::vector<std::vector<int64_t>>{
            std::move(ix.document_index), std::move(ix.sample_index), std::move(ix.shuffle_index)};
      });
  return std::make_unique<GptSplitDataset>(std::move(data), std::move(cache), seq, samples,
                                           doc_index_length, key, cfg.in_order);
}

}  // namespace

std::vector<std::pair<double, std::string>> parse_data_path(const std::vector<std::string>& args,
                                                            bool* weighted,
                                                            const std::string& flag) {
  if (weighted) *weighted = false;
  std::vector<std::string> tok;
  std::string joined;
  for (const std::string& a : args) {
    std::istringstream in(a);
    for (std::string t; in >> t;) {
      tok.push_back(t);
      joined += (joined.empty() ? "" : " ") + t;
    }
  }
  if (tok.empty()) fail_usage("{}: no dataset prefix given", flag);
  std::vector<std::pair<double, std::string>> out;
  size_t numbers = 0;
  for (size_t i = 0; i < tok.size(); i += 2) {
    double w;
    numbers += parse_number(tok[i], &w);
  }
  const size_t pairs = tok.size() / 2;
  if (tok.size() % 2 == 0 && numbers == pairs) {
    std::vector<double> weights;
    for (size_t i = 0; i < tok.size(); i += 2) {
      double w = 0;
      parse_number(tok[i], &w);
      weights.push_back(w);
      out.emplace_back(w, tok[i + 1]);
    }
    check_weights(weights, flag.c_str(), joined);
    if (weighted) *weighted = true;
    return out;
  }
  if (numbers > 0) {
    fail_usage(
        "{} \"{}\": weights and prefixes must alternate (\"W1 P1 W2 P2 ...\"), or "
        "give prefixes only; found {} numbers among {} elements",
        flag, joined, numbers, tok.size());
  }
  for (const std::string& p : tok) out.emplace_back(1.0, p);
  return out;
}

std::array<double, 3> parse_split(const std::string& value) {
  std::vector<double> w;
  std::string part;
  auto take = [&] {
    const auto b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
    const std::string t = b == std::string::npos ? "" : part.substr(b, e - b + 1);
    double x = 0;
    if (!parse_number(t, &x)) {
      fail_usage("--split \"{}\": \"{}\" is not a number (expected e.g. \"969,30,1\")", value, t);
    }
    w.push_back(x);
    part.clear();
  };
  for (char c : value) {
    if (c == ',' || c == '/') {
      take();
    } else {
      part += c;
    }
  }
  take();
  if (w.size() > 3) {
    fail_usage("--split \"{}\": at most three weights (train, valid, test)", value);
  }
  w.resize(3, 0.0);
  check_weights(w, "--split", value);
  const double sum = w[0] + w[1] + w[2];
  return {w[0] / sum, w[1] / sum, w[2] / sum};
}

int64_t one_pass_samples(const GptDataConfig& cfg, DataSplit split) {
  WEFT_CHECK(cfg.blend.size() == 1, "one_pass_samples: {} datasets, not one", cfg.blend.size());
  if (cfg.seq_length <= 0) fail_usage("--seq-length must be positive (got {})", cfg.seq_length);
  const int64_t tokens =
      split_tokens(normalized_split(cfg.split), split, cfg.blend.front().second, cfg.flag);
  // ceil((tokens - 1) / seq): the samples whose labels reach the pass's last token.
  return tokens > cfg.seq_length ? (tokens - 1 + cfg.seq_length - 1) / cfg.seq_length : 0;
}

std::unique_ptr<TokenDataset> make_gpt_dataset(const GptDataConfig& cfg, DataSplit split,
                                               int64_t num_samples) {
  if (cfg.seq_length <= 0) fail_usage("--seq-length must be positive (got {})", cfg.seq_length);
  if (cfg.blend.empty()) fail_usage("{}: no dataset prefix given", cfg.flag);
  if (num_samples < 0) fail("make_gpt_dataset: {} samples asked", num_samples);
  const std::array<double, 3> split_weights = normalized_split(cfg.split);
  std::vector<double> weights;
  for (const auto& [w, p] : cfg.blend)
    weights.push_back(cfg.blend_by_size ? static_cast<double>(epoch_samples(
                                              cfg.seq_length, split_weights, split, p, cfg.flag))
                                        : w);
  // A dataset whose split holds no sample cannot be weighed by its size: refused as in a
  // weighted blend (the trainer skips a test split on this error alone).
  for (size_t j = 0; cfg.blend_by_size && num_samples > 0 && j < weights.size(); ++j)
    if (weights[j] == 0 && cfg.flag != "--data-path")
      fail_usage("{}: {} holds fewer tokens than one sample (--seq-length {}), so it cannot be "
                 "weighed by its size; leave it out or give weights", cfg.flag,
                 cfg.blend[j].second, cfg.seq_length);
    else if (weights[j] == 0)
      throw EmptySplitError(fmt::format(
          "--split {},{},{} and --seq-length {}: the {} split of {} holds fewer tokens than one "
          "sample, yet {} samples of the blend by size are asked of it; give the split a larger "
          "share, a shorter --seq-length, or leave the dataset out of {}",
          split_weights[0], split_weights[1], split_weights[2], cfg.seq_length, split_name(split),
          cfg.blend[j].second, num_samples, cfg.flag));
  if (!cfg.blend_by_size) check_weights(weights, cfg.flag.c_str(), cfg.blend.front().second);
  double sum = 0;
  for (double w : weights) sum += w;
  std::vector<size_t> kept;
  for (size_t j = 0; j < cfg.blend.size(); ++j) {
    check_prefix_files(cfg.blend[j].second, cfg.flag);
    if (weights[j] > 0) kept.push_back(j);
  }
  if (kept.size() == 1) {
    return make_split_dataset(cfg, split_weights, split, static_cast<int64_t>(kept[0]),
                              cfg.blend[kept[0]].second, num_samples);
  }

  // Megatron's BlendedDataset over the datasets of positive weight.
  std::vector<double> norm;
  std::vector<std::unique_ptr<GptSplitDataset>> parts;
  std::string key_text = fmt::format("weft-blend-samples\nversion={}\nsplit={}\nsamples={}\n",
                                     kSamplingVersion, split_name(split), num_samples);
  for (size_t j : kept) {
    norm.push_back(weights[j] / sum);
    parts.push_back(make_split_dataset(cfg, split_weights, split, static_cast<int64_t>(j),
                                       cfg.blend[j].second,
                                       sampling_blend_request(norm.back(), num_samples)));
    key_text += fmt::format("dataset={} weight={:.17g} key={}\n", j, norm.back(),
                            data_hash_hex(parts.back()->key()));
  }
  if (num_samples == 0) {
    return std::make_unique<GptBlendDataset>(std::move(parts), nullptr, cfg.seq_length, 0);
  }
  const uint64_t key = data_hash64(key_text.data(), key_text.size());
  const std::string path =
      (std::filesystem::path(cache_dir(cfg, cfg.blend.front().second)) /
       fmt::format("weft-blend-{}-{}.samples", split_name(split), data_hash_hex(key)))
          .string();
  auto cache = open_or_build(path, SampleCacheKind::kBlend, key, {num_samples, num_samples}, [&] {
    std::vector<std::vector<int64_t>> ix(2, std::vector<int64_t>(static_cast<size_t>(num_samples)));
    sampling_build_blending_index(norm, num_samples, ix[0].data(), ix[1].data());
    std::vector<int64_t> taken(parts.size(), 0);
    for (int64_t d : ix[0]) ++taken[d];
    for (size_t j = 0; j < parts.size(); ++j) {
      WEFT_CHECK(taken[j] <= parts[j]->size(), "the blend takes {} samples of {}, built for {}",
                 taken[j], cfg.blend[kept[j]].second, parts[j]->size());
    }
    return ix;
  });
  return std::make_unique<GptBlendDataset>(std::move(parts), std::move(cache), cfg.seq_length,
                                           num_samples);
}

nlohmann::json gpt_data_identity(const GptDataConfig& cfg) {
  nlohmann::json blend = nlohmann::json::array();
  for (const auto& [w, prefix] : cfg.blend) {
    check_prefix_files(prefix, cfg.flag);
    const std::string idx = idx_path(prefix);
    blend.push_back({{"prefix", prefix},
                     {"weight", w},
                     {"idx_bytes", static_cast<uint64_t>(std::filesystem::file_size(idx))},
                     {"idx_hash", data_hash_hex(data_hash64_file(idx))}});
  }
  const std::array<double, 3> split = normalized_split(cfg.split);
  if (cfg.blend_by_size)  // only then, so that the identities of weighted blends stay as they were
    return {{"sampling_version", kSamplingVersion},
            {"blend", blend},
            {"blend_weights", "samples of each split"},
            {"split", {split[0], split[1], split[2]}},
            {"seq_length", cfg.seq_length},
            {"seed", cfg.seed}};
  return {{"sampling_version", kSamplingVersion},
          {"blend", blend},
          {"split", {split[0], split[1], split[2]}},
          {"seq_length", cfg.seq_length},
          {"seed", cfg.seed}};
}

}  // namespace weft
