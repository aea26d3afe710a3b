// Whole-tensor reads of a checkpoint in one process (see full_read.h).
//
// The index (format.cpp's ckpt_read_metadata) has already checked that each key's chunks tile
// dim 0 exactly once and span every other dim, so assembling a tensor is one copy per chunk
// into rows [offset, offset + length). Reads go through CkptFileCache, which parses each shard
// header once and verifies each chunk's checksum.
#include "weft/checkpoint/full_read.h"

#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include <filesystem>

#include "weft/checkpoint/checkpoint.h"

namespace weft {

Status ckpt_resolve_iter_dir(const std::string& load, int step, std::string* iter_dir) {
  namespace fs = std::filesystem;
  if (!fs::exists(load)) return Status::error(fmt::format("{}: no such directory", load));
  if (fs::exists(load + "/metadata.json")) {
    *iter_dir = load;
    return Status::ok();
  }
  int iteration = step;
  if (iteration < 0) {
    if (Status s = ckpt_read_tracker(load, &iteration); !s)
      return Status::error(fmt::format(
          "{} is neither a checkpoint iteration (no metadata.json) nor a save directory ({})",
          load, s.message()));
  }
  *iter_dir = ckpt_iter_dir(load, iteration);
  if (!fs::exists(*iter_dir))
    return Status::error(fmt::format("{}: no checkpoint of iteration {} ({} does not exist)",
                                     load, iteration, *iter_dir));
  return Status::ok();
}

Status ckpt_read_full_tensor(const CkptIndex& index, const std::string& key, CkptFileCache& files,
                             at::Tensor* out) {
  auto it = index.find(key);
  if (it == index.end()) return Status::error(fmt::format("key '{}' is not in the checkpoint", key));
  const CkptTensorInfo& t = it->second;
  c10::ScalarType dtype;
  try {
    dtype = ckpt_torch_dtype(t.dtype);
  } catch (const std::exception& e) {
    return Status::error(fmt::format("key '{}': {}", key, e.what()));
  }
  at::Tensor full = at::empty(t.shape, at::TensorOptions().dtype(dtype));
  for (const CkptChunk& c : t.chunks) {
    at::Tensor rows = full.narrow(0, c.offsets[0], c.lengths[0]);  // contiguous: dim 0 only
    if (Status s = files.read_chunk(c, rows.data_ptr()); !s) return s;
  }
  *out = full;
  return Status::ok();
}

CkptWeightReader::CkptWeightReader(const std::string& iter_dir)
    : files_(std::make_unique<CkptFileCache>(iter_dir)) {
  status_ = ckpt_read_metadata(iter_dir, &meta_, &index_);
  if (!status_) return;
  const std::string opt = "optimizer.", master = "optimizer.fp32_param.";
  for (const auto& [key, info] : index_) {
    if (key.compare(0, master.size(), master) == 0) {
      pick_[key.substr(master.size())] = key;  // the master wins over the model tensor
    } else if (key.compare(0, opt.size(), opt) != 0) {
      pick_.try_emplace(key, key);
    }
  }
}

const std::vector<int64_t>& CkptWeightReader::shape(const std::string& name) const {
  return index_.at(pick_.at(name)).shape;
}

Status CkptWeightReader::read(const std::string& name, at::Tensor* out) {
  auto it = pick_.find(name);
  if (it == pick_.end())
    return Status::error(fmt::format("weight '{}' is not in the checkpoint", name));
  return ckpt_read_full_tensor(index_, it->second, *files_, out);  // names the file
}

Status ckpt_read_full_weights(const std::string& iter_dir, FullCheckpoint* out) {
  out->dir = iter_dir;
  out->weights.clear();
  out->source_key.clear();
  CkptWeightReader reader(iter_dir);
  if (!reader.status()) return reader.status();
  out->meta = reader.meta();
  for (const auto& [name, key] : reader.source_key()) {
    at::Tensor t;
    if (Status s = reader.read(name, &t); !s) return s;
    out->weights[name] = t;
    out->source_key[name] = key;
  }
  return Status::ok();
}

}  // namespace weft
