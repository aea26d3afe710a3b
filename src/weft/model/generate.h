// Text generation with the trained model: incremental decoding with per-layer caches, and
// sampling. Model layer: no checkpoint, tokenizer or communicator knowledge; the weights come
// through a function the caller supplies (app/cmd_generate.cpp reads them from a checkpoint).
//
// The model is the training model's main path (MTP modules are left out: the main head alone
// predicts the next token), run through the training forward's own pieces (attention_qkv,
// attention_residual, mlp_block, the Mamba mixer's pieces, moe_mlp through LocalExperts), so
// weights, rounding points and dtypes are those of training. What each layer caches:
//   attention:  the rotated keys and the values of every position so far, [b, ng, cap, hd]
//               (GQA: one entry per query group), in the compute dtype;
//   Mamba-2:    the conv's last kernel-1 inputs [b, 3, di + 2 ng ds] and the SSD state
//               [b, nh, hd, ds], both in the accumulation dtype (float32; float64 for float64);
//   MLP / MoE:  nothing (they act on each token alone).
//
// Invariant (tests/model/test_generate.cpp): the logits DecodeState::forward returns for
// positions [p, p + n) equal the training forward's logits of the whole sequence at those
// positions, up to rounding (1e-10 in float64), however the sequence is cut into calls. A
// call that starts at position 0 runs the training forward's own attention and chunked SSD
// scan; later calls attend over the cache and advance the SSD state by its recurrence
// h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t.
//
// Positions: the rotary tables are built for max(seq_length, capacity) positions, so any
// position can be computed; the model was trained on [0, seq_length) only, and the caller
// decides whether to go past it.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "weft/model/config.h"
#include "weft/model/full_params.h"
#include "weft/model/transformer.h"

namespace weft {

class MoeExperts;

// The main model over a FullParams it owns, in one compute dtype on one device.
class InferenceModel {
 public:
  // Gives the full value of a parameter (any dtype, any device).
  using ValueFn = std::function<at::Tensor(const ParamSpec&)>;
  // Registers every parameter of all_param_specs(cfg) outside "mtp." with value(spec), cast to
  // `dtype` on `device`. Throws UsageError naming the parameter when value returns an undefined
  // tensor or one of another shape.
  InferenceModel(const ModelConfig& cfg, const ValueFn& value, c10::Device device,
                 c10::ScalarType dtype);
  ~InferenceModel();
  InferenceModel(const InferenceModel&) = delete;
  InferenceModel& operator=(const InferenceModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  c10::Device device() const { return device_; }
  c10::ScalarType dtype() const { return dtype_; }
  ParamHandle embedding() const { return embedding_; }
  ParamHandle final_norm() const { return final_norm_; }
  ParamHandle output() const { return output_; }  // the embedding when tied
  const std::vector<LayerHandles>& layers() const { return layers_; }

  // The training forward of the whole sequence, no caches: tokens [b, s] int64 -> logits
  // [b, s, V] in the compute dtype (positions past seq_length get rotary rows as well).
  at::Tensor full_logits(const at::Tensor& tokens) const;

 private:
  ModelConfig cfg_;
  c10::Device device_;
  c10::ScalarType dtype_;
  std::unique_ptr<FullParams> params_;  // handles point into it
  std::vector<std::unique_ptr<MoeExperts>> experts_;
  std::vector<std::unique_ptr<RouterBias>> biases_;  // --moe-router-enable-expert-bias
  ParamHandle embedding_, final_norm_, output_;
  std::vector<LayerHandles> layers_;
};

// One layer's cache (the parts its kind has; see the file comment).
struct LayerCache {
  at::Tensor k, v;  // attention: [b, ng, capacity, hd]; rows [0, length) are filled
  at::Tensor conv;  // Mamba: [b, kernel - 1, di + 2 ng ds], the conv's last inputs (0 before 0)
  at::Tensor ssm;   // Mamba: [b, nh, hd, ds], the SSD state after `length` tokens
};

// The decoding state of `batch` sequences of equal length over `model` (which must outlive it).
class DecodeState {
 public:
  DecodeState(const InferenceModel& model, int64_t batch, int64_t capacity);

  // Runs tokens [b, n] (int64, n >= 1) at positions [length(), length() + n), appends them to
  // the caches and returns their logits [b, n, V] in the compute dtype. length() + n must not
  // exceed capacity().
  at::Tensor forward(const at::Tensor& tokens);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  const std::vector<LayerCache>& caches() const { return caches_; }

 private:
  at::Tensor attention(const at::Tensor& x, const LayerHandles& w, LayerCache& c);
  at::Tensor mamba(const at::Tensor& x, const MambaHandles& w, LayerCache& c);

  const InferenceModel& model_;
  RotaryTables rope_;
  std::vector<LayerCache> caches_;
  int64_t batch_, capacity_, length_ = 0;
};

// Sampling, applied in this order: vocab_limit, temperature, then top-k, then top-p, then one
// draw.
struct SamplingOptions {
  double temperature = 1.0;  // logits / T; 0: greedy (argmax, no draw)
  int64_t top_k = 0;         // keep the k most likely tokens (0: all)
  double top_p = 1.0;        // then keep the fewest most likely tokens whose probability
                             // (renormalised after top-k) reaches p (0 or 1: all; 0 is
                             // Megatron's --top_p default, "off")
  int64_t vocab_limit = -1;  // before everything else, draw only ids below this: a tokenizer's
                             // vocabulary inside the model's padded one (-1: every id)
};
// Throws UsageError naming --temperature, --top-k or --top-p for values out of range.
void check_sampling_options(const SamplingOptions& opt);
// One token id from logits [V] (any dtype, any device; computed in float64 on the CPU). Ties
// go to the lower id (greedy and the top-k/top-p order). The draw takes one uniform number from
// `gen` (a CPU generator), so a seed fixes the whole sequence.
int64_t sample_token(const at::Tensor& logits, const SamplingOptions& opt, at::Generator& gen);

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  uint64_t seed = 1234;
  int64_t stop_token = -1;  // stop after generating this id (-1: never)
};
struct GenerateResult {
  std::vector<int64_t> tokens;  // the generated ids, prompt excluded
  double prefill_seconds = 0;   // the prompt's forward and the first token
  double decode_seconds = 0;    // every later step
};
// Prefills the prompt (one sequence, >= 1 token) in one forward, then generates one token per
// step. Deterministic for a given seed on a given device.
GenerateResult generate(const InferenceModel& model, const std::vector<int64_t>& prompt,
                        const GenerateOptions& opt);

}  // namespace weft
