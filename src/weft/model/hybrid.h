// Megatron's hybrid layer pattern (--hybrid-layer-pattern, deprecated alias
// --hybrid-override-pattern): one symbol per layer, M Mamba-2, * attention, - MLP, E MoE; '|'
// separates pipeline stages; '/' starts the MTP patterns, one per depth, all the same, e.g.
// "M-M*-E|M-ME*-/*E/*E" (2 stages of 6 layers, MTP depth 2 of an attention and an MoE layer).
// When the pattern is given it alone defines the layer count, as in Megatron.
#pragma once

#include <string>

#include "weft/model/config.h"

namespace weft {

// Fills cfg->layer_symbols, num_layers, hybrid_stage_layers ('|' present), and with '/'
// mtp_layer_symbols and mtp_num_layers (which must then agree with a --mtp-num-layers > 0 the
// user gave). Throws UsageError naming --hybrid-layer-pattern.
void apply_hybrid_layer_pattern(const std::string& pattern, ModelConfig* cfg);

// Megatron's layer allocation by ratios (--hybrid-attention-ratio, --hybrid-mlp-ratio; the
// rest Mamba): round(layers x ratio) attention layers spread evenly between Mamba sections, then
// round(layers x mlp ratio) of the Mamba layers turned MLP, evenly and right-justified. Python's
// round (half to even) and float steps, so the pattern is Megatron's symbol for symbol. Throws
// UsageError naming the flag for a ratio outside [0, 1] or a sum above 1.
std::string allocate_hybrid_layers(int layers, double attention_ratio, double mlp_ratio);

// With a ratio > 0, Megatron requires the given pattern's main layers (before '/', without '|')
// to hold as many of each symbol as the allocation; throws UsageError naming both otherwise.
void check_pattern_against_ratios(const std::string& pattern, double attention_ratio,
                                  double mlp_ratio);

}  // namespace weft
