// Fault injection for crash tests (leveldb-style): a named point in the code that kills this
// process with SIGKILL when the environment asks for it, so tests can interrupt a save at the
// worst moment. Inactive unless WEFT_FAULT is set:
//   WEFT_FAULT=<point>:<rank>:<iteration>   e.g. checkpoint.after_shard_write:1:2
// kills world rank <rank> when it reaches <point> during iteration <iteration>.
#pragma once

namespace weft {

void fault_point(const char* point, int rank, int iteration);

}  // namespace weft
