// One line of a JSONL corpus, read as Megatron's tools/preprocess_data.py reads it: with
// Python's json.loads, which also takes the literals NaN, Infinity and -Infinity (what
// json.dumps writes for such floats) and numbers beyond float64's range (read as infinities;
// an integer that long, which Python keeps as an int, is read so too).
// Strict JSON parsers refuse those; a corpus written by Python often has them in metadata
// fields beside the text. Here they read as null: preprocessing uses only the --json-keys
// values, which must be strings, so a key holding one is refused as any non-string value.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace weft {

// `line` parsed; throws nlohmann::json::exception (the strict parser's own message) where
// the line is not JSON even with Python's extensions.
nlohmann::json parse_json_line(const std::string& line);

// `line` with NaN, Infinity, -Infinity and out-of-range numbers outside strings replaced by
// null; anything else unchanged (exposed for tests).
std::string python_json_to_strict(std::string_view line);

}  // namespace weft
