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
#include <functional>
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

#include "bench_mpi.h"
#include "ckpt_phases.h"
#include "disk_io.h"

namespace {
namespace fs = std::filesystem;
using namespace weft::bench;
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

// The raw sequential baseline of one round: each rank writes and reads back as many bytes as its
// share of the checkpoint just saved (its shard file; rank 0 also everything else), from the
// reused block buffer and from a state-sized buffer.
struct RawBaseline {
  int rank;
  std::string dir, save_dir, raw_path;
  std::vector<char> buf;  // one pre-touched block, reused by every write and read call

  void round(Sample& s, const std::function<void(int64_t)>& warm) {
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
    if (big_bytes_ != mine) {
      big_.reset(new char[static_cast<size_t>(std::max<int64_t>(mine, 1))]);
      for (int64_t i = 0; i < mine; ++i) big_[i] = static_cast<char>(i * 131 + 7);
      big_bytes_ = mine;
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
    one(kRawWriteBig, kRawReadBig, big_.get(), true);
  }

  // The state-sized buffer: as large as this rank's share, allocated and filled once (like the
  // training state) on the first round, when the share is known.
  std::unique_ptr<char[]> big_;
  int64_t big_bytes_ = 0;
};

// The medians, minima and maxima over the rounds, and whether eviction worked (rank 0).
void print_summary(const std::vector<Sample>& samples) {
  const Sample& last = samples.back();
  std::printf("# summary over %d repeats: save %lld bytes, load read %lld bytes\n",
              static_cast<int>(samples.size()), static_cast<long long>(last.save_bytes),
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

  RawBaseline raw{rank, dir, save_dir, raw_path, std::move(buf), nullptr, 0};

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
    if (prewarm) prewarm_page_cache(warm_path, my_bytes, raw.buf);
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
    // Alternate the order between rounds so that neither side always runs on a fresher device.
    // The first round saves first, so the raw files match the shard files exactly.
    if (r % 2 == 0) {
      checkpoint_round();
      raw.round(s, warm);
    } else {
      raw.round(s, warm);
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

  if (rank == 0) print_summary(samples);
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
  return weft::bench::bench_main(argc, argv, "bench_checkpoint", run);
}
