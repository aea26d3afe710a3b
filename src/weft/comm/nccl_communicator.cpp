// NcclCommunicator: the NCCL backend of Communicator (see nccl_communicator.h), written against
// NCCL 2.28 and PyTorch 2.11's c10::cuda API. Built only with the CUDA path.
//
// Invariant (stream order): each call records an event on the caller's current stream and makes
// this communicator's stream wait on it, enqueues the NCCL work on the communicator's stream,
// then records an event there and makes the current stream wait on it. The host does not wait
// (barrier() excepted), so to the caller a collective behaves like a kernel on the current
// stream; the communicator's own stream lets collectives of different groups overlap.
// Invariant (memory): every tensor NCCL touches is registered with the caching allocator on the
// communicator's stream (recordStream), so its block is not handed to another allocation until
// the NCCL work has finished, even if the caller frees it at once or allocated it on a stream
// other than the current one (then the current stream's wait alone would not protect it).
//
// Arguments are checked like the MPI backend's (comm_check_*, shared), plus the device: tensors
// must be CUDA tensors of the communicator's device. bf16 and fp16 are reduced by NCCL natively
// (each hop accumulates in the element type), so sums of values that are not exact in bf16 can
// differ in the last bits from the MPI backend's fp32 reduction. Avg is ncclAvg. NCCL cannot
// check that a send and its receive have the same size: a mismatch is undefined behaviour.
// Failures after ranks entered NCCL abort the job (comm_abort).
//
// Watchdog (watchdog.h): the host does not wait for NCCL work, so each enqueued operation is
// watched until an event recorded after it on the communicator's stream completes (the watchdog
// thread queries it; run() retires finished ones in order). An operation unfinished after the
// timeout, or an asynchronous NCCL error (ncclCommGetAsyncError, polled by the watchdog thread
// every tick), makes the watchdog name the missing ranks, call ncclCommAbort on every NCCL
// communicator of the process (so no kernel keeps spinning), and abort the job.
#include "weft/comm/nccl_communicator.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "weft/comm/comm_checks.h"
#include "weft/comm/process_groups.h"
#include "weft/comm/watchdog.h"
#include "weft/core/error.h"

namespace weft {
namespace {

ncclDataType_t nccl_reduce_type(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default: fail("no NCCL reduction type for {}", c10::toString(s));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

int mpi_rank_of(MPI_Comm comm) {
  int r = -1;
  if (comm == MPI_COMM_NULL || MPI_Comm_rank(comm, &r) != MPI_SUCCESS)
    fail("NcclCommunicator: invalid MPI communicator");
  return r;
}

// out[0:n) = in[0:n) for the one-member case (a no-op when they are one buffer).
void copy_flat(const at::Tensor& in, const at::Tensor& out) {
  if (in.numel() == 0 || in.data_ptr() == out.data_ptr()) return;
  out.reshape({-1}).copy_(in.reshape({-1}));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::string name, Group members, MPI_Comm mpi_comm);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string backend() const override { return "nccl"; }
  void all_gather(const at::Tensor& in, const at::Tensor& out) override;
  void reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter_async(const at::Tensor& in, const at::Tensor& out,
                                             ReduceOp op) override;
  void all_reduce(const at::Tensor& t, ReduceOp op) override;
  void broadcast(const at::Tensor& t, int root) override;
  void send(const at::Tensor& t, int peer) override;
  void recv(const at::Tensor& t, int peer) override;
  void batch_p2p(const std::vector<P2POp>& ops) override;
  void all_to_all(const at::Tensor& in, const std::vector<int64_t>& send_counts,
                  const at::Tensor& out, const std::vector<int64_t>& recv_counts) override;
  void barrier() override;

 private:
  // Enqueues `enqueue(stream)` (NCCL calls returning ncclResult_t) on the communicator's stream,
  // ordered against the current stream as the file comment says; `tensors` are recorded there.
  // With `finished` set, the current stream does not wait: an event recorded after the work
  // on the communicator's stream is returned there instead (for a Work to wait on later).
  // `seq` is the collective number (WatchedGroup::enter_collective), or 0 for point-to-point
  // work, whose `messages` say what it waits for; the operation is watched until it finishes.
  template <class Enqueue>
  void run(const char* op, uint64_t seq, std::vector<WatchMessage> messages,
           const std::vector<at::Tensor>& tensors, Enqueue&& enqueue,
           cudaEvent_t* finished = nullptr);
  // Ends the watch of enqueued operations that have finished, oldest first (caller holds mu_).
  void retire_finished();
  void check_device(const char* op, const at::Tensor& t) const;
  void* ptr(const at::Tensor& t) const;  // a valid device address even for empty tensors
  std::string where(const char* op) const;
  void nccl_check(ncclResult_t r, const char* op) const;
  void cuda_check(cudaError_t e, const char* op) const;

  MPI_Comm mpi_comm_;
  c10::DeviceIndex device_ = 0;
  ncclComm_t comm_ = nullptr;
  std::optional<c10::cuda::CUDAStream> stream_;  // CUDAStream has no default constructor
  cudaEvent_t ready_ = nullptr;  // recorded on the current stream, waited on by stream_
  cudaEvent_t done_ = nullptr;   // recorded on stream_, waited on by the current stream
  std::mutex mu_;                // the events are reused: one call at a time enqueues
  at::Tensor scratch_;           // one float on the device: barrier payload, empty-buffer address
  // Operations enqueued and watched, in stream order, each with the event recorded after it;
  // finished events are reused. Guarded by mu_.
  struct Pending {
    cudaEvent_t event;
    WatchToken token;
  };
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> spare_events_;
  std::optional<WatchedGroup> watch_;  // set once comm_ exists; reset first in the destructor
};

NcclCommunicator::NcclCommunicator(std::string name, Group members, MPI_Comm mpi_comm)
    : Communicator(std::move(name), std::move(members), mpi_rank_of(mpi_comm)),
      mpi_comm_(mpi_comm) {
  int n = 0;
  MPI_Comm_size(mpi_comm_, &n);
  WEFT_CHECK(n == size(), "group '{}': the MPI communicator has {} ranks but {} members",
             this->name(), n, size());
  if (c10::cuda::device_count() == 0)
    fail("group '{}': the NCCL backend needs a CUDA device and none is visible to this rank; "
         "use --backend mpi or check CUDA_VISIBLE_DEVICES", this->name());
  device_ = c10::cuda::current_device();
  c10::cuda::CUDAGuard guard(device_);

  ncclUniqueId id{};
  if (rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, mpi_comm_) != MPI_SUCCESS)
    comm_abort(where("broadcast of the ncclUniqueId over MPI") + " failed");
  nccl_check(ncclCommInitRank(&comm_, size(), id, rank()), "ncclCommInitRank");

  stream_.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_));
  cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
  cuda_check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  scratch_ = at::empty({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));

  WatchHooks hooks;
  ncclComm_t comm = comm_;
  hooks.async_error = [comm]() -> std::string {
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) return "ncclCommGetAsyncError failed";
    if (async == ncclSuccess || async == ncclInProgress) return "";
    const char* last = ncclGetLastError(comm);
    return fmt::format("asynchronous NCCL error '{}' ({})", ncclGetErrorString(async),
                       last ? last : "");
  };
  hooks.abort = [comm] { ncclCommAbort(comm); };
  watch_.emplace(this->name(), mpi_comm_, std::move(hooks));
}

NcclCommunicator::~NcclCommunicator() {
  watch_.reset();  // unregisters: the watchdog no longer calls the hooks or queries the events
  {
    c10::cuda::CUDAGuard guard(device_);
    if (comm_) ncclCommDestroy(comm_);  // finalizes: flushes this communicator's pending work
    if (ready_) cudaEventDestroy(ready_);
    if (done_) cudaEventDestroy(done_);
    for (const Pending& p : pending_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && mpi_comm_ != MPI_COMM_NULL && mpi_comm_ != MPI_COMM_WORLD)
    MPI_Comm_free(&mpi_comm_);
}

std::string NcclCommunicator::where(const char* op) const {
  return fmt::format("{} on group '{}' (group rank {} of {}, nccl backend, cuda:{})", op, name(),
                     rank(), size(), static_cast<int>(device_));
}

void NcclCommunicator::nccl_check(ncclResult_t r, const char* op) const {
  if (r == ncclSuccess) return;
  const char* last = comm_ ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
  comm_abort(fmt::format("{}: NCCL error '{}' ({})", where(op), ncclGetErrorString(r),
                         last ? last : ""));
}

void NcclCommunicator::cuda_check(cudaError_t e, const char* op) const {
  if (e != cudaSuccess) comm_abort(fmt::format("{}: CUDA error '{}'", where(op), cudaGetErrorString(e)));
}

void NcclCommunicator::check_device(const char* op, const at::Tensor& t) const {
  if (!t.is_cuda() || t.get_device() != device_)
    fail("{}: tensor is on {} but this communicator works on cuda:{}; the NCCL backend takes "
         "CUDA tensors of its own device (CPU tensors go to the MPI backend)",
         where(op), t.device().str(), static_cast<int>(device_));
}

void* NcclCommunicator::ptr(const at::Tensor& t) const {
  void* p = t.numel() > 0 ? t.data_ptr() : nullptr;
  return p ? p : scratch_.data_ptr();
}

void NcclCommunicator::retire_finished() {
  while (!pending_.empty() && cudaEventQuery(pending_.front().event) != cudaErrorNotReady) {
    watch_end(pending_.front().token);
    spare_events_.push_back(pending_.front().event);
    pending_.pop_front();
  }
}

template <class Enqueue>
void NcclCommunicator::run(const char* op, uint64_t seq, std::vector<WatchMessage> messages,
                           const std::vector<at::Tensor>& tensors, Enqueue&& enqueue,
                           cudaEvent_t* finished) {
  std::lock_guard<std::mutex> lock(mu_);
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t current = c10::cuda::getCurrentCUDAStream(device_).stream();
  const cudaStream_t comm_stream = stream_->stream();
  cuda_check(cudaEventRecord(ready_, current), op);
  cuda_check(cudaStreamWaitEvent(comm_stream, ready_, 0), op);
  nccl_check(enqueue(comm_stream), op);
  for (const at::Tensor& t : tensors)
    if (t.defined() && t.numel() > 0)
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *stream_);
  if (finished) {
    cuda_check(cudaEventCreateWithFlags(finished, cudaEventDisableTiming), op);
    cuda_check(cudaEventRecord(*finished, comm_stream), op);
  } else {
    cuda_check(cudaEventRecord(done_, comm_stream), op);
    cuda_check(cudaStreamWaitEvent(current, done_, 0), op);
  }
  retire_finished();
  cudaEvent_t watched = nullptr;
  if (spare_events_.empty()) {
    cuda_check(cudaEventCreateWithFlags(&watched, cudaEventDisableTiming), op);
  } else {
    watched = spare_events_.back();
    spare_events_.pop_back();
  }
  cuda_check(cudaEventRecord(watched, comm_stream), op);
  // Asked on the watchdog thread, which must make the event's device current first (else the
  // runtime would create a context on device 0 for that thread).
  const c10::DeviceIndex dev = device_;
  const WatchToken token = watch_begin(*watch_, op, seq, std::move(messages), [watched, dev] {
    cudaSetDevice(dev);
    return cudaEventQuery(watched) != cudaErrorNotReady;
  });
  if (token == 0) spare_events_.push_back(watched);  // no watchdog running
  else pending_.push_back({watched, token});
  ncclResult_t async = ncclSuccess;
  nccl_check(ncclCommGetAsyncError(comm_, &async), op);
  if (async != ncclInProgress) nccl_check(async, op);
}

void NcclCommunicator::all_gather(const at::Tensor& in, const at::Tensor& out) {
  comm_check_all_gather(*this, in, out);
  check_device("all_gather", in);
  check_device("all_gather", out);
  if (size() == 1) return copy_flat(in, out);
  if (in.numel() == 0) return;  // every member's shard is empty (equal shards): nothing to do
  const size_t bytes = in.nbytes();
  // NCCL's in-place form: `in` is this rank's slot of `out`. Other overlaps are copied first.
  const bool in_place = static_cast<char*>(in.data_ptr()) ==
                        static_cast<char*>(out.data_ptr()) + static_cast<size_t>(rank()) * bytes;
  const at::Tensor src = (!in_place && comm_overlaps(in, out)) ? in.clone() : in;
  run("all_gather", watch_->enter_collective(), {}, {src, out}, [&](cudaStream_t s) {
    return ncclAllGather(src.data_ptr(), out.data_ptr(), bytes, ncclUint8, comm_, s);
  });
}

void NcclCommunicator::reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op) {
  comm_check_reduce_scatter(*this, in, out, op);
  check_device("reduce_scatter", in);
  check_device("reduce_scatter", out);
  if (size() == 1) return copy_flat(in, out);
  if (out.numel() == 0) return;  // equal shards, all empty
  const bool in_place = static_cast<char*>(out.data_ptr()) ==
                        static_cast<char*>(in.data_ptr()) +
                            static_cast<size_t>(rank()) * out.nbytes();
  const at::Tensor src = (!in_place && comm_overlaps(in, out)) ? in.clone() : in;
  run("reduce_scatter", watch_->enter_collective(), {}, {src, out}, [&](cudaStream_t s) {
    return ncclReduceScatter(src.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                             nccl_reduce_type(out.scalar_type()), nccl_op(op), comm_, s);
  });
}

namespace {

// Work of an NCCL collective: an event recorded on the communicator's stream after it; wait()
// makes the caller's current stream wait on it. The tensors were recorded on the communicator's
// stream by run(), so the allocator keeps them until the work is done.
class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t done, c10::DeviceIndex device) : done_(done), device_(device) {}
  ~NcclWork() override {
    if (!waited_) wait();
    if (done_) cudaEventDestroy(done_);
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    if (!done_) return;
    c10::cuda::CUDAGuard guard(device_);
    const cudaError_t e =
        cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device_).stream(), done_, 0);
    if (e != cudaSuccess)
      comm_abort(std::string("NCCL reduce_scatter_async wait: ") + cudaGetErrorString(e));
  }

 private:
  cudaEvent_t done_;
  c10::DeviceIndex device_;
  bool waited_ = false;
};

}  // namespace

std::unique_ptr<Work> NcclCommunicator::reduce_scatter_async(const at::Tensor& in,
                                                             const at::Tensor& out, ReduceOp op) {
  comm_check_reduce_scatter(*this, in, out, op);
  check_device("reduce_scatter", in);
  check_device("reduce_scatter", out);
  if (size() == 1 || out.numel() == 0) {  // nothing in flight: done on the current stream
    reduce_scatter(in, out, op);
    return std::make_unique<NcclWork>(nullptr, device_);
  }
  const bool in_place = static_cast<char*>(out.data_ptr()) ==
                        static_cast<char*>(in.data_ptr()) +
                            static_cast<size_t>(rank()) * out.nbytes();
  const at::Tensor src = (!in_place && comm_overlaps(in, out)) ? in.clone() : in;
  cudaEvent_t done = nullptr;
  run("reduce_scatter_async", watch_->enter_collective(), {}, {src, out}, [&](cudaStream_t s) {
    return ncclReduceScatter(src.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                             nccl_reduce_type(out.scalar_type()), nccl_op(op), comm_, s);
  }, &done);
  return std::make_unique<NcclWork>(done, device_);
}

void NcclCommunicator::all_reduce(const at::Tensor& t, ReduceOp op) {
  comm_check_all_reduce(*this, t, op);
  check_device("all_reduce", t);
  if (size() == 1 || t.numel() == 0) return;
  run("all_reduce", watch_->enter_collective(), {}, {t}, [&](cudaStream_t s) {
    return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                         nccl_reduce_type(t.scalar_type()), nccl_op(op), comm_, s);
  });
}

void NcclCommunicator::broadcast(const at::Tensor& t, int root) {
  comm_check_broadcast(*this, t, root);
  check_device("broadcast", t);
  if (size() == 1 || t.numel() == 0) return;
  run("broadcast", watch_->enter_collective(), {}, {t}, [&](cudaStream_t s) {
    return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, s);
  });
}

void NcclCommunicator::send(const at::Tensor& t, int peer) {
  comm_check_p2p(*this, "send", t, peer);
  check_device("send", t);
  run("send", 0, {{peer, true, watch_->next_send(peer)}}, {t}, [&](cudaStream_t s) {
    return ncclSend(ptr(t), t.nbytes(), ncclUint8, peer, comm_, s);
  });
}

void NcclCommunicator::recv(const at::Tensor& t, int peer) {
  comm_check_p2p(*this, "recv", t, peer);
  check_device("recv", t);
  run("recv", 0, {{peer, false, watch_->next_recv(peer)}}, {t}, [&](cudaStream_t s) {
    return ncclRecv(ptr(t), t.nbytes(), ncclUint8, peer, comm_, s);
  });
}

void NcclCommunicator::batch_p2p(const std::vector<P2POp>& ops) {
  comm_check_batch_p2p(*this, ops);
  std::vector<at::Tensor> tensors;
  tensors.reserve(ops.size());
  for (const P2POp& op : ops) {
    check_device("batch_p2p", op.tensor);
    tensors.push_back(op.tensor);
  }
  if (ops.empty()) return;
  std::vector<WatchMessage> messages;
  for (const P2POp& op : ops)
    messages.push_back(op.kind == P2POp::kSend
                           ? WatchMessage{op.peer, true, watch_->next_send(op.peer)}
                           : WatchMessage{op.peer, false, watch_->next_recv(op.peer)});
  // Inside one NCCL group, the sends to a peer match that peer's receives in posting order.
  run("batch_p2p", 0, std::move(messages), tensors, [&](cudaStream_t s) {
    ncclResult_t r = ncclGroupStart();
    for (size_t i = 0; i < ops.size() && r == ncclSuccess; ++i) {
      const at::Tensor& t = ops[i].tensor;
      r = ops[i].kind == P2POp::kSend
              ? ncclSend(ptr(t), t.nbytes(), ncclUint8, ops[i].peer, comm_, s)
              : ncclRecv(ptr(t), t.nbytes(), ncclUint8, ops[i].peer, comm_, s);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

void NcclCommunicator::all_to_all(const at::Tensor& in, const std::vector<int64_t>& send_counts,
                                  const at::Tensor& out, const std::vector<int64_t>& recv_counts) {
  comm_check_all_to_all(*this, in, send_counts, out, recv_counts);
  check_device("all_to_all", in);
  check_device("all_to_all", out);
  if (size() == 1) return copy_flat(in, out);
  const at::Tensor src = comm_overlaps(in, out) ? in.clone() : in;
  const size_t item = static_cast<size_t>(in.element_size());
  run("all_to_all", watch_->enter_collective(), {}, {src, out}, [&](cudaStream_t s) {
    char* send_base = static_cast<char*>(ptr(src));
    char* recv_base = static_cast<char*>(ptr(out));
    size_t soff = 0, roff = 0;
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < size() && r == ncclSuccess; ++p) {
      const size_t sb = static_cast<size_t>(send_counts[p]) * item;
      const size_t rb = static_cast<size_t>(recv_counts[p]) * item;
      // Zero-byte pairs are posted too: every rank posts the same pattern, the peers pair up.
      r = ncclSend(sb ? send_base + soff : send_base, sb, ncclUint8, p, comm_, s);
      if (r == ncclSuccess) r = ncclRecv(rb ? recv_base + roff : recv_base, rb, ncclUint8, p, comm_, s);
      soff += sb;
      roff += rb;
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

// An NCCL all-reduce of one float, then the host waits for it: when barrier() returns, every
// member has reached its barrier() and this rank's earlier work on the current stream is done.
void NcclCommunicator::barrier() {
  run("barrier", watch_->enter_collective(), {}, {scratch_}, [&](cudaStream_t s) {
    return ncclAllReduce(scratch_.data_ptr(), scratch_.data_ptr(), 1, ncclFloat32, ncclSum,
                         comm_, s);
  });
  cuda_check(cudaStreamSynchronize(stream_->stream()), "barrier");
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::string name, Group members,
                                                     MPI_Comm comm) {
  return std::make_unique<NcclCommunicator>(std::move(name), std::move(members), comm);
}

bool nccl_available() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch, earlier major*1000 + minor*100 + patch.
  const int major = v >= 10000 ? v / 10000 : v / 1000;
  const int minor = v >= 10000 ? (v % 10000) / 100 : (v % 1000) / 100;
  return fmt::format("{}.{}.{}", major, minor, v % 100);
}

}  // namespace weft
