// Activation recomputation (Megatron's --recompute-granularity, --recompute-method,
// --recompute-num-layers and --recompute-modules): a piece of the forward runs once without
// keeping its intermediate activations, and again in the backward, where autograd goes through
// the rerun. Only the piece's inputs are kept in between.
//
// `recomputed` is the one mechanism: an autograd node over the piece's inputs whose forward runs
// the piece with grad mode off (its ops then neither build a graph nor count a use of their
// weights: ParamSource), and whose backward reruns it with grad mode on from detached copies of
// the inputs and back-propagates the output gradients through that rerun, which delivers the
// weights' gradients as an ordinary backward does. weft has no dropout and its ops compute the
// same bits with grad mode on and off, so a recomputed model computes what the plain one does:
// losses and gradients bitwise equal (tests/train/test_recompute.cpp, on the CPU and on
// H100/H200). One caveat: PyTorch's scaled_dot_product_attention may choose its kernel by
// whether gradients are needed (it leaves flash attention out for head dims above 192 on
// sm86/sm89 then); where it does, the forward's attention output and the rerun's can differ in
// the last bits, and the gradients are the rerun's (as in Megatron's recomputation).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "weft/model/config.h"

namespace weft {

// Sets *out from Megatron's flags (empty strings / 0 / an empty list where not given;
// `activations` is --recompute-activations, which means selective; `moe_layer_recompute` is the
// deprecated --moe-layer-recompute, selective with "moe" added) and checks them as Megatron
// does: full needs a method and 1 <= num_layers, selective takes neither; modules weft does not
// have are refused naming --recompute-modules. Method, layers and modules without a granularity
// do nothing, as in Megatron. Throws UsageError naming the flag.
void parse_recompute_flags(bool activations, const std::string& granularity,
                           const std::string& method, int num_layers,
                           const std::vector<std::string>& modules, bool moe_layer_recompute,
                           RecomputeConfig* out);

// A run of consecutive layers of one pipeline stage (indices local to the stage) and whether
// the backward recomputes it.
struct RecomputeChunk {
  int begin = 0, end = 0;
  bool recompute = false;
};
// The stage's `stage_layers` layers in chunks as `r` says (one chunk, not recomputed, unless
// --recompute-granularity full): uniform, every r.num_layers layers one recomputed chunk (the
// last one shorter where they do not divide); block, the first r.num_layers layers each a
// recomputed chunk of one, then the rest in one chunk not recomputed.
std::vector<RecomputeChunk> recompute_chunks(int stage_layers, const RecomputeConfig& r);

// fn(inputs, first): the piece. `first` is true for the run inside the forward (which may do
// bookkeeping such as resharding), false for the rerun in the backward. Inputs and outputs may
// be undefined tensors; the piece must give the same outputs (defined or not) both times.
using RecomputedPiece =
    std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs, bool first)>;

// The piece's outputs, keeping only `inputs` for the backward (see the file comment). With grad
// mode off it just runs fn(inputs, true). `fn` is kept until the backward has run: whatever it
// refers to must live as long.
std::vector<at::Tensor> recomputed(RecomputedPiece fn, const std::vector<at::Tensor>& inputs);

// How many recomputed pieces have rerun in a backward in this process (tests check that a
// recomputation happened, not only that it changed nothing).
int64_t recompute_reruns();

}  // namespace weft
