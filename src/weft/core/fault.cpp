// Fault injection (see fault.h).
#include "weft/core/fault.h"

#include <cerrno>
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
  if (fault_wanted(point, rank, iteration, ":stop")) std::raise(SIGSTOP);
}

bool fault_error(const char* point, int rank, int iteration) {
  return fault_errno(point, rank, iteration) != 0;
}

int fault_errno(const char* point, int rank, int iteration) {
  if (fault_wanted(point, rank, iteration, ":enospc")) return ENOSPC;
  if (fault_wanted(point, rank, iteration, ":eio") || fault_wanted(point, rank, iteration, ":error"))
    return EIO;
  return 0;
}

}  // namespace weft
