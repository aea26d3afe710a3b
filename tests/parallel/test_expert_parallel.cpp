// The alltoall dispatcher (ExpertParallel) against all experts run locally, under 2 and 4 MPI
// ranks (ep = world, one expert block per rank): outputs, the input gradient and every expert's
// weight gradient (summed over the tokens of all ranks) match; a rank whose experts receive no
// rows at all (every token routed to expert 0) still walks the protocol, forward and backward,
// and gets zero gradients.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "weft/comm/communicator.h"
#include "weft/comm/process_groups.h"
#include "weft/model/full_params.h"
#include "weft/model/moe.h"
#include "weft/model/transformer.h"
#include "weft/parallel/expert_parallel.h"

namespace weft {
namespace {

ModelConfig experts_config(int experts) {
  ModelConfig c;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.num_query_groups = 1;
  c.num_experts = experts;
  c.moe_router_topk = 1;
  c.moe_ffn_hidden_size = 6;
  return c;
}

// Rows of rank r sorted by expert with `counts` rows per expert; a function of (r, counts).
torch::Tensor rows_of(int r, int64_t n, int64_t h) {
  torch::manual_seed(100 + r);
  return torch::randn({n, h}, torch::kDouble);
}

void run_case(const std::vector<std::vector<int64_t>>& counts_by_rank) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int E = static_cast<int>(counts_by_rank[0].size()), local = E / world;
  const ModelConfig cfg = experts_config(E);
  LayoutConfig l;
  l.world_size = world;
  l.ep = world;
  Mesh mesh(l);
  ProcessGroups groups(mesh, Backend::kMpi);

  // This rank's experts in an FSDP unit over expert_fsdp_shard (one rank here).
  FsdpUnit unit("l.mlp.experts", expert_param_specs(cfg, "l.", rank * local, local),
                groups.get("expert_fsdp_shard"), torch::kDouble, torch::kCPU);
  unit.load_full([&](const ParamSpec& s) { return init_param(s, cfg, 3); });
  torch::Tensor grad = torch::zeros({unit.shard_numel()}, torch::kFloat);
  unit.set_grad_target(grad);
  ExpertParallel ep(&unit, groups.get("ep"), E, cfg.expert_mlp());

  auto total = [](const std::vector<int64_t>& c) {
    return std::accumulate(c.begin(), c.end(), int64_t{0});
  };
  torch::Tensor x = rows_of(rank, total(counts_by_rank[rank]), 8).requires_grad_(true);
  torch::Tensor y = ep.run(x, counts_by_rank[rank]);
  (y * 0.5).sum().backward();
  for (int i = 0; i < unit.num_params(); ++i) EXPECT_FALSE(unit.has_pending_grads(0));

  // Reference: every expert here, every rank's rows.
  FullParams full;
  std::vector<ParamHandle> fc1, fc2;
  for (const auto& s : expert_param_specs(cfg, "l.", 0, E))
    full.add(s, init_param(s, cfg, 3).to(torch::kDouble));
  for (int e = 0; e < E; ++e) {
    fc1.push_back(full.handle(e));
    fc2.push_back(full.handle(E + e));
  }
  torch::Tensor mine_ref;
  for (int r = 0; r < world; ++r) {
    torch::Tensor xr = rows_of(r, total(counts_by_rank[r]), 8).requires_grad_(true);
    torch::Tensor yr = grouped_expert_mlp(xr, counts_by_rank[r], fc1, fc2, cfg.expert_mlp());
    (yr * 0.5).sum().backward();
    if (r == rank) {
      EXPECT_TRUE(torch::allclose(y, yr, 1e-12, 1e-12));
      EXPECT_TRUE(torch::allclose(x.grad(), xr.grad(), 1e-12, 1e-12));
    }
  }
  for (int e = 0; e < local; ++e) {
    const int g = rank * local + e;
    for (auto [unit_index, full_index] : {std::pair{e, g}, std::pair{local + e, E + g}}) {
      const ShardSegment& seg = unit.segment(unit_index);
      const torch::Tensor got = grad.narrow(0, seg.offset, seg.numel()).to(torch::kDouble);
      const torch::Tensor want = full.grad(full_index).reshape({-1}).to(torch::kDouble);
      EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-9)) << "expert " << g;
    }
  }
}

TEST(ExpertParallel, MatchesLocalExperts) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int E = 2 * world;
  std::vector<std::vector<int64_t>> counts(world);
  for (int r = 0; r < world; ++r)
    for (int e = 0; e < E; ++e) counts[r].push_back((r + 2 * e) % 5);  // some zeros
  run_case(counts);
}

TEST(ExpertParallel, RankWithoutRowsWalksTheProtocol) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<std::vector<int64_t>> counts(world, std::vector<int64_t>(world, 0));
  for (int r = 0; r < world; ++r) counts[r][0] = 3 + r;  // everything to expert 0 (rank 0)
  run_case(counts);
}

}  // namespace
}  // namespace weft
