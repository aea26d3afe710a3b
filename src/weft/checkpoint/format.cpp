// Checkpoint format helpers (see format.h and docs/checkpoint-format.md).
#include "weft/checkpoint/format.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "weft/checkpoint/crc32c.h"

namespace weft {

std::string ckpt_iter_dir_name(int iteration) { return fmt::format("iter_{:07d}", iteration); }
std::string ckpt_iter_dir(const std::string& save, int iteration) {
  return save + "/" + ckpt_iter_dir_name(iteration);
}
std::string ckpt_tmp_dir(const std::string& save, int iteration) {
  return save + "/." + ckpt_iter_dir_name(iteration) + ".tmp";
}
std::string ckpt_shard_file_name(int rank) { return fmt::format("shard_{:05d}.safetensors", rank); }

int64_t CkptChunk::nbytes() const {
  int64_t n = static_cast<int64_t>(safetensors_dtype_size(dtype));
  for (int64_t l : lengths) n *= l;
  return n;
}

nlohmann::json ckpt_chunk_to_json(const CkptChunk& c) {
  return {{"key", c.key},         {"file", c.file},       {"entry", c.entry},
          {"dtype", c.dtype},     {"shape", c.shape},     {"offsets", c.offsets},
          {"lengths", c.lengths}, {"crc32c", fmt::format("{:08x}", c.crc32c)}};
}

Status ckpt_chunk_from_json(const nlohmann::json& j, CkptChunk* c) {
  try {
    c->key = j.at("key").get<std::string>();
    c->file = j.at("file").get<std::string>();
    c->entry = j.at("entry").get<std::string>();
    c->dtype = j.at("dtype").get<std::string>();
    c->shape = j.at("shape").get<std::vector<int64_t>>();
    c->offsets = j.at("offsets").get<std::vector<int64_t>>();
    c->lengths = j.at("lengths").get<std::vector<int64_t>>();
    c->crc32c = static_cast<uint32_t>(std::stoul(j.at("crc32c").get<std::string>(), nullptr, 16));
  } catch (const std::exception& e) {
    return Status::error(fmt::format("malformed chunk entry {}: {}", j.dump(), e.what()));
  }
  if (c->shape.empty() || c->offsets.size() != c->shape.size() ||
      c->lengths.size() != c->shape.size() || safetensors_dtype_size(c->dtype) == 0)
    return Status::error(fmt::format("malformed chunk entry for key '{}'", c->key));
  for (size_t d = 0; d < c->shape.size(); ++d)
    if (c->offsets[d] < 0 || c->lengths[d] < 0 || c->offsets[d] + c->lengths[d] > c->shape[d] ||
        (d > 0 && (c->offsets[d] != 0 || c->lengths[d] != c->shape[d])))
      return Status::error(fmt::format("key '{}': chunk box out of range in {}", c->key, c->file));
  return Status::ok();
}

Status ckpt_build_index(const std::vector<CkptChunk>& chunks, CkptIndex* out) {
  out->clear();
  for (const auto& c : chunks) {
    auto [it, fresh] = out->try_emplace(c.key);
    CkptTensorInfo& t = it->second;
    if (fresh) {
      t.shape = c.shape;
      t.dtype = c.dtype;
    } else if (t.shape != c.shape || t.dtype != c.dtype) {
      return Status::error(fmt::format(
          "key '{}': chunks disagree on the global shape or dtype ({} has [{}] {}, another "
          "chunk [{}] {}); two different tensors were saved under one name",
          c.key, c.file, fmt::join(c.shape, ","), c.dtype, fmt::join(t.shape, ","), t.dtype));
    }
    t.chunks.push_back(c);
  }
  for (auto& [key, t] : *out) {
    std::sort(t.chunks.begin(), t.chunks.end(),
              [](const CkptChunk& a, const CkptChunk& b) { return a.offsets[0] < b.offsets[0]; });
    int64_t next = 0;
    const CkptChunk* prev = nullptr;
    for (const auto& c : t.chunks) {
      if (c.offsets[0] < next)
        return Status::error(fmt::format(
            "key '{}': rows [{}, {}) of {} overlap rows [{}, {}) of {}: two ranks wrote the same "
            "global name (are pipeline layers saved under stage-local names?)",
            key, c.offsets[0], c.offsets[0] + c.lengths[0], c.file, prev->offsets[0], next,
            prev->file));
      if (c.offsets[0] > next)
        return Status::error(fmt::format("key '{}': rows [{}, {}) are in no chunk", key, next,
                                         c.offsets[0]));
      next = c.offsets[0] + c.lengths[0];
      prev = &c;
    }
    if (next != t.shape[0])
      return Status::error(
          fmt::format("key '{}': rows [{}, {}) are in no chunk", key, next, t.shape[0]));
  }
  return Status::ok();
}

Status ckpt_read_tracker(const std::string& save, int* iteration) {
  const std::string path = save + "/" + kTrackerFile;
  std::ifstream f(path);
  if (!f) return Status::error(fmt::format("{}: not found", path));
  std::string text;
  std::getline(f, text);
  try {
    size_t used = 0;
    *iteration = std::stoi(text, &used);
    if (used != text.size() || *iteration < 0) throw std::invalid_argument("trailing text");
  } catch (const std::exception&) {
    return Status::error(fmt::format("{}: expected an iteration number, found '{}'", path, text));
  }
  return Status::ok();
}

Status ckpt_read_metadata(const std::string& dir, nlohmann::json* meta, CkptIndex* index) {
  const std::string path = dir + "/metadata.json";
  std::ifstream f(path);
  if (!f)
    return Status::error(fmt::format("{}: not found (an incomplete or missing checkpoint)", path));
  try {
    *meta = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    return Status::error(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  if (meta->value("format", "") != kCheckpointFormat)
    return Status::error(fmt::format("{}: not a weft checkpoint (format '{}')", path,
                                     meta->value("format", "")));
  if (meta->value("version", -1) != kCheckpointVersion)
    return Status::error(fmt::format("{}: format version {} is not supported (this weft reads {})",
                                     path, meta->value("version", -1), kCheckpointVersion));
  std::vector<CkptChunk> chunks;
  if (!meta->contains("tensors") || !(*meta)["tensors"].is_object())
    return Status::error(fmt::format("{}: no tensor index", path));
  for (const auto& [key, t] : (*meta)["tensors"].items()) {
    for (const auto& cj : t.value("chunks", nlohmann::json::array())) {
      CkptChunk c;
      if (Status s = ckpt_chunk_from_json(cj, &c); !s) return Status::error(path + ": " + s.message());
      if (c.key != key)
        return Status::error(fmt::format("{}: chunk of '{}' listed under '{}'", path, c.key, key));
      chunks.push_back(std::move(c));
    }
  }
  if (Status s = ckpt_build_index(chunks, index); !s) return Status::error(path + ": " + s.message());
  // Each key's own shape and dtype must be its chunks' (the load compares the model's shapes
  // with the chunks'; a key whose recorded shape says otherwise is a damaged index).
  for (const auto& [key, t] : (*meta)["tensors"].items()) {
    auto it = index->find(key);
    if (it == index->end())
      return Status::error(fmt::format("{}: key '{}' has no chunk", path, key));
    try {
      if (t.contains("shape") && t.at("shape").get<std::vector<int64_t>>() != it->second.shape)
        return Status::error(fmt::format("{}: key '{}' records shape {} but its chunks are of "
                                         "shape [{}]", path, key, t.at("shape").dump(),
                                         fmt::join(it->second.shape, ",")));
      if (t.contains("dtype") && t.at("dtype").get<std::string>() != it->second.dtype)
        return Status::error(fmt::format("{}: key '{}' records dtype {} but its chunks are {}",
                                         path, key, t.at("dtype").dump(), it->second.dtype));
    } catch (const nlohmann::json::exception& e) {
      return Status::error(fmt::format("{}: key '{}': malformed shape or dtype ({})", path, key,
                                       e.what()));
    }
  }
  return Status::ok();
}

Status CkptFileCache::header_of(const CkptChunk& c, const SafetensorsHeader** out) {
  auto it = headers_.find(c.file);
  if (it == headers_.end()) {
    SafetensorsHeader h;
    if (Status s = safetensors_read_header(dir_ + "/" + c.file, &h); !s) return s;
    it = headers_.emplace(c.file, std::move(h)).first;
  }
  *out = &it->second;
  return Status::ok();
}

Status CkptFileCache::read_cached(const CkptChunk& c, const SafetensorsHeader& h, void* dst) const {
  const std::string path = dir_ + "/" + c.file;
  auto e = h.entries.find(c.entry);
  if (e == h.entries.end())
    return Status::error(fmt::format("{}: no entry '{}' for key '{}'", path, c.entry, c.key));
  if (e->second.dtype != c.dtype || static_cast<int64_t>(e->second.end - e->second.begin) != c.nbytes())
    return Status::error(fmt::format("{}: entry '{}' does not match the index (dtype or size)",
                                     path, c.entry));
  if (Status s = safetensors_read_entry(path, h, c.entry, dst, c.nbytes()); !s) return s;
  const uint32_t crc = crc32c(dst, static_cast<size_t>(c.nbytes()));
  if (crc != c.crc32c)
    return Status::error(fmt::format("{}: checksum mismatch for key '{}' (entry '{}'): stored "
                                     "{:08x}, computed {:08x}; the file is corrupted",
                                     path, c.key, c.entry, c.crc32c, crc));
  return Status::ok();
}

Status CkptFileCache::read_chunk(const CkptChunk& c, void* dst) {
  const SafetensorsHeader* h = nullptr;
  if (Status s = header_of(c, &h); !s) return s;
  return read_cached(c, *h, dst);
}

Status CkptFileCache::read_chunks(std::vector<Read> reads, int threads) {
  std::vector<const SafetensorsHeader*> hs(reads.size());
  for (size_t i = 0; i < reads.size(); ++i)
    if (Status s = header_of(reads[i].chunk, &hs[i]); !s) return s;
  // File order: the threads walk each file front to back together (queue depth `threads`).
  std::vector<size_t> order(reads.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto begin_of = [&](size_t i) {
    auto e = hs[i]->entries.find(reads[i].chunk.entry);
    return e == hs[i]->entries.end() ? uint64_t{0} : e->second.begin;
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (reads[a].chunk.file != reads[b].chunk.file) return reads[a].chunk.file < reads[b].chunk.file;
    return begin_of(a) < begin_of(b);
  });
  std::vector<Status> results(reads.size(), Status::ok());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();) {
      const size_t i = order[k];
      results[i] = read_cached(reads[i].chunk, *hs[i], reads[i].dst);
    }
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(reads.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (const Status& s : results)
    if (!s) return s;
  return Status::ok();
}

Status ckpt_fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::error(fmt::format("{}: cannot open ({})", dir, std::strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::error(fmt::format("{}: fsync failed ({})", dir, std::strerror(err)));
  return Status::ok();
}

}  // namespace weft
