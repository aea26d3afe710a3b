// Profiling of iterations --profile-step-start + 1 .. --profile-step-end (1-based; Megatron
// starts when `start` iterations are done and stops after iteration `end`) on the ranks of
// --profile-ranks (default: every rank), with Megatron's flags and meanings:
//   --profile --use-pytorch-profiler: PyTorch's Kineto profiler records the CPU-side ATen ops and
//     every CUDA kernel, memcpy and memset, written as Chrome-trace JSON (chrome://tracing,
//     ui.perfetto.dev) to <--profile-dir>/trace_rank<R>.json; bench/gpu/trace_summary.py sums a
//     trace's kernel time by kind.
//   --profile alone: an Nsight Systems capture range, cudaProfilerStart() before the first
//     iteration and cudaProfilerStop() after the last, for a run under `nsys profile
//     --capture-range=cudaProfilerApi`; weft writes nothing itself.
//
// Both are reached only in the CUDA build (profiler_cuda.cpp): Debian's CPU libtorch 1.13 is
// built without Kineto, so a CPU build refuses --profile with a clear message
// (profiler_available()); the capture range also needs --device cuda.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace weft {

struct ProfileConfig {
  bool enabled = false;        // --profile
  int step_start = 10;         // --profile-step-start: iterations done before the window
  int step_end = 12;           // --profile-step-end: last profiled iteration (1-based)
  bool pytorch = false;        // --use-pytorch-profiler: Kineto trace, else nsys range
  std::vector<int> ranks;      // --profile-ranks (empty: every rank)
  std::string dir = "profile"; // --profile-dir
};

// Whether this build can trace (the Kineto profiler of the CUDA build).
bool profiler_available();
// Throws UsageError naming the flag for an unusable profile request. Local: no collectives.
void validate_profile_config(const ProfileConfig& p);

class IterationProfiler {
 public:
  IterationProfiler(const ProfileConfig& cfg, int rank);
  ~IterationProfiler();  // a trace still running is stopped and discarded
  IterationProfiler(const IterationProfiler&) = delete;
  IterationProfiler& operator=(const IterationProfiler&) = delete;

  void before_iteration(int iteration);  // starts at iteration step_start + 1
  // Stops at step_end, writes the trace and returns its path (empty otherwise).
  std::string after_iteration(int iteration);

 private:
  ProfileConfig cfg_;
  int rank_ = 0;
  bool active_ = false;  // this rank traces
  bool running_ = false;
};

}  // namespace weft
