// Rank-tagged error messages (see error.h).
#include "weft/core/error.h"

#include <atomic>

namespace weft {
namespace {
std::atomic<int> g_rank{-1};

std::string with_rank(const std::string& what) {
  int r = g_rank.load();
  return r < 0 ? what : fmt::format("[rank {}] {}", r, what);
}
}  // namespace

void set_error_rank(int rank) { g_rank.store(rank); }
int error_rank() { return g_rank.load(); }

Error::Error(const std::string& what) : std::runtime_error(with_rank(what)) {}

}  // namespace weft
