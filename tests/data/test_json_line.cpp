// JSONL lines as Python's json.loads reads them (data/json_line.h): NaN, Infinity, -Infinity and
// numbers beyond float64 read as null outside strings; strings and ordinary JSON unchanged; a
// line that is not JSON even so is refused with the strict parser's error.
#include <gtest/gtest.h>

#include "weft/data/json_line.h"

namespace weft {
namespace {

TEST(JsonLine, PythonLiteralsAndOverflowReadAsNull) {
  const auto doc = parse_json_line(
      R"({"text": "a NaN and Infinity, -Infinity 1e309", "s": NaN, "t": [Infinity, -Infinity],)"
      R"( "big": 1e309, "neg": -2E+400, "ok": -1.5e3, "tiny": 1e-400})");
  EXPECT_EQ(doc["text"], "a NaN and Infinity, -Infinity 1e309");
  EXPECT_TRUE(doc["s"].is_null());
  EXPECT_TRUE(doc["t"][0].is_null());
  EXPECT_TRUE(doc["t"][1].is_null());
  EXPECT_TRUE(doc["big"].is_null());
  EXPECT_TRUE(doc["neg"].is_null());
  EXPECT_EQ(doc["ok"], -1500.0);
  EXPECT_TRUE(doc["tiny"].is_number());  // underflow is a number (0 or subnormal), as in Python
}

TEST(JsonLine, StringsAndEscapesAreLeftAlone) {
  const std::string line = R"({"text": "say \"NaN\" \\", "n": 12, "x": "Infinity"})";
  EXPECT_EQ(python_json_to_strict(line), line);
  EXPECT_EQ(python_json_to_strict(R"({"a": "\\", "b": NaN})"), R"({"a": "\\", "b": null})");
  EXPECT_EQ(parse_json_line(line)["text"], "say \"NaN\" \\");
}

TEST(JsonLine, WhatIsNotJsonStaysRefused) {
  // Python refuses these too: malformed numbers stay malformed even where a prefix overflows.
  for (const char* bad : {R"({"text": "a" "b"})", R"({"text": nan})", R"({"text": +Infinity})",
                          R"({"text": 'a'})", R"({"text": "a")", R"({"n": 1e309e5})",
                          R"({"n": 01e309})", R"({"n": 1.e309})", R"({"n": 1e309-})",
                          R"({"n": 1e309.5})", R"({"n": -})"}) {
    EXPECT_THROW(parse_json_line(bad), nlohmann::json::exception) << bad;
  }
  EXPECT_THROW(parse_json_line(std::string("{\"n\": 1e309\0}", 13)), nlohmann::json::exception);
  try {
    parse_json_line(R"({"n": NaN, "text": })");
    FAIL() << "parsed";
  } catch (const nlohmann::json::parse_error& e) {
    // The error is about the line as written (at the NaN), not about the rewritten one.
    EXPECT_NE(std::string(e.what()).find("column 7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace weft
