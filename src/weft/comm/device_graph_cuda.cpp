// CUDA graphs (see device_graph.h) through ATen's at::cuda::CUDAGraph, which routes the
// capture's allocations into a private pool of the caching allocator; built only with CUDA.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "weft/comm/device_graph.h"
#include "weft/core/error.h"

namespace weft {

struct CudaGraph::Impl {
  at::cuda::CUDAGraph graph;
};

bool cuda_graphs_available() { return true; }

CudaGraph::CudaGraph() : impl_(std::make_unique<Impl>()) {}
CudaGraph::~CudaGraph() = default;

void CudaGraph::capture(const std::function<void()>& fn) {
  WEFT_CHECK(!captured_, "CudaGraph::capture: already captured");
  // Everything queued so far is finished, and the blocks the eager steps left cached go back
  // to the device, so the graph's pool can take them.
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  // Capture needs a stream other than the default one; the autograd engine runs backward on
  // the streams its forward ran on, so it is captured too.
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    // Thread-local mode: a forbidden call on this thread fails the capture, while the other
    // threads of the process (the collective watchdog, the asynchronous checkpoint writer) go
    // on calling CUDA; the autograd thread only queues work on the captured stream.
    impl_->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      fn();
    } catch (...) {
      try {
        impl_->graph.capture_end();  // ends the capture and the pool's routing; fails itself
      } catch (...) {
      }
      throw;
    }
    impl_->graph.capture_end();
  }
  c10::cuda::device_synchronize();
  captured_ = true;
}

void CudaGraph::replay() {
  WEFT_CHECK(captured_, "CudaGraph::replay before a successful capture");
  impl_->graph.replay();
}

}  // namespace weft
