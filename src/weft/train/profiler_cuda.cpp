// The CUDA side of the iteration profiler (see profiler.h), CUDA build only: CPU ops and CUDA
// activity (kernels, memcpy, memset) recorded between kineto_start() and
// kineto_stop_and_save(), saved as Chrome-trace JSON; and the Nsight Systems capture range.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>
#include <string>

#include "weft/core/error.h"

namespace weft {
namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

ProfilerConfig kineto_config() { return ProfilerConfig(ProfilerState::KINETO); }
std::set<ActivityType> kineto_activities() { return {ActivityType::CPU, ActivityType::CUDA}; }

}  // namespace

void kineto_start() {
  prof::prepareProfiler(kineto_config(), kineto_activities());
  prof::enableProfiler(kineto_config(), kineto_activities());
}

void kineto_stop_and_save(const std::string& path) {
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  if (!path.empty()) {
    WEFT_CHECK(result != nullptr, "profiler: no result to save to {}", path);
    result->save(path);
  }
}

void cuda_profiler_range(bool start) {
  const cudaError_t e = start ? cudaProfilerStart() : cudaProfilerStop();
  WEFT_CHECK(e == cudaSuccess, "--profile: {} failed: {}",
             start ? "cudaProfilerStart" : "cudaProfilerStop", cudaGetErrorString(e));
}

}  // namespace weft
