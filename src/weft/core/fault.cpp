// Fault injection (see fault.h).
#include "weft/core/fault.h"

#include <csignal>
#include <cstdlib>
#include <string>

namespace weft {

void fault_point(const char* point, int rank, int iteration) {
  const char* spec = std::getenv("WEFT_FAULT");
  if (!spec) return;
  const std::string want = std::string(point) + ":" + std::to_string(rank) + ":" +
                           std::to_string(iteration);
  if (want == spec) std::raise(SIGKILL);
}

}  // namespace weft
