// Expert parallelism: the alltoall token dispatcher (--moe-token-dispatcher-type alltoall).
//
// The ep group of the mesh splits a layer's E experts into ep contiguous blocks: ep rank r holds
// global experts [r*E/ep, (r+1)*E/ep), their weights in one FSDP unit sharded over the
// expert_fsdp_shard group. The model hands over its rows sorted by global expert (moe.h); the
// dispatcher
//   1. exchanges the per-expert row counts with one all-to-all of int64 over the ep group,
//   2. sends each rank the rows of its experts (all-to-all of rows, source-major on arrival),
//   3. regroups the arrivals expert-major (for each local expert, the rows from source 0, then
//      source 1, ...), runs the local experts, and restores the arrival order,
//   4. sends the outputs back with the inverse all-to-all.
// Both all-to-alls are autograd functions whose backward is the opposite exchange, so the
// backward walks the same protocol. Every member of the ep group calls run() for every MoE layer
// and microbatch, also with no rows to send (invariant 6). The fixed source order makes the
// result deterministic; with ep = 1 nothing is communicated.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "weft/comm/communicator.h"
#include "weft/model/moe.h"
#include "weft/parallel/fsdp_unit.h"

namespace weft {

// Uneven all-to-all of rows [N, ...] along dim 0 with autograd: send_rows[i] rows go to group
// rank i; recv_rows[i] rows arrive from rank i. The gradient takes the reverse path.
at::Tensor all_to_all_rows(Communicator& comm, const at::Tensor& x,
                           const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows);

class ExpertParallel : public MoeExperts {
 public:
  // `experts` holds this rank's experts as expert_param_specs(cfg, prefix, first, E/ep) (fc1 of
  // each, then fc2 of each); `ep` is the mesh's ep group. Both must outlive this object.
  ExpertParallel(FsdpUnit* experts, Communicator* ep, int num_experts, const MlpSpec& spec,
                 bool grouped_gemm = false);
  at::Tensor run(const at::Tensor& rows, const std::vector<int64_t>& counts) override;

 private:
  Communicator* ep_;
  int num_experts_, local_;
  MlpSpec spec_;
  bool grouped_gemm_;
  std::vector<ParamHandle> fc1_, fc2_;
};

}  // namespace weft
