// Test helper: bitwise comparison of two committed checkpoints, key by key, and of the metadata
// that decides a resume (iteration, consumed samples and tokens, optimizer steps and parameter
// groups, LR scheduler, data position, RNG streams). Rank 0 reads both (every chunk
// checksum-verified by the reader); other ranks return "". Any failure to read is a difference,
// never a silent match. Also diff_resaved: a checkpoint loaded and saved again at once.
#pragma once

#include <string>
#include <vector>

#include "support/job.h"
#include "weft/checkpoint/format.h"

namespace weft::test {

// "" when a and b hold the same keys with bitwise equal contents; otherwise one line per
// difference or read failure.
inline std::string diff_checkpoints(const std::string& a, const std::string& b) {
  std::string out;
  if (world_rank() != 0) return out;
  nlohmann::json ma, mb;
  CkptIndex ia, ib;
  Status sa = ckpt_read_metadata(a, &ma, &ia), sb = ckpt_read_metadata(b, &mb, &ib);
  if (!sa) return "A unreadable: " + sa.message();
  if (!sb) return "B unreadable: " + sb.message();
  CkptFileCache fa(a), fb(b);
  // All chunks of a key, concatenated in chunk order; false when a chunk cannot be read.
  auto full = [](const CkptTensorInfo& ti, CkptFileCache& f, std::vector<uint8_t>* bytes) {
    for (const auto& c : ti.chunks) {
      std::vector<uint8_t> buf(c.nbytes());
      if (!f.read_chunk(c, buf.data())) return false;
      bytes->insert(bytes->end(), buf.begin(), buf.end());
    }
    return true;
  };
  for (const auto& [key, t] : ia) {
    if (!ib.count(key)) {
      out += "missing in B: " + key + "\n";
      continue;
    }
    std::vector<uint8_t> x, y;
    if (!full(t, fa, &x)) out += "unreadable in A: " + key + "\n";
    else if (!full(ib.at(key), fb, &y)) out += "unreadable in B: " + key + "\n";
    else if (x != y) out += "differs: " + key + "\n";
  }
  for (const auto& [key, t] : ib)
    if (!ia.count(key)) out += "missing in A: " + key + "\n";
  for (const char* k : {"iteration", "consumed_samples", "consumed_tokens", "optimizer",
                        "lr_scheduler", "data", "rng", "skipped_iterations", "nan_iterations"}) {
    const nlohmann::json va = ma.value(k, nlohmann::json()), vb = mb.value(k, nlohmann::json());
    if (va != vb) out += std::string("metadata differs: ") + k + "\n";
  }
  return out;
}

// The restore half of "everything saved is restored bitwise": loads iteration `iteration` of
// the checkpoint directory `from` with config `c` on `world` ranks, saves it again at once to
// `to` and returns diff_checkpoints of the two saves of that iteration. `c` is the config of
// the runs that saved: its train_iters gives the LR schedule's decay length. Collective over
// MPI_COMM_WORLD (run_job).
inline std::string diff_resaved(const TrainConfig& c, int world, const std::string& from,
                                int iteration, const std::string& to) {
  TrainConfig r = c;
  r.load = from;
  r.ckpt_step = iteration;
  r.save = to;
  r.train_iters = iteration;
  r.lr.decay_iters = c.train_iters;  // the schedule of the runs that saved (from --train-iters)
  run_job(r, world, false, nullptr, nullptr, [](Trainer& t, const ProcessGroups&) { t.save(); });
  const std::string name = ckpt_iter_dir_name(iteration);
  return diff_checkpoints(from + "/" + name, to + "/" + name);
}

}  // namespace weft::test
