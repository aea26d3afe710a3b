// Microbatches replayed from a CUDA graph (see graphed_schedule.h).
#include "weft/parallel/graphed_schedule.h"

#include <ATen/ops/empty_like.h>

#include <exception>

#include "weft/comm/device_graph.h"
#include "weft/core/error.h"

namespace weft {

GraphedMicrobatches::GraphedMicrobatches() = default;
GraphedMicrobatches::~GraphedMicrobatches() = default;

at::Tensor GraphedMicrobatches::run(PipelineStage& stage, int num_microbatches,
                                    const std::function<Microbatch(int)>& batch,
                                    double loss_scale) {
  WEFT_CHECK(stage.num_stages() == 1, "a graphed schedule needs one pipeline stage, not {}",
             stage.num_stages());
  stage.reset_losses();
  for (int m = 0; m < num_microbatches; ++m) {
    const Microbatch b = batch(m);
    // The graph records the tensors it reads: a loss mask would be one microbatch's.
    WEFT_CHECK(!b.loss.mask.defined(), "a CUDA graph cannot replay a loss mask (--eod-mask-loss)");
    if (!graph_) {
      // Recorded, not run: microbatch 0's stage bookkeeping (a stage of one) is the same for
      // every replay.
      tokens_ = at::empty_like(b.tokens);
      labels_ = at::empty_like(b.labels);
      auto graph = std::make_unique<CudaGraph>();
      try {
        graph->capture([&] {
          const at::Tensor out = stage.forward(0, tokens_, labels_, loss_scale, b.loss);
          stage.backward(0, out, at::Tensor());
        });
      } catch (const std::exception& e) {
        fail("--cuda-graph-impl local: capturing the forward and backward of a microbatch "
             "failed (run without the flag): {}", e.what());
      }
      graph_ = std::move(graph);
    }
    tokens_.copy_(b.tokens, /*non_blocking=*/true);
    labels_.copy_(b.labels, /*non_blocking=*/true);
    graph_->replay();
  }
  return stage.losses();
}

}  // namespace weft
