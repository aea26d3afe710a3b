// Fault injection (see fault.h).
#include "weft/core/fault.h"

#include <csignal>
#include <cstdlib>
#include <string>

namespace weft {
namespace {

bool fault_wanted(const char* point, int rank, int iteration, const char* suffix) {
  const char* spec = std::getenv("WEFT_FAULT");
  if (!spec) return false;
  // <rank> and <iteration> may each be '*' (any).
  for (const std::string& r : {std::to_string(rank), std::string("*")})
    for (const std::string& it : {std::to_string(iteration), std::string("*")})
      if (std::string(point) + ":" + r + ":" + it + suffix == spec) return true;
  return false;
}

}  // namespace

void fault_point(const char* point, int rank, int iteration) {
  if (fault_wanted(point, rank, iteration, "")) std::raise(SIGKILL);
}

bool fault_error(const char* point, int rank, int iteration) {
  return fault_wanted(point, rank, iteration, ":error");
}

}  // namespace weft
