// Gradient reductions after the schedule (grad_sync.h).
#include "weft/parallel/grad_sync.h"

#include "weft/comm/process_groups.h"
#include "weft/parallel/grad_access.h"
#include "weft/parallel/pipeline_stage.h"

namespace weft {

void all_reduce_stage_grads(PipelineStage& stage, const ProcessGroups& groups) {
  for (auto& u : stage.units())
    if (Communicator* rep = u->replicate_comm(); rep && rep->size() > 1)
      rep->all_reduce(grad_shard(*u), ReduceOp::kSum);
  if (stage.has_embedding_copy()) {
    FsdpUnit* e = stage.is_first() ? stage.embedding_unit() : stage.embedding_copy_unit();
    if (e) groups.get("embedding")->all_reduce(grad_shard(*e), ReduceOp::kSum);
  }
}

}  // namespace weft
