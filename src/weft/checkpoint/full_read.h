// Reading whole model weights out of a checkpoint in one process, without MPI: every global
// tensor assembled from its chunks, whatever layout (pp, dp, ep, HSDP) wrote them. For tools
// that run the model unsharded (`weft generate`).
//
// Invariant: a weight's value is the same whatever layout saved it (invariant 1): chunks are
// boxes of the global tensor (docs/checkpoint-format.md), the index they come from has passed
// the coverage check (every row exactly once), and every chunk's CRC-32C is verified on read,
// as the distributed loader does. The float32 master copy (optimizer.fp32_param.<name>) is
// preferred over the model tensor in compute dtype when the checkpoint holds it; callers cast
// to their compute dtype (a bf16 model tensor is the master rounded to bf16).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/checkpoint/format.h"
#include "weft/core/status.h"

namespace weft {

// The iteration directory `load` names: `load` itself when it holds metadata.json, else
// <load>/iter_<step> (step >= 0) or <load>/iter_<tracker's latest> (step < 0).
Status ckpt_resolve_iter_dir(const std::string& load, int step, std::string* iter_dir);

// The full tensor of `key` (CPU, stored dtype), assembled from its chunks of `index`, every
// checksum verified. Error (naming the file and key) on a missing key, unreadable or corrupted
// chunk.
Status ckpt_read_full_tensor(const CkptIndex& index, const std::string& key, CkptFileCache& files,
                             at::Tensor* out);

// The model weights of one iteration directory, read one at a time: metadata and the index at
// construction (Status in status()), each weight when asked for. Host memory: the weight asked
// for (export streams a model larger than memory through this; ckpt_read_full_weights holds
// them all).
class CkptWeightReader {
 public:
  explicit CkptWeightReader(const std::string& iter_dir);
  const Status& status() const { return status_; }  // of reading metadata.json and the index
  const nlohmann::json& meta() const { return meta_; }
  // Weight name -> the key its value comes from (the float32 master when stored).
  const std::map<std::string, std::string>& source_key() const { return pick_; }
  // Its global shape, from the index (name must be in source_key()).
  const std::vector<int64_t>& shape(const std::string& name) const;
  // The weight's full tensor (CPU, stored dtype), every checksum verified.
  Status read(const std::string& name, at::Tensor* out);

 private:
  Status status_ = Status::ok();
  nlohmann::json meta_;
  CkptIndex index_;
  std::map<std::string, std::string> pick_;
  std::unique_ptr<CkptFileCache> files_;
};

struct FullCheckpoint {
  std::string dir;      // the iteration directory read
  nlohmann::json meta;  // its metadata.json
  // Every model weight by global name (keys outside "optimizer."): the float32 master when
  // stored, else the model tensor in its stored dtype. CPU tensors.
  std::map<std::string, at::Tensor> weights;
  std::map<std::string, std::string> source_key;  // name -> the key the value was read from
};

// Reads metadata and every model weight of the iteration directory `iter_dir`.
Status ckpt_read_full_weights(const std::string& iter_dir, FullCheckpoint* out);

}  // namespace weft
