// The NCCL backend of Communicator: collectives on CUDA tensors over one group, bootstrapped
// over that group's MPI communicator. Built only with the CUDA path (WEFT_WITH_CUDA); this
// header holds no CUDA or NCCL types so that CPU-only code may include it.
//
// Invariant: a communicator works on exactly one device, the CUDA device current when it was
// created (callers select it from MpiRuntime::local_rank() before building ProcessGroups), and
// on one dedicated stream of that device; every call is ordered after the caller's current
// stream's earlier work and before its later work, as if the collective ran on that stream.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "weft/comm/communicator.h"
#include "weft/comm/mpi_runtime.h"
#include "weft/comm/process_groups.h"

namespace weft {

// Collective over `comm`: every member calls it with the same `name` and `members`. Takes
// ownership of `comm` (kept for the lifetime of the communicator, freed with it). Group rank 0
// makes the ncclUniqueId and broadcasts it over `comm`; then every member joins with
// ncclCommInitRank on the current CUDA device.
std::unique_ptr<Communicator> make_nccl_communicator(std::string name, Group members,
                                                     MPI_Comm comm);

}  // namespace weft
