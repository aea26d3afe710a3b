// JSONL lines with Python's extensions (json_line.h).
#include "weft/data/json_line.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>

namespace weft {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Whether `s` is one JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? (Python's json
// reads the same grammar).
bool is_json_number(std::string_view s) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t start = i;
    while (i < s.size() && is_digit(s[i])) ++i;
    return i > start;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < s.size() && s[i] == '.' && (++i, !digits())) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

// Whether the number `s` (a JSON number) lies beyond float64's range.
bool overflows(const std::string& s) {
  errno = 0;
  const double v = std::strtod(s.c_str(), nullptr);
  return errno == ERANGE && std::isinf(v);
}

}  // namespace

std::string python_json_to_strict(std::string_view s) {
  static constexpr std::string_view kLiterals[] = {"-Infinity", "Infinity", "NaN"};
  std::string out;
  out.reserve(s.size());
  bool in_string = false;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < s.size()) {
        out += s[i + 1];  // an escaped character, a quote included
        i += 2;
        continue;
      }
      if (c == '"') in_string = false;
      ++i;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      ++i;
      continue;
    }
    bool literal = false;
    for (std::string_view lit : kLiterals) {
      if (s.substr(i, lit.size()) == lit) {
        out += "null";
        i += lit.size();
        literal = true;
        break;
      }
    }
    if (literal) continue;
    if (c == '-' || is_digit(c)) {
      size_t j = i + 1;
      while (j < s.size() && (is_digit(s[j]) || s[j] == '.' || s[j] == 'e' || s[j] == 'E' ||
                              s[j] == '+' || s[j] == '-'))
        ++j;
      const std::string number(s.substr(i, j - i));
      out += is_json_number(number) && overflows(number) ? std::string("null") : number;
      i = j;
      continue;
    }
    out += c;
    ++i;
  }
  return out;
}

nlohmann::json parse_json_line(const std::string& line) {
  try {
    return nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    // Only a line that a strict parser refuses pays for the rewrite; where the rewrite does
    // not parse either, the strict parser's error about the line as written is the one thrown.
    const std::exception_ptr strict = std::current_exception();
    try {
      return nlohmann::json::parse(python_json_to_strict(line));
    } catch (const nlohmann::json::exception&) {
      std::rethrow_exception(strict);
    }
  }
}

}  // namespace weft
