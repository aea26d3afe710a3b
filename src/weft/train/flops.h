// Model FLOPs per token of one training step (forward and backward, no recomputation), the
// numerator of MFU, and the default peak it is divided by. The formula is bench/gpu/mfu.py's,
// ported: 6 FLOPs per token for every weight a token meets in a matmul (2 forward, 4
// backward), plus the attention scores and the Mamba-2 SSD scan (a bias, --add-qkv-bias's, is
// no matmul weight and is not counted):
//   attention ('*', and a transformer layer's first half)  h*(nh+2ng)*hd + nh*hd*h + h, and
//                                                         6*s*nh*hd for the causal scores
//   dense MLP ('-', a dense transformer layer)             3*h*ffn + h
//   MoE MLP ('E', an MoE transformer layer): the ACTIVE weights: topk experts of 3*h*f, the
//     router h*E, the shared expert 3*h*sf, its norm h (experts a token skips are not counted)
//   Mamba-2 ('M')  h*(2*di + 2*G*N + H) + di*h + h, and 3*H*(2*Q*N + 2*Q*P + 4*P*N) for the
//     chunked SSD (di = H*P, Q = min(chunk, s))
//   output layer   V*h (the embedding lookup is no matmul and is not counted)
//   each MTP depth: eh_proj 2*h*h, its three norms 3*h, its layers as above, and the output
//     layer V*h again (the depth computes its own logits)
// Norm weights count 6 per token as in mfu.py; the final norm, softmax, routing and other
// elementwise work are not counted.
#pragma once

#include <string>

#include "weft/model/config.h"

namespace weft {

double model_flops_per_token(const ModelConfig& m);

// The peak FLOP/s of one device for MFU when --peak-tflops is not given: 989e12 (H200 dense
// bf16) for --device cuda with --bf16; 0 (unknown: no MFU) otherwise.
double default_peak_flops(const std::string& device, bool bf16);

}  // namespace weft
