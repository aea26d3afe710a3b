// The alltoall token dispatcher (see expert_parallel.h).
#include "weft/parallel/expert_parallel.h"

#include <ATen/Functions.h>
#include <torch/csrc/autograd/custom_function.h>

#include <functional>
#include <numeric>

#include "weft/core/error.h"

namespace weft {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

int64_t sum_of(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

// Rows -> elements for Communicator::all_to_all.
std::vector<int64_t> elements(const std::vector<int64_t>& rows, int64_t row_numel) {
  std::vector<int64_t> out(rows);
  for (auto& n : out) n *= row_numel;
  return out;
}

at::Tensor exchange(Communicator& comm, const at::Tensor& x, const std::vector<int64_t>& send,
                    const std::vector<int64_t>& recv) {
  std::vector<int64_t> shape = x.sizes().vec();
  // From the sizes, not x[0]: a rank may have no rows to send.
  const int64_t row_numel =
      std::accumulate(shape.begin() + 1, shape.end(), int64_t{1}, std::multiplies<int64_t>());
  WEFT_CHECK(sum_of(send) == x.size(0), "all_to_all_rows: send counts sum to {}, rows {}",
             sum_of(send), x.size(0));
  shape[0] = sum_of(recv);
  at::Tensor out = at::empty(shape, x.options());
  comm.all_to_all(x.contiguous().view({-1}), elements(send, row_numel), out.view({-1}),
                  elements(recv, row_numel));
  return out;
}

struct AllToAllRowsFn : Function<AllToAllRowsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm_ptr,
                            const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
    ctx->saved_data["comm"] = comm_ptr;
    ctx->saved_data["send"] = c10::IValue(send);
    ctx->saved_data["recv"] = c10::IValue(recv);
    return exchange(*reinterpret_cast<Communicator*>(static_cast<intptr_t>(comm_ptr)), x, send,
                    recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* comm =
        reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    return {exchange(*comm, grads[0], recv, send), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all_rows(Communicator& comm, const at::Tensor& x,
                           const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows) {
  WEFT_CHECK(static_cast<int>(send_rows.size()) == comm.size() &&
                 static_cast<int>(recv_rows.size()) == comm.size(),
             "all_to_all_rows over {} ({} ranks): {} send and {} recv counts", comm.name(),
             comm.size(), send_rows.size(), recv_rows.size());
  return AllToAllRowsFn::apply(x, static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm)),
                               send_rows, recv_rows);
}

ExpertParallel::ExpertParallel(FsdpUnit* experts, Communicator* ep, int num_experts,
                               const MlpSpec& spec, bool grouped_gemm)
    : ep_(ep), num_experts_(num_experts), spec_(spec), grouped_gemm_(grouped_gemm) {
  WEFT_CHECK(num_experts % ep->size() == 0, "{} experts do not split over ep {}", num_experts,
             ep->size());
  local_ = num_experts / ep->size();
  WEFT_CHECK(experts->num_params() == 2 * local_, "expert unit {} has {} parameters, expected {}",
             experts->name(), experts->num_params(), 2 * local_);
  for (int i = 0; i < local_; ++i) {
    fc1_.push_back(experts->handle(i));
    fc2_.push_back(experts->handle(local_ + i));
  }
}

at::Tensor ExpertParallel::run(const at::Tensor& rows, const std::vector<int64_t>& counts) {
  WEFT_CHECK(static_cast<int>(counts.size()) == num_experts_, "{} counts for {} experts",
             counts.size(), num_experts_);
  const int P = ep_->size();
  if (P == 1) return grouped_expert_mlp(rows, counts, fc1_, fc2_, spec_, grouped_gemm_);

  // 1. counts[r*L + e] go to rank r; from source s arrive its counts for my L experts.
  // (On the rows' device, so that the NCCL backend can take them.)
  const at::Tensor sent_counts = at::tensor(counts, at::kLong).to(rows.device());
  at::Tensor got_counts = at::empty({P * local_}, sent_counts.options());
  ep_->all_to_all(sent_counts, std::vector<int64_t>(P, local_), got_counts,
                  std::vector<int64_t>(P, local_));
  got_counts = got_counts.cpu();
  const int64_t* got = got_counts.data_ptr<int64_t>();
  std::vector<int64_t> send(P, 0), recv(P, 0), local_counts(local_, 0);
  for (int r = 0; r < P; ++r)
    for (int e = 0; e < local_; ++e) {
      send[r] += counts[r * local_ + e];
      recv[r] += got[r * local_ + e];
      local_counts[e] += got[r * local_ + e];
    }

  // 2. rows to the experts' ranks; arrivals are source-major, then expert.
  const at::Tensor arrived = all_to_all_rows(*ep_, rows, send, recv);

  // 3. expert-major order: for each local expert, the rows of source 0, 1, ...
  std::vector<int64_t> start(P * local_);  // arrival offset of (source, expert)
  for (int64_t r = 0, off = 0; r < P; ++r)
    for (int e = 0; e < local_; ++e) {
      start[r * local_ + e] = off;
      off += got[r * local_ + e];
    }
  std::vector<int64_t> perm;
  perm.reserve(arrived.size(0));
  for (int e = 0; e < local_; ++e)
    for (int r = 0; r < P; ++r)
      for (int64_t i = 0; i < got[r * local_ + e]; ++i) perm.push_back(start[r * local_ + e] + i);
  const at::Tensor order = at::tensor(perm, at::kLong).to(rows.device());
  at::Tensor inverse = at::empty_like(order);
  inverse.index_put_({order}, at::arange(static_cast<int64_t>(perm.size()), order.options()));
  const at::Tensor out = grouped_expert_mlp(permute_rows(arrived, order, inverse), local_counts,
                                            fc1_, fc2_, spec_, grouped_gemm_);

  // 4. back in arrival order, and home.
  return all_to_all_rows(*ep_, permute_rows(out, inverse, order), recv, send);
}

}  // namespace weft
