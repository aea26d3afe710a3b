// The process groups of the mesh as communicators (process_groups.cpp), and which backends
// this build has.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "weft/comm/communicator.h"
#include "weft/mesh/mesh.h"

namespace weft {

enum class Backend { kMpi, kNccl };

// Every group of the mesh that holds this rank, as communicators over one backend.
// Construction is collective over the world: every rank must construct it, and each group is
// checked by its members (they compare a digest of the membership list) before it is used;
// a disagreement fails with a message naming the group kind and both member lists.
class ProcessGroups {
 public:
  // `base` is the communicator the mesh's ranks are numbered in (a test may run a job on a
  // subset of the world); it must be valid while the groups are constructed.
  ProcessGroups(const Mesh& mesh, Backend backend, MPI_Comm base = MPI_COMM_WORLD);
  ~ProcessGroups();

  const Mesh& mesh() const { return mesh_; }
  int rank() const { return rank_; }
  // The communicator of group `kind` holding this rank; null for "embedding" on middle stages.
  Communicator* get(const std::string& kind) const;
  Communicator& world() const { return *world_; }
  // An MPI communicator over the world for small host-side exchanges (agreement flags,
  // checkpoint chunk lists), whatever the backend: it takes CPU tensors.
  Communicator& control() const { return *control_; }

 private:
  Mesh mesh_;
  int rank_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Communicator> control_;
  std::vector<std::pair<std::string, std::unique_ptr<Communicator>>> groups_;
};

// True when weft was built with the NCCL backend.
bool nccl_available();
std::string nccl_version();  // "" when not built

}  // namespace weft
