// MpiCommunicator (see mpi_communicator.h); the argument checks it shares with the NCCL backend
// are in comm_checks.cpp.
//
// Invariant: a call either throws before MPI is entered (bad arguments, identical on every
// member when the caller's arithmetic is), or enters exactly one MPI operation on comm_ (a
// batch: one Waitall over all its requests) that every member enters too, zero-length buffers
// included; host staging buffers live until that operation has completed.
#include "weft/comm/mpi_communicator.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <fmt/ranges.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "weft/comm/comm_checks.h"
#include "weft/core/error.h"

namespace weft {
namespace {
// MPI moves data in units of the widest unsigned type dividing the element size, so any dtype
// moves (bf16 as 2-byte units, complex128 as pairs of 8-byte units).
struct MoveUnit {
  MPI_Datatype type;
  int64_t per_element;
};

MoveUnit move_unit(const at::Tensor& t) {
  const int64_t item = static_cast<int64_t>(t.element_size());
  if (item % 8 == 0) return {MPI_UINT64_T, item / 8};
  if (item % 4 == 0) return {MPI_UINT32_T, item / 4};
  if (item % 2 == 0) return {MPI_UINT16_T, item / 2};
  return {MPI_UINT8_T, item};
}

// bf16 and fp16 are reduced in fp32 (MPI has no reduction for them); the rest natively.
at::ScalarType reduce_dtype(at::ScalarType s) {
  return (s == at::kBFloat16 || s == at::kHalf) ? at::kFloat : s;
}

MPI_Datatype reduce_mpi_type(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kChar: return MPI_INT8_T;
    default: fail("no MPI reduction type for {}", c10::toString(s));
  }
}

MPI_Op reduce_mpi_op(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

// Valid address for MPI even when the tensor is empty (its data pointer may be null).
void* buf(const at::Tensor& t) {
  static char empty_buffer;
  void* p = t.data_ptr();
  return p ? p : &empty_buffer;
}

// A CPU buffer MPI can use in place of `t`, in dtype `dtype`: `t` itself when it already is one.
// `load` copies t's values in (inputs and in-place buffers); otherwise it is left uninitialized.
at::Tensor host_view(const at::Tensor& t, at::ScalarType dtype, bool load) {
  if (t.is_cpu() && t.scalar_type() == dtype) return t;
  if (load) return t.to(at::kCPU, dtype).contiguous();
  return at::empty(t.sizes(), t.options().device(at::kCPU).dtype(dtype));
}

// Writes a host view back into the caller's tensor when they differ (device and dtype cast).
void store(const at::Tensor& host, const at::Tensor& t) {
  if (!host.is_same(t)) t.copy_(host);
}

// out[0:n) = in[0:n) for the one-member case, skipped when they are one buffer.
void copy_flat(const at::Tensor& in, const at::Tensor& out) {
  if (in.numel() == 0 || in.data_ptr() == out.data_ptr()) return;
  out.reshape({-1}).copy_(in.reshape({-1}));
}

}  // namespace

// ---- MpiCommunicator -------------------------------------------------------------------------

namespace {
int comm_rank_of(MPI_Comm comm) {
  int r = -1;
  if (comm == MPI_COMM_NULL || MPI_Comm_rank(comm, &r) != MPI_SUCCESS)
    fail("MpiCommunicator: invalid MPI communicator");
  return r;
}
}  // namespace

MpiCommunicator::MpiCommunicator(std::string name, Group members, MPI_Comm comm)
    : Communicator(std::move(name), std::move(members), comm_rank_of(comm)), comm_(comm),
      watch_(this->name(), comm) {
  int n = 0;
  MPI_Comm_size(comm_, &n);
  WEFT_CHECK(n == size(), "group '{}': the MPI communicator has {} ranks but {} members [{}]",
             this->name(), n, size(), fmt::join(this->members(), ", "));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  void* ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found);
  if (found && ub) tag_ub_ = *static_cast<int*>(ub);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF)
    MPI_Comm_free(&comm_);
}

int MpiCommunicator::tag_of(uint64_t index) const {
  return static_cast<int>(index % (static_cast<uint64_t>(tag_ub_) + 1));
}

void MpiCommunicator::check(int rc, const char* op) const {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  comm_abort(fmt::format("{}: MPI error: {}", comm_where(*this, op), std::string(msg, len)));
}

int MpiCommunicator::count(int64_t n, const char* op, const char* what) const {
  if (n > INT_MAX)
    fail("{}: {} is {} MPI units, more than MPI's int count allows ({}); split the buffer",
         comm_where(*this, op), what, n, INT_MAX);
  return static_cast<int>(n);
}

void MpiCommunicator::all_gather(const at::Tensor& in, const at::Tensor& out) {
  comm_check_all_gather(*this, in, out);
  if (size() == 1) return copy_flat(in, out);
  const MoveUnit u = move_unit(in);
  const int n = count(in.numel() * u.per_element, "all_gather", "in");
  count(out.numel() * u.per_element, "all_gather", "out");
  at::Tensor host_out = host_view(out, out.scalar_type(), false);
  // `in` already sitting in its slot of `out` is MPI_IN_PLACE; any other overlap is copied.
  const bool in_place = host_out.is_same(out) && in.is_cpu() && in.numel() > 0 &&
                        static_cast<char*>(in.data_ptr()) ==
                            static_cast<char*>(out.data_ptr()) + rank() * in.nbytes();
  at::Tensor host_in;
  if (!in_place) {
    host_in = host_view(in, in.scalar_type(), true);
    if (comm_overlaps(host_in, host_out)) host_in = host_in.clone();
  }
  {
    WatchScope w(watch_, "all_gather", watch_.enter_collective());
    check(MPI_Allgather(in_place ? MPI_IN_PLACE : buf(host_in), n, u.type, buf(host_out), n,
                        u.type, comm_),
          "all_gather");
  }
  store(host_out, out);
}

// The blocking reduce-scatter is the non-blocking one waited for at once: Open MPI's blocking
// MPI_Reduce_scatter_block and non-blocking MPI_Ireduce_scatter_block (libnbc) sum the ranks in
// different orders, and one primitive keeps --overlap-grad-reduce on and off bitwise equal.
void MpiCommunicator::reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op) {
  reduce_scatter_async(in, out, op)->wait();
}

namespace {

class MpiWork final : public Work {
 public:
  MpiWork(MpiCommunicator* comm, MPI_Request req, uint64_t seq, at::Tensor in,
          at::Tensor host_out, at::Tensor out, bool avg)
      : comm_(comm), req_(req), seq_(seq), in_(std::move(in)), host_out_(std::move(host_out)),
        out_(std::move(out)), avg_(avg) {}
  ~MpiWork() override {
    if (!done_) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    if (req_ != MPI_REQUEST_NULL) {
      WatchScope w(comm_->watched(), "reduce_scatter_async", seq_);
      const int rc = MPI_Wait(&req_, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        comm_abort(fmt::format("MPI_Wait(reduce_scatter) on group {} failed ({})", comm_->name(), rc));
    }
    if (avg_) host_out_.div_(comm_->size());
    store(host_out_, out_);
  }

 private:
  MpiCommunicator* comm_;
  MPI_Request req_;
  uint64_t seq_;  // its collective number on the group
  at::Tensor in_, host_out_, out_;  // kept alive until the request completes
  bool avg_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<Work> MpiCommunicator::reduce_scatter_async(const at::Tensor& in,
                                                            const at::Tensor& out, ReduceOp op) {
  comm_check_reduce_scatter(*this, in, out, op);
  if (size() == 1) {
    copy_flat(in, out);
    return std::make_unique<MpiWork>(this, MPI_REQUEST_NULL, 0, at::Tensor(), out, out, false);
  }
  const at::ScalarType w = reduce_dtype(in.scalar_type());
  const int n = count(out.numel(), "reduce_scatter", "out");
  count(in.numel(), "reduce_scatter", "in");
  at::Tensor host_in = host_view(in, w, true), host_out = host_view(out, w, false);
  if (comm_overlaps(host_in, host_out)) host_in = host_in.clone();
  MPI_Request req = MPI_REQUEST_NULL;
  const uint64_t seq = watch_.enter_collective();
  check(MPI_Ireduce_scatter_block(buf(host_in), buf(host_out), n, reduce_mpi_type(w),
                                  reduce_mpi_op(op), comm_, &req),
        "reduce_scatter_async");
  return std::make_unique<MpiWork>(this, req, seq, host_in, host_out, out, op == ReduceOp::kAvg);
}

void MpiCommunicator::all_reduce(const at::Tensor& t, ReduceOp op) {
  comm_check_all_reduce(*this, t, op);
  if (size() == 1) return;
  const at::ScalarType w = reduce_dtype(t.scalar_type());
  const int n = count(t.numel(), "all_reduce", "t");
  at::Tensor host = host_view(t, w, true);
  {
    WatchScope s(watch_, "all_reduce", watch_.enter_collective());
    check(MPI_Allreduce(MPI_IN_PLACE, buf(host), n, reduce_mpi_type(w), reduce_mpi_op(op), comm_),
          "all_reduce");
  }
  if (op == ReduceOp::kAvg) host.div_(size());
  store(host, t);
}

void MpiCommunicator::broadcast(const at::Tensor& t, int root) {
  comm_check_broadcast(*this, t, root);
  if (size() == 1) return;
  const MoveUnit u = move_unit(t);
  const int n = count(t.numel() * u.per_element, "broadcast", "t");
  at::Tensor host = host_view(t, t.scalar_type(), rank() == root);
  {
    WatchScope s(watch_, "broadcast", watch_.enter_collective());
    check(MPI_Bcast(buf(host), n, u.type, root, comm_), "broadcast");
  }
  if (rank() != root) store(host, t);
}

void MpiCommunicator::send(const at::Tensor& t, int peer) {
  comm_check_p2p(*this, "send", t, peer);
  const MoveUnit u = move_unit(t);
  const int n = count(t.numel() * u.per_element, "send", "t");
  at::Tensor host = host_view(t, t.scalar_type(), true);
  const uint64_t k = watch_.next_send(peer);
  WatchScope s(watch_, "send", 0, {{peer, true, k}});
  check(MPI_Send(buf(host), n, u.type, peer, tag_of(k), comm_), "send");
}

void MpiCommunicator::recv(const at::Tensor& t, int peer) {
  comm_check_p2p(*this, "recv", t, peer);
  const MoveUnit u = move_unit(t);
  const int n = count(t.numel() * u.per_element, "recv", "t");
  at::Tensor host = host_view(t, t.scalar_type(), false);
  MPI_Status st;
  {
    const uint64_t k = watch_.next_recv(peer);
    WatchScope s(watch_, "recv", 0, {{peer, false, k}});
    check(MPI_Recv(buf(host), n, u.type, peer, tag_of(k), comm_, &st), "recv");
  }
  int got = 0;
  MPI_Get_count(&st, u.type, &got);
  // Both sides have completed, so throwing here leaves nobody waiting.
  if (got != n)
    fail("{}: expected {} elements from group rank {} but it sent {}", comm_where(*this, "recv"),
         t.numel(), peer, got / u.per_element);
  store(host, t);
}

void MpiCommunicator::batch_p2p(const std::vector<P2POp>& ops) {
  comm_check_batch_p2p(*this, ops);
  struct Posted {
    at::Tensor host;
    MoveUnit unit;
    int count;
  };
  std::vector<Posted> posted;
  posted.reserve(ops.size());
  for (const P2POp& op : ops) {
    const MoveUnit u = move_unit(op.tensor);
    const int n = count(op.tensor.numel() * u.per_element, "batch_p2p", "a tensor");
    posted.push_back({host_view(op.tensor, op.tensor.scalar_type(), op.kind == P2POp::kSend), u, n});
  }
  std::vector<MPI_Request> reqs(ops.size(), MPI_REQUEST_NULL);
  std::vector<WatchMessage> messages;
  messages.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const Posted& p = posted[i];
    const int peer = ops[i].peer;
    if (ops[i].kind == P2POp::kSend) {
      messages.push_back({peer, true, watch_.next_send(peer)});
      check(MPI_Isend(buf(p.host), p.count, p.unit.type, peer, tag_of(messages.back().index),
                      comm_, &reqs[i]),
            "batch_p2p (isend)");
    } else {
      messages.push_back({peer, false, watch_.next_recv(peer)});
      check(MPI_Irecv(buf(p.host), p.count, p.unit.type, peer, tag_of(messages.back().index),
                      comm_, &reqs[i]),
            "batch_p2p (irecv)");
    }
  }
  std::vector<MPI_Status> sts(ops.size());
  {
    WatchScope s(watch_, "batch_p2p", 0, std::move(messages));
    check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), sts.data()),
          "batch_p2p (wait)");
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != P2POp::kRecv) continue;
    int got = 0;
    MPI_Get_count(&sts[i], posted[i].unit.type, &got);
    if (got != posted[i].count)
      fail("{}: receive #{} expected {} elements from group rank {} but it sent {}",
           comm_where(*this, "batch_p2p"), i, ops[i].tensor.numel(), ops[i].peer,
           got / posted[i].unit.per_element);
    store(posted[i].host, ops[i].tensor);
  }
}

void MpiCommunicator::all_to_all(const at::Tensor& in, const std::vector<int64_t>& send_counts,
                                 const at::Tensor& out, const std::vector<int64_t>& recv_counts) {
  comm_check_all_to_all(*this, in, send_counts, out, recv_counts);
  if (size() == 1) return copy_flat(in, out);
  const MoveUnit u = move_unit(in);
  // Counts and displacements in MPI units; each must fit MPI's int.
  const auto n = static_cast<size_t>(size());
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  int64_t soff = 0, roff = 0;
  for (size_t i = 0; i < n; ++i) {
    sd[i] = count(soff, "all_to_all", "a send displacement");
    rd[i] = count(roff, "all_to_all", "a receive displacement");
    sc[i] = count(send_counts[i] * u.per_element, "all_to_all", "a send count");
    rc[i] = count(recv_counts[i] * u.per_element, "all_to_all", "a receive count");
    soff += send_counts[i] * u.per_element;
    roff += recv_counts[i] * u.per_element;
  }
  at::Tensor host_in = host_view(in, in.scalar_type(), true);
  at::Tensor host_out = host_view(out, out.scalar_type(), false);
  if (comm_overlaps(host_in, host_out)) host_in = host_in.clone();
  {
    WatchScope s(watch_, "all_to_all", watch_.enter_collective());
    check(MPI_Alltoallv(buf(host_in), sc.data(), sd.data(), u.type, buf(host_out), rc.data(),
                        rd.data(), u.type, comm_),
          "all_to_all");
  }
  store(host_out, out);
}

void MpiCommunicator::barrier() {
  WatchScope s(watch_, "barrier", watch_.enter_collective());
  check(MPI_Barrier(comm_), "barrier");
}

}  // namespace weft
