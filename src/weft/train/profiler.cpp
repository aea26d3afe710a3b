// Iteration profiler (see profiler.h): flag checks and the start/stop window; the Kineto calls
// live in profiler_cuda.cpp, built only with the CUDA path.
#include "weft/train/profiler.h"

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>

#include "weft/comm/device.h"
#include "weft/core/error.h"

namespace weft {

#if defined(WEFT_WITH_CUDA)
void kineto_start();
void kineto_stop_and_save(const std::string& path);  // empty path: discard
void cuda_profiler_range(bool start);                // cudaProfilerStart / cudaProfilerStop
#endif

bool profiler_available() {
#if defined(WEFT_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

void validate_profile_config(const ProfileConfig& p) {
  if (!p.enabled) return;
  if (!profiler_available())
    fail_usage("--profile needs the CUDA build of weft (the Kineto profiler and the CUDA "
               "profiler API are not part of this CPU-only libtorch)");
  if (p.step_start < 0) fail_usage("--profile-step-start must be >= 0 (got {})", p.step_start);
  if (p.step_end <= p.step_start)
    fail_usage("--profile-step-end ({}) must be > --profile-step-start ({}): the profiled "
               "iterations are start+1..end, as Megatron's", p.step_end, p.step_start);
  if (p.pytorch && p.dir.empty()) fail_usage("--profile-dir must not be empty");
  for (int r : p.ranks)
    if (r < 0) fail_usage("--profile-ranks: rank {} is negative", r);
}

IterationProfiler::IterationProfiler(const ProfileConfig& cfg, int rank) : cfg_(cfg), rank_(rank) {
  active_ = cfg.enabled && (cfg.ranks.empty() ||
                            std::find(cfg.ranks.begin(), cfg.ranks.end(), rank) != cfg.ranks.end());
  if (active_ && cfg.pytorch) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.dir, ec);
    if (ec) fail_usage("--profile-dir {}: {}", cfg.dir, ec.message());
  }
}

IterationProfiler::~IterationProfiler() {
#if defined(WEFT_WITH_CUDA)
  if (running_) {
    try {
      if (cfg_.pytorch) kineto_stop_and_save("");
      else cuda_profiler_range(false);
    } catch (...) {
    }
  }
#endif
}

void IterationProfiler::before_iteration(int iteration) {
  if (!active_ || running_ || iteration != cfg_.step_start + 1) return;
#if defined(WEFT_WITH_CUDA)
  if (cfg_.pytorch) kineto_start();
  else cuda_profiler_range(true);
  running_ = true;
#endif
}

std::string IterationProfiler::after_iteration(int iteration) {
  if (!running_ || iteration < cfg_.step_end) return {};
  running_ = false;
  std::string path;
#if defined(WEFT_WITH_CUDA)
  // The last step's optimizer may still run (train_step does not wait for it): let it finish
  // inside the profiled window.
  if (cuda_device_count() > 0) device_synchronize(c10::Device(c10::kCUDA));
  if (!cfg_.pytorch) {
    cuda_profiler_range(false);
    return {};
  }
  path = (std::filesystem::path(cfg_.dir) / fmt::format("trace_rank{}.json", rank_)).string();
  kineto_stop_and_save(path);
#endif
  return path;
}

}  // namespace weft
