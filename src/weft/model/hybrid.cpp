// The hybrid layer pattern (see hybrid.h).
#include "weft/model/hybrid.h"

#include <algorithm>
#include <cmath>
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

std::string allocate_hybrid_layers(int layers, double attention_ratio, double mlp_ratio) {
  if (layers < 1) fail_usage("--num-layers must be >= 1 to allocate hybrid layers (got {})", layers);
  if (!(attention_ratio >= 0 && attention_ratio <= 1))
    fail_usage("--hybrid-attention-ratio {}: must be in [0, 1]", attention_ratio);
  if (!(mlp_ratio >= 0 && mlp_ratio <= 1))
    fail_usage("--hybrid-mlp-ratio {}: must be in [0, 1]", mlp_ratio);
  if (attention_ratio + mlp_ratio > 1)
    fail_usage("--hybrid-attention-ratio {} plus --hybrid-mlp-ratio {} exceed 1", attention_ratio,
               mlp_ratio);
  // std::nearbyint rounds half to even in the default rounding mode, as Python's round.
  const auto count = [&](double ratio) {
    return static_cast<int>(std::nearbyint(static_cast<double>(layers) * ratio));
  };
  std::string out(static_cast<size_t>(layers), 'M');
  const int attention = count(attention_ratio);
  int mamba = layers - attention;
  const double section = static_cast<double>(mamba) / static_cast<double>(attention + 1);
  double x = section;
  for (char& c : out) {
    if (x < 0.5) {
      c = '*';
      x += section;
    } else {
      x -= 1;
    }
  }
  const int mlp = count(mlp_ratio);
  if (mlp > 0) {
    mamba -= mlp;
    const double step = static_cast<double>(mamba) / static_cast<double>(mlp);
    x = step;
    for (char& c : out) {
      if (c != 'M') continue;
      if (x < 0.5) {
        c = '-';
        x += step;
      } else {
        x -= 1;
      }
    }
  }
  return out;
}

void check_pattern_against_ratios(const std::string& pattern, double attention_ratio,
                                  double mlp_ratio) {
  if (attention_ratio == 0 && mlp_ratio == 0) return;
  std::string main = pattern.substr(0, pattern.find('/'));
  main.erase(std::remove(main.begin(), main.end(), '|'), main.end());
  const std::string allocated =
      allocate_hybrid_layers(static_cast<int>(main.size()), attention_ratio, mlp_ratio);
  for (char s : {'M', '*', '-', 'E'})
    if (std::count(main.begin(), main.end(), s) != std::count(allocated.begin(), allocated.end(), s))
      fail_usage("--hybrid-layer-pattern '{}' and --hybrid-attention-ratio {} / --hybrid-mlp-ratio "
                 "{} disagree: the ratios allocate '{}', and Megatron requires the pattern to hold "
                 "as many layers of each type; give the pattern alone or matching ratios",
                 pattern, attention_ratio, mlp_ratio, allocated);
}

}  // namespace weft
