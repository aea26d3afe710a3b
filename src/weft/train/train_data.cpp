// TrainData (see train_data.h).
#include "weft/train/train_data.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <string>

#include "weft/core/error.h"
#include "weft/data/gpt_dataset.h"
#include "weft/data/indexed_dataset.h"
#include "weft/data/mock_dataset.h"
#include "weft/train/trainer.h"

namespace weft {
namespace {

// Mock data's valid stream: another seed, so it never repeats a training sample's rule.
constexpr uint64_t kMockValidSeedOffset = 0x5EED5EEDull;
constexpr uint64_t kMockTestSeedOffset = 0x7E575EEDull;

constexpr const char* kSplitFlags[3] = {"--train-data-path", "--valid-data-path",
                                        "--test-data-path"};

// The sampling of `split`: --data-path cut by --split, or with per-split paths (Megatron's
// blend_per_split) that split's own blend over all of its documents: the split's share 1,
// the others 0, as Megatron's builder spoofs the split ranges.
GptDataConfig gpt_config(const TrainConfig& c, DataSplit split = DataSplit::kTrain) {
  GptDataConfig g;
  bool weighted = false;
  const int i = static_cast<int>(split);
  g.flag = c.per_split_data() ? kSplitFlags[i] : "--data-path";
  g.blend = parse_data_path(c.per_split_data() ? c.split_data_path[i] : c.data_path, &weighted,
                            g.flag);
  g.blend_by_size = !weighted && g.blend.size() > 1;
  if (c.per_split_data()) {
    g.split = {0, 0, 0};
    g.split[i] = 1;
  } else {
    g.split = parse_split(c.split);
  }
  g.seq_length = c.model.seq_length;
  g.seed = c.seed;
  g.cache_path = c.data_cache_path;
  return g;
}

// --skip-train evaluates once whatever --eval-interval says (Megatron's do_valid).
bool wants_eval(const TrainConfig& c) {
  return (c.eval_interval > 0 || c.skip_train) && c.eval_iters > 0;
}

}  // namespace

void validate_data_config(const TrainConfig& c) {
  if (c.eval_interval < 0) fail_usage("--eval-interval must be >= 0 (got {})", c.eval_interval);
  if (c.eval_iters < 0) fail_usage("--eval-iters must be >= 0 (got {})", c.eval_iters);
  if (c.multiple_validation_sets && !c.full_validation)
    fail_usage("--multiple-validation-sets needs --full-validation (as in Megatron: without it "
               "the sets' evaluation positions are not defined)");
  if (!c.validation_set_names.empty() && !c.multiple_validation_sets)
    fail_usage("--validation-set-names needs --multiple-validation-sets (as Megatron asserts)");
  if (c.full_validation && !c.real_data())
    fail_usage("--full-validation needs indexed datasets (--data-path or --valid-data-path): "
               "mock data has no end to validate up to");
  if (c.full_validation && c.real_data() && (!c.per_split_data() || !c.split_data_path[1].empty())) {
    // Megatron refuses weights there too: every sample of each dataset counts once.
    const bool per_split = c.per_split_data();
    const char* flag = per_split ? "--valid-data-path" : "--data-path";
    bool weighted = false;
    parse_data_path(per_split ? c.split_data_path[1] : c.data_path, &weighted, flag);
    if (weighted)
      fail_usage("{} with weights and --full-validation: full validation reads every sample of "
                 "each dataset once, so the weights mean nothing there; give the datasets without "
                 "weights (Megatron refuses them too){}", flag,
                 per_split ? "" : ", or validate on --valid-data-path with --train-data-path");
  }
  if (c.multiple_validation_sets) {
    if (c.split_data_path[1].empty())
      fail_usage("--multiple-validation-sets needs --valid-data-path: each of its datasets is "
                 "one validation set (Megatron builds the sets from the per-split paths only)");
    bool weighted = false;
    const auto sets = parse_data_path(c.split_data_path[1], &weighted, "--valid-data-path");
    if (weighted)
      fail_usage("--valid-data-path with --multiple-validation-sets: give the datasets without "
                 "weights (each is evaluated on its own, as Megatron requires)");
    if (!c.validation_set_names.empty() && c.validation_set_names.size() != sets.size())
      fail_usage("--validation-set-names gives {} names for the {} datasets of --valid-data-path",
                 c.validation_set_names.size(), sets.size());
  }
  if (!c.real_data()) {
    if (!c.data_cache_path.empty())
      fail_usage("--data-cache-path needs --data-path (or --train-data-path)");
    return;
  }
  // One data source, as Megatron asserts.
  if (c.mock_data)
    fail_usage("--mock-data and {} both given; choose one",
               c.data_path.empty() ? "--train-data-path/--valid-data-path/--test-data-path"
                                   : "--data-path");
  if (c.per_split_data() && !c.data_path.empty())
    fail_usage("--data-path and --train/valid/test-data-path both given; give one data source "
               "(Megatron asserts the same)");
  if (c.per_split_data() && c.split_data_path[0].empty())
    fail_usage("--valid-data-path/--test-data-path without --train-data-path: the training "
               "split needs its own data");
  for (int i = 0; i < 3; ++i) {
    if (c.per_split_data() ? c.split_data_path[i].empty() : i > 0) continue;
    const GptDataConfig g = gpt_config(c, static_cast<DataSplit>(i));  // parses the blend, --split
    for (const auto& [w, prefix] : g.blend)
      for (const std::string& f : {idx_path(prefix), bin_path(prefix)})
        if (!std::filesystem::is_regular_file(f))
          fail_usage("{}: {} does not exist (a dataset prefix P needs P.idx and P.bin, "
                     "written by `weft data preprocess`)", g.flag, f);
  }
  if (!c.data_cache_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c.data_cache_path, ec);
    if (!std::filesystem::is_directory(c.data_cache_path))
      fail_usage("--data-cache-path {}: not a directory and cannot be created", c.data_cache_path);
  }
}

TrainData::TrainData(const TrainConfig& c, Communicator& control, int rank, int64_t valid_from,
                     int resume_iteration)
    : vocab_(c.model.vocab_size) {
  const int64_t train_samples =
      c.skip_train ? 0 : train_batches(c).samples_after(0, c.train_iters);
  // Megatron's get_train_valid_test_num_samples: one evaluation per --eval-interval from
  // --start-eval-at-iter on plus the one at the end of training on the valid split (with
  // --skip-train that one alone); one on the test split.
  const int64_t eval_batches =
      wants_eval(c) ? static_cast<int64_t>(c.eval_iters) * c.eval_global_batch() : 0;
  const int64_t evaluations =
      c.skip_train ? 1
                   : c.evaluations_through(c.train_iters) -
                         c.evaluations_through(resume_iteration) + 1;
  const int64_t valid_samples =
      c.full_validation || eval_batches == 0 ? 0
                                             : (c.skip_train ? 0 : valid_from) + eval_batches * evaluations;
  // --full-validation reads its own datasets, whatever --eval-iters says (Megatron's do_valid).
  const bool full_valid = c.full_validation && (c.eval_interval > 0 || c.skip_train);
  const int64_t test_samples = eval_batches;
  if (!c.real_data()) {
    train_ = std::make_unique<MockDataset>(c.seed, c.model.vocab_size, c.model.seq_length);
    if (valid_samples > 0)
      valid_ = std::make_unique<MockDataset>(c.seed + kMockValidSeedOffset, c.model.vocab_size,
                                             c.model.seq_length);
    if (test_samples > 0)
      test_ = std::make_unique<MockDataset>(c.seed + kMockTestSeedOffset, c.model.vocab_size,
                                            c.model.seq_length);
    identity_ = {{"kind", "mock"}, {"seed", c.seed}};
    return;
  }
  const bool per_split = c.per_split_data();
  const GptDataConfig g = gpt_config(c);
  check_ids_ = true;
  if (per_split)  // a split without its path is not evaluated, as in Megatron
    for (int i = 0; i < 3; ++i) flags_[i] = kSplitFlags[i];
  auto build = [&] {
    train_ = make_gpt_dataset(g, DataSplit::kTrain, train_samples);
    if (valid_samples > 0 && (!per_split || !c.split_data_path[1].empty()))
      valid_ = make_gpt_dataset(gpt_config(c, DataSplit::kValid), DataSplit::kValid, valid_samples);
    full_valid_.clear();
    full_valid_n_.clear();
    if (full_valid && (!per_split || !c.split_data_path[1].empty())) {
      const GptDataConfig v = gpt_config(c, DataSplit::kValid);
      for (const auto& [w, prefix] : v.blend) {  // each dataset alone, one pass
        GptDataConfig one = v;
        one.blend = {{1.0, prefix}};
        one.blend_by_size = false;
        one.in_order = true;
        const int64_t n = one_pass_samples(one, DataSplit::kValid);
        full_valid_.push_back(make_gpt_dataset(one, DataSplit::kValid, std::max<int64_t>(n, 1)));
        full_valid_n_.push_back(n);
      }
    }
    // The test split is evaluated where --split gives it a share that holds the samples, as
    // Megatron builds it only for a non-zero share; a share too small (a few documents of a
    // small corpus) skips the test evaluation with its reason instead of failing the run. The
    // outcome is the same on every rank (the same files).
    test_.reset();
    if (test_samples > 0 && (per_split ? !c.split_data_path[2].empty() : g.split[2] > 0)) {
      try {
        test_ = make_gpt_dataset(gpt_config(c, DataSplit::kTest), DataSplit::kTest, test_samples);
      } catch (const EmptySplitError& e) {
        no_test_reason_ = e.what();
      }
    }
  };
  // Rank 0 builds the caches; one all-reduce tells the others whether it succeeded.
  std::exception_ptr error;  // rank 0's UsageError, rethrown as it is after the all-reduce
  if (rank == 0) {
    try {
      build();
    } catch (const UsageError&) {
      error = std::current_exception();
    }
  }
  at::Tensor failed = at::full({1}, error ? 1.0f : 0.0f, at::kFloat);
  if (control.size() > 1) control.all_reduce(failed, ReduceOp::kMax);
  if (rank == 0 && error) std::rethrow_exception(error);
  if (rank != 0) {
    build();  // loads the caches rank 0 wrote (or raises rank 0's error again)
    if (failed.item<float>() > 0)
      throw UsageError("building the datasets failed on rank 0 (see its message)");
  }
  if (per_split) {
    // Each split's blend; "blend" stays the training split's, which a resume compares.
    identity_ = gpt_data_identity(g);
    for (int i = 1; i < 3; ++i)
      if (!c.split_data_path[i].empty())
        identity_[i == 1 ? "valid" : "test"] = gpt_data_identity(gpt_config(c, static_cast<DataSplit>(i)));
  } else {
    identity_ = gpt_data_identity(g);
  }
  identity_["kind"] = "gpt";
}

at::Tensor loss_keep(const at::Tensor& tokens, const at::Tensor& labels, int64_t eod, int64_t pad) {
  at::Tensor keep = at::ones_like(tokens, at::kBool);
  if (eod >= 0) keep &= tokens.ne(eod);
  if (pad >= 0) keep &= labels.ne(pad);
  return keep;
}

const TokenDataset& TrainData::dataset(DataSplit split, int set) const {
  if (set >= 0) {
    WEFT_CHECK(split == DataSplit::kValid && set < full_valid_sets(),
               "no validation set {} (--full-validation has {})", set, full_valid_sets());
    return *full_valid_[set];
  }
  const auto& d = split == DataSplit::kTrain ? train_ : split == DataSplit::kValid ? valid_ : test_;
  WEFT_CHECK(d != nullptr, "the {} split was not built", static_cast<int>(split));
  return *d;
}

LossPositions TrainData::loss_positions(DataSplit split, int64_t first, int64_t count,
                                       int64_t eod, int64_t pad, int set) const {
  const TokenDataset& d = dataset(split, set);
  LossPositions n;
  for (int64_t at = first; at < first + count; at += 64) {
    at::Tensor tokens, labels;
    d.batch(at, static_cast<int>(std::min<int64_t>(64, first + count - at)), &tokens, &labels);
    if (pad >= 0 && !n.pad_seen)
      n.pad_seen = tokens.eq(pad).any().item<bool>() || labels.eq(pad).any().item<bool>();
    n.unmasked += loss_keep(tokens, labels, eod, pad).sum().item<int64_t>();
  }
  return n;
}

void TrainData::fetch(DataSplit split, int64_t first, int count, c10::Device device,
                      at::Tensor* tokens, at::Tensor* labels, int set) const {
  const TokenDataset& d = dataset(split, set);
  d.batch(first, count, tokens, labels);
  if (check_ids_) {
    const int64_t lo = std::min(tokens->min().item<int64_t>(), labels->min().item<int64_t>());
    const int64_t hi = std::max(tokens->max().item<int64_t>(), labels->max().item<int64_t>());
    if (lo < 0 || hi >= vocab_)
      fail_usage("{}: {} sample {} holds token id {}, outside the model's vocabulary "
                 "of {} (--vocab-size); the data was tokenized with another tokenizer",
                 flags_[static_cast<int>(split)], split == DataSplit::kTrain   ? "train"
                 : split == DataSplit::kValid ? "valid"
                                              : "test",
                 first, lo < 0 ? lo : hi, vocab_);
  }
  if (device.is_cuda()) {
    // From pinned memory the copies are queued without waiting; from pageable memory CUDA
    // first drains the stream (a host sync per microbatch in the middle of the schedule).
    *tokens = tokens->pin_memory().to(device, /*non_blocking=*/true);
    *labels = labels->pin_memory().to(device, /*non_blocking=*/true);
  }
}

}  // namespace weft
