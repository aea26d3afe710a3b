// Mesh tests: DESIGN.md's worked examples, the PP-aware FSDP regression, the refusals, and
// exhaustive property tests over every valid layout up to world 64, both orders, HSDP included.
// The reference for small worlds is a brute-force construction written from DESIGN.md's words
// (ranks that differ only along the group's axes), independent of the mesh's stride walk.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "weft/core/error.h"
#include "weft/mesh/mesh.h"

namespace weft {
namespace {

using Groups = std::vector<Group>;

LayoutConfig layout(int world, int tp, int cp, int pp, int ep, int etp, int outer, bool map) {
  LayoutConfig c;
  c.world_size = world;
  c.tp = tp;
  c.cp = cp;
  c.pp = pp;
  c.ep = ep;
  c.etp = etp;
  c.dp_outer = outer;
  c.tp_pp_dp_mapping = map;
  return c;
}

TEST(Mesh, WorkedExamplePp2Ep2) {
  Mesh m(layout(8, 1, 1, 2, 2, -1, 1, false));
  EXPECT_EQ(m.dp(), 4);
  EXPECT_EQ(m.edp(), 2);
  EXPECT_EQ(m.groups("dp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(m.groups("pp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.groups("ep"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.groups("edp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.groups("embedding"), m.groups("pp"));
  EXPECT_EQ(m.groups("fsdp_shard"), m.groups("dp"));
  EXPECT_EQ(m.groups("expert_fsdp_shard"), m.groups("edp"));
  EXPECT_EQ(m.groups("fsdp_replicate").size(), 8u);
}

TEST(Mesh, WorkedExampleHsdp) {
  Mesh m(layout(8, 1, 1, 2, 1, -1, 2, false));
  EXPECT_EQ(m.groups("fsdp_shard"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.groups("fsdp_replicate"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

// Megatron-FSDP built its mesh from stage-local sizes and broke with PP > 1: with world 8 and
// pp 2, FSDP groups must have 4 members each and no rank may be in two of them.
TEST(Mesh, RegressionPipelineAwareFsdpGroups) {
  for (bool map : {false, true}) {
    Mesh m(layout(8, 1, 1, 2, 1, -1, 1, map));
    const auto& shard = m.groups("fsdp_shard");
    ASSERT_EQ(shard.size(), 2u);
    std::set<int> seen;
    for (const auto& g : shard) {
      EXPECT_EQ(g.size(), 4u);
      for (int r : g) EXPECT_TRUE(seen.insert(r).second) << "rank " << r << " in two groups";
    }
    // Every FSDP group lies inside one pipeline stage.
    for (const auto& g : shard)
      for (int r : g) EXPECT_EQ(m.coord(r, "pp"), m.coord(g[0], "pp"));
  }
}

TEST(Mesh, TpPpDpMapping) {
  Mesh m(layout(8, 2, 1, 2, 1, -1, 1, true));
  EXPECT_EQ(m.order(), "tp-cp-ep-pp-dp");
  EXPECT_EQ(m.groups("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.groups("pp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.groups("dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

void expect_usage_error(const LayoutConfig& c, const std::string& needle) {
  try {
    Mesh m(c);
    ADD_FAILURE() << "layout accepted, expected an error containing: " << needle;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Mesh, Refusals) {
  expect_usage_error(layout(10, 1, 1, 4, 1, -1, 1, false), "tp*cp*pp = 1*1*4 = 4");
  expect_usage_error(layout(8, 1, 1, 2, 4, 2, 1, false), "etp*ep*pp = 2*4*2 = 16");
  expect_usage_error(layout(8, 1, 1, 2, 2, -1, 3, false),
                     "--num-distributed-optimizer-instances 3 does not divide");
  expect_usage_error(layout(8, 2, 1, 2, 1, 1, 1, true), "dense and expert pipeline groups differ");
  // pp = 1: the pipeline groups are single ranks in both decompositions (Megatron accepts).
  EXPECT_NO_THROW(validate_layout(layout(8, 1, 2, 1, 1, -1, 1, true)));
  expect_usage_error(layout(8, 0, 1, 1, 1, -1, 1, false), "--tensor-model-parallel-size must be >= 1");
  expect_usage_error(layout(8, 1, 1, -2, 1, -1, 1, false), "--pipeline-model-parallel-size");
  expect_usage_error(layout(0, 1, 1, 1, 1, -1, 1, false), "--world-size");
  expect_usage_error(layout(8, 1, 1, 1, 1, 0, 1, false), "--expert-tensor-parallel-size");
  // dp_outer divides dp*cp but not edp.
  expect_usage_error(layout(8, 1, 1, 1, 8, 1, 2, false), "expert FSDP group");
}

// --- exhaustive properties ---------------------------------------------------------------

struct Axes {
  std::vector<std::string> names;  // fastest first
  std::vector<int> sizes;
};

Axes dense_axes(const Mesh& m) {
  if (m.config().tp_pp_dp_mapping) return {{"tp", "cp", "pp", "dp"}, {m.tp(), m.cp(), m.pp(), m.dp()}};
  return {{"tp", "cp", "dp", "pp"}, {m.tp(), m.cp(), m.dp(), m.pp()}};
}
Axes expert_axes(const Mesh& m) {
  if (m.config().tp_pp_dp_mapping) return {{"etp", "ep", "pp", "edp"}, {m.etp(), m.ep(), m.pp(), m.edp()}};
  return {{"etp", "ep", "edp", "pp"}, {m.etp(), m.ep(), m.edp(), m.pp()}};
}

// Coordinates written independently: peel sizes off the rank, fastest first.
std::vector<int> coords(const Axes& a, int r) {
  std::vector<int> c;
  for (int s : a.sizes) {
    c.push_back(r % s);
    r /= s;
  }
  return c;
}

// Brute force: the ranks whose coordinates outside `axes` equal r's, ordered by their index
// along `axes` (first axis of the decomposition fastest).
Group brute_group(const Axes& a, int world, int r, const std::vector<std::string>& axes) {
  auto in = [&](size_t i) {
    return std::find(axes.begin(), axes.end(), a.names[i]) != axes.end();
  };
  auto cr = coords(a, r);
  std::vector<std::pair<long, int>> members;
  for (int s = 0; s < world; ++s) {
    auto cs = coords(a, s);
    bool same = true;
    long idx = 0, mul = 1;
    for (size_t i = 0; i < a.names.size(); ++i) {
      if (in(i)) {
        idx += cs[i] * mul;
        mul *= a.sizes[i];
      } else if (cs[i] != cr[i]) {
        same = false;
      }
    }
    if (same) members.push_back({idx, s});
  }
  std::sort(members.begin(), members.end());
  Group g;
  for (auto& [i, s] : members) g.push_back(s);
  return g;
}

void check_partition(const Mesh& m, const std::string& kind, size_t size) {
  std::vector<int> count(m.world_size(), 0);
  int prev_first = -1;
  for (const auto& g : m.groups(kind)) {
    ASSERT_EQ(g.size(), size) << kind;
    ASSERT_GT(g[0], prev_first) << kind << " not sorted by first rank";
    prev_first = g[0];
    for (int r : g) ++count[r];
  }
  for (int r = 0; r < m.world_size(); ++r) ASSERT_EQ(count[r], 1) << kind << " rank " << r;
}

void check_orthogonal(const Mesh& m, const std::string& a, const std::string& b, int r) {
  const Group& ga = m.group_of(a, r);
  const Group& gb = m.group_of(b, r);
  std::set<int> sa(ga.begin(), ga.end());
  int common = 0;
  for (int x : gb) common += sa.count(x);
  ASSERT_EQ(common, 1) << a << " x " << b << " at rank " << r;
}

void check_mesh(const Mesh& m, bool brute) {
  const int w = m.world_size();
  const int D = m.dp() * m.cp(), N = m.dp_outer();
  ASSERT_EQ(m.tp() * m.cp() * m.dp() * m.pp(), w);
  ASSERT_EQ(m.etp() * m.ep() * m.edp() * m.pp(), w);
  check_partition(m, "tp", m.tp());
  check_partition(m, "cp", m.cp());
  check_partition(m, "dp", m.dp());
  check_partition(m, "pp", m.pp());
  check_partition(m, "dp_cp", D);
  check_partition(m, "tp_pp", m.tp() * m.pp());
  check_partition(m, "tp_cp", m.tp() * m.cp());
  check_partition(m, "tp_dp_cp", m.tp() * D);
  check_partition(m, "ep", m.ep());
  check_partition(m, "etp", m.etp());
  check_partition(m, "edp", m.edp());
  check_partition(m, "etp_ep", m.etp() * m.ep());
  check_partition(m, "etp_ep_pp", m.etp() * m.ep() * m.pp());
  check_partition(m, "fsdp_shard", D / N);
  check_partition(m, "fsdp_replicate", N);
  check_partition(m, "expert_fsdp_shard", m.edp() / N);
  check_partition(m, "expert_fsdp_replicate", N);

  const Axes dn = dense_axes(m), ex = expert_axes(m);
  for (int r = 0; r < w; ++r) {
    // group rank = coordinate
    for (const char* a : {"tp", "cp", "dp", "pp"}) ASSERT_EQ(m.group_rank(a, r), m.coord(r, a)) << a;
    for (const char* a : {"etp", "ep", "edp"}) ASSERT_EQ(m.group_rank(a, r), m.coord(r, a)) << a;
    ASSERT_EQ(m.group_rank("dp_cp", r), m.coord(r, "cp") + m.cp() * m.coord(r, "dp"));
    // orthogonality within each decomposition
    for (const char* a : {"tp", "cp", "dp"}) check_orthogonal(m, a, "pp", r);
    check_orthogonal(m, "tp", "cp", r);
    check_orthogonal(m, "tp", "dp", r);
    check_orthogonal(m, "cp", "dp", r);
    check_orthogonal(m, "etp", "ep", r);
    check_orthogonal(m, "ep", "edp", r);
    check_orthogonal(m, "edp", "pp", r);
    check_orthogonal(m, "fsdp_shard", "fsdp_replicate", r);
    check_orthogonal(m, "expert_fsdp_shard", "expert_fsdp_replicate", r);
    check_orthogonal(m, "fsdp_shard", "pp", r);
    // dense and expert pipeline groups are the same
    ASSERT_EQ(m.group_of("pp", r), brute_group(ex, w, r, {"pp"})) << "expert pp differs";
    // HSDP: shard x replicate = the dp-cp group; shard groups are contiguous slices of it
    {
      const Group& dpcp = m.group_of("dp_cp", r);
      const Group& sh = m.group_of("fsdp_shard", r);
      const Group& rep = m.group_of("fsdp_replicate", r);
      std::set<int> prod;
      for (int x : rep) {
        int base = m.group_rank("dp_cp", x) / (D / N) * (D / N);
        for (int k = 0; k < D / N; ++k) prod.insert(dpcp[base + k]);
      }
      ASSERT_EQ(prod, std::set<int>(dpcp.begin(), dpcp.end()));
      int gr = m.group_rank("dp_cp", r);
      ASSERT_EQ(sh, Group(dpcp.begin() + gr / (D / N) * (D / N), dpcp.begin() + gr / (D / N) * (D / N) + D / N));
      ASSERT_EQ(m.group_rank("fsdp_shard", r), gr % (D / N));
      ASSERT_EQ(m.group_rank("fsdp_replicate", r), gr / (D / N));
      const Group& eg = m.group_of("edp", r);
      const Group& esh = m.group_of("expert_fsdp_shard", r);
      int egr = m.group_rank("edp", r), es = m.edp() / N;
      ASSERT_EQ(esh, Group(eg.begin() + egr / es * es, eg.begin() + egr / es * es + es));
    }
    // embedding: first and last of the pipeline group
    const Group& pg = m.group_of("pp", r);
    bool edge = r == pg.front() || r == pg.back();
    ASSERT_EQ(m.has_group("embedding", r), edge);
    if (edge) {
      Group want = m.pp() == 1 ? Group{r} : Group{pg.front(), pg.back()};
      ASSERT_EQ(m.group_of("embedding", r), want);
    }
    if (brute) {
      ASSERT_EQ(m.group_of("tp", r), brute_group(dn, w, r, {"tp"}));
      ASSERT_EQ(m.group_of("cp", r), brute_group(dn, w, r, {"cp"}));
      ASSERT_EQ(m.group_of("dp", r), brute_group(dn, w, r, {"dp"}));
      ASSERT_EQ(m.group_of("dp_cp", r), brute_group(dn, w, r, {"dp", "cp"}));
      ASSERT_EQ(m.group_of("pp", r), brute_group(dn, w, r, {"pp"}));
      ASSERT_EQ(m.group_of("tp_pp", r), brute_group(dn, w, r, {"tp", "pp"}));
      ASSERT_EQ(m.group_of("tp_cp", r), brute_group(dn, w, r, {"tp", "cp"}));
      ASSERT_EQ(m.group_of("tp_dp_cp", r), brute_group(dn, w, r, {"tp", "dp", "cp"}));
      ASSERT_EQ(m.group_of("ep", r), brute_group(ex, w, r, {"ep"}));
      ASSERT_EQ(m.group_of("etp", r), brute_group(ex, w, r, {"etp"}));
      ASSERT_EQ(m.group_of("edp", r), brute_group(ex, w, r, {"edp"}));
      ASSERT_EQ(m.group_of("etp_ep", r), brute_group(ex, w, r, {"etp", "ep"}));
      ASSERT_EQ(m.group_of("etp_ep_pp", r), brute_group(ex, w, r, {"etp", "ep", "pp"}));
      auto c = coords(dn, r);
      for (size_t i = 0; i < dn.names.size(); ++i) ASSERT_EQ(m.coord(r, dn.names[i]), c[i]);
    }
  }
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Whether the dense and the expert decompositions put every rank in the same pipeline group.
bool same_pipeline_groups(int w, int tp, int cp, int pp, int ep, int etp, bool map) {
  const int dp = w / (tp * cp * pp), edp = w / (etp * ep * pp);
  Axes dense = map ? Axes{{"tp", "cp", "pp", "dp"}, {tp, cp, pp, dp}}
                   : Axes{{"tp", "cp", "dp", "pp"}, {tp, cp, dp, pp}};
  Axes expert = map ? Axes{{"etp", "ep", "pp", "edp"}, {etp, ep, pp, edp}}
                    : Axes{{"etp", "ep", "edp", "pp"}, {etp, ep, edp, pp}};
  for (int r = 0; r < w; ++r)
    if (brute_group(dense, w, r, {"pp"}) != brute_group(expert, w, r, {"pp"})) return false;
  return true;
}

TEST(Mesh, EveryValidLayoutUpToWorld64) {
  long valid = 0, refused = 0;
  for (int w = 1; w <= 64; ++w) {
    for (int tp : divisors(w))
      for (int cp : divisors(w / tp))
        for (int pp : divisors(w / tp / cp))
          for (int etp : divisors(w / pp))
            for (int ep : divisors(w / pp / etp))
              for (int outer : divisors(w))
                for (bool map : {false, true}) {
                  LayoutConfig c = layout(w, tp, cp, pp, ep, etp, outer, map);
                  bool ok = true;
                  try {
                    validate_layout(c);
                  } catch (const UsageError&) {
                    ok = false;
                  }
                  // Validity written independently of validate_layout: the dense and the
                  // expert decompositions must give the same pipeline group to every rank
                  // (brute force), and HSDP must divide both FSDP groups.
                  int dp = w / (tp * cp * pp), edp = w / (etp * ep * pp);
                  bool want = (dp * cp) % outer == 0 && edp % outer == 0 &&
                              same_pipeline_groups(w, tp, cp, pp, ep, etp, map);
                  ASSERT_EQ(ok, want) << "w" << w << " tp" << tp << " cp" << cp << " pp" << pp
                                      << " etp" << etp << " ep" << ep << " outer" << outer;
                  if (!ok) {
                    ++refused;
                    continue;
                  }
                  ++valid;
                  Mesh m(c);
                  check_mesh(m, w <= 16);
                  if (HasFatalFailure()) {
                    ADD_FAILURE() << "layout w" << w << " tp" << tp << " cp" << cp << " pp" << pp
                                  << " etp" << etp << " ep" << ep << " outer" << outer
                                  << " map" << map;
                    return;
                  }
                }
  }
  std::printf("checked %ld valid layouts, %ld refused\n", valid, refused);
  EXPECT_GT(valid, 10000);
}

}  // namespace
}  // namespace weft
