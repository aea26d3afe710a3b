// A CUDA graph of the work one callable queues on the device: captured once, replayed many
// times (`weft train --cuda-graph-impl local` replays each microbatch's forward and backward
// this way; train/trainer.h says under which conditions). Replaying skips the host: one launch
// instead of thousands of kernel launches through ATen and autograd, which is what a small
// model's step is bound by.
//
// What a captured graph relies on: every tensor it reads or writes that outlives the capture
// (weights, gradient buffers, inputs) keeps its address, and is updated in place; tensors the
// callable allocates come from the graph's own memory pool, which stays reserved while the
// graph lives; nothing in the callable reads device values on the host or depends on them for
// a shape. The CPU build has no graphs: cuda_graphs_available() is false there and capture()
// throws. Nothing here includes CUDA headers (device_graph_cuda.cpp does).
#pragma once

#include <functional>
#include <memory>

namespace weft {

// Whether this build can capture CUDA graphs (the CUDA build).
bool cuda_graphs_available();

class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Records the device work of fn() into the graph; nothing of it runs. The device is
  // synchronised and the allocator's cached blocks released first, and fn runs on a side
  // stream in thread-local capture mode: a forbidden call of fn (a host synchronisation, a
  // pageable copy) makes the capture fail, the error is thrown, and the graph stays unusable;
  // other threads' CUDA calls (the watchdog, the checkpoint writer) are not affected.
  void capture(const std::function<void()>& fn);
  // Queues the recorded work on the current stream. Requires a successful capture().
  void replay();
  bool captured() const { return captured_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool captured_ = false;
};

}  // namespace weft
