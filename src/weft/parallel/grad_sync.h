// The gradient reductions after the 1F1B schedule, beyond each unit's reduce-scatter over its
// shard group (which runs inside backward, fsdp_unit.h): the HSDP all-reduce over the replica
// group, and the tied embedding's all-reduce between the first and the last stage.
#pragma once

namespace weft {

class PipelineStage;
class ProcessGroups;

// Sums every unit's gradient shard over its replicate group (HSDP, --num-distributed-
// optimizer-instances > 1), then the tied embedding's shard over the "embedding" group (the
// first stage's embedding and the last stage's copy, which then hold the same sum). Collective
// over those groups; call once per step, after the schedule.
void all_reduce_stage_grads(PipelineStage& stage, const ProcessGroups& groups);

}  // namespace weft
