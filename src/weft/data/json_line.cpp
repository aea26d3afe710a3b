// JSONL lines with Python's extensions (json_line.h).
#include "weft/data/json_line.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>

namespace weft {

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
    if (c == '-' || (c >= '0' && c <= '9')) {
      size_t j = i + 1;
      while (j < s.size() && ((s[j] >= '0' && s[j] <= '9') || std::strchr(".eE+-", s[j]) != nullptr))
        ++j;
      const std::string number(s.substr(i, j - i));
      errno = 0;
      const double v = std::strtod(number.c_str(), nullptr);
      out += errno == ERANGE && std::isinf(v) ? std::string("null") : number;
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
