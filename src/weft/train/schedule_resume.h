// A resumed run's learning-rate schedule against the one its checkpoint was trained with, as
// Megatron's OptimizerParamScheduler.load_state_dict compares them: the peak and minimum
// rates, the decay style, the warmup and decay lengths (in samples) and the weight decay.
// Where they differ, Megatron refuses the resume; weft trains on with the flags' schedule and
// warns, naming what differs and the two flags, since extending a run with a longer
// --train-iters (the decay defaulting to it) is a common and deliberate resume.
// --override-opt_param-scheduler trains with the flags' schedule without the warning;
// --use-checkpoint-opt_param-scheduler takes the checkpoint's (its lengths in samples; the
// warmup's starting rate stays the flag's, as Megatron does not store it). A typical cause is a
// longer --train-iters without --lr-decay-iters (the decay then defaults to the new length).
// The weight decay's schedule is compared too: its ends and style, and its increment length
// (--train-iters x the batch) where either run increases it; Megatron compares that length
// under the constant style as well, where it changes nothing: weft does not, so a longer run
// with --lr-decay-iters given resumes. Nothing is checked where the schedule is not restored
// (--finetune, --no-load-optim), as in Megatron.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

#include "weft/optim/lr_schedule.h"

namespace weft {

struct ScheduleResume {
  bool override_flags = false;  // --override-opt_param-scheduler
  bool use_checkpoint = false;  // --use-checkpoint-opt_param-scheduler
};

// meta: the checkpoint's metadata.json (its "lr_scheduler" and "config"); run: this run's
// resolved schedule (decay lengths, global_batch and the weight decay's set). Returns the warning naming what
// differs and both flags (empty where nothing does, or under --override-opt_param-scheduler);
// with use_checkpoint, replaces run's rates, style and lengths by the checkpoint's. `load`
// names the checkpoint in the message.
std::string resume_lr_schedule(const nlohmann::json& meta, const ScheduleResume& how,
                               const std::string& load, LrScheduleConfig* run);
// The checkpoint's schedule position in samples (Megatron's num_steps): as recorded, or for a
// checkpoint that predates the record, its optimizer steps x its global batch.
int64_t checkpoint_scheduler_samples(const nlohmann::json& meta, int64_t steps);

}  // namespace weft
