// Distributed save and load of a training state under global names (invariants 1-4, 9).
//
// Save is collective over the job's world: every rank writes its chunks (model tensors in
// compute dtype, float32 master, both moments) into a temporary directory and fsyncs; rank 0
// checks coverage, writes metadata.json last, renames the directory and then replaces the
// tracker atomically (docs/checkpoint-format.md). Only replicate-rank-0 ranks write (HSDP
// replicas are deduplicated) and the last stage's tied embedding copy is not written.
//
// Load reads the index, checks coverage, shapes and the key sets (strictness), and then every
// rank copies the rows of its shards from whichever chunks overlap them (a box intersection),
// in place into the live buffers, so the tensors the optimizer holds stay the same objects.
// Any layout loads any checkpoint. Every rank agrees on success before returning, so a bad
// chunk on one rank makes every rank fail with that rank's message instead of a hang.
#pragma once

#include <nlohmann/json.hpp>
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "weft/comm/communicator.h"
#include "weft/comm/process_groups.h"
#include "weft/optim/adamw.h"
#include "weft/parallel/pipeline_stage.h"

namespace weft {

struct SaveRequest {
  std::string dir;           // --save
  int iteration = 0;
  nlohmann::json meta;       // config, layout, counters, lr scheduler, data position
  // This rank's optimizer parameter-group settings keyed by global name; the union over all
  // ranks is stored as meta["optimizer"]["param_groups"].
  nlohmann::json local_param_groups = nlohmann::json::object();
  // Test hooks: write layer keys under stage-local numbers, and skip the coverage check, to
  // produce the colliding checkpoints that other systems write.
  bool debug_stage_local_names = false;
  bool debug_skip_coverage_check = false;
};

// Collective. Throws weft::Error (same message on every rank) when any rank fails; then
// nothing new is listed and the previous checkpoint stays the latest.
void ckpt_save(const SaveRequest& req, const PipelineStage& stage, ShardedAdamW& opt,
               const ProcessGroups& groups);

// A save in three phases, so that --async-save (async_save.h) can run the middle one on a
// background thread; ckpt_save runs all three back to back on the calling thread, and
// both produce the same files byte for byte.
struct CkptSave;  // one save in flight; defined in checkpoint.cpp
struct CkptSaveDeleter {
  void operator()(CkptSave* s) const;
};
using CkptSavePtr = std::unique_ptr<CkptSave, CkptSaveDeleter>;

// Allocates *snapshot (see ckpt_save_begin) at the size this rank's state needs, so that the
// first asynchronous save does not stall on it (pinning 11 GB took 11.7 s on the H200). Local.
void ckpt_reserve_snapshot(const PipelineStage& stage, ShardedAdamW& opt, at::Tensor* snapshot);

// Phase 1. Collective over groups.control(), training thread: rank 0 recreates the temporary
// directory; every rank collects its chunks and the RNG streams and parameter groups of every
// rank. Without `snapshot` the chunks are views of the live state (training must not step
// before phase 2 ends); with it they are copied into *snapshot (one byte buffer, grown as
// needed, pinned when the state is on a GPU; it must stay untouched until phase 2 ends), so
// training may go on at once. Throws weft::Error (same on every rank) when the directory fails.
CkptSavePtr ckpt_save_begin(const SaveRequest& req, const PipelineStage& stage, ShardedAdamW& opt,
                            const ProcessGroups& groups, at::Tensor* snapshot);
// Phase 2. Local (no collective; any one thread): writes, checksums and fsyncs this rank's
// shard file into the temporary directory and keeps the result for phase 3; never throws. When
// *cancel turns true it stops early with an error (the save is then abandoned, never listed).
void ckpt_save_write(CkptSave& save, const std::atomic<bool>* cancel = nullptr);
// Phase 3. Collective over groups.control(), training thread, after phase 2 on every rank:
// agrees on every rank's result; rank 0 commits (coverage, metadata.json, rename, tracker).
// Throws like ckpt_save; the temporary directory is then removed.
void ckpt_save_commit(CkptSave& save, const ProcessGroups& groups);
// Bytes of tensor data this rank writes into one checkpoint: exactly what ckpt_save
// writes (the main replica's shards of the model tensors in compute dtype, the float32 master
// and both moments in their dtypes; the tied copy on the last stage not). Safetensors headers
// and metadata.json are not counted. Local.
int64_t ckpt_bytes_on_rank(const PipelineStage& stage, ShardedAdamW& opt);

// Megatron's --dist-ckpt-strictness values, with Megatron's words: an "unexpected" key is one the
// model asks for that the checkpoint lacks, a "missing" key one the checkpoint has that the
// model does not load (the reverse of PyTorch's load_state_dict words). A model key that is not
// loaded keeps its initial value; a checkpoint key that is not used is left on disk.
enum class Strictness {
  kRaiseAll,            // both are errors
  kRaiseUnexpected,     // model keys absent from the checkpoint are errors; unused ones ignored
  kLogAll,              // both logged (rank 0, stderr); also return_all
  kLogUnexpected,       // model keys absent from the checkpoint logged; unused ones ignored;
                        // also return_unexpected
  kAssumeOkUnexpected,  // Megatron's and weft's default: as raise_unexpected (Megatron relies on
                        // its reader to fail on an absent key; weft names it first)
  kIgnoreAll,           // both ignored
};
// Parses a --dist-ckpt-strictness value (also accepts return_all / return_unexpected, which
// behave as log_all / log_unexpected: a command line has no caller to return keys to); throws
// UsageError naming the flag.
Strictness ckpt_parse_strictness(const std::string& value);

struct LoadRequest {
  std::string dir;          // --load
  int step = -1;            // --ckpt-step (-1: the tracker's latest)
  Strictness strictness = Strictness::kAssumeOkUnexpected;
  nlohmann::json layout;    // the current layout, as saved in metadata["layout"]: per-rank RNG
                            // streams are restored only when it equals the saved one
  // --finetune: model weights only (the float32 master when stored, else the model tensor),
  // into both the weights and the master; optimizer keys are neither expected nor read,
  // moments and step count stay fresh, no RNG stream is restored. Without it, a checkpoint
  // holding no optimizer state (`weft ckpt import`) is refused naming --finetune.
  bool finetune = false;
  // --no-load-optim: the model tensors (not the float32 masters, as Megatron) into weights and
  // masters, the moments and step count fresh (the caller keeps the iteration and data
  // position); --no-load-rng: no RNG stream restored.
  bool no_load_optim = false;
  bool no_load_rng = false;
  // Called on every rank with the checkpoint's metadata.json once it is read, before any tensor
  // is: the caller refuses a checkpoint of another model there (throwing on every rank alike).
  std::function<void(const nlohmann::json& meta)> check_metadata;
};

// The iteration `--load dir [--ckpt-step step]` names: `step` when >= 0, else the tracker's
// latest; -1 when step < 0 and `dir` has no tracker file. Throws UsageError naming --load on an
// unreadable tracker.
int ckpt_load_iteration(const std::string& dir, int step);

// Collective. Returns the checkpoint's metadata.json, or null JSON when `dir` has no tracker
// and no step was asked for (nothing to load: training starts from scratch). Throws
// UsageError/Error with the same message on every rank otherwise.
nlohmann::json ckpt_load(const LoadRequest& req, PipelineStage& stage, ShardedAdamW& opt,
                         const ProcessGroups& groups);

// Seeds the process's CPU generator, the one whose state every checkpoint saves and restores
// per rank, as Megatron's _set_random_seed: --seed + 100 x the pipeline stage. Unseeded, its
// state (hence metadata.json) would differ between two runs of the same command.
void ckpt_seed_rng(uint64_t seed);

// Safetensors dtype names ("F32", "BF16", ...) of ATen dtypes and back; throw for dtypes a
// checkpoint cannot hold.
std::string ckpt_dtype_name(c10::ScalarType t);
c10::ScalarType ckpt_torch_dtype(const std::string& name);

// Every global key a model with this config expects (weights, the routers' expert biases and
// optimizer state), sorted.
std::vector<std::string> ckpt_expected_keys(const ModelConfig& cfg);

}  // namespace weft
