// Test support: invariant 8 observed — the first pipeline stage's embedding and the last
// stage's copy of it (tied output layer, MTP) stay bitwise equal: weights, master weights and
// both moments.
#pragma once

#include <gtest/gtest.h>

#include <ATen/Functions.h>

#include <cstddef>

#include "weft/comm/process_groups.h"
#include "weft/train/trainer.h"

namespace weft::test {

// Expects this rank's embedding shard (first stage) or copy shard (last stage) bitwise equal
// to its counterpart on the other end of the "embedding" group. Collective over that group:
// every member calls it at the same step (run_job's `inspect` does); ranks without an
// embedding copy in their stage return at once.
inline void expect_embedding_copies_equal(Trainer& t, const ProcessGroups& g) {
  PipelineStage& s = t.stage();
  if (!s.has_embedding_copy()) return;
  Communicator* emb = g.get("embedding");
  if (!emb) return;
  FsdpUnit* u = s.is_first() ? s.embedding_unit() : s.embedding_copy_unit();
  ASSERT_NE(u, nullptr);
  size_t k = 0;
  while (t.optimizer().units()[k] != u) ++k;
  const UnitOptimState& st = t.optimizer().state(k);
  for (const at::Tensor& x : {u->param_shard(), st.master, st.exp_avg, st.exp_avg_sq}) {
    at::Tensor both = at::empty({2, x.numel()}, x.options());
    emb->all_gather(x.contiguous(), both.view({-1}));
    EXPECT_TRUE(at::equal(both[0], both[1]))
        << "embedding copies differ after iteration " << t.iteration();
  }
}

}  // namespace weft::test
