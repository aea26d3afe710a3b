// Fault injection for crash tests (leveldb-style): a named point in the code that, when the
// environment asks for it, either kills this process with SIGKILL (so tests can interrupt a save
// at the worst moment) or makes the point report an error (so tests can see one rank fail while
// the others go on). Inactive unless WEFT_FAULT is set:
//   WEFT_FAULT=<point>:<rank>:<iteration>         e.g. checkpoint.after_shard_write:1:2
// kills world rank <rank> when it reaches fault_point(<point>) during iteration <iteration>;
//   WEFT_FAULT=<point>:<rank>:<iteration>:error   e.g. checkpoint.shard_write:1:2:error
// makes fault_error(<point>) return true there, and the caller fails as on an I/O error (or
// plants what the point documents, e.g. train.nan_grad);
//   WEFT_FAULT=<point>:<rank>:<iteration>:enospc (or :eio)
// does the same and tells fault_errno(<point>) which error to simulate (disk full or EIO;
// `:error` means EIO);
//   WEFT_FAULT=<point>:<rank>:<iteration>:stop    e.g. train.after_backward:1:3:stop
// stops world rank <rank> there with SIGSTOP (a hung rank, which mpirun does not notice).
// <rank> or <iteration> may be '*'.
#pragma once

namespace weft {

void fault_point(const char* point, int rank, int iteration);
// True when WEFT_FAULT asks for an error at this point, rank and iteration.
bool fault_error(const char* point, int rank, int iteration);
// The errno value WEFT_FAULT asks this point to simulate (ENOSPC or EIO), or 0.
int fault_errno(const char* point, int rank, int iteration);

}  // namespace weft
