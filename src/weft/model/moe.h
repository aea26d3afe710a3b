// The mixture-of-experts MLP (Megatron's MoELayer with the alltoall dispatcher's semantics):
// a router picks the top-k experts per token, the (token, slot) pairs are sorted by global
// expert and run through the experts (SwiGLU or squared ReLU), and each token's outputs are combined back weighted by
// its routing probabilities; optional shared experts run on every token and are added.
//
// Routing (Megatron's defaults): --moe-router-score-function softmax takes the top-k of the
// logits, then a softmax over those k; sigmoid takes the top-k of sigmoid(logits) and, for
// k > 1, normalises them to sum 1. Router logits come out of the linear in the compute dtype
// and are routed in float32; the probabilities are cast back to the compute dtype, as Megatron
// does. Dropless by default: every pair reaches its expert. With --moe-expert-capacity-factor
// (Megatron's token dropping) each expert takes at most expert_capacity(T) of a forward's pairs,
// ranked by --moe-token-drop-policy; the others add nothing to their tokens. The aux loss and
// z-loss count every choice before the drop, the expert-bias counts the pairs after it (both as
// Megatron's).
//
// The auxiliary load-balancing loss (--moe-router-load-balancing-type aux_loss) of one layer on
// T tokens is E / (k * T^2) * sum_e (sum_t p_te) * n_e, with p the softmax over all experts (for
// sigmoid: sigmoid normalised over all experts) and n_e the pairs routed to e. With
// --moe-z-loss-coeff the router z-loss (ST-MoE's, Megatron's z_loss_func) is the mean over the T
// tokens of logsumexp(logits)^2, the logits in the routing's float32. Both are returned without
// their coefficients; the caller weighs them.
//
// Where the experts run is the MoeExperts' business: LocalExperts runs all of them here; the
// expert-parallel dispatcher (parallel/expert_parallel.h) sends rows to the ranks that hold
// them. Either way the rows come back in the order they went out, and the combine sums each
// token's k outputs in slot order, so the result is deterministic and independent of ep.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "weft/model/config.h"
#include "weft/model/param_source.h"

namespace weft {

// Runs the routed experts on rows sorted by global expert.
class MoeExperts {
 public:
  virtual ~MoeExperts() = default;
  // rows [N, h] in the compute dtype; counts[e] (host, one per global expert, summing to N)
  // rows for expert e, experts in ascending order. Returns [N, h]: row i is the output of row
  // i's expert. Collective for distributed implementations: every member calls it per layer.
  virtual at::Tensor run(const at::Tensor& rows, const std::vector<int64_t>& counts) = 0;
};

// Experts over rows grouped by expert: counts[i] consecutive rows go through
// mlp(rows, fc1[i], fc2[i], spec) (SwiGLU or squared ReLU, MlpSpec).
// Every expert's weights are used (and get a gradient) even when it received no rows. With
// `grouped_gemm` (--moe-grouped-gemm) and where grouped_gemm_usable, all experts run through
// grouped_gemm_expert_mlp; otherwise one GEMM chain per expert. Both give the same result up to
// rounding.
at::Tensor grouped_expert_mlp(const at::Tensor& rows, const std::vector<int64_t>& counts,
                              const std::vector<ParamHandle>& fc1,
                              const std::vector<ParamHandle>& fc2, const MlpSpec& spec,
                              bool grouped_gemm = false);
// Whether grouped_gemm_expert_mlp can run these rows: a libtorch with torch._grouped_mm, bf16
// rows on CUDA with the fused kernels on, dims that keep the kernel's 16-byte alignment.
bool grouped_gemm_usable(const at::Tensor& rows, int64_t ffn);
// The experts through grouped GEMMs (moe_grouped.cpp); all handles from one ParamSource.
at::Tensor grouped_gemm_expert_mlp(const at::Tensor& rows, const std::vector<int64_t>& counts,
                                   const std::vector<ParamHandle>& fc1,
                                   const std::vector<ParamHandle>& fc2, const MlpSpec& spec);

// All experts on this rank (single-process runs and reference tests).
class LocalExperts : public MoeExperts {
 public:
  LocalExperts(std::vector<ParamHandle> fc1, std::vector<ParamHandle> fc2, const MlpSpec& spec,
               bool grouped_gemm = false)
      : fc1_(std::move(fc1)), fc2_(std::move(fc2)), spec_(spec), grouped_gemm_(grouped_gemm) {}
  at::Tensor run(const at::Tensor& rows, const std::vector<int64_t>& counts) override {
    return grouped_expert_mlp(rows, counts, fc1_, fc2_, spec_, grouped_gemm_);
  }

 private:
  std::vector<ParamHandle> fc1_, fc2_;
  MlpSpec spec_;
  bool grouped_gemm_;
};

// The router's decision for T tokens.
struct MoeRouting {
  at::Tensor experts;   // [T, k] int64 global expert of each slot
  at::Tensor probs;     // [T, k] float32 (float64 for float64 logits) combine weights, autograd
  at::Tensor aux_loss;  // 0-dim, same dtype, the layer's unweighted aux loss (with autograd)
  at::Tensor z_loss;    // 0-dim, same dtype, the unweighted z-loss; 0 without --moe-z-loss-coeff
};
// logits [T, E] in any floating dtype. With `expert_bias` ([E] float32; the sigmoid router,
// --moe-router-enable-expert-bias) the top k are those of sigmoid(logits) + expert_bias, and
// the combine weights are their sigmoid scores without the bias (normalised, scaled), as
// Megatron's; the aux loss counts the choices without the bias, as Megatron's. The T rows are
// `sequences` sequences of T / sequences tokens each: with --moe-router-load-balancing-type
// seq_aux_loss the aux loss is that of each sequence (T / sequences tokens in the formula
// above), averaged over them (Megatron's, DeepSeek-V3's sequence-wise balance loss).
MoeRouting route_tokens(const at::Tensor& logits, const ModelConfig& cfg,
                        const at::Tensor& expert_bias = {}, int64_t sequences = 1);

// One MoE layer's --moe-router-enable-expert-bias state, on the layer's device: `bias` float32
// [E] (checkpointed as router_bias_name), and `pairs` float64 [E], the (token, slot) pairs this
// rank routed to each expert in training forwards (grad mode on; evaluation and generation
// count nothing) since the last update. Exact integers in float64 (float32 stops at 2^24).
struct RouterBias {
  at::Tensor bias, pairs;
};
// The state of a layer whose bias is `bias` (float32 [E], on the layer's device): no pairs yet.
RouterBias make_router_bias(const at::Tensor& bias);
// Megatron's aux-loss-free update from the pairs of a step summed over every rank of the stage,
// pairs [n, E] float64: bias + rate * sign(mean over E of pairs - pairs), with the step in
// float32 as Megatron's (sign * rate, then the add). Returns the new bias [n, E] float32.
at::Tensor updated_expert_bias(const at::Tensor& pairs, const at::Tensor& bias, double rate);

// Megatron's expert capacity for T tokens: ceil(T * k / E * --moe-expert-capacity-factor),
// at most T (what an expert can receive).
int64_t expert_capacity(int64_t tokens, const ModelConfig& cfg);

// y = x[perm] along dim 0, with gradient grad[inverse] (perm must be a permutation and
// `inverse` its inverse: both gathers, so the backward is deterministic, no scatter-add).
at::Tensor permute_rows(const at::Tensor& x, const at::Tensor& perm, const at::Tensor& inverse);

// The MoE MLP on the normalised input xn [b, s, h]: route, run the experts, combine, add the
// shared experts (shared_fc1/fc2 unset: none). Returns [b, s, h]; adds the layer's unweighted
// losses [aux, z] (a [2] tensor in the routing dtype) into *aux_loss (defined or not) when
// aux_loss is given. With `bias` the top-k choice uses
// bias->bias, and in grad mode the pairs per expert are added into bias->pairs.
at::Tensor moe_mlp(const at::Tensor& xn, ParamHandle router, ParamHandle shared_fc1,
                   ParamHandle shared_fc2, MoeExperts& experts, const ModelConfig& cfg,
                   at::Tensor* aux_loss, RouterBias* bias = nullptr);

// Parses --moe-layer-freq for `num_layers` layers: an int N (layer i is MoE when i % N == 0) or
// a Python-style list such as "[0,1,1,1]" or "([1]*3+[0])*2" (one 0/1 per layer). Throws
// UsageError naming the flag.
std::vector<int> parse_moe_layer_freq(const std::string& value, int num_layers);

}  // namespace weft
