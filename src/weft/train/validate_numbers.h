// Range checks of every numeric flag of `weft train` that no other check covers completely:
// each value must be finite and in its range, or training starts with NaNs (`--lr nan`), runs
// forever (`--exit-duration-in-mins nan` never fires) or fails late. One UsageError line names
// the flag and the value. Local, no collectives; called first by validate_train_config.
#pragma once

namespace weft {

struct TrainConfig;

void validate_numeric_flags(const TrainConfig& cfg);

}  // namespace weft
