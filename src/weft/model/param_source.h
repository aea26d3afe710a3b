// How the model reaches its weights: through a ParamSource, never by owning tensors.
//
// The model (model/) knows nothing about sharding. Each parametric op (linear, the RMSNorm
// scale, the embedding lookup) holds a ParamHandle and asks the source for the full weight at
// forward time and again at backward time, and accumulates the weight gradient into a buffer
// the source gives it. A plain source (FullParams) holds full tensors; the FSDP unit
// (parallel/) gathers shards on demand and reduce-scatters the gradient once every use of the
// unit in this backward has delivered its gradient.
//
// Contract for ops: per forward use under grad mode, call forward_weight() once; in the
// matching backward, call backward_weight() (if the weight is needed), add into grad_buffer()
// (or write into grad_buffer_to_write(), see there), then call grad_ready() exactly once. Tensors returned by forward_weight/backward_weight are
// valid until the op returns; ops must not keep them (so sources may free them).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

enum class InitKind {
  kNormal,        // N(0, init_std)
  kScaledNormal,  // N(0, init_std / sqrt(2 * num_layers)): projections into the residual
  kOnes,          // norm weights
  kZeros,         // buffers that start at zero (the routers' expert biases)
  kConvUniform,   // U(+-0.5): PyTorch's Conv1d default for 4 taps (Mamba conv weight and bias)
  kALog,          // log(U[1, 16]) (Mamba A_log)
  kDtBias,        // inverse softplus of a log-uniform dt in [1e-3, 1e-1] (Mamba dt_bias)
};

// A parameter as the model declares it: global name, global shape, initialisation, and
// whether weight decay applies.
struct ParamSpec {
  std::string name;             // global, layout-independent (DESIGN.md "Parameter names")
  std::vector<int64_t> shape;   // global shape
  InitKind init = InitKind::kNormal;
  bool decay = true;            // false for norms and biases
  // The word embedding and the output layer (Megatron's is_embedding_or_output_parameter):
  // --decoupled-lr's parameters.
  bool embedding_or_output = false;
};

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // The full weight in compute dtype, for a forward use (counted when grad mode is on).
  virtual at::Tensor forward_weight(int index) = 0;
  // The full weight again, inside the backward of a counted use.
  virtual at::Tensor backward_weight(int index) = 0;
  // A float32 buffer of the full shape to accumulate this backward's gradient into.
  virtual at::Tensor grad_buffer(int index) = 0;
  // Marks one counted use's gradient as delivered.
  virtual void grad_ready(int index) = 0;

  // grad_buffer() for an op that produces its whole weight gradient in one operation. Where
  // `fresh`, the buffer holds no gradient of this step yet and arbitrary values: the op writes
  // it (a matmul with beta 0) instead of adding into it, which spares the source a zeroing pass
  // over it and the matmul a read of it. Otherwise add, as into grad_buffer(). The default
  // hands out grad_buffer(), never fresh.
  struct WriteTarget {
    at::Tensor buffer;
    bool fresh = false;
  };
  virtual WriteTarget grad_buffer_to_write(int index) { return {grad_buffer(index), false}; }
};

struct ParamHandle {
  ParamSource* source = nullptr;  // not owned; must outlive every graph that uses it
  int index = -1;
};

}  // namespace weft
