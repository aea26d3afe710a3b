// The non-interleaved 1F1B pipeline schedule over the pp group.
//
// Stage s of P runs min(P-s-1, M) warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards. Activations go to the next stage and
// gradients to the previous one by point-to-point transfers on the pp communicator; a send
// and the opposite-direction receive that follow each other are posted as one batch, so two
// neighbouring stages never wait on each other. Every member of the pp group walks the same
// schedule, so the transfers always pair up.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

#include "weft/comm/communicator.h"
#include "weft/parallel/pipeline_stage.h"

namespace weft {

struct Microbatch {
  at::Tensor tokens;  // [b, s] int64, used by the first stage
  at::Tensor labels;  // [b, s] int64, used by the last stage
  LossOptions loss;    // how the last stage weighs the losses (pipeline_stage.h)
};

// Runs one step's forward and backward over `num_microbatches` microbatches. `batch(m)` gives
// microbatch m (called on every stage: the first takes its tokens, the last its labels, every
// one its LossOptions; a middle stage's needs no tokens or labels). `pp` is the pipeline communicator (size 1
// with pp = 1). Returns this rank's share of the step's logged losses, the stage's losses()
// [lm, aux, mtp, z] (float64 on the stage's device, see pipeline_stage.h): summed there in
// microbatch order, so the step needs no host synchronisation. Stages without an lm or MTP
// head contribute zeros for them.
at::Tensor run_1f1b(PipelineStage& stage, Communicator& pp, int num_microbatches,
                int micro_batch_size, const std::function<Microbatch(int)>& batch,
                double loss_scale);

// Forward only (evaluation): every microbatch through the stages in order, under no-grad, with
// the same transfers as 1F1B's forwards; no gradient state is touched. Returns the stage's
// losses() as run_1f1b does.
at::Tensor run_forward_only(PipelineStage& stage, Communicator& pp, int num_microbatches,
                            int micro_batch_size, const std::function<Microbatch(int)>& batch,
                            double loss_scale);

}  // namespace weft
