// The on-disk format of docs/checkpoint-format.md, without any knowledge of ranks: paths,
// the chunk index in metadata.json, the coverage check (invariant 2), and reading one chunk
// with its checksum verified. Used by the distributed save/load and by `weft ckpt`.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/checkpoint/safetensors.h"
#include "weft/core/status.h"

namespace weft {

inline constexpr int kCheckpointVersion = 1;
inline constexpr const char* kCheckpointFormat = "weft-checkpoint";
inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";

std::string ckpt_iter_dir_name(int iteration);             // "iter_0000002"
std::string ckpt_iter_dir(const std::string& save, int iteration);
std::string ckpt_tmp_dir(const std::string& save, int iteration);  // ".iter_0000002.tmp"
std::string ckpt_shard_file_name(int rank);                // "shard_00002.safetensors"

// One chunk of a global tensor: a box (offsets, lengths) stored as one safetensors entry.
struct CkptChunk {
  std::string key, file, entry, dtype;
  std::vector<int64_t> shape;    // the key's global shape
  std::vector<int64_t> offsets;  // per dim
  std::vector<int64_t> lengths;  // per dim
  uint32_t crc32c = 0;
  int64_t nbytes() const;
};
nlohmann::json ckpt_chunk_to_json(const CkptChunk& c);
Status ckpt_chunk_from_json(const nlohmann::json& j, CkptChunk* out);

struct CkptTensorInfo {
  std::vector<int64_t> shape;
  std::string dtype;
  std::vector<CkptChunk> chunks;  // sorted by offsets[0]
};
using CkptIndex = std::map<std::string, CkptTensorInfo>;

// Builds the index from chunks and checks that every key's chunks agree on shape and dtype
// and tile the tensor exactly once along dim 0 (no gap, no overlap). On overlap the message
// names both files: the sign of two ranks writing one name (stage-local names).
Status ckpt_build_index(const std::vector<CkptChunk>& chunks, CkptIndex* out);

// Reads the iteration from the tracker; Status error when missing or unparsable.
Status ckpt_read_tracker(const std::string& save, int* iteration);

// Reads and checks metadata.json of a checkpoint directory (format, version) and its index.
Status ckpt_read_metadata(const std::string& dir, nlohmann::json* meta, CkptIndex* index);

// Caches parsed safetensors headers by file, so a load parses each shard file once.
class CkptFileCache {
 public:
  explicit CkptFileCache(std::string dir) : dir_(std::move(dir)) {}
  // Reads chunk `c` into dst (c.nbytes() bytes) and verifies its CRC-32C.
  Status read_chunk(const CkptChunk& c, void* dst);
  // Reads many chunks, each into its own destination, with up to `threads` reads (and their
  // checksums) in flight at once, in file order; the first error (in `reads` order) is returned.
  // Destinations must not overlap. Thread-safe against nothing else on this cache.
  struct Read {
    CkptChunk chunk;
    void* dst = nullptr;
  };
  Status read_chunks(std::vector<Read> reads, int threads);

 private:
  Status header_of(const CkptChunk& c, const SafetensorsHeader** out);
  // read_chunk once the header is cached; const, so several threads may call it.
  Status read_cached(const CkptChunk& c, const SafetensorsHeader& h, void* dst) const;
  std::string dir_;
  std::map<std::string, SafetensorsHeader> headers_;
};

// fsyncs a directory (after a rename or file creation inside it).
Status ckpt_fsync_dir(const std::string& dir);

}  // namespace weft
