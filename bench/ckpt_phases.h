// bench_checkpoint --phases: instrumented copies of the library's per-rank save and load steps
// (the library is not touched), each phase timed on its own; phase times are the slowest rank's.
#pragma once

#include <cstdint>
#include <string>

namespace weft {
class Trainer;
}

namespace weft::bench {

struct SavePhases {
  double collect = 0, crc = 0, write = 0, fsync = 0, meta = 0;
};

// The writer-rank part of ckpt_save, phase by phase, into <dir>/phases/ (same bytes,
// same entry order, same write loop; the header is built the same way by write order).
SavePhases save_phases(weft::Trainer& t, const std::string& dir);

struct LoadPhases {
  // alloc: at::empty plus the first touch of every page (the page faults that a pread into a
  // fresh buffer would take inside the kernel), so `read` is the I/O and the kernel's copy.
  double meta = 0, header = 0, alloc = 0, read = 0, crc = 0, copy = 0;
  double total = 0;     // barrier to barrier
  int64_t direct = 0;   // chunks read straight into the live shard (direct mode)
};

// The per-rank part of ckpt_load on the checkpoint just saved (same layout): the same
// units, keys, skip rule and chunk reads, with each step timed on its own. Collective only at
// the ends; phase times are each rank's sum, then the slowest rank's.
// `direct` is a prototype of the recommended fix: a chunk whose rows all lie in this rank's
// shard (every chunk, on the layout that saved it) is pread straight into the live shard and
// its CRC-32C computed there, with no temporary buffer and no copy.
LoadPhases load_phases(weft::Trainer& t, const std::string& save_dir, bool direct);

}  // namespace weft::bench
