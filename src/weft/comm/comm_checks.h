// The argument checks every backend (MPI, NCCL) runs before it communicates, and two helpers
// they share. Each check throws weft::Error naming the op, the group, this rank's position and
// the offending sizes; none communicates, so when every member passes the same wrong arguments
// every member throws and nobody waits in a collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "weft/comm/communicator.h"

namespace weft {

// "<op> on group '<name>' (group rank r of n, <backend> backend)", for messages.
std::string comm_where(const Communicator& c, const char* op);

void comm_check_all_gather(const Communicator& c, const at::Tensor& in, const at::Tensor& out);
void comm_check_reduce_scatter(const Communicator& c, const at::Tensor& in, const at::Tensor& out,
                               ReduceOp op);
void comm_check_all_reduce(const Communicator& c, const at::Tensor& t, ReduceOp op);
void comm_check_broadcast(const Communicator& c, const at::Tensor& t, int root);
// Blocking send/recv: the peer must be another member (a blocking self-send would deadlock).
void comm_check_p2p(const Communicator& c, const char* op, const at::Tensor& t, int peer);
void comm_check_batch_p2p(const Communicator& c, const std::vector<P2POp>& ops);
void comm_check_all_to_all(const Communicator& c, const at::Tensor& in,
                           const std::vector<int64_t>& send_counts, const at::Tensor& out,
                           const std::vector<int64_t>& recv_counts);

// Whether the byte ranges of two tensors' data intersect (both non-empty, same device).
bool comm_overlaps(const at::Tensor& a, const at::Tensor& b);

// For a failure after ranks entered a collective: prints `what` with the world rank to stderr
// and aborts every rank of the job (MPI_Abort), so no peer is left waiting.
[[noreturn]] void comm_abort(const std::string& what);

}  // namespace weft
