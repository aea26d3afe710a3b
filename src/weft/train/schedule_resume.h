// A resumed run's learning-rate schedule against the one its checkpoint was trained with, as
// Megatron's OptimizerParamScheduler.load_state_dict: the peak and minimum rates, the decay
// style and the warmup and decay lengths (in samples) must agree, since the restored step
// count only continues the same schedule. --override-opt_param-scheduler trains with the
// flags' schedule instead; --use-checkpoint-opt_param-scheduler takes the checkpoint's. A
// typical cause is a longer --train-iters without --lr-decay-iters (the decay then defaults to
// the new length). Nothing is checked where the schedule is not restored (--finetune,
// --no-load-optim), as in Megatron.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

#include "weft/optim/lr_schedule.h"

namespace weft {

struct ScheduleResume {
  bool override_flags = false;  // --override-opt_param-scheduler
  bool use_checkpoint = false;  // --use-checkpoint-opt_param-scheduler
};

// meta: the checkpoint's metadata.json (its "lr_scheduler" and "config"); run: this run's
// resolved schedule (decay lengths and global_batch set). Throws UsageError naming what differs
// and both flags; with use_checkpoint, replaces run's rates, style and lengths by the
// checkpoint's. `load` names the checkpoint in the message.
void resume_lr_schedule(const nlohmann::json& meta, const ScheduleResume& how,
                        const std::string& load, LrScheduleConfig* run);

}  // namespace weft
