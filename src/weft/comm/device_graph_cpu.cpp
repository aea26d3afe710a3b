// CPU stand-in for device_graph_cuda.cpp (see device_graph.h): no graphs without CUDA.
#include "weft/comm/device_graph.h"

#include "weft/core/error.h"

namespace weft {

struct CudaGraph::Impl {};

bool cuda_graphs_available() { return false; }

CudaGraph::CudaGraph() = default;
CudaGraph::~CudaGraph() = default;

void CudaGraph::capture(const std::function<void()>&) {
  fail_usage("--cuda-graph-impl local: this weft was built without CUDA (CPU-only libtorch)");
}

void CudaGraph::replay() { fail("CudaGraph::replay: this weft was built without CUDA"); }

}  // namespace weft
