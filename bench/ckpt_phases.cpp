// Instrumented copies of the library's per-rank save and load steps (ckpt_phases.h).
#include "ckpt_phases.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

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
#include "disk_io.h"

namespace weft::bench {
namespace fs = std::filesystem;
namespace {
const char* const kStateKinds[] = {"fp32_param", "exp_avg", "exp_avg_sq"};
}  // namespace

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

}  // namespace weft::bench
