// Test support: expect_usage, the check that a call is refused with a UsageError whose message
// names what it should (a flag, a path, a value).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "weft/core/error.h"

namespace weft::test {

// Runs `f` and expects a UsageError whose message contains `needle`; a call that returns, or
// throws anything else, fails the test.
template <typename F>
void expect_usage(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error naming " << needle;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace weft::test
