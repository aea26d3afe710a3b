// Parametric ops as custom autograd functions over ParamHandles (see ops.h).
//
// Each op fetches its weight with forward_weight() *outside* Function::apply, where grad mode
// still has the caller's value (apply switches it off around forward), so the source counts
// exactly the uses that get a graph node. The weight travels into forward as a non-tensor
// argument: it is no autograd input, no edge to whatever produced it is kept, and it is never
// saved. Backward fetches it again with backward_weight() only when the input gradient needs
// it, accumulates the weight gradient into grad_buffer(), then calls grad_ready() once.
#include "weft/model/ops.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/rsqrt.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <vector>

#include "weft/core/compat.h"
#include "weft/core/error.h"
#include "weft/model/fused.h"

namespace weft::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

// A weight fetched for one forward: passed to Function::apply as a plain value so that autograd
// neither tracks nor saves it.
struct WeightRef {
  at::Tensor value;
};

void check_handle(ParamHandle h) {
  WEFT_CHECK(h.source != nullptr && h.index >= 0, "op called with an unset ParamHandle (index {})",
             h.index);
}

void save_handle(AutogradContext* ctx, ParamHandle h) {
  ctx->saved_data["weft_source"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(h.source));
  ctx->saved_data["weft_index"] = static_cast<int64_t>(h.index);
}

ParamHandle load_handle(AutogradContext* ctx) {
  ParamHandle h;
  h.source = reinterpret_cast<ParamSource*>(
      static_cast<intptr_t>(ctx->saved_data.at("weft_source").toInt()));
  h.index = static_cast<int>(ctx->saved_data.at("weft_index").toInt());
  return h;
}

// Under grad mode, an op must get a graph node even when no tensor input requires grad (token
// ids; a detached stage input), else its weight gradient would silently never be delivered.
// Returns a zero-element leaf that requires grad in that case (its gradient is always
// undefined, so nothing accumulates into it), nullopt otherwise.
c10::optional<at::Tensor> grad_anchor(bool grad_mode, const at::Tensor& x,
                                      const at::Tensor& weight) {
  if (!grad_mode || x.requires_grad()) return c10::nullopt;
  return at::empty({0}, weight.options()).requires_grad_(true);
}

void check_grad_buffer(ParamHandle h, const at::Tensor& buf, at::IntArrayRef shape) {
  WEFT_CHECK(buf.defined() && buf.sizes() == shape,
             "grad_buffer({}) must be a full-shape [{}] buffer, got [{}]", h.index,
             fmt::join(shape, ", "),
             buf.defined() ? fmt::format("{}", fmt::join(buf.sizes(), ", ")) : "undefined");
}

at::Tensor fetch_grad_buffer(ParamHandle h, at::IntArrayRef shape) {
  at::Tensor buf = h.source->grad_buffer(h.index);
  check_grad_buffer(h, buf, shape);
  return buf;
}

ParamSource::WriteTarget fetch_grad_write_target(ParamHandle h, at::IntArrayRef shape) {
  ParamSource::WriteTarget t = h.source->grad_buffer_to_write(h.index);
  check_grad_buffer(h, t.buffer, shape);
  return t;
}

// --- linear: y = x @ W^T ---------------------------------------------------------------------

// `compute` (linear_in; -1: x's dtype) is the dtype of the product: x and W are cast to it in
// forward and again in backward, so that x is saved in its own (narrower) dtype, as Megatron's
// router_gating_linear saves it.
struct LinearFn : Function<LinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& /*anchor*/, const WeightRef& w,
                            ParamHandle h, int64_t compute) {
    save_handle(ctx, h);
    ctx->save_for_backward({x});
    ctx->saved_data["weft_out"] = w.value.size(0);
    ctx->saved_data["weft_in"] = w.value.size(1);
    ctx->saved_data["weft_compute"] = compute;
    const c10::ScalarType dt = compute < 0 ? x.scalar_type() : static_cast<c10::ScalarType>(compute);
    return compat::matmul(x.to(dt), w.value.to(dt).t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const ParamHandle h = load_handle(ctx);
    const at::Tensor x_saved = ctx->get_saved_variables()[0];
    const int64_t out = ctx->saved_data.at("weft_out").toInt();
    const int64_t in = ctx->saved_data.at("weft_in").toInt();
    const int64_t compute = ctx->saved_data.at("weft_compute").toInt();
    const at::Tensor& dy = grads[0];  // in the product's dtype
    const at::Tensor x = compute < 0 ? x_saved : x_saved.to(dy.scalar_type());

    at::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      const at::Tensor w = h.source->backward_weight(h.index);
      dx = compat::matmul(dy, w.to(dy.scalar_type())).to(x_saved.scalar_type());
    }

    // dW = dy2d^T @ x2d, summed over every token: written by the GEMM into a fresh buffer,
    // added by it otherwise.
    ParamSource::WriteTarget t = fetch_grad_write_target(h, {out, in});
    const at::Tensor dy2 = dy.reshape({-1, out});
    const at::Tensor x2 = x.reshape({-1, in});
    if (t.fresh)
      compat::mm_write(t.buffer, dy2.t(), x2);
    else
      compat::addmm_accumulate(t.buffer, dy2.t(), x2);
    h.source->grad_ready(h.index);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// --- a linear layer's bias: y = x + b ----------------------------------------------------------

struct BiasFn : Function<BiasFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& /*anchor*/, const WeightRef& b,
                            ParamHandle h) {
    save_handle(ctx, h);
    return x + b.value;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const ParamHandle h = load_handle(ctx);
    const at::Tensor& dy = grads[0];
    const int64_t n = dy.size(-1);
    // db = sum over every token of dy, reduced in float32 (not in bf16) into the buffer.
    at::Tensor buf = fetch_grad_buffer(h, {n});
    const auto acc = accum_dtype(dy.scalar_type());
    const at::Tensor db = dy.reshape({-1, n}).sum(at::IntArrayRef{0}, /*keepdim=*/false, acc);
    buf.add_(db.to(buf.scalar_type()));
    h.source->grad_ready(h.index);
    return {ctx->needs_input_grad(0) ? dy : at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// --- RMSNorm scale: y = xhat * w ---------------------------------------------------------------

struct ScaleFn : Function<ScaleFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& xhat,
                            const c10::optional<at::Tensor>& /*anchor*/, const WeightRef& w,
                            ParamHandle h) {
    save_handle(ctx, h);
    ctx->save_for_backward({xhat});
    return xhat * w.value;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const ParamHandle h = load_handle(ctx);
    const at::Tensor xhat = ctx->get_saved_variables()[0];
    const at::Tensor& dy = grads[0];
    const int64_t n = xhat.size(-1);

    at::Tensor dxhat;
    if (ctx->needs_input_grad(0)) dxhat = dy * h.source->backward_weight(h.index);

    // dw = sum over every token of dy * xhat, in the buffer's dtype and at least float32 (a bf16
    // buffer, --grad-reduce-in-bf16, gets the float32 sum rounded once).
    at::Tensor buf = fetch_grad_buffer(h, {n});
    const auto acc = at::promote_types(buf.scalar_type(), at::kFloat);
    const at::Tensor dw = (dy.reshape({-1, n}).to(acc) * xhat.reshape({-1, n}).to(acc)).sum(0);
    buf.add_(dw.to(buf.scalar_type()));
    h.source->grad_ready(h.index);
    return {dxhat, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// --- fused RMSNorm (CUDA): y = round(x * rstd) * w in one kernel ------------------------------

// The backward of the fused norm functions below, from their saved {x, rstd} (x the row that was
// normalised): dx for dy, plus dres where defined, and the weight gradient delivered once. The
// kernel needs the weight for dx and yields the weight gradient in the same pass, so the
// weight is fetched even when x needs no gradient.
at::Tensor fused_norm_backward(AutogradContext* ctx, const at::Tensor& dy, const at::Tensor& dres) {
  const ParamHandle h = load_handle(ctx);
  const auto saved = ctx->get_saved_variables();
  at::Tensor dw;
  at::Tensor dx = fused::rms_norm_backward(dy, saved[0], h.source->backward_weight(h.index),
                                           saved[1], &dw, dres);
  ParamSource::WriteTarget t = fetch_grad_write_target(h, {saved[0].size(-1)});
  if (t.fresh)
    t.buffer.copy_(dw);
  else
    t.buffer.add_(dw);
  h.source->grad_ready(h.index);
  return dx;
}

struct RmsNormFn : Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& /*anchor*/, const WeightRef& w,
                            ParamHandle h, double eps) {
    save_handle(ctx, h);
    auto [y, rstd] = fused::rms_norm_forward(x, w.value, eps);
    ctx->save_for_backward({x, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor dx = fused_norm_backward(ctx, grads[0], at::Tensor());
    if (!ctx->needs_input_grad(0)) dx = at::Tensor();
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// --- fused residual add and RMSNorm (CUDA): {s = x + res, round(s * rstd) * w} -------------------

// The gradient of s arrives from its later uses (the next residual add) and from the norm; the
// backward adds them inside the norm's kernel, which autograd would otherwise do as a separate
// add, and hands the sum to both x and res, as the add's own backward does.
struct AddRmsNormFn : Function<AddRmsNormFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& res,
                               const c10::optional<at::Tensor>& /*anchor*/, const WeightRef& w,
                               ParamHandle h, double eps) {
    save_handle(ctx, h);
    auto [sum, y, rstd] = fused::add_rms_norm_forward(x, res, w.value, eps);
    ctx->save_for_backward({sum, rstd});
    // The sum often has no other use (the final norm, where the last residual add of the
    // stream ends): its gradient then stays undefined instead of a tensor of zeros to read.
    ctx->set_materialize_grads(false);
    return {sum, y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor dy =
        grads[1].defined() ? grads[1] : at::zeros_like(ctx->get_saved_variables()[0]);
    const at::Tensor dsum = fused_norm_backward(ctx, dy, grads[0]);
    at::Tensor dx = ctx->needs_input_grad(0) ? dsum : at::Tensor();
    at::Tensor dres = ctx->needs_input_grad(1) ? dsum : at::Tensor();
    return {dx, dres, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// --- embedding: y = W[tokens] --------------------------------------------------------------------

// into[ids[i]] = rows[i] (accumulate: +=) through index_put_.
void put_rows(at::Tensor& into, const at::Tensor& ids, const at::Tensor& rows, bool accumulate) {
  c10::List<c10::optional<at::Tensor>> index;
  index.push_back(c10::optional<at::Tensor>(ids));
  into.index_put_(index, rows, accumulate);
}

// The sum over repeated tokens in a fixed order (invariant 3, bitwise resume). On CUDA,
// index_put_ with accumulate is the sort-based kernel (index_add_ would use atomics); on
// the CPU it is the other way round: index_put_ adds float32 with atomics across threads
// above 32768 elements, while index_add_ sums each row in index order (libtorch 1.13: one
// index after another; 2.x: as scatter_add_, sorted or split over columns).
void add_rows(at::Tensor& into, const at::Tensor& ids, const at::Tensor& rows) {
  if (into.is_cuda())
    put_rows(into, ids, rows, /*accumulate=*/true);
  else
    into.index_add_(0, ids, rows);
}

// Adds dy_rows [tokens, n] into the rows `ids` of a bf16 buffer (--grad-reduce-in-bf16): each
// token's rows summed in float32, added to its row and rounded once, so that a frequent token
// is not rounded at every occurrence. The distinct tokens come from a sort and a running count rather than at::_unique, which
// reads their number on the host: no synchronisation, and a CUDA graph can record it.
// There is a slot per id; the slots past the last distinct token are padding: padding
// slot j names the j-th sorted id again and carries that id's new row, so that every
// write to a row carries the same value and each row is named at most as often as its
// token occurs. The rows are written, not accumulated: index_put_'s accumulation (and
// under deterministic algorithms its write too) runs the repeats of one index in
// sequence, 4.8 ms at 0.8B on an H100 when all the padding named one row.
void add_rows_rounded_once(at::Tensor& buf, const at::Tensor& ids, const at::Tensor& dy_rows) {
  const at::Tensor id64 = ids.to(at::kLong);  // scatter_ indexes with int64
  const int64_t count = id64.numel();
  const auto [sorted, order] = id64.sort();
  const at::Tensor first = at::zeros({1}, id64.options());
  const at::Tensor slot_sorted =
      at::cat({first, sorted.slice(0, 1).ne(sorted.slice(0, 0, count - 1)).to(at::kLong)})
          .cumsum(0);
  const at::Tensor slot = at::empty_like(id64).scatter_(0, order, slot_sorted);
  const at::Tensor padding =
      at::arange(count, id64.options()).gt(slot_sorted.narrow(0, count - 1, 1));
  const at::Tensor distinct =
      sorted.clone().scatter_(0, slot_sorted, sorted);  // slots past the last keep sorted[j]
  at::Tensor sums = at::zeros({count, dy_rows.size(1)}, dy_rows.options().dtype(at::kFloat));
  add_rows(sums, slot, dy_rows.to(at::kFloat));
  at::Tensor rows = buf.index_select(0, distinct).to(at::kFloat).add_(sums).to(buf.scalar_type());
  rows = at::where(padding.unsqueeze(1), rows.index_select(0, slot_sorted), rows);
  put_rows(buf, distinct, rows, /*accumulate=*/false);
}

struct EmbeddingFn : Function<EmbeddingFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& tokens,
                            const c10::optional<at::Tensor>& /*anchor*/, const WeightRef& w,
                            ParamHandle h) {
    save_handle(ctx, h);
    ctx->save_for_backward({tokens});
    ctx->saved_data["weft_rows"] = w.value.size(0);
    std::vector<int64_t> shape(tokens.sizes().begin(), tokens.sizes().end());
    shape.push_back(w.value.size(1));
    return w.value.index_select(0, tokens.reshape({-1})).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const ParamHandle h = load_handle(ctx);
    const at::Tensor tokens = ctx->get_saved_variables()[0];
    const int64_t rows = ctx->saved_data.at("weft_rows").toInt();
    const at::Tensor& dy = grads[0];
    const int64_t n = dy.size(-1);

    at::Tensor buf = fetch_grad_buffer(h, {rows, n});
    const at::Tensor ids = tokens.reshape({-1});
    if (buf.scalar_type() == at::kBFloat16 && ids.numel() > 0) {
      add_rows_rounded_once(buf, ids, dy.reshape({-1, n}));
    } else {
      add_rows(buf, ids, dy.reshape({-1, n}).to(buf.scalar_type()));
    }
    h.source->grad_ready(h.index);
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// --- the weight as a value: y = copy(W) --------------------------------------------------------

struct ValueFn : Function<ValueFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& /*anchor*/, const WeightRef& w,
                            ParamHandle h) {
    save_handle(ctx, h);
    return w.value.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const ParamHandle h = load_handle(ctx);
    const at::Tensor& dy = grads[0];
    at::Tensor buf = fetch_grad_buffer(h, dy.sizes());
    buf.add_(dy.to(buf.scalar_type()));
    h.source->grad_ready(h.index);
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor param_value(ParamHandle weight) {
  check_handle(weight);
  const bool grad_mode = at::GradMode::is_enabled();
  at::Tensor w = weight.source->forward_weight(weight.index);
  if (!grad_mode) return w;
  // Always through the anchor: the weight is the only input.
  at::Tensor anchor = at::empty({0}, w.options()).requires_grad_(true);
  return ValueFn::apply(anchor, WeightRef{std::move(w)}, weight);
}

namespace {

// `compute`: linear_in's product dtype, or nullopt for linear (x and W of one dtype).
at::Tensor linear_impl(const at::Tensor& x, ParamHandle weight,
                       c10::optional<c10::ScalarType> compute) {
  check_handle(weight);
  const bool grad_mode = at::GradMode::is_enabled();
  at::Tensor w = weight.source->forward_weight(weight.index);
  WEFT_CHECK(w.dim() == 2 && x.size(-1) == w.size(1),
             "linear: input [..., {}] does not match weight {} of shape [{}]", x.size(-1),
             weight.index, fmt::join(w.sizes(), ", "));
  WEFT_CHECK(compute || w.scalar_type() == x.scalar_type(),
             "linear: input {} and weight {} {} differ in dtype", c10::toString(x.scalar_type()),
             weight.index, c10::toString(w.scalar_type()));
  if (!grad_mode) {
    const c10::ScalarType dt = compute ? *compute : x.scalar_type();
    return compat::matmul(x.to(dt), w.to(dt).t());
  }
  auto anchor = grad_anchor(grad_mode, x, w);
  return LinearFn::apply(x, anchor, WeightRef{std::move(w)}, weight,
                         compute ? static_cast<int64_t>(*compute) : int64_t{-1});
}

}  // namespace

at::Tensor linear(const at::Tensor& x, ParamHandle weight) {
  return linear_impl(x, weight, c10::nullopt);
}

at::Tensor add_bias(const at::Tensor& x, ParamHandle bias) {
  check_handle(bias);
  const bool grad_mode = at::GradMode::is_enabled();
  at::Tensor b = bias.source->forward_weight(bias.index);
  WEFT_CHECK(b.dim() == 1 && x.dim() >= 1 && x.size(-1) == b.size(0) &&
                 b.scalar_type() == x.scalar_type(),
             "add_bias: input [..., {}] {} does not match bias {} of shape [{}] {}", x.size(-1),
             c10::toString(x.scalar_type()), bias.index, fmt::join(b.sizes(), ", "),
             c10::toString(b.scalar_type()));
  if (!grad_mode) return x + b;
  auto anchor = grad_anchor(grad_mode, x, b);
  return BiasFn::apply(x, anchor, WeightRef{std::move(b)}, bias);
}

at::Tensor linear_in(const at::Tensor& x, ParamHandle weight, c10::ScalarType dtype) {
  return linear_impl(x, weight, dtype);
}

namespace {

// The ATen composition: the normalisation runs in float32 (float64 for float64 x) under native
// autograd and is cast back to x's dtype *before* the multiply by w, as Megatron's RMSNorm does.
at::Tensor reference_rms_norm(const at::Tensor& x, ParamHandle weight, at::Tensor w, double eps,
                              bool grad_mode) {
  const at::Tensor xf = x.to(accum_dtype(x.scalar_type()));
  const at::Tensor xhat =
      (xf * at::rsqrt((xf * xf).mean({-1}, /*keepdim=*/true) + eps)).to(x.scalar_type());
  WEFT_CHECK(w.dim() == 1 && x.size(-1) == w.size(0),
             "rms_norm: input [..., {}] does not match weight {} of shape [{}]", x.size(-1),
             weight.index, fmt::join(w.sizes(), ", "));
  if (!grad_mode) return xhat * w;
  auto anchor = grad_anchor(grad_mode, xhat, w);
  return ScaleFn::apply(xhat, anchor, WeightRef{std::move(w)}, weight);
}

// Whether the fused RMSNorm kernels take x with the fetched weight w.
bool fused_norm_applies(const at::Tensor& x, const at::Tensor& w) {
  return fused::usable(x) && fused::rms_norm_supports(x.size(-1)) &&
         w.scalar_type() == x.scalar_type() && w.dim() == 1 && w.size(0) == x.size(-1);
}

// rms_norm with the weight already fetched (one use of it).
at::Tensor rms_norm_fetched(const at::Tensor& x, ParamHandle weight, at::Tensor w, double eps) {
  const bool grad_mode = at::GradMode::is_enabled();
  if (fused_norm_applies(x, w)) {
    if (!grad_mode) return fused::rms_norm_forward(x, w, eps).first;
    auto anchor = grad_anchor(grad_mode, x, w);
    return RmsNormFn::apply(x, anchor, WeightRef{std::move(w)}, weight, eps);
  }
  return reference_rms_norm(x, weight, std::move(w), eps, grad_mode);
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, ParamHandle weight, double eps) {
  check_handle(weight);
  return rms_norm_fetched(x, weight, weight.source->forward_weight(weight.index), eps);
}

std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& res,
                                               ParamHandle weight, double eps) {
  check_handle(weight);
  WEFT_CHECK(x.sizes() == res.sizes() && x.scalar_type() == res.scalar_type(),
             "add_rms_norm: input and residual differ in shape or dtype");
  at::Tensor w = weight.source->forward_weight(weight.index);  // the one use of the weight
  if (fused_norm_applies(x, w) && fused::usable(res) && x.device() == res.device()) {
    const bool grad_mode = at::GradMode::is_enabled();
    if (!grad_mode) {
      auto [sum, y, rstd] = fused::add_rms_norm_forward(x, res, w, eps);
      return {sum, y};
    }
    c10::optional<at::Tensor> anchor;
    if (!x.requires_grad() && !res.requires_grad()) anchor = grad_anchor(grad_mode, x, w);
    variable_list out = AddRmsNormFn::apply(x, res, anchor, WeightRef{std::move(w)}, weight, eps);
    return {out[0], out[1]};
  }
  const at::Tensor sum = x + res;
  return {sum, rms_norm_fetched(sum, weight, std::move(w), eps)};
}

at::Tensor embedding(const at::Tensor& tokens, ParamHandle weight) {
  check_handle(weight);
  WEFT_CHECK(tokens.scalar_type() == at::kLong, "embedding: tokens must be int64, got {}",
             c10::toString(tokens.scalar_type()));
  const bool grad_mode = at::GradMode::is_enabled();
  at::Tensor w = weight.source->forward_weight(weight.index);
  WEFT_CHECK(w.dim() == 2, "embedding: weight {} must be 2-D", weight.index);
  if (!grad_mode) {
    std::vector<int64_t> shape(tokens.sizes().begin(), tokens.sizes().end());
    shape.push_back(w.size(1));
    return w.index_select(0, tokens.reshape({-1})).view(shape);
  }
  auto anchor = grad_anchor(grad_mode, tokens, w);
  return EmbeddingFn::apply(tokens, anchor, WeightRef{std::move(w)}, weight);
}

}  // namespace weft::ops
