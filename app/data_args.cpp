// Megatron's data-args files (see data_args.h).
#include "data_args.h"

#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "weft/core/error.h"

namespace weft {
namespace {

std::string read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_usage("{} {}: cannot read the file", flag, path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

void read_data_args_files(const std::string& data_args_path,
                          const std::string& per_split_data_args_path, TrainConfig* t) {
  if (!data_args_path.empty()) {
    if (!t->data_path.empty())
      fail_usage("--data-args-path and --data-path both give the blend; give one (Megatron "
                 "asserts the same)");
    t->data_path = words(read_file(data_args_path, "--data-args-path"));
    if (t->data_path.empty())
      fail_usage("--data-args-path {}: the file holds no dataset", data_args_path);
  }
  if (per_split_data_args_path.empty()) return;
  const char* flag = "--per-split-data-args-path";
  if (t->per_split_data())
    fail_usage("{} and --train/valid/test-data-path both give the splits' blends; give one",
               flag);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(per_split_data_args_path, flag));
  } catch (const nlohmann::json::parse_error& e) {
    fail_usage("{} {}: not JSON ({})", flag, per_split_data_args_path, e.what());
  }
  if (!j.is_object())
    fail_usage("{} {}: not a JSON object with \"train\", \"valid\" and \"test\"", flag,
               per_split_data_args_path);
  const char* keys[3] = {"train", "valid", "test"};
  for (const auto& [key, value] : j.items())
    if (key != keys[0] && key != keys[1] && key != keys[2])
      fail_usage("{} {}: unknown key \"{}\" (the keys are train, valid and test)", flag,
                 per_split_data_args_path, key);
  for (int i = 0; i < 3; ++i) {
    if (!j.contains(keys[i]) || j[keys[i]].is_null()) continue;
    const nlohmann::json& v = j[keys[i]];
    std::vector<std::string>& out = t->split_data_path[i];
    if (v.is_string()) {
      out = words(v.get<std::string>());
    } else if (v.is_array()) {
      for (const nlohmann::json& w : v) {
        if (w.is_string())
          out.push_back(w.get<std::string>());
        else if (w.is_number())
          out.push_back(w.dump());
        else
          fail_usage("{} {}: \"{}\" holds {}, neither a word nor a number", flag,
                     per_split_data_args_path, keys[i], w.dump());
      }
    } else {
      fail_usage("{} {}: \"{}\" is {}, not a string or a list", flag, per_split_data_args_path,
                 keys[i], v.dump());
    }
    if (out.empty())
      fail_usage("{} {}: \"{}\" names no dataset", flag, per_split_data_args_path, keys[i]);
  }
  if (!t->per_split_data())
    fail_usage("{} {}: no split has data (give \"train\" at least)", flag,
               per_split_data_args_path);
}

}  // namespace weft
