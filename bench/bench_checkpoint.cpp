// bench_checkpoint: save and load throughput of weft's distributed checkpoint code for a model
// with gigabytes of training state, next to the raw sequential write and read bandwidth of the
// same directory, measured in the same run. Run it under mpirun, e.g.
//   mpirun -np 2 bench_checkpoint --dir /tmp/weft-bench-ckpt --repeats 5
//
// What is timed (barrier to barrier, so the slowest rank's time; every rank is in step):
//   save      Trainer::save(): the real ckpt_save (chunk CRC-32C, shard writes, fsync,
//             commit protocol). bytes = the sizes of every file in the iter_NNNNNNN directory.
//   load      ckpt_load() called directly on the live trainer, after every checkpoint
//             file was fsynced and evicted from the page cache (posix_fadvise DONTNEED; mincore
//             tells whether that worked). bytes = what the loader read through read/pread
//             (/proc/self/io rchar, summed over ranks). With float32 compute the weights are the
//             master, so the loader skips the weight entries and reads 3/4 of the files.
//   raw write each rank write()s the bytes of its own shard file (rank 0 also the metadata) to
//             one file in the same directory in 64 MiB blocks, then fsync; raw read reads it
//             back in 64 MiB blocks after DONTNEED eviction. Two sources/destinations:
//             - one pre-touched 64 MiB buffer reused for every block (the disk's best case);
//             - "state buf": one buffer as large as the rank's share, filled once per process
//               like the training state, walked through block by block. On VMs where the first
//               kernel access to a user page is expensive (this one: ~15 us per 4 KiB page,
//               about 0.27 GB/s) only this baseline pays what the checkpoint's write() from,
//               and read into, gigabytes of state pays.
// Ratios (STYLE.md rule 7): save over each raw write, load over each raw read. `disk%` is the
// share of the bytes the kernel moved to or from the block device in the timed region
// (/proc/self/io write_bytes / read_bytes), the evidence that a write was flushed and a read cold.
//
// Before each timed write, a scratch file of the same size is written, fsynced, evicted and
// deleted (--no-prewarm turns this off), so that every write gets page-cache pages that were
// freed a moment ago; see prewarm_page_cache(). Rounds alternate which side goes first.
//
// async    --async-save's AsyncCheckpointSaver on the same state into <dir>/async: `stall_ms`
//          is the time the training thread is blocked (barrier to barrier: the copy into the
//          reused host snapshot, pinned when --device cuda), `async_done_ms` when the background
//          write and the commit are finished; printed next to `sync_save_ms` (the save above)
//          as `stall/sync`. The snapshot buffer is allocated before the first round (printed
//          once), as `weft train --async-save` does at start-up; every round reuses it.
//
// --phases also runs an instrumented copy of the save and load steps of every rank (the
// library is not touched): collect, CRC-32C, write() to the page cache, fsync, metadata; and for
// load: header + metadata, allocation + first touch of the temporary chunk buffer, pread, CRC-32C,
// copy into the live shard. Phase times are the slowest rank's; their sum is printed next to
// the real call's time. It then times a prototype of the load without the temporary buffer
// (pread straight into the live shard, CRC-32C there), as evidence for the fix it suggests.
//
// The state is the initial state (--iters-train 0) unless training steps are asked for. The
// directory holds `ckpt/`, `raw_RRRRR.bin`, `prewarm_RRRRR.bin` and `phases/` while running; all
// are removed at the end, and the directory too when it is left empty.
#include <ATen/core/grad_mode.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "weft/checkpoint/async_save.h"
#include "weft/checkpoint/checkpoint.h"
#include "weft/comm/device.h"
#include "weft/checkpoint/crc32c.h"
#include "weft/checkpoint/format.h"
#include "weft/checkpoint/safetensors.h"
#include "weft/comm/communicator.h"
#include "weft/comm/mpi_runtime.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"
#include "weft/core/remove_tree.h"
#include "weft/train/trainer.h"

namespace {
namespace fs = std::filesystem;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

int64_t sum_over_ranks(int64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

// Seconds of `fn` from a barrier to a barrier: the slowest rank's time.
template <class Fn>
double timed(Fn&& fn) {
  barrier();
  const double t0 = MPI_Wtime();
  fn();
  barrier();
  return max_over_ranks(MPI_Wtime() - t0);
}

// This process's I/O counters (/proc/self/io): bytes through read/write syscalls and bytes the
// block layer moved for it.
struct IoCounters {
  int64_t rchar = 0, wchar = 0, read_bytes = 0, write_bytes = 0;
};

IoCounters io_counters() {
  IoCounters c;
  std::ifstream f("/proc/self/io");
  std::string key;
  int64_t v = 0;
  while (f >> key >> v) {
    if (key == "rchar:") c.rchar = v;
    else if (key == "wchar:") c.wchar = v;
    else if (key == "read_bytes:") c.read_bytes = v;
    else if (key == "write_bytes:") c.write_bytes = v;
  }
  return c;
}

IoCounters io_delta_over_ranks(const IoCounters& a, const IoCounters& b) {
  return {sum_over_ranks(b.rchar - a.rchar), sum_over_ranks(b.wchar - a.wchar),
          sum_over_ranks(b.read_bytes - a.read_bytes),
          sum_over_ranks(b.write_bytes - a.write_bytes)};
}

void check_errno(bool ok, const std::string& what) {
  if (!ok) weft::fail("bench_checkpoint: {}: {}", what, std::strerror(errno));
}

// Flushes the file's dirty pages (a no-op after the writer's fsync), then drops its pages from
// the page cache. Returns {bytes resident before, bytes resident after} per mincore.
std::pair<int64_t, int64_t> evict_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check_errno(fd >= 0, "open " + path);
  struct stat sb;
  check_errno(::fstat(fd, &sb) == 0, "fstat " + path);
  const int64_t size = sb.st_size;
  const long page = ::sysconf(_SC_PAGESIZE);
  auto resident = [&]() -> int64_t {
    if (size == 0) return 0;
    void* m = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
    check_errno(m != MAP_FAILED, "mmap " + path);
    std::vector<unsigned char> vec(static_cast<size_t>((size + page - 1) / page));
    check_errno(::mincore(m, static_cast<size_t>(size), vec.data()) == 0, "mincore " + path);
    ::munmap(m, static_cast<size_t>(size));
    int64_t n = 0;
    for (unsigned char v : vec) n += v & 1;
    return std::min(size, n * page);
  };
  check_errno(::fsync(fd) == 0, "fsync " + path);
  const int64_t before = resident();
  if (const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); rc != 0)
    weft::fail("bench_checkpoint: posix_fadvise(DONTNEED) {}: {}", path, std::strerror(rc));
  const int64_t after = resident();
  ::close(fd);
  return {before, after};
}

struct Eviction {
  int64_t bytes = 0, before = 0, after = 0;
};

// Every regular file under `dir` (recursively), or `dir` itself when it is a file.
Eviction evict_tree(const std::string& dir) {
  Eviction e;
  auto one = [&](const fs::path& p) {
    auto [b, a] = evict_file(p.string());
    e.bytes += static_cast<int64_t>(fs::file_size(p));
    e.before += b;
    e.after += a;
  };
  if (fs::is_regular_file(dir)) {
    one(dir);
  } else {
    for (const auto& f : fs::recursive_directory_iterator(dir))
      if (f.is_regular_file()) one(f.path());
  }
  return e;
}

int64_t tree_bytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& f : fs::recursive_directory_iterator(dir))
    if (f.is_regular_file()) n += static_cast<int64_t>(f.file_size());
  return n;
}

// Commits the file system's dirty data and journal (deletions included, which this ext4 mount
// turns into discards), so that a timed region starts from a quiet device.
void sync_fs(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  check_errno(fd >= 0, "open " + dir);
  check_errno(::syncfs(fd) == 0, "syncfs " + dir);
  ::close(fd);
}

// ---- raw sequential baseline ---------------------------------------------------------------

// Writes `bytes` to `path` in `block`-byte write() calls, then fsyncs. With `advance` the calls
// walk through `src` (a buffer of `bytes`); otherwise every call writes the same first block.
// Returns the seconds spent in fsync (the rest is write() into the page cache).
double raw_write(const std::string& path, const char* src, int64_t block, int64_t bytes,
                 bool advance) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  check_errno(fd >= 0, "create " + path);
  int64_t done = 0;
  while (done < bytes) {
    const size_t n = static_cast<size_t>(std::min(bytes - done, block));
    const ssize_t w = ::write(fd, advance ? src + done : src, n);
    if (w < 0 && errno == EINTR) continue;
    check_errno(w > 0, "write " + path);
    done += w;
  }
  const double t0 = MPI_Wtime();
  check_errno(::fsync(fd) == 0, "fsync " + path);
  const double t = MPI_Wtime() - t0;
  check_errno(::close(fd) == 0, "close " + path);
  return t;
}

// Reads `path` to its end in `block`-byte read() calls into `dst` (walking through it with
// `advance`, else reusing its first block); the file must hold exactly `bytes`.
void raw_read(const std::string& path, char* dst, int64_t block, int64_t bytes, bool advance) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check_errno(fd >= 0, "open " + path);
  int64_t got = 0;
  for (;;) {
    const int64_t room = advance ? std::min(block, bytes - got) : block;
    if (room <= 0) break;
    const ssize_t r = ::read(fd, advance ? dst + got : dst, static_cast<size_t>(room));
    if (r < 0 && errno == EINTR) continue;
    check_errno(r >= 0, "read " + path);
    if (r == 0) break;
    got += r;
  }
  ::close(fd);
  if (got != bytes) weft::fail("bench_checkpoint: {}: read {} bytes, wrote {}", path, got, bytes);
}

// Writes `bytes` to a scratch file with fsync, evicts it and deletes it (untimed), so that the
// page-cache pages the next timed write gets were freed a moment ago. On a VM with virtio-balloon
// free page reporting (this one), free memory is handed back to the host about 2 s after it
// is freed, and write() into such pages runs at 0.4-0.8 GB/s instead of 5-7 GB/s; without this
// step a timed write's speed depends on what ran before it, not on the code or the disk.
void prewarm_page_cache(const std::string& path, int64_t bytes, std::vector<char>& buf) {
  raw_write(path, buf.data(), static_cast<int64_t>(buf.size()), bytes, false);
  evict_file(path);
  ::unlink(path.c_str());
}

// ---- instrumented copies of the library's per-rank save and load steps ---------------------

const char* const kStateKinds[] = {"fp32_param", "exp_avg", "exp_avg_sq"};

struct SavePhases {
  double collect = 0, crc = 0, write = 0, fsync = 0, meta = 0;
};

// The writer-rank part of ckpt_save, phase by phase, into <dir>/phases/ (same bytes,
// same entry order, same write loop; the header is built the same way by write order).
SavePhases save_phases(weft::Trainer& t, const std::string& dir) {
  SavePhases p;
  const int rank = world_rank();
  const std::string out = dir + "/phases";
  if (rank == 0) {
    (void)weft::remove_tree(out);
    fs::create_directories(out);
  }
  barrier();
  weft::PipelineStage& stage = t.stage();
  weft::ShardedAdamW& opt = t.optimizer();
  struct Entry {
    std::string name;
    at::Tensor data;
    uint32_t crc = 0;
  };
  std::vector<Entry> entries;
  p.collect = timed([&] {
    at::NoGradGuard no_grad;
    const auto& units = opt.units();
    for (size_t k = 0; k < units.size(); ++k) {
      const weft::FsdpUnit& u = *units[k];
      if (stage.is_embedding_copy(&u)) continue;
      weft::UnitOptimState& st = opt.state(k);
      for (int i = 0; i < u.num_params(); ++i) {
        const weft::ShardSegment& seg = u.segment(i);
        if (seg.valid_rows == 0) continue;
        const std::string name = u.spec(i).name;
        auto rows = [&](const at::Tensor& flat) {
          std::vector<int64_t> shape = u.spec(i).shape;
          shape[0] = seg.valid_rows;
          return flat.narrow(0, seg.offset, seg.valid_numel()).view(shape).to(at::kCPU).contiguous();
        };
        const std::string at_row = "@" + std::to_string(seg.row_start);
        entries.push_back({name + at_row, rows(u.param_shard())});
        const at::Tensor* states[] = {&st.master, &st.exp_avg, &st.exp_avg_sq};
        for (int s = 0; s < 3; ++s)
          entries.push_back({std::string("optimizer.") + kStateKinds[s] + "." + name + at_row,
                             rows(*states[s])});
      }
    }
  });
  auto nbytes = [](const at::Tensor& d) { return static_cast<size_t>(d.numel()) * d.element_size(); };
  p.crc = timed([&] {
    for (auto& e : entries) e.crc = weft::crc32c(e.data.data_ptr(), nbytes(e.data));
  });
  const std::string path = out + "/" + weft::ckpt_shard_file_name(rank);
  int fd = -1;
  p.write = timed([&] {
    std::string header(8, '\0');
    header += '{';
    for (const auto& e : entries) {
      nlohmann::ordered_json j;
      j["dtype"] = e.data.scalar_type() == at::kFloat ? "F32" : "BF16";
      j["shape"] = e.data.sizes().vec();
      if (header.size() > 9) header += ',';
      header += nlohmann::json(e.name).dump() + ":" + j.dump();
    }
    header += '}';
    fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    check_errno(fd >= 0, "create " + path);
    auto write_all = [&](const void* data, size_t n) {
      const char* c = static_cast<const char*>(data);
      while (n > 0) {
        const ssize_t w = ::write(fd, c, std::min(n, size_t{1} << 30));
        if (w < 0 && errno == EINTR) continue;
        check_errno(w > 0, "write " + path);
        c += w;
        n -= static_cast<size_t>(w);
      }
    };
    write_all(header.data(), header.size());
    for (const auto& e : entries) write_all(e.data.data_ptr(), nbytes(e.data));
  });
  p.fsync = timed([&] {
    check_errno(::fsync(fd) == 0, "fsync " + path);
    check_errno(::close(fd) == 0, "close " + path);
  });
  p.meta = timed([&] {
    // Chunk list to JSON on every rank; rank 0 writes a metadata file of that size and fsyncs
    // it and the directory (the all-gathers of the real commit carry a few kB).
    nlohmann::json chunks = nlohmann::json::array();
    for (const auto& e : entries) {
      weft::CkptChunk c;
      c.key = e.name.substr(0, e.name.find('@'));
      c.file = weft::ckpt_shard_file_name(rank);
      c.entry = e.name;
      c.dtype = "F32";
      c.shape = e.data.sizes().vec();
      c.offsets.assign(c.shape.size(), 0);
      c.lengths = c.shape;
      c.crc32c = e.crc;
      chunks.push_back(weft::ckpt_chunk_to_json(c));
    }
    const std::string text = chunks.dump(1);
    if (rank == 0) {
      const std::string mpath = out + "/metadata.json";
      const int mfd = ::open(mpath.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
      check_errno(mfd >= 0, "create " + mpath);
      check_errno(::write(mfd, text.data(), text.size()) == static_cast<ssize_t>(text.size()),
                  "write " + mpath);
      check_errno(::fsync(mfd) == 0, "fsync " + mpath);
      ::close(mfd);
      check_errno(weft::ckpt_fsync_dir(out).is_ok(), "fsync dir " + out);
    }
  });
  barrier();
  if (rank == 0) (void)weft::remove_tree(out);
  return p;
}

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
LoadPhases load_phases(weft::Trainer& t, const std::string& save_dir, bool direct) {
  LoadPhases p;
  const double start = MPI_Wtime();
  int iteration = 0;
  if (!weft::ckpt_read_tracker(save_dir, &iteration).is_ok())
    weft::fail("bench_checkpoint: no tracker in {}", save_dir);
  const std::string dir = weft::ckpt_iter_dir(save_dir, iteration);
  barrier();
  auto clock = [] { return MPI_Wtime(); };
  double t0 = clock();
  nlohmann::json meta;
  weft::CkptIndex index;
  if (weft::Status s = weft::ckpt_read_metadata(dir, &meta, &index); !s)
    weft::fail("bench_checkpoint: {}", s.message());
  p.meta = clock() - t0;
  std::map<std::string, weft::SafetensorsHeader> headers;
  at::NoGradGuard no_grad;
  weft::ShardedAdamW& opt = t.optimizer();
  const auto& units = opt.units();
  auto load_rows = [&](const weft::CkptTensorInfo& info, int64_t row_start, int64_t rows,
                       at::Tensor dst) {
    const int64_t end = row_start + rows;
    for (const weft::CkptChunk& c : info.chunks) {
      const int64_t c0 = c.offsets[0], c1 = c0 + c.lengths[0];
      const int64_t lo = std::max(row_start, c0), hi = std::min(end, c1);
      if (lo >= hi) continue;
      const std::string path = dir + "/" + c.file;
      double s = clock();
      auto it = headers.find(c.file);
      if (it == headers.end()) {
        weft::SafetensorsHeader h;
        if (weft::Status st = weft::safetensors_read_header(path, &h); !st)
          weft::fail("bench_checkpoint: {}", st.message());
        it = headers.emplace(c.file, std::move(h)).first;
      }
      p.header += clock() - s;
      if (direct && lo == c0 && hi == c1) {
        void* into = dst.narrow(0, c0 - row_start, c1 - c0).data_ptr();
        s = clock();
        if (weft::Status st = weft::safetensors_read_entry(path, it->second, c.entry, into,
                                                           static_cast<size_t>(c.nbytes()));
            !st)
          weft::fail("bench_checkpoint: {}", st.message());
        p.read += clock() - s;
        s = clock();
        const uint32_t crc = weft::crc32c(into, static_cast<size_t>(c.nbytes()));
        p.crc += clock() - s;
        if (crc != c.crc32c) weft::fail("bench_checkpoint: checksum mismatch in {}", c.entry);
        ++p.direct;
        continue;
      }
      s = clock();
      at::Tensor buf = at::empty(c.lengths, at::TensorOptions().dtype(
                                                c.dtype == "F32" ? at::kFloat : at::kBFloat16));
      auto* bytes = static_cast<volatile char*>(buf.data_ptr());
      for (int64_t off = 0; off < c.nbytes(); off += 4096) bytes[off] = 0;
      p.alloc += clock() - s;
      s = clock();
      if (weft::Status st = weft::safetensors_read_entry(path, it->second, c.entry, buf.data_ptr(),
                                                         static_cast<size_t>(c.nbytes()));
          !st)
        weft::fail("bench_checkpoint: {}", st.message());
      p.read += clock() - s;
      s = clock();
      const uint32_t crc = weft::crc32c(buf.data_ptr(), static_cast<size_t>(c.nbytes()));
      p.crc += clock() - s;
      if (crc != c.crc32c) weft::fail("bench_checkpoint: checksum mismatch in {}", c.entry);
      s = clock();
      dst.narrow(0, lo - row_start, hi - lo).copy_(buf.narrow(0, lo - c0, hi - lo));
      p.copy += clock() - s;
    }
  };
  for (size_t k = 0; k < units.size(); ++k) {
    weft::FsdpUnit& u = *units[k];
    weft::UnitOptimState& state = opt.state(k);
    for (int i = 0; i < u.num_params(); ++i) {
      const weft::ShardSegment& seg = u.segment(i);
      if (seg.valid_rows == 0) continue;
      std::vector<int64_t> shape = u.spec(i).shape;
      shape[0] = seg.valid_rows;
      const std::string name = u.spec(i).name;
      auto load = [&](const std::string& key, const at::Tensor& flat) {
        auto it = index.find(key);
        if (it == index.end()) return false;
        load_rows(it->second, seg.row_start, seg.valid_rows,
                  flat.narrow(0, seg.offset, seg.valid_numel()).view(shape));
        return true;
      };
      const bool has_master = load("optimizer.fp32_param." + name, state.master);
      if (!u.param_shard().is_same(state.master) || !has_master) load(name, u.param_shard());
      load("optimizer.exp_avg." + name, state.exp_avg);
      load("optimizer.exp_avg_sq." + name, state.exp_avg_sq);
    }
  }
  barrier();
  p.total = MPI_Wtime() - start;
  for (double* v : {&p.meta, &p.header, &p.alloc, &p.read, &p.crc, &p.copy, &p.total})
    *v = max_over_ranks(*v);
  p.direct = sum_over_ranks(p.direct);
  return p;
}

// ---- reporting -----------------------------------------------------------------------------

// One timed operation of a round, summed over ranks (bytes, I/O counters) and timed as the
// slowest rank.
struct Op {
  double seconds = 0;
  double fsync_seconds = 0;  // raw writes: the slowest rank's fsync, part of `seconds`
  int64_t bytes = 0;
  IoCounters io;
  double gbps() const { return static_cast<double>(bytes) / 1e9 / seconds; }
};

enum OpKind { kSave, kRawWrite, kRawWriteBig, kLoad, kRawRead, kRawReadBig, kNumOps };
const char* const kOpNames[kNumOps] = {"save",    "raw write",  "raw write (state buf)",
                                       "load",    "raw read",   "raw read (state buf)"};

struct Sample {
  Op op[kNumOps];
  int64_t save_bytes = 0;  // checkpoint directory size (load's op bytes are the bytes read)
  Eviction ckpt_evict, raw_evict;
  bool phases = false;
  std::string loadavg;  // /proc/loadavg at the start of the round: how busy the machine was
  SavePhases sp;
  LoadPhases lp, lp_direct;
  double stall = 0, async_done = 0;  // seconds: --async-save's blocking part and its whole
  double ratio(OpKind a, OpKind b) const { return op[a].gbps() / op[b].gbps(); }
  double load_ckpt_gbps() const { return static_cast<double>(save_bytes) / 1e9 / op[kLoad].seconds; }
};

double pct(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

void print_sample(int r, int n, const Sample& s) {
  std::printf("# repeat %d/%d (%s first; load average %s)\n", r + 1, n,
              r % 2 ? "raw" : "checkpoint", s.loadavg.c_str());
  std::printf("%-22s %14s %9s %8s %7s\n", "op", "bytes", "seconds", "GB/s", "disk%");
  for (int k = 0; k < kNumOps; ++k) {
    const Op& o = s.op[k];
    const bool write = k < kLoad;
    std::printf("%-22s %14lld %9.3f %8.3f %6.1f%%\n", kOpNames[k],
                static_cast<long long>(o.bytes), o.seconds, o.gbps(),
                pct(write ? o.io.write_bytes : o.io.read_bytes, o.bytes));
  }
  std::printf("save/raw-write %.3f  save/raw-write(state buf) %.3f  load/raw-read %.3f  "
              "load/raw-read(state buf) %.3f  (checkpoint bytes / load time: %.3f GB/s)\n",
              s.ratio(kSave, kRawWrite), s.ratio(kSave, kRawWriteBig), s.ratio(kLoad, kRawRead),
              s.ratio(kLoad, kRawReadBig), s.load_ckpt_gbps());
  std::printf("eviction: checkpoint %.1f%% -> %.1f%% resident, raw %.1f%% -> %.1f%% resident "
              "(mincore, before -> after DONTNEED)\n",
              pct(s.ckpt_evict.before, s.ckpt_evict.bytes),
              pct(s.ckpt_evict.after, s.ckpt_evict.bytes), pct(s.raw_evict.before, s.raw_evict.bytes),
              pct(s.raw_evict.after, s.raw_evict.bytes));
  std::printf("async save: stall_ms %.1f  sync_save_ms %.1f  stall/sync %.3f  (written and "
              "committed after async_done_ms %.1f)\n",
              1e3 * s.stall, 1e3 * s.op[kSave].seconds, s.stall / s.op[kSave].seconds,
              1e3 * s.async_done);
  if (s.phases) {
    std::printf("raw write phases (s): write %.3f  fsync %.3f; state buf: write %.3f  fsync %.3f\n",
                s.op[kRawWrite].seconds - s.op[kRawWrite].fsync_seconds,
                s.op[kRawWrite].fsync_seconds,
                s.op[kRawWriteBig].seconds - s.op[kRawWriteBig].fsync_seconds,
                s.op[kRawWriteBig].fsync_seconds);
    const SavePhases& p = s.sp;
    const double sum = p.collect + p.crc + p.write + p.fsync + p.meta;
    std::printf("save phases (instrumented copy, s): collect %.3f  crc32c %.3f  write %.3f  "
                "fsync %.3f  metadata %.3f  = %.3f (real save %.3f)\n",
                p.collect, p.crc, p.write, p.fsync, p.meta, sum, s.op[kSave].seconds);
    const LoadPhases& l = s.lp;
    const double lsum = l.meta + l.header + l.alloc + l.read + l.crc + l.copy;
    std::printf("load phases (instrumented copy, s): metadata %.3f  headers %.3f  alloc+fault %.3f  "
                "pread %.3f  crc32c %.3f  copy %.3f  = %.3f (real load %.3f)\n",
                l.meta, l.header, l.alloc, l.read, l.crc, l.copy, lsum, s.op[kLoad].seconds);
    const LoadPhases& d = s.lp_direct;
    std::printf("load prototype, pread into the live shard (s): pread %.3f  crc32c %.3f  other "
                "%.3f  = %.3f -> %.3f GB/s, %.3f of raw read (%lld chunks direct)\n",
                d.read, d.crc, d.total - d.read - d.crc, d.total,
                static_cast<double>(s.op[kLoad].bytes) / 1e9 / d.total,
                static_cast<double>(s.op[kLoad].bytes) / 1e9 / d.total / s.op[kRawRead].gbps(),
                static_cast<long long>(d.direct));
  }
}

void print_stat(const std::string& name, std::vector<double> v, const char* unit) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  std::printf("%-26s %8.3f %8.3f %8.3f  %s\n", name.c_str(), med, v.front(), v.back(), unit);
}

// ---- the benchmark -------------------------------------------------------------------------

int run(int argc, char** argv, const weft::MpiRuntime& mpi) {
  CLI::App app{"checkpoint save/load throughput against raw sequential disk bandwidth"};
  std::string dir = "/tmp/weft-bench-ckpt";
  weft::TrainConfig cfg;
  cfg.model.hidden_size = 1024;
  cfg.model.ffn_hidden_size = 2816;
  cfg.model.num_layers = 8;
  cfg.model.num_attention_heads = 16;
  cfg.model.num_query_groups = 16;
  cfg.model.vocab_size = 32000;
  cfg.model.seq_length = 128;
  int iters_train = 0, repeats = 3, block_mib = 64;
  bool phases = false, keep = false, prewarm = true;
  app.add_option("--dir", dir, "directory for the checkpoint and the raw files");
  app.add_option("--hidden-size", cfg.model.hidden_size);
  app.add_option("--ffn-hidden-size", cfg.model.ffn_hidden_size);
  app.add_option("--num-layers", cfg.model.num_layers);
  app.add_option("--num-attention-heads", cfg.model.num_attention_heads);
  app.add_option("--num-query-groups", cfg.model.num_query_groups);
  app.add_option("--vocab-size", cfg.model.vocab_size);
  app.add_option("--seq-length", cfg.model.seq_length);
  app.add_option("--device", cfg.device, "cpu | cuda: where the training state lives");
  app.add_flag("--bf16", cfg.model.bf16, "bf16 weights (the fp32 master is then a separate buffer)");
  app.add_option("--pipeline-model-parallel-size", cfg.layout.pp, "pp; dp = world / pp");
  app.add_option("--iters-train", iters_train, "training steps before the first save (0: initial state)");
  app.add_option("--repeats", repeats, "save/load/raw rounds in this process");
  app.add_option("--block-mib", block_mib, "raw baseline block size in MiB");
  app.add_flag("--phases", phases, "also time the phases of an instrumented copy of save and load");
  app.add_flag("--keep", keep, "leave the last checkpoint in --dir");
  app.add_flag("--prewarm,!--no-prewarm", prewarm,
               "before each timed write, write+evict+delete a scratch file of its size (default on)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return mpi.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
  }
  if (repeats < 1 || block_mib < 1 || iters_train < 0)
    weft::fail_usage("--repeats and --block-mib must be >= 1, --iters-train >= 0");
  const int rank = mpi.world_rank(), world = mpi.world_size();
  const std::string save_dir = dir + "/ckpt";
  const std::string raw_path = dir + "/" + fmt::format("raw_{:05d}.bin", rank);
  const std::string warm_path = dir + "/" + fmt::format("prewarm_{:05d}.bin", rank);
  if (rank == 0) {
    fs::create_directories(dir);
    (void)weft::remove_tree(save_dir);
    (void)weft::remove_tree(dir + "/phases");
  }
  barrier();

  cfg.layout.world_size = world;
  cfg.micro_batch_size = 1;
  const int dp = world / std::max(1, cfg.layout.pp);
  cfg.global_batch_size = cfg.micro_batch_size * dp;
  cfg.train_iters = iters_train;
  cfg.quiet = true;
  cfg.save = save_dir;
  if (cfg.device == "cuda") weft::set_cuda_device(mpi.local_rank());
  weft::Mesh mesh(cfg.layout);
  weft::ProcessGroups groups(mesh, weft::Backend::kMpi);
  double t_init = MPI_Wtime();
  weft::Trainer trainer(cfg, groups);
  for (int i = 0; i < iters_train; ++i) trainer.train_step();
  if (iters_train == 0) {
    // The moments start as at::zeros, whose pages the allocator leaves unmapped until first
    // touched; the first save would then time ~1 GB of page faults (about 20 us each on this
    // VM) that a trained state never has. Writing the same zeros maps them, as a step would.
    for (size_t k = 0; k < trainer.optimizer().units().size(); ++k) {
      trainer.optimizer().state(k).exp_avg.zero_();
      trainer.optimizer().state(k).exp_avg_sq.zero_();
    }
  }
  t_init = max_over_ranks(MPI_Wtime() - t_init);

  // Training-state bytes: weights in compute dtype + float32 master + both moments, over the
  // shards this job writes (replicate rank 0; the tied copy once).
  const int64_t elem = cfg.model.bf16 ? 2 : 4;
  int64_t params = 0;
  if (groups.get("fsdp_replicate")->rank() == 0)
    for (auto& u : trainer.stage().units())
      if (!trainer.stage().is_embedding_copy(u.get()))
        for (int i = 0; i < u->num_params(); ++i) params += u->segment(i).valid_numel();
  params = sum_over_ranks(params);
  const int64_t state_bytes = params * (elem + 4 + 4 + 4);

  if (rank == 0) {
    std::printf("# bench_checkpoint: %d rank(s), pp %d, dp %d, %d threads/rank, MPI %s\n", world,
                mesh.pp(), mesh.dp(), at::get_num_threads(),
                weft::MpiRuntime::library_version().c_str());
    std::printf("# state on %s\n", cfg.device.c_str());
    std::printf("# model: hidden %d, ffn %d, layers %d, heads %d, query groups %d, vocab %d, "
                "%s compute; %lld parameters; state %lld bytes (%.2f GB: weights + fp32 master "
                "+ 2 fp32 moments); trainer ready in %.1f s (%d train steps)\n",
                cfg.model.hidden_size, cfg.model.ffn_hidden_size, cfg.model.num_layers,
                cfg.model.num_attention_heads, cfg.model.num_query_groups, cfg.model.vocab_size,
                cfg.model.bf16 ? "bf16" : "fp32", static_cast<long long>(params),
                static_cast<long long>(state_bytes), state_bytes / 1e9, t_init, iters_train);
    std::printf("# dir %s; raw baseline: per rank its shard's bytes, %d MiB write()/read() "
                "blocks, fsync; GB = 1e9 bytes; times are barrier to barrier (slowest rank); "
                "page-cache prewarm before timed writes: %s\n",
                dir.c_str(), block_mib, prewarm ? "on" : "off");
  }

  std::vector<char> buf(static_cast<size_t>(block_mib) << 20);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 131 + 7);  // pre-touch

  // The state-sized raw buffer: as large as this rank's share, allocated and filled once (like
  // the training state) on the first raw round, when the share is known.
  std::unique_ptr<char[]> big;
  int64_t big_bytes = 0;

  weft::LoadRequest lreq;
  lreq.dir = save_dir;
  lreq.layout = weft::layout_to_json(mesh, cfg);
  std::vector<Sample> samples;
  // Its snapshot buffer is allocated once, as `weft train --async-save` does at start-up, and
  // reused by every round.
  weft::AsyncCheckpointSaver saver(groups);
  const double reserve_s = timed([&] { saver.reserve(trainer.stage(), trainer.optimizer()); });
  if (rank == 0)
    std::printf("async save: snapshot buffer allocated at start-up in %.1f ms (not a stall)\n",
                1e3 * reserve_s);
  int64_t last_save_bytes = state_bytes;  // the estimate until the first save
  auto warm = [&](int64_t my_bytes) {
    if (prewarm) prewarm_page_cache(warm_path, my_bytes, buf);
    barrier();
    sync_fs(dir);
  };
  for (int r = 0; r < repeats; ++r) {
    Sample s;
    if (rank == 0) {
      std::ifstream la("/proc/loadavg");
      std::getline(la, s.loadavg);
    }
    auto checkpoint_round = [&] {
      if (rank == 0) (void)weft::remove_tree(save_dir);  // so the save never times removing an old one
      barrier();
      warm(last_save_bytes / world);
      Op& save = s.op[kSave];
      IoCounters a = io_counters();
      save.seconds = timed([&] { trainer.save(); });
      save.io = io_delta_over_ranks(a, io_counters());
      int64_t b = rank == 0 ? tree_bytes(save_dir) : 0;
      MPI_Bcast(&b, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
      save.bytes = s.save_bytes = last_save_bytes = b;
      s.ckpt_evict = evict_tree(save_dir);  // every rank: same host, idempotent
      barrier();
      Op& load = s.op[kLoad];
      a = io_counters();
      load.seconds = timed(
          [&] { weft::ckpt_load(lreq, trainer.stage(), trainer.optimizer(), groups); });
      load.io = io_delta_over_ranks(a, io_counters());
      load.bytes = load.io.rchar;
      // The same state saved with --async-save's saver: the stall, then the background write.
      const std::string async_dir = dir + "/async";
      if (rank == 0) (void)weft::remove_tree(async_dir);
      barrier();
      warm(last_save_bytes / world);
      weft::SaveRequest req;
      req.dir = async_dir;
      req.iteration = trainer.iteration();
      req.meta = {{"bench", "async"}};
      s.stall = timed([&] { saver.start(req, trainer.stage(), trainer.optimizer()); });
      s.async_done = s.stall + timed([&] { saver.finish(); });
      if (rank == 0) (void)weft::remove_tree(async_dir);
      barrier();
      sync_fs(dir);
    };
    auto raw_round = [&] {
      // This rank's share: its shard file (rank 0 also everything else in the checkpoint).
      int64_t mine = 0;
      {
        int iteration = 0;
        if (!weft::ckpt_read_tracker(save_dir, &iteration).is_ok())
          weft::fail("bench_checkpoint: no checkpoint in {} to size the raw files", save_dir);
        const std::string idir = weft::ckpt_iter_dir(save_dir, iteration);
        int64_t total = rank == 0 ? tree_bytes(idir) : 0;
        MPI_Bcast(&total, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
        const std::string f = idir + "/" + weft::ckpt_shard_file_name(rank);
        if (fs::exists(f)) mine = static_cast<int64_t>(fs::file_size(f));
        const int64_t shards = sum_over_ranks(mine);
        if (rank == 0) mine += total - shards;
      }
      if (big_bytes != mine) {
        big.reset(new char[static_cast<size_t>(std::max<int64_t>(mine, 1))]);
        for (int64_t i = 0; i < mine; ++i) big[i] = static_cast<char>(i * 131 + 7);
        big_bytes = mine;
      }
      const int64_t block = static_cast<int64_t>(buf.size());
      auto one = [&](OpKind wk, OpKind rk, char* src, bool advance) {
        if (rank == 0 && fs::exists(raw_path)) fs::remove(raw_path);
        barrier();
        warm(mine);
        Op& w = s.op[wk];
        IoCounters a = io_counters();
        double fsync_s = 0;
        w.seconds = timed([&] { fsync_s = raw_write(raw_path, src, block, mine, advance); });
        w.fsync_seconds = max_over_ranks(fsync_s);
        w.io = io_delta_over_ranks(a, io_counters());
        w.bytes = sum_over_ranks(mine);
        Eviction e = evict_tree(raw_path);
        s.raw_evict = {sum_over_ranks(e.bytes), sum_over_ranks(e.before), sum_over_ranks(e.after)};
        Op& rd = s.op[rk];
        a = io_counters();
        rd.seconds = timed([&] { raw_read(raw_path, src, block, mine, advance); });
        rd.io = io_delta_over_ranks(a, io_counters());
        rd.bytes = sum_over_ranks(mine);
        ::unlink(raw_path.c_str());
        barrier();
        sync_fs(dir);
      };
      one(kRawWrite, kRawRead, buf.data(), false);
      one(kRawWriteBig, kRawReadBig, big.get(), true);
    };
    // Alternate the order between rounds so that neither side always runs on a fresher device.
    // The first round saves first, so the raw files match the shard files exactly.
    if (r % 2 == 0) {
      checkpoint_round();
      raw_round();
    } else {
      raw_round();
      checkpoint_round();
    }
    if (phases) {
      s.phases = true;
      warm(last_save_bytes / world);
      s.sp = save_phases(trainer, dir);
      sync_fs(dir);
      evict_tree(save_dir);
      barrier();
      s.lp = load_phases(trainer, save_dir, false);
      evict_tree(save_dir);
      barrier();
      s.lp_direct = load_phases(trainer, save_dir, true);
    }
    if (rank == 0) {
      print_sample(r, repeats, s);
      std::fflush(stdout);
    }
    samples.push_back(s);
  }

  if (rank == 0) {
    const Sample& last = samples.back();
    std::printf("# summary over %d repeats: save %lld bytes, load read %lld bytes\n", repeats,
                static_cast<long long>(last.save_bytes),
                static_cast<long long>(last.op[kLoad].bytes));
    std::printf("%-26s %8s %8s %8s\n", "metric", "median", "min", "max");
    auto stat = [&](const std::string& name, auto fn, const char* unit) {
      std::vector<double> v;
      for (const auto& s : samples) v.push_back(fn(s));
      print_stat(name, v, unit);
    };
    for (int k = 0; k < kNumOps; ++k)
      stat(kOpNames[k], [k](const Sample& s) { return s.op[k].gbps(); },
           k == kLoad ? "GB/s (bytes read)" : "GB/s");
    stat("load (checkpoint bytes)", [](const Sample& s) { return s.load_ckpt_gbps(); },
         "GB/s (checkpoint size / load time)");
    stat("save/raw-write", [](const Sample& s) { return s.ratio(kSave, kRawWrite); }, "");
    stat("save/raw-write(state buf)", [](const Sample& s) { return s.ratio(kSave, kRawWriteBig); }, "");
    stat("load/raw-read", [](const Sample& s) { return s.ratio(kLoad, kRawRead); }, "");
    stat("load/raw-read(state buf)", [](const Sample& s) { return s.ratio(kLoad, kRawReadBig); }, "");
    stat("stall_ms", [](const Sample& s) { return 1e3 * s.stall; }, "ms (--async-save blocks training)");
    stat("sync_save_ms", [](const Sample& s) { return 1e3 * s.op[kSave].seconds; }, "ms");
    stat("stall/sync", [](const Sample& s) { return s.stall / s.op[kSave].seconds; }, "");
    stat("async_done_ms", [](const Sample& s) { return 1e3 * s.async_done; }, "ms (write + commit)");
    const bool evicted = last.ckpt_evict.after * 100 < last.ckpt_evict.bytes;
    std::printf("# page-cache eviction (posix_fadvise DONTNEED): %s (%.1f%% of the checkpoint "
                "resident after it)\n",
                evicted ? "supported" : "NOT effective: loads were warm",
                pct(last.ckpt_evict.after, last.ckpt_evict.bytes));
  }
  barrier();
  if (rank == 0 && !keep) {
    (void)weft::remove_tree(save_dir);
    std::error_code ec;
    fs::remove(dir, ec);  // only if now empty
  }
  barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  weft::MpiRuntime mpi(&argc, &argv);
  weft::set_error_rank(mpi.world_rank());
  // Ranks share the cores: give each its fair share of intra-op threads (DESIGN.md).
  at::set_num_threads(mpi.threads_per_rank());
  try {
    return run(argc, argv, mpi);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint: rank %d: %s\n", mpi.world_rank(), e.what());
    weft::MpiRuntime::abort(2);
  }
}
