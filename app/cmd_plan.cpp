// `weft plan` (see cmd_plan.h): parses the same flags as `weft train` (one parser, so the plan
// describes exactly the run those flags start) and prints weft::make_train_plan's report.
// Needs no MPI: the mesh and the shard arithmetic are pure functions of the config.
#include "cmd_plan.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cmd_train.h"
#include "weft/core/error.h"
#include "weft/train/plan.h"

namespace weft::app {
namespace {

struct PlanArgs {
  int world_size = 1;
  double mfu = 0.4;
  bool json = false;
};

}  // namespace

void add_plan_command(CLI::App* app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* c = app->add_subcommand(
      "plan", "memory per rank (weights, gradients, optimizer state, activations, buffers), "
              "checkpoint size and step time of the `weft train` run these flags start");
  c->add_option("--world-size", a->world_size, "number of ranks")->capture_default_str();
  c->add_option("--mfu", a->mfu, "model FLOPs utilisation assumed for the step time")
      ->capture_default_str();
  c->add_flag("--json", a->json, "print JSON instead of a table");
  ParsedTrainFlags train = add_train_flags(c);
  c->callback([a, train] {
    TrainFlags f = train();
    for (const std::string& w : f.warnings) std::fprintf(stderr, "weft plan: warning: %s\n", w.c_str());
    if (!f.global_batch_given) default_global_batch_size(&f.cfg, a->world_size);
    resolve_train_samples(&f.cfg);
    // --peak-tflops is the train flag (MFU in the log line); unset, plan assumes an H200's
    // dense bf16 peak whatever --device says, since it plans GPU runs.
    if (f.cfg.peak_tflops != -1 && !(f.cfg.peak_tflops > 0 && std::isfinite(f.cfg.peak_tflops)))
      fail_usage("--peak-tflops must be a finite number > 0 (got {})", f.cfg.peak_tflops);
    const double peak = f.cfg.peak_tflops > 0 ? f.cfg.peak_tflops : 989;
    const bool fused = f.cfg.device == "cuda" && f.fused_kernels;
    const TrainPlan p = make_train_plan(f.cfg, a->world_size, a->mfu, peak, fused);
    if (a->json)
      std::cout << train_plan_json(p).dump() << "\n";
    else
      std::cout << train_plan_text(p, f.cfg, a->mfu, peak);
  });
}

}  // namespace weft::app
