// The parallel layout: from the world size and Megatron-named layout flags to every rank's
// coordinates and every process group.
//
// Pure C++ (no torch, no MPI). Semantics are DESIGN.md's "Parallel layout": the leftmost axis
// of the order string varies fastest; a group for a set of axes holds the ranks that differ only
// along those axes, ordered by their index along those axes (first axis fastest). Dense groups
// come from (tp, cp, dp, pp), expert groups from (etp, ep, edp, pp), and both decompositions
// must yield the same pipeline groups. FSDP shard/replicate groups are derived from the
// world-spanning dp-cp and edp groups, so the pipeline axis is always part of the construction.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace weft {

// Layout flags, named after Megatron-Core's. etp < 1 means "default to tp".
struct LayoutConfig {
  int world_size = 1;
  int tp = 1;        // --tensor-model-parallel-size
  int cp = 1;        // --context-parallel-size
  int pp = 1;        // --pipeline-model-parallel-size
  int ep = 1;        // --expert-model-parallel-size
  int etp = -1;      // --expert-tensor-parallel-size (default: tp)
  int dp_outer = 1;  // --num-distributed-optimizer-instances (HSDP replicas)
  bool tp_pp_dp_mapping = false;  // --use-tp-pp-dp-mapping
};

using Group = std::vector<int>;  // global ranks, in group-rank order

// Every group kind the mesh builds, in the order they are printed. A kind is named by the axes
// it spans, joined by '_': dense kinds by tp, cp, dp, pp; expert kinds by etp, ep, edp, pp (so
// etp_ep spans etp x ep: Megatron-Core's expert-tensor-and-model-parallel group, built there from
// its expert rank generator's "tp-ep"). Derived kinds: embedding and the FSDP shard/replicate
// groups (see Mesh).
inline const std::vector<std::string>& mesh_group_kinds() {
  static const std::vector<std::string> kinds = {
      "tp",        "cp",  "dp",  "dp_cp",  "pp",        "tp_pp",          "tp_cp",
      "tp_dp_cp",  "ep",  "etp", "etp_ep", "etp_ep_pp", "edp",            "embedding",
      "fsdp_shard", "fsdp_replicate", "expert_fsdp_shard", "expert_fsdp_replicate"};
  return kinds;
}

class Mesh {
 public:
  // Validates the layout and builds every group. Throws UsageError naming the flag and the
  // arithmetic when the layout is invalid.
  explicit Mesh(const LayoutConfig& cfg);

  const LayoutConfig& config() const { return cfg_; }
  int world_size() const { return cfg_.world_size; }
  int tp() const { return cfg_.tp; }
  int cp() const { return cfg_.cp; }
  int pp() const { return cfg_.pp; }
  int ep() const { return cfg_.ep; }
  int etp() const { return cfg_.etp; }
  int dp() const { return dp_; }
  int edp() const { return edp_; }
  int dp_outer() const { return cfg_.dp_outer; }
  std::string order() const;  // "tp-cp-ep-dp-pp" or "tp-cp-ep-pp-dp"

  // Coordinate of `rank` along a named axis: tp, cp, dp, pp (dense) or etp, ep, edp (expert).
  int coord(int rank, const std::string& axis) const;

  // All groups of one kind (see mesh_group_kinds), sorted by first rank.
  const std::vector<Group>& groups(const std::string& kind) const;
  // Whether `rank` belongs to a group of `kind` (only "embedding" leaves ranks out).
  bool has_group(const std::string& kind, int rank) const;
  // The group of `kind` that holds `rank`.
  const Group& group_of(const std::string& kind, int rank) const;
  // Index of `rank` inside its group of `kind` (its group rank).
  int group_rank(const std::string& kind, int rank) const;

 private:
  LayoutConfig cfg_;
  int dp_ = 1;
  int edp_ = 1;
  std::map<std::string, std::vector<Group>> groups_;
  std::map<std::string, std::vector<int>> group_index_;  // kind -> rank -> index in groups_
};

// Throws UsageError if the layout is invalid; returns the normalized config (etp resolved).
LayoutConfig validate_layout(LayoutConfig cfg);

}  // namespace weft
