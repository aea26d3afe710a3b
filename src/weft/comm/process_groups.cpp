// ProcessGroups: one communicator per group kind of the mesh (mesh_group_kinds()) holding this
// rank, each over its own MPI communicator split from the base communicator (MPI_COMM_WORLD
// unless the caller runs the job on a subset of the world).
//
// Invariant: a communicator is handed out only after its members have proved they agree on who
// belongs to it: each member hashes the member list it expects (FNV-1a, 64 bit) and the group
// all-reduces MIN and MAX of the hashes together with each member's local verdict (communicator
// size and its own position); any disagreement makes every member throw the same error, so no
// rank goes on alone. Before that, local checks (world size, backend built) throw before any
// collective, and one world-wide check makes all ranks throw if they were started with
// different layouts.
#include <fmt/ranges.h>
#include <mpi.h>

#include <cstdint>
#include <numeric>

#include "weft/comm/communicator.h"
#include "weft/comm/mpi_communicator.h"
#include "weft/comm/mpi_runtime.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"
#include "weft/core/hash.h"
#if defined(WEFT_WITH_CUDA)
#include "weft/comm/nccl_communicator.h"
#endif

namespace weft {
namespace {

uint64_t digest_members(const Group& g) {
  uint64_t h = fnv1a64_u64(kFnv1a64Offset, g.size());
  for (int r : g) h = fnv1a64_u64(h, static_cast<uint64_t>(static_cast<int64_t>(r)));
  return h;
}

uint64_t digest_layout(const LayoutConfig& c) {
  uint64_t h = kFnv1a64Offset;
  for (int64_t v : {c.world_size, c.tp, c.cp, c.pp, c.ep, c.etp, c.dp_outer,
                    static_cast<int>(c.tp_pp_dp_mapping)})
    h = fnv1a64_u64(h, static_cast<uint64_t>(v));
  return h;
}

// Over `comm`: true on every member when all members' `digest` are equal and every `ok` holds.
// One all-reduce of {d, ~d, ok} with MIN gives min(d), max(d) = ~min(~d) and all(ok).
bool all_agree(MPI_Comm comm, uint64_t digest, bool ok) {
  uint64_t v[3] = {digest, ~digest, ok ? 1u : 0u};
  MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_UINT64_T, MPI_MIN, comm);
  return v[0] == ~v[1] && v[2] == 1;
}

// Every member's expected list (collective over `comm`; called only once all members know the
// check failed), to name a list that differs from this rank's in the error message.
Group first_other_list(MPI_Comm comm, const Group& mine, int* who) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
  std::exclusive_scan(lens.begin(), lens.end(), displs.begin(), 0);
  std::vector<int> all(static_cast<size_t>(displs.back() + lens.back()));
  MPI_Allgatherv(mine.data(), len, MPI_INT, all.data(), lens.data(), displs.data(), MPI_INT, comm);
  for (int i = 0; i < n; ++i) {
    Group g(all.begin() + displs[i], all.begin() + displs[i] + lens[i]);
    if (g != mine) {
      *who = i;
      return g;
    }
  }
  *who = -1;
  return mine;
}

// Collective over `comm`; returns "" when every member agrees, else the error message (then
// every member returns one).
std::string verify_group(const std::string& kind, const Group& expected, int expected_rank,
                         MPI_Comm comm) {
  int n = 0, r = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &r);
  const bool ok = n == static_cast<int>(expected.size()) && r == expected_rank;
  if (all_agree(comm, digest_members(expected), ok)) return "";
  int who = -1;
  const Group other = first_other_list(comm, expected, &who);
  return fmt::format(
      "process group '{}' is inconsistent: this rank expected members [{}] with itself at "
      "position {}, but the MPI communicator has {} ranks with this rank at {}{}; every rank "
      "must build the mesh from the same layout flags",
      kind, fmt::join(expected, ", "), expected_rank, n, r,
      who < 0 ? std::string()
              : fmt::format("; communicator rank {} expected [{}]", who, fmt::join(other, ", ")));
}

std::unique_ptr<Communicator> make_communicator(Backend backend, std::string name, Group members,
                                                MPI_Comm comm) {
#if defined(WEFT_WITH_CUDA)
  if (backend == Backend::kNccl)
    return make_nccl_communicator(std::move(name), std::move(members), comm);
#endif
  WEFT_CHECK(backend == Backend::kMpi, "group '{}': backend not built", name);
  return std::make_unique<MpiCommunicator>(std::move(name), std::move(members), comm);
}

}  // namespace

ProcessGroups::ProcessGroups(const Mesh& mesh, Backend backend, MPI_Comm base)
    : mesh_(mesh), rank_(-1) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    fail("ProcessGroups: MPI is not running; construct weft::MpiRuntime first");
  int world = 0;
  MPI_Comm_rank(base, &rank_);
  MPI_Comm_size(base, &world);

  // Local checks: identical on every rank started with the same flags, so all throw together.
  if (world != mesh_.world_size())
    fail_usage("the layout is for --world-size {} but the job has {} ranks (mpirun -np {}); "
               "start it with mpirun -np {} or pass --world-size {}",
               mesh_.world_size(), world, world, mesh_.world_size(), world);
  if (backend == Backend::kNccl && !nccl_available())
    fail_usage("the NCCL backend was requested but this weft was built without CUDA; "
               "use the MPI backend or build against a CUDA-enabled libtorch with NCCL");

  // Ranks started with different layouts would split into inconsistent groups: stop them all.
  if (!all_agree(base, digest_layout(mesh_.config()), true))
    fail_usage("ranks were started with different parallel layouts (this rank: world {}, tp {}, "
               "cp {}, pp {}, ep {}, etp {}, dp_outer {}); pass the same flags to every rank",
               mesh_.world_size(), mesh_.tp(), mesh_.cp(), mesh_.pp(), mesh_.ep(), mesh_.etp(),
               mesh_.dp_outer());

  // Every rank splits for every kind (MPI_UNDEFINED where it has no group of that kind); the
  // verdicts are agreed on world-wide before any backend communicator is made (NCCL's creation
  // is itself collective), so a bad group stops every rank and none waits in a creation.
  struct Split {
    std::string kind;
    const Group* expected;  // null: this rank has no group of this kind
    MPI_Comm comm;
  };
  std::vector<Split> splits;
  std::string error;
  for (const std::string& kind : mesh_group_kinds()) {
    int color = MPI_UNDEFINED, key = 0;
    const Group* expected = nullptr;
    if (mesh_.has_group(kind, rank_)) {
      expected = &mesh_.group_of(kind, rank_);
      color = static_cast<int>(expected - mesh_.groups(kind).data());
      key = mesh_.group_rank(kind, rank_);
    }
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(base, color, key, &comm);
    if (comm != MPI_COMM_NULL) {
      std::string bad = verify_group(kind, *expected, key, comm);
      if (error.empty()) error = std::move(bad);
    }
    splits.push_back({kind, expected, comm});
  }
  if (!all_agree(base, 0, error.empty())) {
    for (Split& s : splits)
      if (s.comm != MPI_COMM_NULL) MPI_Comm_free(&s.comm);
    if (error.empty()) error = "another rank found an inconsistent process group (see its error)";
    fail("{}", error);
  }

  Group all(static_cast<size_t>(world));
  std::iota(all.begin(), all.end(), 0);
  MPI_Comm world_comm = MPI_COMM_NULL;
  MPI_Comm_dup(base, &world_comm);
  world_ = make_communicator(backend, "world", all, world_comm);
  MPI_Comm control_comm = MPI_COMM_NULL;
  MPI_Comm_dup(base, &control_comm);
  control_ = std::make_unique<MpiCommunicator>("control", all, control_comm);
  for (Split& s : splits)
    groups_.emplace_back(s.kind, s.expected
                                     ? make_communicator(backend, s.kind, *s.expected, s.comm)
                                     : nullptr);
}

ProcessGroups::~ProcessGroups() = default;

Communicator* ProcessGroups::get(const std::string& kind) const {
  for (const auto& [k, c] : groups_)
    if (k == kind) return c.get();
  fail("unknown process group kind '{}' (known: {})", kind, fmt::join(mesh_group_kinds(), ", "));
}

#if !defined(WEFT_WITH_CUDA)
bool nccl_available() { return false; }
std::string nccl_version() { return ""; }
#endif

}  // namespace weft
