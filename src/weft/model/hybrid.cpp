// The hybrid layer pattern (see hybrid.h).
#include "weft/model/hybrid.h"

#include <vector>

#include "weft/core/error.h"

namespace weft {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

void check_symbols(const std::string& pattern, const std::string& part, const char* where) {
  for (size_t i = 0; i < part.size(); ++i)
    if (part[i] != 'M' && part[i] != '*' && part[i] != '-' && part[i] != 'E')
      fail_usage("--hybrid-layer-pattern '{}': unknown symbol '{}' in the {} (use M Mamba, * "
                 "attention, - MLP, E MoE; | between stages, / before each MTP depth)",
                 pattern, part[i], where);
}

}  // namespace

void apply_hybrid_layer_pattern(const std::string& pattern, ModelConfig* cfg) {
  if (pattern.empty()) fail_usage("--hybrid-layer-pattern is empty");
  const std::vector<std::string> parts = split(pattern, '/');
  const std::vector<std::string> stages = split(parts[0], '|');
  std::string symbols;
  std::vector<int> sizes;
  for (const std::string& st : stages) {
    check_symbols(pattern, st, "decoder pattern");
    if (st.empty())
      fail_usage("--hybrid-layer-pattern '{}': a pipeline stage between '|' has no layers",
                 pattern);
    symbols += st;
    sizes.push_back(static_cast<int>(st.size()));
  }
  cfg->layer_symbols = symbols;
  cfg->num_layers = static_cast<int>(symbols.size());
  cfg->hybrid_stage_layers = stages.size() > 1 ? sizes : std::vector<int>{};
  cfg->mtp_layer_symbols.clear();
  if (parts.size() == 1) return;
  for (size_t k = 1; k < parts.size(); ++k) {
    check_symbols(pattern, parts[k], "MTP pattern");
    if (parts[k].find('|') != std::string::npos || parts[k].empty())
      fail_usage("--hybrid-layer-pattern '{}': MTP pattern {} must be a non-empty run of layer "
                 "symbols", pattern, k);
    if (parts[k] != parts[1])
      fail_usage("--hybrid-layer-pattern '{}': the MTP patterns differ ('{}' vs '{}'); every "
                 "depth has the same layers", pattern, parts[1], parts[k]);
  }
  const int depths = static_cast<int>(parts.size()) - 1;
  if (cfg->mtp_num_layers > 0 && cfg->mtp_num_layers != depths)
    fail_usage("--mtp-num-layers {} disagrees with the {} MTP pattern(s) of "
               "--hybrid-layer-pattern '{}'", cfg->mtp_num_layers, depths, pattern);
  cfg->mtp_num_layers = depths;
  cfg->mtp_layer_symbols = parts[1];
}

}  // namespace weft
