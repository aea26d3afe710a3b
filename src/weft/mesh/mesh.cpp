// Builds the mesh (see mesh.h). A decomposition is a list of (axis, size) from fastest to
// slowest; a rank's coordinate along axis i is (rank / stride_i) % size_i. A group for a subset
// of axes is enumerated by fixing the other coordinates and walking the subset's coordinates
// with the first listed axis fastest, which also yields the group-rank order.
#include "weft/mesh/mesh.h"

#include <algorithm>
#include <cstdint>

#include "weft/core/error.h"

namespace weft {
namespace {

struct Axis {
  std::string name;
  int size;
};
using Decomposition = std::vector<Axis>;

int stride_of(const Decomposition& d, size_t i) {
  int s = 1;
  for (size_t k = 0; k < i; ++k) s *= d[k].size;
  return s;
}

int index_of(const Decomposition& d, const std::string& name) {
  for (size_t i = 0; i < d.size(); ++i)
    if (d[i].name == name) return static_cast<int>(i);
  return -1;
}

// All groups of the ranks that differ only along `axes` (names in d), sorted by first rank.
std::vector<Group> make_groups(const Decomposition& d, const std::vector<std::string>& axes,
                               int world) {
  std::vector<int> in_set;
  for (const auto& a : axes) in_set.push_back(index_of(d, a));
  std::vector<int> outside;
  for (size_t i = 0; i < d.size(); ++i)
    if (std::find(in_set.begin(), in_set.end(), static_cast<int>(i)) == in_set.end())
      outside.push_back(static_cast<int>(i));
  // Group members follow the order of the decomposition (first axis fastest), so sort the
  // in-set axes by their position in it.
  std::sort(in_set.begin(), in_set.end());

  int group_size = 1;
  for (int i : in_set) group_size *= d[i].size;
  int num_groups = world / group_size;

  std::vector<Group> out;
  out.reserve(num_groups);
  for (int g = 0; g < num_groups; ++g) {
    int base = 0, rem = g;
    for (int i : outside) {
      base += (rem % d[i].size) * stride_of(d, i);
      rem /= d[i].size;
    }
    Group grp;
    grp.reserve(group_size);
    for (int m = 0; m < group_size; ++m) {
      int r = base, rm = m;
      for (int i : in_set) {
        r += (rm % d[i].size) * stride_of(d, i);
        rm /= d[i].size;
      }
      grp.push_back(r);
    }
    out.push_back(std::move(grp));
  }
  std::sort(out.begin(), out.end(), [](const Group& a, const Group& b) { return a[0] < b[0]; });
  return out;
}

// HSDP: each group of size D splits into n contiguous shard groups of size D/n; replicate
// groups take every (D/n)-th member.
void split_hsdp(const std::vector<Group>& base, int n, std::vector<Group>* shard,
                std::vector<Group>* replicate) {
  for (const auto& g : base) {
    int s = static_cast<int>(g.size()) / n;
    for (int k = 0; k < n; ++k) shard->emplace_back(g.begin() + k * s, g.begin() + (k + 1) * s);
    for (int j = 0; j < s; ++j) {
      Group r;
      for (int k = 0; k < n; ++k) r.push_back(g[k * s + j]);
      replicate->push_back(std::move(r));
    }
  }
  auto by_first = [](const Group& a, const Group& b) { return a[0] < b[0]; };
  std::sort(shard->begin(), shard->end(), by_first);
  std::sort(replicate->begin(), replicate->end(), by_first);
}

Decomposition dense_decomposition(const LayoutConfig& c, int dp) {
  if (c.tp_pp_dp_mapping) return {{"tp", c.tp}, {"cp", c.cp}, {"pp", c.pp}, {"dp", dp}};
  return {{"tp", c.tp}, {"cp", c.cp}, {"dp", dp}, {"pp", c.pp}};
}

Decomposition expert_decomposition(const LayoutConfig& c, int edp) {
  if (c.tp_pp_dp_mapping) return {{"etp", c.etp}, {"ep", c.ep}, {"pp", c.pp}, {"edp", edp}};
  return {{"etp", c.etp}, {"ep", c.ep}, {"edp", edp}, {"pp", c.pp}};
}

}  // namespace

LayoutConfig validate_layout(LayoutConfig c) {
  if (c.etp < 1 && c.etp != -1)
    fail_usage("--expert-tensor-parallel-size must be >= 1 (got {})", c.etp);
  if (c.etp == -1) c.etp = c.tp;
  const std::pair<const char*, int> sizes[] = {
      {"--world-size", c.world_size},
      {"--tensor-model-parallel-size", c.tp},
      {"--context-parallel-size", c.cp},
      {"--pipeline-model-parallel-size", c.pp},
      {"--expert-model-parallel-size", c.ep},
      {"--expert-tensor-parallel-size", c.etp},
      {"--num-distributed-optimizer-instances", c.dp_outer}};
  // A mesh is tabulated rank by rank: a bound keeps an absurd size a usage error, not bad_alloc.
  constexpr int kMaxWorld = 1 << 20;
  for (const auto& [flag, v] : sizes) {
    if (v < 1) fail_usage("{} must be >= 1 (got {})", flag, v);
    if (v > kMaxWorld) fail_usage("{} must be <= {} (got {})", flag, kMaxWorld, v);
  }

  const int w = c.world_size;
  const int64_t dense = int64_t{c.tp} * c.cp * c.pp, expert = int64_t{c.etp} * c.ep * c.pp;
  if (w % dense != 0)
    fail_usage(
        "world size {} is not divisible by tp*cp*pp = {}*{}*{} = {} "
        "(--tensor-model-parallel-size, --context-parallel-size, --pipeline-model-parallel-size)",
        w, c.tp, c.cp, c.pp, dense);
  if (w % expert != 0)
    fail_usage(
        "world size {} is not divisible by etp*ep*pp = {}*{}*{} = {} "
        "(--expert-tensor-parallel-size, --expert-model-parallel-size, "
        "--pipeline-model-parallel-size)",
        w, c.etp, c.ep, c.pp, expert);
  const int dp = w / (c.tp * c.cp * c.pp);
  const int edp = w / (c.etp * c.ep * c.pp);
  // With pp = 1 every pipeline group is a single rank in both decompositions, so they agree
  // whatever the strides (Megatron accepts these layouts too).
  if (c.tp_pp_dp_mapping && c.pp > 1 && c.tp * c.cp != c.etp * c.ep)
    fail_usage(
        "dense and expert pipeline groups differ: with --use-tp-pp-dp-mapping and "
        "--pipeline-model-parallel-size > 1 the pipeline stride tp*cp = {}*{} = {} must equal "
        "etp*ep = {}*{} = {} (--expert-model-parallel-size, --expert-tensor-parallel-size)",
        c.tp, c.cp, c.tp * c.cp, c.etp, c.ep, c.etp * c.ep);
  if ((dp * c.cp) % c.dp_outer != 0)
    fail_usage(
        "--num-distributed-optimizer-instances {} does not divide the FSDP shard group "
        "dp*cp = {}*{} = {}",
        c.dp_outer, dp, c.cp, dp * c.cp);
  if (edp % c.dp_outer != 0)
    fail_usage(
        "--num-distributed-optimizer-instances {} does not divide the expert FSDP group "
        "edp = world/(etp*ep*pp) = {}/({}*{}*{}) = {}",
        c.dp_outer, w, c.etp, c.ep, c.pp, edp);
  return c;
}

Mesh::Mesh(const LayoutConfig& cfg) : cfg_(validate_layout(cfg)) {
  const int w = cfg_.world_size;
  dp_ = w / (cfg_.tp * cfg_.cp * cfg_.pp);
  edp_ = w / (cfg_.etp * cfg_.ep * cfg_.pp);
  const Decomposition dense = dense_decomposition(cfg_, dp_);
  const Decomposition expert = expert_decomposition(cfg_, edp_);

  groups_["tp"] = make_groups(dense, {"tp"}, w);
  groups_["cp"] = make_groups(dense, {"cp"}, w);
  groups_["dp"] = make_groups(dense, {"dp"}, w);
  groups_["dp_cp"] = make_groups(dense, {"dp", "cp"}, w);
  groups_["pp"] = make_groups(dense, {"pp"}, w);
  groups_["tp_pp"] = make_groups(dense, {"tp", "pp"}, w);
  groups_["tp_cp"] = make_groups(dense, {"tp", "cp"}, w);
  groups_["tp_dp_cp"] = make_groups(dense, {"tp", "dp", "cp"}, w);
  groups_["ep"] = make_groups(expert, {"ep"}, w);
  groups_["etp"] = make_groups(expert, {"etp"}, w);
  groups_["etp_ep"] = make_groups(expert, {"etp", "ep"}, w);
  groups_["etp_ep_pp"] = make_groups(expert, {"etp", "ep", "pp"}, w);
  groups_["edp"] = make_groups(expert, {"edp"}, w);

  // validate_layout proved the strides agree; this is the belt to its braces.
  if (make_groups(expert, {"pp"}, w) != groups_["pp"])
    fail_usage("dense and expert pipeline groups differ for this layout");

  auto& emb = groups_["embedding"];
  for (const auto& g : groups_["pp"])
    emb.push_back(g.size() == 1 ? Group{g.front()} : Group{g.front(), g.back()});

  split_hsdp(groups_["dp_cp"], cfg_.dp_outer, &groups_["fsdp_shard"], &groups_["fsdp_replicate"]);
  split_hsdp(groups_["edp"], cfg_.dp_outer, &groups_["expert_fsdp_shard"],
             &groups_["expert_fsdp_replicate"]);

  for (const auto& [kind, gs] : groups_) {
    auto& idx = group_index_[kind];
    idx.assign(w, -1);
    for (size_t i = 0; i < gs.size(); ++i)
      for (int r : gs[i]) idx[r] = static_cast<int>(i);
  }
}

std::string Mesh::order() const {
  return cfg_.tp_pp_dp_mapping ? "tp-cp-ep-pp-dp" : "tp-cp-ep-dp-pp";
}

int Mesh::coord(int rank, const std::string& axis) const {
  const bool expert = axis == "etp" || axis == "ep" || axis == "edp";
  const Decomposition d = expert ? expert_decomposition(cfg_, edp_) : dense_decomposition(cfg_, dp_);
  int i = index_of(d, axis);
  if (i < 0) fail("unknown mesh axis '{}'", axis);
  return (rank / stride_of(d, i)) % d[i].size;
}

const std::vector<Group>& Mesh::groups(const std::string& kind) const {
  auto it = groups_.find(kind);
  if (it == groups_.end()) fail("unknown group kind '{}'", kind);
  return it->second;
}

bool Mesh::has_group(const std::string& kind, int rank) const {
  groups(kind);  // validates the kind
  return group_index_.at(kind).at(rank) >= 0;
}

const Group& Mesh::group_of(const std::string& kind, int rank) const {
  const auto& gs = groups(kind);
  int i = group_index_.at(kind).at(rank);
  WEFT_CHECK(i >= 0, "rank {} is in no {} group", rank, kind);
  return gs[i];
}

int Mesh::group_rank(const std::string& kind, int rank) const {
  const Group& g = group_of(kind, rank);
  return static_cast<int>(std::find(g.begin(), g.end(), rank) - g.begin());
}

}  // namespace weft
