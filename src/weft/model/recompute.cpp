// Activation recomputation (see recompute.h): one custom autograd function that keeps the
// piece's inputs and reruns the piece in its backward.
#include "weft/model/recompute.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "weft/core/error.h"

namespace weft {

void parse_recompute_flags(bool activations, const std::string& granularity,
                           const std::string& method, int num_layers,
                           const std::vector<std::string>& modules, bool moe_layer_recompute,
                           RecomputeConfig* out) {
  RecomputeConfig r;
  if (!granularity.empty() && granularity != "full" && granularity != "selective")
    fail_usage("--recompute-granularity must be full or selective (got '{}')", granularity);
  if (!method.empty() && method != "uniform" && method != "block")
    fail_usage("--recompute-method must be uniform or block (got '{}')", method);
  r.granularity = activations ? "selective" : granularity;  // Megatron: the flag wins
  if (moe_layer_recompute) {  // Megatron's deprecated spelling of selective with "moe"
    if (r.full())
      fail_usage("--moe-layer-recompute cannot be combined with --recompute-granularity full");
    r.granularity = "selective";
  }
  if (r.full()) {
    if (method.empty())
      fail_usage("--recompute-granularity full needs --recompute-method uniform or block");
    if (num_layers < 1)
      fail_usage("--recompute-granularity full needs --recompute-num-layers >= 1 (got {})",
                 num_layers);
    r.method = method;
    r.num_layers = num_layers;
  } else if (r.selective()) {
    if (!method.empty())
      fail_usage("--recompute-method {} is for --recompute-granularity full; selective "
                 "recomputation takes the modules of --recompute-modules in every layer",
                 method);
    if (num_layers != 0)
      fail_usage("--recompute-num-layers is for --recompute-granularity full; leave it out with "
                 "selective recomputation");
    std::vector<std::string> names = modules;
    if (names.empty()) names = {"core_attn"};  // Megatron's default
    if (moe_layer_recompute && std::find(names.begin(), names.end(), "moe") == names.end())
      names.push_back("moe");
    for (const std::string& m : names) {
      if (m == "core_attn") r.core_attn = true;
      else if (m == "mlp") r.mlp = true;
      else if (m == "moe") r.moe = true;
      else if (m == "shared_experts") r.shared_experts = true;
      else if (m == "moe_act" || m == "layernorm" || m == "mla_up_proj")
        fail_usage("--recompute-modules {} is not implemented in weft (Megatron recomputes it "
                   "with output-discarding checkpoints); weft recomputes core_attn, mlp, moe and "
                   "shared_experts",
                   m);
      else if (m == "gdn_norm_out" || m == "gdp_in_proj" || m == "gdp_qkv" || m == "mhc")
        fail_usage("--recompute-modules {}: weft's model has no such module (no gated delta "
                   "nets or hyper-connections); it recomputes core_attn, "
                   "mlp, moe and shared_experts",
                   m);
      else
        fail_usage("--recompute-modules {}: not one of Megatron's modules (core_attn, moe_act, "
                   "layernorm, mla_up_proj, mlp, moe, shared_experts, gdn_norm_out, "
                   "gdp_in_proj, gdp_qkv, mhc)",
                   m);
    }
  }
  *out = r;
}

std::vector<RecomputeChunk> recompute_chunks(int stage_layers, const RecomputeConfig& r) {
  std::vector<RecomputeChunk> out;
  if (!r.full() || r.num_layers < 1) {
    if (stage_layers > 0) out.push_back({0, stage_layers, false});
    return out;
  }
  if (r.method == "uniform") {
    for (int l = 0; l < stage_layers; l += r.num_layers)
      out.push_back({l, std::min(l + r.num_layers, stage_layers), true});
    return out;
  }
  const int n = std::min(r.num_layers, stage_layers);  // block
  for (int l = 0; l < n; ++l) out.push_back({l, l + 1, true});
  if (n < stage_layers) out.push_back({n, stage_layers, false});
  return out;
}

namespace {

std::atomic<int64_t> g_reruns{0};

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

// The piece and what the backward needs to rebuild its call, kept in the autograd context.
struct Piece : torch::CustomClassHolder {
  RecomputedPiece fn;
  std::vector<char> in_defined;    // per input of fn
  std::vector<char> in_grad;       // per input: required grad in the forward
  std::vector<char> out_defined;   // per output of fn
};

c10::intrusive_ptr<Piece> piece_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<Piece>(ctx->saved_data.at("weft_piece").toCapsule());
}

// Inputs: the piece's defined inputs, then an anchor where none of them requires grad (so that
// the node exists and the rerun delivers its weights' gradients), then the piece.
struct RecomputeFn : Function<RecomputeFn> {
  static variable_list forward(AutogradContext* ctx, at::TensorList args, bool anchored,
                               c10::intrusive_ptr<Piece> piece) {
    ctx->set_materialize_grads(false);
    const size_t n = args.size() - (anchored ? 1 : 0);
    std::vector<at::Tensor> kept(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(n));
    ctx->save_for_backward(kept);
    std::vector<at::Tensor> inputs(piece->in_defined.size());
    for (size_t i = 0, j = 0; i < inputs.size(); ++i)
      if (piece->in_defined[i]) inputs[i] = kept[j++];
    std::vector<at::Tensor> outs = piece->fn(inputs, true);  // grad mode is off here
    variable_list defined;
    piece->out_defined.assign(outs.size(), 0);
    for (size_t i = 0; i < outs.size(); ++i)
      if (outs[i].defined()) {
        piece->out_defined[i] = 1;
        defined.push_back(outs[i]);
      }
    ctx->saved_data["weft_piece"] = c10::IValue::make_capsule(piece);
    ctx->saved_data["weft_anchored"] = anchored;
    return defined;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const c10::intrusive_ptr<Piece> piece = piece_of(ctx);
    const bool anchored = ctx->saved_data.at("weft_anchored").toBool();
    const variable_list kept = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs(piece->in_defined.size());
    for (size_t i = 0, j = 0; i < inputs.size(); ++i)
      if (piece->in_defined[i]) {
        inputs[i] = kept[j++].detach();
        if (piece->in_grad[i]) inputs[i].requires_grad_(true);
      }
    variable_list roots, root_grads;
    {
      at::AutoGradMode grad_on(true);
      const std::vector<at::Tensor> outs = piece->fn(inputs, false);
      WEFT_CHECK(outs.size() == piece->out_defined.size(),
                 "recomputed piece gave {} outputs, {} in the forward", outs.size(),
                 piece->out_defined.size());
      variable_list unused;  // outputs that need a gradient but got none
      for (size_t i = 0, k = 0; i < outs.size(); ++i) {
        WEFT_CHECK(outs[i].defined() == (piece->out_defined[i] != 0),
                   "recomputed piece: output {} is {} in the rerun and {} in the forward", i,
                   outs[i].defined() ? "defined" : "undefined",
                   piece->out_defined[i] ? "defined" : "undefined");
        if (!outs[i].defined()) continue;
        const at::Tensor& g = grads[k++];
        if (!outs[i].requires_grad()) continue;
        if (g.defined()) {
          roots.push_back(outs[i]);
          root_grads.push_back(g);
        } else {
          unused.push_back(outs[i]);
        }
      }
      // Every use of a weight in the rerun awaits its gradient (ParamSource): with no output
      // gradient at all, back-propagate zeros so that each still gets one.
      if (roots.empty())
        for (const at::Tensor& u : unused) {
          roots.push_back(u);
          root_grads.push_back(at::zeros_like(u));
        }
    }
    g_reruns.fetch_add(1, std::memory_order_relaxed);
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    variable_list result;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (piece->in_defined[i])
        result.push_back(inputs[i].requires_grad() ? inputs[i].grad() : at::Tensor());
    if (anchored) result.emplace_back();
    result.emplace_back();  // anchored flag
    result.emplace_back();  // the piece
    return result;
  }
};

}  // namespace

int64_t recompute_reruns() { return g_reruns.load(std::memory_order_relaxed); }

std::vector<at::Tensor> recomputed(RecomputedPiece fn, const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return fn(inputs, true);
  auto piece = c10::make_intrusive<Piece>();
  piece->fn = std::move(fn);
  std::vector<at::Tensor> args;
  bool any_grad = false;
  for (const at::Tensor& t : inputs) {
    piece->in_defined.push_back(t.defined());
    piece->in_grad.push_back(t.defined() && t.requires_grad());
    if (t.defined()) {
      args.push_back(t);
      any_grad = any_grad || t.requires_grad();
    }
  }
  const bool anchored = !any_grad;
  if (anchored) args.push_back(at::empty({0}).requires_grad_(true));
  variable_list defined = RecomputeFn::apply(at::TensorList(args), anchored, piece);
  std::vector<at::Tensor> outs(piece->out_defined.size());
  for (size_t i = 0, k = 0; i < outs.size(); ++i)
    if (piece->out_defined[i]) outs[i] = defined[k++];
  return outs;
}

}  // namespace weft
