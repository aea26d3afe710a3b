// Distributed checkpoint save and load (see checkpoint.h and docs/checkpoint-format.md).
#include "weft/checkpoint/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "weft/checkpoint/crc32c.h"
#include "weft/checkpoint/device_staging.h"
#include "weft/checkpoint/format.h"
#include "weft/checkpoint/safetensors.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"
#include "weft/core/remove_tree.h"
#include "weft/core/fault.h"
#include "weft/comm/device.h"
#include "weft/parallel/grad_access.h"

namespace weft {
namespace fs = std::filesystem;
namespace {

const char* const kStateKinds[] = {"fp32_param", "exp_avg", "exp_avg_sq"};

}  // namespace

void ckpt_seed_rng(uint64_t seed) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_current_seed(seed);
}

std::string ckpt_dtype_name(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kDouble: return "F64";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kByte: return "U8";
    default: fail("checkpoint: dtype {} cannot be stored", c10::toString(t));
  }
}

c10::ScalarType ckpt_torch_dtype(const std::string& d) {
  if (d == "F32") return at::kFloat;
  if (d == "BF16") return at::kBFloat16;
  if (d == "F16") return at::kHalf;
  if (d == "F64") return at::kDouble;
  if (d == "I64") return at::kLong;
  if (d == "I32") return at::kInt;
  if (d == "U8") return at::kByte;
  fail("checkpoint: stored dtype {} is not supported", d);
}

namespace {

// All ranks' strings, in rank order (collective over `world`).
std::vector<std::string> all_gather_strings(Communicator& world, const std::string& mine) {
  const int n = world.size();
  at::Tensor len = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
  at::Tensor lens = at::empty({n}, at::kLong);
  world.all_gather(len, lens);
  int64_t max_len = lens.max().item<int64_t>();
  at::Tensor buf = at::zeros({max_len}, at::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::empty({n * max_len}, at::kByte);
  world.all_gather(buf, all);
  std::vector<std::string> out;
  const char* p = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) out.emplace_back(p + r * max_len, lens[r].item<int64_t>());
  return out;
}

// Collective: every rank gets the first failure (by rank) or ok.
Status agree(Communicator& world, const Status& mine) {
  auto all = all_gather_strings(world, mine ? "" : mine.message());
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) return Status::error(all[r]);
  return Status::ok();
}

std::string stage_local_name(const std::string& name, int first_layer) {
  const std::string prefix = "decoder.layers.";
  if (name.rfind(prefix, 0) != 0) return name;
  size_t dot = name.find('.', prefix.size());
  int l = std::stoi(name.substr(prefix.size(), dot - prefix.size()));
  return prefix + std::to_string(l - first_layer) + name.substr(dot);
}

// The checkpoint key of parameter i of unit u (the tied copy maps to the embedding's key).
std::string model_key(const FsdpUnit& u, int i) { return u.spec(i).name; }
std::string state_key(const char* kind, const std::string& name) {
  return std::string("optimizer.") + kind + "." + name;
}

struct LocalTensor {
  std::string key;
  at::Tensor data;  // this rank's valid rows: a contiguous view of the live buffer (any device)
  int64_t row_start;
  std::vector<int64_t> shape;  // global
};

std::vector<LocalTensor> local_tensors(const PipelineStage& stage, ShardedAdamW& opt,
                                       bool stage_local) {
  std::vector<LocalTensor> out;
  const auto& units = opt.units();
  for (size_t k = 0; k < units.size(); ++k) {
    const FsdpUnit& u = *units[k];
    if (stage.is_embedding_copy(&u)) continue;  // stored once, by the first stage
    if (!u.main_replica()) continue;            // HSDP replicas are written once
    UnitOptimState& st = opt.state(k);
    for (int i = 0; i < u.num_params(); ++i) {
      const ShardSegment& seg = u.segment(i);
      if (seg.valid_rows == 0) continue;
      std::string name = model_key(u, i);
      if (stage_local) name = stage_local_name(name, stage.first_layer());
      auto rows = [&](const at::Tensor& flat) {
        std::vector<int64_t> shape = u.spec(i).shape;
        shape[0] = seg.valid_rows;
        return flat.narrow(0, seg.offset, seg.valid_numel()).view(shape);
      };
      out.push_back({name, rows(u.param_shard()), seg.row_start, u.spec(i).shape});
      const at::Tensor* states[] = {&st.master, &st.exp_avg, &st.exp_avg_sq};
      for (int s = 0; s < 3; ++s)
        out.push_back({state_key(kStateKinds[s], name), rows(*states[s]), seg.row_start,
                       u.spec(i).shape});
    }
  }
  // The routers' expert biases: replicated over the stage, written whole by one rank.
  if (stage.writes_router_biases())
    for (const auto& [key, b] : stage.router_biases()) {
      const std::string name = stage_local ? stage_local_name(key, stage.first_layer()) : key;
      out.push_back({name, b->bias, 0, {b->bias.size(0)}});
    }
  return out;
}

std::string rng_state_hex() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor s = gen.get_state();
  std::string hex;
  const uint8_t* p = s.data_ptr<uint8_t>();
  for (int64_t i = 0; i < s.numel(); ++i) hex += fmt::format("{:02x}", p[i]);
  return hex;
}

void restore_rng_state(const std::string& hex) {
  at::Tensor s = at::empty({static_cast<int64_t>(hex.size() / 2)}, at::kByte);
  uint8_t* p = s.data_ptr<uint8_t>();
  for (size_t i = 0; i < hex.size() / 2; ++i) p[i] = std::stoi(hex.substr(2 * i, 2), nullptr, 16);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(s);
}

Status write_text_file_synced(const std::string& path, const std::string& text) {
  {
    std::ofstream f(path, std::ios::trunc);
    f << text;
    f.flush();
    if (!f) return Status::error(fmt::format("{}: write failed", path));
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    return Status::error(fmt::format("{}: fsync failed", path));
  }
  ::close(fd);
  return Status::ok();
}

// Rank 0's part of the commit: coverage, metadata.json, rename, tracker.
Status commit(const SaveRequest& req, const std::vector<std::string>& chunk_lists,
              const std::vector<std::string>& rngs, const std::vector<std::string>& pgroups) {
  const std::string tmp = ckpt_tmp_dir(req.dir, req.iteration);
  const std::string final_dir = ckpt_iter_dir(req.dir, req.iteration);
  std::vector<CkptChunk> chunks;
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& list : chunk_lists) {
    for (const auto& cj : nlohmann::json::parse(list)) {
      CkptChunk c;
      if (Status s = ckpt_chunk_from_json(cj, &c); !s) return s;
      chunks.push_back(c);
    }
  }
  CkptIndex index;
  if (!req.debug_skip_coverage_check) {
    if (Status s = ckpt_build_index(chunks, &index); !s)
      return Status::error("save refused: " + s.message());
  }
  for (const auto& c : chunks) {
    auto& t = tensors[c.key];
    t["shape"] = c.shape;
    t["dtype"] = c.dtype;
    t["chunks"].push_back(ckpt_chunk_to_json(c));
  }
  nlohmann::json meta = req.meta;
  meta["format"] = kCheckpointFormat;
  meta["version"] = kCheckpointVersion;
  meta["iteration"] = req.iteration;
  meta["tensors"] = tensors;
  nlohmann::json rng = nlohmann::json::array();
  for (size_t r = 0; r < rngs.size(); ++r) rng.push_back({{"rank", r}, {"cpu_state", rngs[r]}});
  meta["rng"] = rng;
  nlohmann::json merged = nlohmann::json::object();
  for (const auto& g : pgroups) merged.update(nlohmann::json::parse(g));
  meta["optimizer"]["param_groups"] = merged;
  if (Status s = write_text_file_synced(tmp + "/metadata.json", meta.dump(1)); !s) return s;
  if (Status s = ckpt_fsync_dir(tmp); !s) return s;
  std::error_code ec;
  const std::string old = final_dir + ".old";
  if (fs::exists(final_dir)) {
    if (Status s = remove_tree(old); !s) return s;
    fs::rename(final_dir, old, ec);
    if (ec) return Status::error(fmt::format("{}: cannot move aside: {}", final_dir, ec.message()));
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) return Status::error(fmt::format("{}: rename to {} failed: {}", tmp, final_dir, ec.message()));
  if (Status s = ckpt_fsync_dir(req.dir); !s) return s;
  (void)remove_tree(old);  // the new iteration is committed; a leftover .old is harmless
  const std::string tracker = req.dir + "/" + kTrackerFile;
  if (Status s = write_text_file_synced(tracker + ".tmp", fmt::format("{}\n", req.iteration)); !s)
    return s;
  fs::rename(tracker + ".tmp", tracker, ec);
  if (ec) return Status::error(fmt::format("{}: rename failed: {}", tracker, ec.message()));
  return ckpt_fsync_dir(req.dir);
}

}  // namespace

// One save in flight (checkpoint.h): what phase 1 collected, phase 2 wrote, phase 3 commits.
struct CkptSave {
  SaveRequest req;
  int rank = 0;
  std::string tmp;                   // the temporary directory every rank writes into
  std::vector<LocalTensor> tensors;  // views of the live state, or of the snapshot buffer
  std::vector<std::string> rngs, pgroups;  // every rank's, gathered in phase 1
  Status written = Status::error("not written");
  nlohmann::json chunk_list = nlohmann::json::array();
};

void CkptSaveDeleter::operator()(CkptSave* s) const { delete s; }

namespace {

// Grows `snapshot` to hold every tensor (64-byte aligned pieces), pinned when any is on a GPU
// so that the device-to-host copies run at PCIe speed and asynchronously. Returns the device
// the tensors live on (CPU when all are on the host).
c10::Device reserve_snapshot(const std::vector<LocalTensor>& tensors, at::Tensor* snapshot) {
  int64_t total = 0;
  c10::Device device(c10::kCPU);
  for (const auto& t : tensors) {
    total += (t.data.numel() * t.data.element_size() + 63) / 64 * 64;
    if (!t.data.device().is_cpu()) device = t.data.device();
  }
  const bool pinned = !device.is_cpu();
  if (!snapshot->defined() || snapshot->numel() < total || (pinned && !snapshot->is_pinned()))
    *snapshot = at::empty({std::max<int64_t>(total, 1)},
                          at::TensorOptions().dtype(at::kByte).pinned_memory(pinned));
  return device;
}

}  // namespace

void ckpt_reserve_snapshot(const PipelineStage& stage, ShardedAdamW& opt, at::Tensor* snapshot) {
  at::NoGradGuard no_grad;
  (void)reserve_snapshot(local_tensors(stage, opt, false), snapshot);
}

CkptSavePtr ckpt_save_begin(const SaveRequest& req, const PipelineStage& stage, ShardedAdamW& opt,
                            const ProcessGroups& groups, at::Tensor* snapshot) {
  at::NoGradGuard no_grad;
  Communicator& world = groups.control();
  CkptSavePtr save(new CkptSave);
  save->req = req;
  save->rank = world.rank();
  save->tmp = ckpt_tmp_dir(req.dir, req.iteration);
  const std::string& tmp = save->tmp;

  Status st = Status::ok();
  if (save->rank == 0) {
    std::error_code ec;
    fs::create_directories(req.dir, ec);
    if (Status s = remove_tree(tmp); !s)
      st = Status::error(fmt::format("--save {}: {}", req.dir, s.message()));
    else if (!ec) fs::create_directory(tmp, ec);
    if (st && ec) st = Status::error(fmt::format("--save {}: cannot create {}: {}", req.dir, tmp, ec.message()));
  }
  if (Status s = agree(world, st); !s) fail("checkpoint save failed: {}", s.message());

  // Each unit's main replica writes it (dense and expert units have different replicate groups).
  save->tensors = local_tensors(stage, opt, req.debug_stage_local_names);
  if (snapshot) {
    // Copy every chunk into one host buffer (64-byte aligned pieces), pinned when any chunk is
    // on a GPU so the device-to-host copies run at PCIe speed and asynchronously.
    const c10::Device device = reserve_snapshot(save->tensors, snapshot);
    const bool on_device = !device.is_cpu();
    int64_t off = 0;
    for (auto& t : save->tensors) {
      const int64_t n = t.data.numel() * t.data.element_size();
      at::Tensor host =
          snapshot->narrow(0, off, n).view(t.data.scalar_type()).view(t.data.sizes());
      host.copy_(t.data, /*non_blocking=*/true);
      t.data = host;
      off += (n + 63) / 64 * 64;
    }
    if (on_device) device_synchronize(device);  // the copies are done before training goes on
  }
  save->rngs = all_gather_strings(world, rng_state_hex());
  save->pgroups = all_gather_strings(world, req.local_param_groups.dump());
  return save;
}

void ckpt_save_write(CkptSave& save, const std::atomic<bool>* cancel) {
  const SaveRequest& req = save.req;
  const int rank = save.rank;
  const std::vector<LocalTensor>& tensors = save.tensors;
  Status st = Status::ok();
  if (!tensors.empty()) {
    std::vector<SafetensorsWriteEntry> entries;
    const std::string file = ckpt_shard_file_name(rank);
    const std::string path = save.tmp + "/" + file;
    for (const auto& t : tensors) {
      SafetensorsWriteEntry e;
      e.name = fmt::format("{}@{}", t.key, t.row_start);
      e.dtype = ckpt_dtype_name(t.data.scalar_type());
      e.shape = t.data.sizes().vec();
      e.nbytes = static_cast<size_t>(t.data.numel()) * t.data.element_size();
      entries.push_back(e);
    }
    // The chunk list with each entry's checksum, fixed-width hex, so that the header can be
    // sized before the data is written and checksummed.
    auto chunks_with = [&](const std::vector<uint32_t>& crcs) {
      nlohmann::json list = nlohmann::json::array();
      for (size_t i = 0; i < tensors.size(); ++i) {
        const LocalTensor& t = tensors[i];
        CkptChunk c;
        c.key = t.key;
        c.file = file;
        c.entry = entries[i].name;
        c.dtype = entries[i].dtype;
        c.shape = t.shape;
        c.offsets.assign(t.shape.size(), 0);
        c.offsets[0] = t.row_start;
        c.lengths = entries[i].shape;
        c.crc32c = crcs[i];
        list.push_back(ckpt_chunk_to_json(c));
      }
      return list;
    };
    auto metadata = [&](const std::vector<uint32_t>& crcs) {
      return std::map<std::string, std::string>{{"format", kCheckpointFormat},
                                                {"version", std::to_string(kCheckpointVersion)},
                                                {"rank", std::to_string(rank)},
                                                {"chunks", chunks_with(crcs).dump()}};
    };
    // Blocks of host tensors are written from their memory; blocks of GPU tensors go through
    // one pinned staging buffer (D2H at PCIe speed, then checksum and write while hot).
    constexpr size_t kBlock = size_t{64} << 20;
    at::Tensor staging;
    const size_t middle = tensors.size() / 2;
    auto source = [&](size_t i, size_t off, size_t n, const void** out) -> Status {
      if (cancel && cancel->load()) return Status::error("abandoned (the job is ending)");
      if (i == middle && off == 0) {
        // Half of the file is written: the fault points of the crash and disk-full tests.
        fault_point("checkpoint.during_shard_write", rank, req.iteration);
        if (int err = fault_errno("checkpoint.shard_write", rank, req.iteration))
          return Status::error(
              fmt::format("injected write error (WEFT_FAULT): {}", std::strerror(err)));
      }
      const at::Tensor& t = tensors[i].data;
      if (t.device().is_cpu()) {
        *out = static_cast<const char*>(t.data_ptr()) + off;
        return Status::ok();
      }
      if (!staging.defined())
        staging = at::empty({static_cast<int64_t>(kBlock)},
                            at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      staging.narrow(0, 0, static_cast<int64_t>(n))
          .copy_(t.reshape({-1}).view(at::kByte).narrow(0, static_cast<int64_t>(off),
                                                        static_cast<int64_t>(n)));
      *out = staging.data_ptr();
      return Status::ok();
    };
    std::vector<uint32_t> crcs;
    try {
      st = safetensors_write_streamed(path, entries, source, metadata, kBlock, &crcs);
    } catch (const std::exception& e) {
      st = Status::error(fmt::format("{}: {}", path, e.what()));
    }
    if (st) save.chunk_list = chunks_with(crcs);
  }
  fault_point("checkpoint.after_shard_write", rank, req.iteration);
  save.written = st;
}

void ckpt_save_commit(CkptSave& save, const ProcessGroups& groups) {
  Communicator& world = groups.control();
  const int rank = save.rank;
  const Status& st = save.written;
  auto lists = all_gather_strings(world, save.chunk_list.dump());
  if (Status s = agree(world, st ? st : Status::error(fmt::format("rank {}: {}", rank, st.message())));
      !s) {
    if (rank == 0) (void)remove_tree(save.tmp);
    fail("checkpoint save failed, nothing was listed: {}", s.message());
  }
  fault_point("checkpoint.before_commit", rank, save.req.iteration);
  Status committed = rank == 0 ? commit(save.req, lists, save.rngs, save.pgroups) : Status::ok();
  if (Status s = agree(world, committed); !s) {
    if (rank == 0) (void)remove_tree(save.tmp);
    fail("checkpoint save failed, nothing was listed: {}", s.message());
  }
}

void ckpt_save(const SaveRequest& req, const PipelineStage& stage, ShardedAdamW& opt,
               const ProcessGroups& groups) {
  CkptSavePtr save = ckpt_save_begin(req, stage, opt, groups, nullptr);
  ckpt_save_write(*save);
  ckpt_save_commit(*save, groups);
}

int64_t ckpt_bytes_on_rank(const PipelineStage& stage, ShardedAdamW& opt) {
  int64_t bytes = 0;
  for (const LocalTensor& t : local_tensors(stage, opt, false))
    bytes += t.data.numel() * static_cast<int64_t>(t.data.element_size());
  return bytes;
}

Strictness ckpt_parse_strictness(const std::string& v) {
  if (v == "raise_all") return Strictness::kRaiseAll;
  if (v == "raise_unexpected") return Strictness::kRaiseUnexpected;
  if (v == "log_all" || v == "return_all") return Strictness::kLogAll;
  if (v == "log_unexpected" || v == "return_unexpected") return Strictness::kLogUnexpected;
  if (v == "assume_ok_unexpected") return Strictness::kAssumeOkUnexpected;
  if (v == "ignore_all") return Strictness::kIgnoreAll;
  fail_usage(
      "--dist-ckpt-strictness must be one of raise_all, raise_unexpected, log_all, "
      "log_unexpected, assume_ok_unexpected, ignore_all, return_all, return_unexpected "
      "(got '{}')",
      v);
}

std::vector<std::string> ckpt_expected_keys(const ModelConfig& cfg) {
  std::vector<std::string> keys;
  for (const ParamSpec& p : all_param_specs(cfg)) {
    const std::string& n = p.name;
    keys.push_back(n);
    for (const char* k : kStateKinds) keys.push_back(state_key(k, n));
  }
  // The routers' expert biases: model keys without optimizer state. Missing ones (a checkpoint
  // trained without --moe-router-enable-expert-bias) follow --dist-ckpt-strictness like any
  // model key; where it lets them pass they start at zero.
  for (const ParamSpec& b : router_bias_specs(cfg)) keys.push_back(b.name);
  std::sort(keys.begin(), keys.end());
  return keys;
}

namespace {

std::string first_keys(const std::vector<std::string>& keys) {
  std::vector<std::string> head(keys.begin(), keys.begin() + std::min<size_t>(keys.size(), 5));
  return fmt::format("{}{}", fmt::join(head, ", "), keys.size() > 5 ? ", ..." : "");
}

// Local checks every rank makes identically (no collective): key sets and shapes.
// With `weights_only` (--finetune) the optimizer keys are neither expected nor unexpected.
void check_keys(const std::string& dir, const CkptIndex& index, const ModelConfig& cfg,
                Strictness strict, bool rank0, bool weights_only) {
  const auto expected = ckpt_expected_keys(cfg);
  std::vector<std::string> missing, unexpected;
  std::set<std::string> exp(expected.begin(), expected.end());
  auto is_opt = [](const std::string& k) { return k.rfind("optimizer.", 0) == 0; };
  for (const auto& k : expected)
    if (!index.count(k) && !(weights_only && is_opt(k))) missing.push_back(k);
  for (const auto& [k, t] : index)
    if (!exp.count(k) && !(weights_only && is_opt(k))) unexpected.push_back(k);
  // `missing` (the model's keys the checkpoint lacks) is Megatron's "unexpected", and
  // `unexpected` (checkpoint keys nothing loads) Megatron's "missing" (checkpoint.h).
  const bool raise_missing = strict == Strictness::kRaiseAll ||
                             strict == Strictness::kRaiseUnexpected ||
                             strict == Strictness::kAssumeOkUnexpected;
  const bool raise_unexpected = strict == Strictness::kRaiseAll;
  const bool log_missing = strict == Strictness::kLogAll || strict == Strictness::kLogUnexpected;
  const bool log_unexpected = strict == Strictness::kLogAll;
  if (!missing.empty() && raise_missing)
    fail_usage("checkpoint {}: {} key(s) the model expects are not in it: {} (a checkpoint of a "
               "different model? --dist-ckpt-strictness log_unexpected loads the rest and leaves "
               "these at their initial values)",
               dir, missing.size(), first_keys(missing));
  if (!unexpected.empty() && raise_unexpected)
    fail_usage("checkpoint {}: {} key(s) that nothing in this model loads: {} (a checkpoint of a "
               "different model? --dist-ckpt-strictness assume_ok_unexpected, the default, "
               "leaves them unused)",
               dir, unexpected.size(), first_keys(unexpected));
  if (rank0 && !missing.empty() && log_missing)
    fmt::print(stderr,
               "weft: warning: checkpoint {}: {} key(s) the model expects are not in it, left at "
               "their initial values: {}\n",
               dir, missing.size(), first_keys(missing));
  if (rank0 && !unexpected.empty() && log_unexpected)
    fmt::print(stderr, "weft: warning: checkpoint {}: {} key(s) that nothing loads, left unused: {}\n",
               dir, unexpected.size(), first_keys(unexpected));
}

// Reads in flight at once while loading (each a pread of one chunk and its CRC-32C): enough
// queue depth for an NVMe device and the checksums of several chunks on several cores.
// WEFT_CKPT_LOAD_THREADS overrides it (1: one read at a time; for measurements).
int load_threads() {
  const char* v = std::getenv("WEFT_CKPT_LOAD_THREADS");
  const int n = v ? std::atoi(v) : 4;
  return n >= 1 ? n : 4;
}

// The chunk of `t` that is exactly rows [row_start, row_start + rows) in `dtype` (the same
// layout saved it), or null.
const CkptChunk* exact_chunk(const CkptTensorInfo& t, int64_t row_start, int64_t rows,
                             c10::ScalarType dtype) {
  for (const CkptChunk& c : t.chunks)
    if (c.offsets[0] == row_start && c.lengths[0] == rows && ckpt_torch_dtype(c.dtype) == dtype)
      return &c;
  return nullptr;
}

// Copies rows [row_start, row_start + rows) of `t` into `dst` ([rows, ...] view of a live
// host buffer), reading every overlapping chunk (checksum verified). With `deferred`, a chunk
// that is exactly these rows is not read now but queued for CkptFileCache::read_chunks.
Status load_rows(const CkptTensorInfo& t, int64_t row_start, int64_t rows, at::Tensor dst,
                 CkptFileCache& files, std::vector<CkptFileCache::Read>* deferred = nullptr) {
  // Same layout: read straight into the live buffer (no temporary, which on a fresh page costs
  // more than the read itself).
  if (dst.is_cpu() && dst.is_contiguous())
    if (const CkptChunk* c = exact_chunk(t, row_start, rows, dst.scalar_type())) {
      if (!deferred) return files.read_chunk(*c, dst.data_ptr());
      deferred->push_back({*c, dst.data_ptr()});
      return Status::ok();
    }
  const int64_t end = row_start + rows;
  for (const CkptChunk& c : t.chunks) {
    const int64_t c0 = c.offsets[0], c1 = c0 + c.lengths[0];
    const int64_t lo = std::max(row_start, c0), hi = std::min(end, c1);
    if (lo >= hi) continue;
    at::Tensor buf = at::empty(c.lengths, at::TensorOptions().dtype(ckpt_torch_dtype(c.dtype)));
    if (Status s = files.read_chunk(c, buf.data_ptr()); !s) return s;
    dst.narrow(0, lo - row_start, hi - lo).copy_(buf.narrow(0, lo - c0, hi - lo));
  }
  return Status::ok();
}

// Pinned bytes per staging buffer (two alternate) for device destinations: the largest shard
// of the 0.8B model (the fp32 output layer, 262 MB) fits; smaller states get smaller buffers.
constexpr int64_t kDeviceStageBytes = int64_t{512} << 20;

}  // namespace

int ckpt_load_iteration(const std::string& dir, int step) {
  if (step >= 0) return step;
  if (!fs::exists(dir + "/" + kTrackerFile)) return -1;
  int iteration = -1;
  if (Status s = ckpt_read_tracker(dir, &iteration); !s) fail_usage("--load: {}", s.message());
  return iteration;
}

nlohmann::json ckpt_load(const LoadRequest& req, PipelineStage& stage, ShardedAdamW& opt,
                         const ProcessGroups& groups) {
  at::NoGradGuard no_grad;
  Communicator& world = groups.control();
  const bool rank0 = world.rank() == 0;
  const int iteration = ckpt_load_iteration(req.dir, req.step);
  if (iteration < 0) {
    if (rank0)
      fmt::print(stderr, "weft: warning: --load {}: no {} found; starting from scratch\n",
                 req.dir, kTrackerFile);
    return nlohmann::json();
  }
  const std::string dir = ckpt_iter_dir(req.dir, iteration);
  nlohmann::json meta;
  CkptIndex index;
  if (Status s = ckpt_read_metadata(dir, &meta, &index); !s)
    fail_usage("--load {} (iteration {}): {}", req.dir, iteration, s.message());
  if (req.check_metadata) req.check_metadata(meta);
  const ModelConfig& cfg = stage.model_config();
  const bool weights_only = req.finetune || req.no_load_optim;
  if (!weights_only) {
    bool has_optimizer_state = false;
    for (const auto& [k, t] : index) has_optimizer_state |= k.rfind("optimizer.", 0) == 0;
    if (!has_optimizer_state)
      fail_usage("--load {}: checkpoint {} holds model weights only (no optimizer state, e.g. "
                 "written by `weft ckpt import`); load it with --finetune (or --no-load-optim)",
                 req.dir, dir);
  }
  check_keys(dir, index, cfg, req.strictness, rank0, weights_only);

  // Shapes of every key this model expects and the checkpoint has.
  auto check_shape = [&](const std::string& key, const std::vector<int64_t>& shape) {
    auto it = index.find(key);
    if (it != index.end() && it->second.shape != shape)
      fail_usage("checkpoint {}: key '{}' has shape [{}], the model expects [{}] (a checkpoint of "
                 "a different model?)",
                 dir, key, fmt::join(it->second.shape, ","), fmt::join(shape, ","));
  };
  for (FsdpUnit* u : opt.units())
    for (int i = 0; i < u->num_params(); ++i) {
      check_shape(model_key(*u, i), u->spec(i).shape);
      for (const char* k : kStateKinds) check_shape(state_key(k, model_key(*u, i)), u->spec(i).shape);
    }
  for (const auto& [key, b] : stage.router_biases()) check_shape(key, {b->bias.size(0)});

  // Copy rows in place.
  Status st = Status::ok();
  at::Tensor staging;  // pinned host bytes for device destinations of another layout
  CkptFileCache files(dir);
  int64_t device_bytes = 0;  // an upper bound of what this rank loads into device tensors
  for (FsdpUnit* u : opt.units())
    if (!u->param_shard().is_cpu())
      device_bytes += u->param_shard().numel() * u->param_shard().element_size();
  if (device_bytes > 0) device_bytes += opt.state_bytes();
  DeviceLoadStager stager(std::min(kDeviceStageBytes, device_bytes));
  // Same-layout chunks are queued and read load_threads() at a time, those of device
  // destinations into the stager's pinned buffer, whose copies to the device run while the
  // next batch reads (flush() before anything reads a destination, and at the end).
  std::vector<CkptFileCache::Read> deferred;
  auto flush = [&] {
    if (st && !deferred.empty()) st = files.read_chunks(std::move(deferred), load_threads());
    deferred.clear();
    if (st) stager.issue();
  };
  const auto& units = opt.units();
  try {
    for (size_t k = 0; k < units.size() && st; ++k) {
      FsdpUnit& u = *units[k];
      UnitOptimState& state = opt.state(k);
      for (int i = 0; i < u.num_params() && st; ++i) {
        const ShardSegment& seg = u.segment(i);
        if (seg.valid_rows == 0) continue;
        std::vector<int64_t> shape = u.spec(i).shape;
        shape[0] = seg.valid_rows;
        auto view = [&](const at::Tensor& flat) {
          return flat.narrow(0, seg.offset, seg.valid_numel()).view(shape);
        };
        const std::string name = model_key(u, i);
        // Another layout's rows on a device: through one grow-only pinned buffer, one read at
        // a time (no fresh pages per chunk; the host-to-device copy runs at PCIe speed).
        auto load_device_serial = [&](const CkptTensorInfo& t, const at::Tensor& dst) {
          const int64_t nbytes = dst.numel() * dst.element_size();
          if (!staging.defined() || staging.numel() < nbytes)
            staging = at::empty({nbytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
          at::Tensor host = staging.narrow(0, 0, nbytes).view(dst.scalar_type()).view(shape);
          st = load_rows(t, seg.row_start, seg.valid_rows, host, files);
          if (st) dst.copy_(host);
        };
        auto load = [&](const std::string& key, const at::Tensor& flat) {
          auto it = index.find(key);
          if (it == index.end()) return false;
          at::Tensor dst = view(flat);
          if (dst.device().is_cpu()) {
            st = load_rows(it->second, seg.row_start, seg.valid_rows, dst, files, &deferred);
            return true;
          }
          const CkptChunk* c = exact_chunk(it->second, seg.row_start, seg.valid_rows, dst.scalar_type());
          void* p = c && dst.is_contiguous() ? stager.reserve(dst) : nullptr;
          if (c && dst.is_contiguous() && !p && stager.can_hold(dst)) {  // full: read it, retry
            flush();
            if (st) p = stager.reserve(dst);
          }
          if (p)
            deferred.push_back({*c, p});
          else if (st)
            load_device_serial(it->second, dst);
          return true;
        };
        if (weights_only) {
          // Weights only: with --finetune the master from the stored master, else from the
          // model tensor (any dtype, converted); with --no-load-optim from the model tensor, as
          // Megatron's reload_model_params rebuilds its main params from the (bf16) model. The
          // compute copy follows the master as after an optimizer step.
          const bool from_master = req.finetune || !index.count(name);
          if (!(from_master && load(state_key("fp32_param", name), state.master)) && st)
            load(name, state.master);
          flush();
          if (st && !u.param_shard().is_same(state.master))
            view(u.param_shard()).copy_(view(state.master));
          continue;
        }
        const bool has_master = load(state_key("fp32_param", name), state.master);
        if (st && !u.param_shard().is_same(state.master)) {
          if (!load(name, u.param_shard()) && has_master) {
            flush();
            if (st) view(u.param_shard()).copy_(view(state.master));
          }
        } else if (st && !has_master) {
          load(name, u.param_shard());
        }
        if (st) load(state_key("exp_avg", name), state.exp_avg);
        // WEFT_FAULT=checkpoint.skip_exp_avg_sq:<rank>:<iteration>:error plants a broken restore
        // (the second moments stay fresh) for tests of `weft verify-resume`.
        if (st && !fault_error("checkpoint.skip_exp_avg_sq", world.rank(), iteration))
          load(state_key("exp_avg_sq", name), state.exp_avg_sq);
      }
    }
    flush();
    stager.finish();
    // The routers' expert biases, whole, on every rank of the stage (also with --finetune).
    for (const auto& [key, b] : stage.router_biases()) {
      auto it = index.find(key);
      if (!st || it == index.end()) continue;
      at::Tensor host = at::empty({b->bias.size(0)}, at::kFloat);
      st = load_rows(it->second, 0, host.size(0), host, files);
      if (st) b->bias.copy_(host);
    }
  } catch (const std::exception& e) {
    st = Status::error(e.what());
  }
  if (Status s = agree(world, st ? st : Status::error(fmt::format("rank {}: {}", world.rank(), st.message())));
      !s)
    fail("--load {} failed: {}", req.dir, s.message());

  if (!weights_only && meta.contains("optimizer"))  // else a fresh optimizer at step 0
    opt.set_steps(meta["optimizer"].value("steps", int64_t{0}));
  // RNG streams belong to ranks; restore them only on the layout that saved them.
  if (!req.finetune && !req.no_load_rng && !req.layout.is_null() &&
      meta.value("layout", nlohmann::json()) == req.layout && meta.contains("rng")) {
    for (const auto& r : meta["rng"])
      if (r.value("rank", -1) == world.rank()) restore_rng_state(r.value("cpu_state", ""));
  }
  return meta;
}

}  // namespace weft
