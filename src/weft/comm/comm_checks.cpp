// The argument checks every backend shares (comm_checks.h): each names the op, the group, this
// rank's position and the offending sizes, and none communicates.
#include "weft/comm/comm_checks.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "weft/core/error.h"

namespace weft {
namespace {


std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

}  // namespace

std::string comm_where(const Communicator& c, const char* op) {
  return fmt::format("{} on group '{}' (group rank {} of {}, {} backend)", op, c.name(),
                     c.rank(), c.size(), c.backend());
}

namespace {

void check_tensor(const Communicator& c, const char* op, const char* arg, const at::Tensor& t) {
  if (!t.defined()) fail("{}: `{}` is an undefined tensor", comm_where(c, op), arg);
  if (t.layout() != at::kStrided) fail("{}: `{}` must be a dense tensor", comm_where(c, op), arg);
  if (!t.is_contiguous())
    fail("{}: `{}` must be contiguous (shape {}, strides {})", comm_where(c, op), arg, shape_str(t),
         fmt::join(t.strides(), ", "));
}

void check_same_dtype(const Communicator& c, const char* op, const at::Tensor& in,
                      const at::Tensor& out) {
  if (in.scalar_type() != out.scalar_type())
    fail("{}: `in` is {} but `out` is {}; both must have one dtype", comm_where(c, op),
         c10::toString(in.scalar_type()), c10::toString(out.scalar_type()));
}

// The dtypes every backend reduces (NCCL's set); movement ops take any dtype.
void check_reducible(const Communicator& c, const char* op, const at::Tensor& t, ReduceOp rop) {
  const at::ScalarType s = t.scalar_type();
  switch (s) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kInt: case at::kLong: case at::kByte: case at::kChar:
      break;
    default:
      fail("{}: cannot reduce dtype {} (float32/64, bfloat16, float16, int8, uint8, int32, "
           "int64 only)", comm_where(c, op), c10::toString(s));
  }
  if (rop == ReduceOp::kAvg && !at::isFloatingType(s))
    fail("{}: ReduceOp avg needs a floating dtype, got {}; reduce with sum and divide",
         comm_where(c, op), c10::toString(s));
}

void check_peer(const Communicator& c, const char* op, int peer) {
  if (peer < 0 || peer >= c.size())
    fail("{}: peer {} is not a group rank (0..{})", comm_where(c, op), peer, c.size() - 1);
}

}  // namespace

void comm_check_all_gather(const Communicator& c, const at::Tensor& in, const at::Tensor& out) {
  check_tensor(c, "all_gather", "in", in);
  check_tensor(c, "all_gather", "out", out);
  check_same_dtype(c, "all_gather", in, out);
  if (out.numel() != c.size() * in.numel())
    fail("{}: out.numel() {} != size {} * in.numel() {} (in {}, out {})", comm_where(c, "all_gather"),
         out.numel(), c.size(), in.numel(), shape_str(in), shape_str(out));
}

void comm_check_reduce_scatter(const Communicator& c, const at::Tensor& in, const at::Tensor& out,
                               ReduceOp op) {
  check_tensor(c, "reduce_scatter", "in", in);
  check_tensor(c, "reduce_scatter", "out", out);
  check_same_dtype(c, "reduce_scatter", in, out);
  check_reducible(c, "reduce_scatter", in, op);
  if (in.numel() != c.size() * out.numel())
    fail("{}: in.numel() {} != size {} * out.numel() {} (in {}, out {})",
         comm_where(c, "reduce_scatter"), in.numel(), c.size(), out.numel(), shape_str(in),
         shape_str(out));
}

void comm_check_all_reduce(const Communicator& c, const at::Tensor& t, ReduceOp op) {
  check_tensor(c, "all_reduce", "t", t);
  check_reducible(c, "all_reduce", t, op);
}

void comm_check_broadcast(const Communicator& c, const at::Tensor& t, int root) {
  check_tensor(c, "broadcast", "t", t);
  if (root < 0 || root >= c.size())
    fail("{}: root {} is not a group rank (0..{})", comm_where(c, "broadcast"), root, c.size() - 1);
}

void comm_check_p2p(const Communicator& c, const char* op, const at::Tensor& t, int peer) {
  check_tensor(c, op, "t", t);
  check_peer(c, op, peer);
  if (peer == c.rank())
    fail("{}: peer {} is this rank; a blocking {} to itself never completes (use batch_p2p)",
         comm_where(c, op), peer, op);
}

void comm_check_batch_p2p(const Communicator& c, const std::vector<P2POp>& ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const char* arg = ops[i].kind == P2POp::kSend ? "send tensor" : "recv tensor";
    check_tensor(c, "batch_p2p", arg, ops[i].tensor);
    check_peer(c, "batch_p2p", ops[i].peer);
  }
}

void comm_check_all_to_all(const Communicator& c, const at::Tensor& in,
                           const std::vector<int64_t>& send_counts, const at::Tensor& out,
                           const std::vector<int64_t>& recv_counts) {
  const char* op = "all_to_all";
  check_tensor(c, op, "in", in);
  check_tensor(c, op, "out", out);
  check_same_dtype(c, op, in, out);
  const auto n = static_cast<size_t>(c.size());
  if (send_counts.size() != n || recv_counts.size() != n)
    fail("{}: send_counts has {} entries and recv_counts {}; both need one per rank ({})",
         comm_where(c, op), send_counts.size(), recv_counts.size(), n);
  for (size_t i = 0; i < n; ++i)
    if (send_counts[i] < 0 || recv_counts[i] < 0)
      fail("{}: negative count for rank {} (send {}, recv {})", comm_where(c, op), i, send_counts[i],
           recv_counts[i]);
  const int64_t sends = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t recvs = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  if (sends != in.numel() || recvs != out.numel())
    fail("{}: sum(send_counts) {} vs in.numel() {}, sum(recv_counts) {} vs out.numel() {}; "
         "each pair must be equal (send_counts [{}], recv_counts [{}])",
         comm_where(c, op), sends, in.numel(), recvs, out.numel(), fmt::join(send_counts, ", "),
         fmt::join(recv_counts, ", "));
  const auto self = static_cast<size_t>(c.rank());
  if (send_counts[self] != recv_counts[self])
    fail("{}: this rank sends {} elements to itself but expects {} from itself", comm_where(c, op),
         send_counts[self], recv_counts[self]);
}

bool comm_overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || a.device() != b.device()) return false;
  auto lo_a = reinterpret_cast<uintptr_t>(a.data_ptr()), lo_b = reinterpret_cast<uintptr_t>(b.data_ptr());
  auto hi_a = lo_a + a.nbytes(), hi_b = lo_b + b.nbytes();
  return lo_a < hi_b && lo_b < hi_a;
}

void comm_abort(const std::string& what) {
  int rank = -1, initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "[rank %d] weft: %s; aborting the job\n", rank, what.c_str());
  std::fflush(stderr);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace weft
