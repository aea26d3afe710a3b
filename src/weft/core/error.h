// Errors carrying the rank, the flag or key involved, and what to do about it.
//
// Contract: broken invariants and bad input throw weft::Error (or a subclass); recoverable I/O
// returns an error value instead. The rank is attached by whoever knows it (set_error_rank at
// start-up), so every message printed by any layer names the rank that raised it.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace weft {

// The rank reported in error messages; -1 until the communicator starts.
void set_error_rank(int rank);
int error_rank();

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what);
};

// Bad user input: a flag value, a layout, a config or a checkpoint. The CLI maps it to exit 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_usage(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace weft

// Checks an invariant; the message is formatted only on failure.
#define WEFT_CHECK(cond, ...)                                                           \
  do {                                                                                  \
    if (!(cond)) ::weft::fail("{}:{}: check `{}` failed: {}", __FILE__, __LINE__, #cond, \
                              fmt::format(__VA_ARGS__));                                \
  } while (0)
