// Reading config.json fields for the Hugging Face import (hf_config.cpp, hf_nemotron_h.cpp):
// typed reads and refusals, each a UsageError of one line naming the key.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "weft/core/error.h"

namespace weft {

// Reads `key` into *out (int, double, bool or string); false when absent or null, which is
// refused for a required key. A wrong type or an int out of range is refused naming the key.
template <typename T>
inline bool hf_get(const nlohmann::json& j, const char* key, T* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) fail_usage("hf import: config.json is missing '{}'", key);
    return false;
  }
  bool ok = true;
  if constexpr (std::is_same_v<T, int>) {
    // In range before the narrowing get<int>: 4294967297 would read as 1.
    ok = it->is_number_integer() &&
         (it->is_number_unsigned()
              ? it->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int>::max())
              : it->get<int64_t>() >= std::numeric_limits<int>::min() &&
                    it->get<int64_t>() <= std::numeric_limits<int>::max());
    if (it->is_number_integer() && !ok)
      fail_usage("hf import: config.json '{}' is {}, out of range", key, it->dump());
  }
  if constexpr (std::is_same_v<T, double>) ok = it->is_number();
  if constexpr (std::is_same_v<T, bool>) ok = it->is_boolean();
  if constexpr (std::is_same_v<T, std::string>) ok = it->is_string();
  if (!ok) fail_usage("hf import: config.json '{}' has the wrong type ({})", key, it->dump());
  *out = it->get<T>();
  return true;
}

// The value of `key`, or `fallback` when it is absent or null (checked as hf_get).
template <typename T>
inline T hf_get_or(const nlohmann::json& j, const char* key, T fallback) {
  hf_get(j, key, &fallback, false);
  return fallback;
}

// Refuses `key` when present, non-null and not equal to `allowed` (JSON equality).
inline void hf_refuse_unless(const nlohmann::json& j, const char* key,
                             const nlohmann::json& allowed, const char* why) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null() || *it == allowed) return;
  if (allowed.is_number() && it->is_number() && it->get<double>() == allowed.get<double>()) return;
  fail_usage("hf import: config.json {} is {}; {}", key, it->dump(), why);
}

}  // namespace weft
