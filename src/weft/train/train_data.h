// The trainer's data: the train and valid sample streams and the rule by which a rank picks
// its samples. Sample indices are global (consumed samples), so the stream is the same on every
// layout and continues exactly after a resume on any layout.
//
// Sources: Megatron indexed datasets through GPTDataset sampling (--data-path, --split,
// --data-cache-path) or mock data (--mock-data, or no --data-path). As in Megatron, the train
// split is asked for train_iters x global_batch samples (under a --step-batch-size-schedule the
// samples of its train_iters steps), the valid split for the evaluations every --eval-interval
// plus the one at the end, --eval-iters batches of --eval-global-batch-size each, after those
// its checkpoint's evaluations read (Trainer::consumed_valid_samples), and the test split for one
// evaluation (read once, at the end of training); --full-validation reads one pass over each
// validation dataset instead. docs/data-sampling.md, "Which samples an evaluation reads".
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "weft/comm/communicator.h"
#include "weft/data/gpt_dataset.h"
#include "weft/data/token_dataset.h"

namespace weft {

struct TrainConfig;

// Checks the data flags of `cfg` (parses --data-path and --split, checks every prefix's .idx
// and .bin exist, --mock-data vs --data-path, eval counts). Local: no collectives. Throws
// UsageError naming the flag or the file.
void validate_data_config(const TrainConfig& cfg);

// The positions that stay in the loss (bool, the shape of `tokens`): an input token other than
// `eod` and a label other than `pad` (-1: no such rule). One rule for the host count and the
// microbatch's mask.
at::Tensor loss_keep(const at::Tensor& tokens, const at::Tensor& labels, int64_t eod, int64_t pad);

struct LossPositions {
  int64_t unmasked = 0;
  bool pad_seen = false;
};

class TrainData {
 public:
  // Collective over `control` (the world's host-side communicator): rank 0 builds the index
  // caches first, the others then load them (an error on rank 0 is reproduced by every rank
  // building the same dataset, so each one throws the same UsageError).
  // A resumed run (`resume_iteration` > 0) sizes the valid split from `valid_from`, the valid
  // samples its checkpoint's evaluations read (Trainer::consumed_valid_samples).
  TrainData(const TrainConfig& cfg, Communicator& control, int rank, int64_t valid_from = 0,
            int resume_iteration = 0);

  // Samples [first, first + count) of one split's stream, moved to `device`; tokens outside
  // [0, vocab) are an error naming --data-path. `set` >= 0 reads validation set `set` of
  // --full-validation instead (split kValid).
  void fetch(DataSplit split, int64_t first, int count, c10::Device device, at::Tensor* tokens,
             at::Tensor* labels, int set = -1) const;
  // The loss mask of samples [first, first + count) (read on the host, in pieces of 64 samples):
  // how many positions have an input token other than `eod` and a label other than `pad` (-1:
  // no such rule), and whether any token or label is `pad`.
  LossPositions loss_positions(DataSplit split, int64_t first, int64_t count, int64_t eod,
                               int64_t pad, int set = -1) const;
  bool has_valid() const { return valid_ != nullptr || !full_valid_.empty(); }
  // --full-validation: one dataset per prefix of the validation blend (--valid-data-path, or
  // --data-path cut by --split), each holding the samples of one pass over its documents
  // (one_pass_samples), in the blend's order.
  int full_valid_sets() const { return static_cast<int>(full_valid_.size()); }
  int64_t full_valid_samples(int set) const { return full_valid_n_.at(set); }
  bool has_test() const { return test_ != nullptr; }
  // Why a run that evaluates, with a test share in --split, has no test split: the share is
  // too small to hold the samples ("" otherwise).
  const std::string& no_test_reason() const { return no_test_reason_; }
  // What the checkpoint records under "data" (besides the consumed samples).
  const nlohmann::json& identity() const { return identity_; }

 private:
  const TokenDataset& dataset(DataSplit split, int set) const;

  std::unique_ptr<TokenDataset> train_, valid_, test_;
  std::vector<std::unique_ptr<TokenDataset>> full_valid_;
  std::vector<int64_t> full_valid_n_;
  std::string no_test_reason_;
  nlohmann::json identity_;
  const char* flags_[3] = {"--data-path", "--data-path", "--data-path"};  // for error messages
  int64_t vocab_ = 0;
  bool check_ids_ = false;
};

}  // namespace weft
