// bench_collectives: bandwidth of all_gather and reduce_scatter (sum) over the world group, per
// message size, for one backend and dtype. Run it under mpirun, e.g.
//   mpirun -np 4 bench_collectives --backend mpi --dtype fp32 --max-bytes 64M --iters 20
//
// Definitions follow nccl-tests: `bytes` is the size of the whole buffer (all_gather's output,
// reduce_scatter's input), time is the mean over --iters calls after --warmup calls, taken as
// the slowest rank's, algbw = bytes / time and busbw = algbw * (n-1)/n, the bytes each rank's
// link must carry. Baseline (STYLE.md rule 7): a local copy of the same bytes on one rank of
// the same run; `bus/copy` is busbw over that copy bandwidth. Timing is collective: every rank
// runs every size; a closing barrier (host-synchronising on NCCL) ends each timed loop.
// --distributed-timeout-minutes M runs the collective watchdog (comm/watchdog.h) as `weft train`
// does; comparing small sizes with and without it shows what watching each call costs.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include "weft/comm/communicator.h"
#include "weft/comm/mpi_runtime.h"

#include "bench_mpi.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"

namespace {

int64_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  const double v = std::stod(s, &pos);
  const std::string unit = s.substr(pos);
  double mult = 1;
  if (unit == "K" || unit == "KiB" || unit == "k") mult = 1024.0;
  else if (unit == "M" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) weft::fail_usage("--max-bytes/--min-bytes: unknown unit '{}' in '{}'", unit, s);
  return static_cast<int64_t>(v * mult);
}

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "fp16" || s == "float16") return at::kHalf;
  if (s == "fp64" || s == "float64") return at::kDouble;
  weft::fail_usage("--dtype: '{}' is not one of fp32, bf16, fp16, fp64", s);
}

std::string human(int64_t b) {
  if (b >= (int64_t{1} << 20)) return fmt::format("{}M", b >> 20);
  if (b >= 1024) return fmt::format("{}K", b >> 10);
  return std::to_string(b);
}

// Seconds per call of `fn`, the slowest rank's; `sync` ends the timed loop on every rank.
template <class Fn, class Sync>
double time_per_call(int warmup, int iters, Fn&& fn, Sync&& sync) {
  for (int i = 0; i < warmup; ++i) fn();
  sync();
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) fn();
  sync();
  double dt = (MPI_Wtime() - t0) / iters;
  MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return dt;
}

int run(int argc, char** argv, weft::MpiRuntime& mpi) {
  CLI::App app{"all_gather / reduce_scatter bandwidth per message size"};
  std::string backend = "mpi", dtype_name = "fp32", min_bytes = "1K", max_bytes = "64M";
  int iters = 20, warmup = 5;
  double watchdog_minutes = 0;
  app.add_option("--backend", backend, "mpi (CPU tensors) or nccl (CUDA tensors)");
  app.add_option("--dtype", dtype_name, "fp32, bf16, fp16 or fp64");
  app.add_option("--min-bytes", min_bytes, "smallest total buffer, e.g. 1K");
  app.add_option("--max-bytes", max_bytes, "largest total buffer, e.g. 64M (sizes step x4)");
  app.add_option("--iters", iters, "timed calls per size");
  app.add_option("--warmup", warmup, "untimed calls per size");
  app.add_option("--distributed-timeout-minutes", watchdog_minutes,
                 "run the collective watchdog with this timeout (0: no watchdog)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return mpi.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
  }
  if (backend != "mpi" && backend != "nccl")
    weft::fail_usage("--backend: '{}' is not mpi or nccl", backend);
  if (iters < 1 || warmup < 0) weft::fail_usage("--iters must be >= 1 and --warmup >= 0");
  const at::ScalarType dtype = parse_dtype(dtype_name);
  const int64_t lo = std::max<int64_t>(parse_bytes(min_bytes), 1), hi = parse_bytes(max_bytes);

  const bool nccl = backend == "nccl";
  at::Device dev(at::kCPU);
  if (nccl) {
    if (!at::hasCUDA()) weft::fail_usage("--backend nccl needs CUDA, and this build/run has none");
    auto* impl = c10::impl::getDeviceGuardImpl(at::kCUDA);
    dev = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(mpi.local_rank()));
    impl->setDevice(dev);
  }
  if (watchdog_minutes > 0) mpi.start_watchdog(watchdog_minutes * 60);
  const int n = mpi.world_size();
  weft::Mesh mesh(weft::LayoutConfig{.world_size = n});
  weft::ProcessGroups groups(mesh, nccl ? weft::Backend::kNccl : weft::Backend::kMpi);
  weft::Communicator& world = groups.world();
  const auto opts = at::TensorOptions().dtype(dtype).device(dev);
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));

  if (mpi.world_rank() == 0) {
    std::printf("# bench_collectives: %d ranks, backend %s (%s), dtype %s, %d iters after %d "
                "warm-up, MPI %s%s%s, watchdog %s\n",
                n, backend.c_str(), dev.str().c_str(), c10::toString(dtype), iters, warmup,
                weft::MpiRuntime::library_version().c_str(), nccl ? ", NCCL " : "",
                nccl ? weft::nccl_version().c_str() : "", watchdog_minutes > 0 ? "on" : "off");
    std::printf("# bytes: whole buffer; time in us; bandwidths in GB/s; bus/copy = busbw over a "
                "local copy of the same bytes\n");
    std::printf("%8s %12s | %10s %8s %8s %9s | %10s %8s %8s %9s | %8s\n", "bytes", "elements",
                "ag time", "algbw", "busbw", "bus/copy", "rs time", "algbw", "busbw", "bus/copy",
                "copy");
  }
  for (int64_t bytes = lo; bytes <= hi; bytes *= 4) {
    const int64_t shard = bytes / item / n;  // elements per rank
    if (shard == 0) continue;
    const int64_t total = shard * n, real_bytes = total * item;
    at::Tensor full = at::ones({total}, opts);
    at::Tensor part = at::ones({shard}, opts);
    at::Tensor copy_dst = at::empty({total}, opts);
    auto sync = [&] { world.barrier(); };
    const double t_ag = time_per_call(warmup, iters, [&] { world.all_gather(part, full); }, sync);
    const double t_rs = time_per_call(
        warmup, iters, [&] { world.reduce_scatter(full, part, weft::ReduceOp::kSum); }, sync);
    const double t_cp = time_per_call(warmup, iters, [&] { copy_dst.copy_(full); }, sync);
    const double gb = static_cast<double>(real_bytes) / 1e9, bus = (n - 1.0) / n;
    const double copy_bw = gb / t_cp;
    if (mpi.world_rank() == 0)
      std::printf("%8s %12lld | %10.1f %8.2f %8.2f %9.3f | %10.1f %8.2f %8.2f %9.3f | %8.2f\n",
                  human(real_bytes).c_str(), static_cast<long long>(total), t_ag * 1e6, gb / t_ag,
                  gb / t_ag * bus, gb / t_ag * bus / copy_bw, t_rs * 1e6, gb / t_rs,
                  gb / t_rs * bus, gb / t_rs * bus / copy_bw, copy_bw);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return weft::bench::bench_main(argc, argv, "bench_collectives", run);
}
