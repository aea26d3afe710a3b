// The routed experts through grouped GEMMs (--moe-grouped-gemm, see moe.h): for all experts at
// once, fc1 and fc2 forward and both input gradients are one torch._grouped_mm each, on CUDA in
// bf16. Written as one autograd function over the experts' ParamHandles (ops.h's contract: each
// handle is fetched once in forward, again in backward, and gets one gradient).
//
// The experts' weights are taken as a [G, rows, cols] view when they lie back to back in memory
// (an FSDP unit with a shard group of one rank keeps fc1 of every expert, then fc2 of every
// expert, in one flat buffer), otherwise stacked into one temporary. Weight gradients come from
// one grouped GEMM per projection too (ragged K: each expert's rows), in bf16 as the kernel
// writes them, and are added into the gradient buffers (one add when the buffers are adjacent):
// each microbatch's weight gradient is rounded to bf16 once, as under PyTorch's autocast, then
// accumulated in float32 (in bf16 with --grad-reduce-in-bf16). Fewer, larger launches matter
// here: a per-expert loop made the step host-bound.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <numeric>

#include "weft/core/compat.h"
#include "weft/core/error.h"
#include "weft/model/fused.h"
#include "weft/model/moe.h"

namespace weft {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

// [G, r, c] view over G tensors of shape [r, c] that lie back to back in one storage; undefined
// when they do not.
at::Tensor adjacent_view(const std::vector<at::Tensor>& w) {
  const int64_t n = w[0].numel();
  for (size_t g = 0; g < w.size(); ++g)
    if (!w[g].is_contiguous() || w[g].sizes() != w[0].sizes() ||
        !w[g].storage().is_alias_of(w[0].storage()) ||
        w[g].storage_offset() != w[0].storage_offset() + static_cast<int64_t>(g) * n)
      return {};
  return w[0].as_strided({static_cast<int64_t>(w.size()), w[0].size(0), w[0].size(1)},
                         {n, w[0].size(1), 1});
}

// [G, r, c] over G weights of shape [r, c]: a view when they are adjacent, else a copy.
at::Tensor stacked(const std::vector<at::Tensor>& w) {
  at::Tensor v = adjacent_view(w);
  return v.defined() ? v : at::stack(w);
}

// Adds dw [G, r, c] (one group per expert; groups of experts without rows are not written by the
// kernel and are skipped) into the experts' gradient buffers.
void accumulate(ParamSource* s, const std::vector<int64_t>& idx, const at::Tensor& dw,
                const std::vector<int64_t>& counts) {
  std::vector<at::Tensor> bufs;
  for (int64_t i : idx) bufs.push_back(s->grad_buffer(static_cast<int>(i)));
  const bool all_rows = std::all_of(counts.begin(), counts.end(), [](int64_t n) { return n > 0; });
  at::Tensor view = all_rows ? adjacent_view(bufs) : at::Tensor();
  if (view.defined()) {
    view.add_(dw);
  } else {
    for (size_t g = 0; g < bufs.size(); ++g)
      if (counts[g] > 0) bufs[g].add_(dw[g]);
  }
  for (int64_t i : idx) s->grad_ready(static_cast<int>(i));
}

struct Experts {
  ParamSource* source;
  std::vector<int64_t> fc1, fc2;  // handle indices
  bool squared_relu = false;
};

// The activation of a [N, fc1 rows] and its input gradient: SwiGLU through the fused kernels,
// squared ReLU (relu(a)^2, gradient 2 relu(a) dact) in ATen.
at::Tensor activation(const at::Tensor& a, bool squared_relu) {
  return squared_relu ? at::relu(a).square() : fused::swiglu_forward(a);
}
at::Tensor activation_backward(const at::Tensor& dact, const at::Tensor& a, bool squared_relu) {
  return squared_relu ? dact * at::relu(a) * 2 : fused::swiglu_backward(dact, a);
}

std::vector<at::Tensor> fetch(ParamSource* s, const std::vector<int64_t>& idx, bool backward) {
  std::vector<at::Tensor> out;
  for (int64_t i : idx)
    out.push_back(backward ? s->backward_weight(static_cast<int>(i))
                           : s->forward_weight(static_cast<int>(i)));
  return out;
}

struct GroupedMlpFn : Function<GroupedMlpFn> {
  // `w1`, `w2`: the stacked weights fetched for this forward (not saved).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows,
                            const c10::optional<at::Tensor>& /*anchor*/, const at::Tensor& w1,
                            const at::Tensor& w2, const Experts& e,
                            const std::vector<int64_t>& counts) {
    ctx->saved_data["source"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(e.source));
    ctx->saved_data["fc1"] = c10::IValue(e.fc1);
    ctx->saved_data["fc2"] = c10::IValue(e.fc2);
    ctx->saved_data["counts"] = c10::IValue(counts);
    ctx->saved_data["squared_relu"] = e.squared_relu;
    std::vector<int64_t> ends(counts.size());
    std::partial_sum(counts.begin(), counts.end(), ends.begin());
    const at::Tensor offs = at::tensor(std::vector<int32_t>(ends.begin(), ends.end()), at::kInt)
                                .to(rows.device(), /*non_blocking=*/true);
    const at::Tensor x = rows.contiguous();
    const at::Tensor a = compat::grouped_mm(x, w1.transpose(1, 2), offs);  // [N, 2f] or [N, f]
    ctx->save_for_backward({x, a, offs});
    return compat::grouped_mm(activation(a, e.squared_relu), w2.transpose(1, 2), offs);  // [N, h]
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* source =
        reinterpret_cast<ParamSource*>(static_cast<intptr_t>(ctx->saved_data["source"].toInt()));
    const std::vector<int64_t> fc1 = ctx->saved_data["fc1"].toIntVector();
    const std::vector<int64_t> fc2 = ctx->saved_data["fc2"].toIntVector();
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const bool squared_relu = ctx->saved_data["squared_relu"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &a = saved[1], &offs = saved[2];
    const at::Tensor dy = grads[0].contiguous();

    const at::Tensor w2 = stacked(fetch(source, fc2, true));      // [G, h, f]
    const at::Tensor act = activation(a, squared_relu);           // recomputed, [N, f]
    const at::Tensor dact = compat::grouped_mm(dy, w2, offs);     // [N, f]
    const at::Tensor da = activation_backward(dact, a, squared_relu);  // like a
    at::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      const at::Tensor w1 = stacked(fetch(source, fc1, true));    // [G, fc1 rows, h]
      dx = compat::grouped_mm(da, w1, offs);                      // [N, h]
    }
    // Weight gradients: dW2[g] = dy_g^T act_g, dW1[g] = da_g^T x_g (groups split the rows).
    accumulate(source, fc2, compat::grouped_mm(dy.t(), act, offs), counts);
    accumulate(source, fc1, compat::grouped_mm(da.t(), x, offs), counts);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool grouped_gemm_usable(const at::Tensor& rows, int64_t ffn) {
  // 16-byte aligned rows for the kernel: h and f multiples of 8 bf16 elements.
  return compat::grouped_mm_usable(rows) && fused::usable(rows) && rows.size(0) > 0 &&
         rows.size(-1) % 8 == 0 && ffn % 8 == 0;
}

at::Tensor grouped_gemm_expert_mlp(const at::Tensor& rows, const std::vector<int64_t>& counts,
                                   const std::vector<ParamHandle>& fc1,
                                   const std::vector<ParamHandle>& fc2, const MlpSpec& spec) {
  WEFT_CHECK(!fc1.empty() && fc1.size() == fc2.size() && counts.size() == fc1.size(),
             "grouped_gemm_expert_mlp: {} counts, {} / {} experts", counts.size(), fc1.size(),
             fc2.size());
  Experts e{fc1[0].source, {}, {}, spec.squared_relu};
  for (size_t g = 0; g < fc1.size(); ++g) {
    WEFT_CHECK(fc1[g].source == e.source && fc2[g].source == e.source,
               "grouped_gemm_expert_mlp: experts must share one ParamSource");
    e.fc1.push_back(fc1[g].index);
    e.fc2.push_back(fc2[g].index);
  }
  const bool grad_mode = at::GradMode::is_enabled();
  const at::Tensor w1 = stacked(fetch(e.source, e.fc1, false));
  const at::Tensor w2 = stacked(fetch(e.source, e.fc2, false));
  c10::optional<at::Tensor> anchor;
  if (grad_mode && !rows.requires_grad()) anchor = at::empty({0}, w1.options()).requires_grad_(true);
  return GroupedMlpFn::apply(rows, anchor, w1, w2, e, counts);
}

}  // namespace weft
