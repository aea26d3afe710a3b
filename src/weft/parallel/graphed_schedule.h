// The schedule of a stage of one (pp = 1) with its microbatches replayed from a CUDA graph
// (`weft train --cuda-graph-impl local`): the forward and backward of microbatch 0 of the first
// call is captured once (comm/device_graph.h), and every microbatch of every call copies its
// tokens and labels into the graph's input buffers and replays it. What run_1f1b would compute,
// bit for bit: the gradients accumulate in place in the units' gradient buffers and the losses
// in the stage's losses(), both zeroed (eagerly) by their owners before a step.
//
// The caller guarantees what a replay cannot re-check (train/trainer.cpp validates it): one
// pipeline stage, FSDP shard groups of one rank (no collective inside the graph), no routed
// experts (no data-dependent shapes), and the same micro-batch shape and loss scale every step.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

#include "weft/parallel/pipeline_stage.h"
#include "weft/parallel/schedule.h"

namespace weft {

class CudaGraph;

class GraphedMicrobatches {
 public:
  GraphedMicrobatches();
  ~GraphedMicrobatches();

  // One step's forward and backward over `num_microbatches` microbatches, batch(m) fetched
  // before the replay of microbatch m (never inside the capture). Returns the stage's losses()
  // as run_1f1b does. A failed capture throws weft::Error naming --cuda-graph-impl.
  at::Tensor run(PipelineStage& stage, int num_microbatches,
                 const std::function<Microbatch(int)>& batch, double loss_scale);
  bool captured() const { return graph_ != nullptr; }

 private:
  std::unique_ptr<CudaGraph> graph_;
  at::Tensor tokens_, labels_;  // the graph's input buffers
};

}  // namespace weft
