// `mpirun -np R weft verify-resume <train flags> --at K --to N [--load-layout "<layout flags>"]`:
// proves that a checkpoint restart continues the run exactly. In one process per rank it
// trains N iterations straight (saving at N), then trains again from the same start, saves and
// stops at K (--exit-interval K, as a preempted job), builds a fresh Trainer (on the layout of
// --load-layout if given) that loads that checkpoint and trains to N. It compares iterations
// K+1..N (lm, load-balancing and MTP losses, grad norm), the evaluations after K (every
// validation and test loss the two runs report there) and the two checkpoints at N key by key:
// bitwise on the same layout, within --rtol (default 1e-6; checkpoint tensors relative to
// each key's largest magnitude) across layouts. Rank 0 prints one
// verdict line; any difference exits 1 on every rank.
#include "cmd_verify_resume.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "cmd_ckpt.h"
#include "cmd_train.h"
#include "layout_flags.h"
#include "weft/comm/mpi_runtime.h"
#include "weft/comm/process_groups.h"
#include "weft/core/error.h"
#include "weft/core/remove_tree.h"

namespace weft::app {
namespace {

// --rtol's default across layouts with --bf16 (verify_resume below says why).
constexpr double kBf16Rtol = 1e-2;

struct VerifyArgs {
  int at = -1, to = -1;
  std::string load_layout;
  std::string workdir;
  double rtol = -1;  // -1: 0 (bitwise) on the same layout, 1e-6 across layouts (bf16: 1e-2)
};

// The layout after the restart: the run's layout with --load-layout's flags applied.
void apply_load_layout(const std::string& flags, TrainConfig* cfg) {
  CLI::App p{"--load-layout"};
  add_layout_flags(&p, &cfg->layout);
  int dp = -1;
  p.add_option("--data-parallel-size", dp, "checked against world / (tp * cp * pp)");
  p.add_option("--decoder-first-pipeline-num-layers", cfg->first_stage_layers, "");
  p.add_option("--decoder-last-pipeline-num-layers", cfg->last_stage_layers, "");
  try {
    p.parse(flags, /*program_name_included=*/false);
  } catch (const CLI::ParseError& e) {
    fail_usage("--load-layout '{}': {}", flags, e.what());
  }
  if (dp > 0) {
    const int world = cfg->layout.world_size;
    const int derived = world / (cfg->layout.tp * cfg->layout.cp * cfg->layout.pp);
    if (dp != derived)
      fail_usage("--load-layout: --data-parallel-size {} does not match world {} / (tp {} * cp {} "
                 "* pp {}) = {}", dp, world, cfg->layout.tp, cfg->layout.cp, cfg->layout.pp,
                 derived);
  }
}

// Rank 0's string on every rank (a few hundred bytes, over the control communicator).
std::string broadcast_string(Communicator& c, const std::string& s) {
  at::Tensor n = at::zeros({1}, at::kLong);
  if (c.rank() == 0) n.fill_(static_cast<int64_t>(s.size()));
  c.broadcast(n, 0);
  at::Tensor b = at::zeros({n.item<int64_t>()}, at::kByte);
  if (c.rank() == 0 && !s.empty()) std::memcpy(b.data_ptr(), s.data(), s.size());
  c.broadcast(b, 0);
  return std::string(reinterpret_cast<const char*>(b.data_ptr()), static_cast<size_t>(b.numel()));
}

bool close(double a, double b, double rtol) {
  if (rtol == 0) return a == b || (std::isnan(a) && std::isnan(b));
  return std::fabs(a - b) <= rtol * std::max(std::fabs(a), std::fabs(b));
}

// "" when iterations K+1..N of the resumed run match the straight run; else the first difference.
std::string compare_stats(const std::vector<IterationStats>& straight,
                          const std::vector<IterationStats>& resumed, int at, int to,
                          double rtol) {
  if (static_cast<int>(straight.size()) != to)
    return fmt::format("the straight run trained {} iterations, not {}", straight.size(), to);
  if (static_cast<int>(resumed.size()) != to - at)
    return fmt::format("the resumed run trained {} iterations after the restart, not {}",
                       resumed.size(), to - at);
  for (int i = 0; i < to - at; ++i) {
    const IterationStats& a = straight[at + i];
    const IterationStats& b = resumed[i];
    const std::pair<const char*, std::pair<double, double>> values[] = {
        {"lm loss", {b.lm_loss, a.lm_loss}},
        {"load-balancing loss", {b.aux_loss, a.aux_loss}},
        {"mtp loss", {b.mtp_loss, a.mtp_loss}},
        {"z-loss", {b.z_loss, a.z_loss}},
        {"grad norm", {b.grad_norm, a.grad_norm}},
    };
    if (b.iteration != a.iteration)
      return fmt::format("the resumed run's step {} is iteration {}, the straight run's {}",
                         i + 1, b.iteration, a.iteration);
    for (const auto& [what, v] : values)
      if (!close(v.first, v.second, rtol))
        return fmt::format("iteration {} {} {:.9g} (resumed) vs {:.9g} (straight)", a.iteration,
                           what, v.first, v.second);
    if (b.consumed_samples != a.consumed_samples)
      return fmt::format("iteration {} consumed samples {} (resumed) vs {} (straight)",
                         a.iteration, b.consumed_samples, a.consumed_samples);
  }
  return "";
}

// "" when the resumed run's evaluations (all after iteration `at`) are the straight run's after
// `at`, in order; else the first difference.
std::string compare_validations(const std::vector<ValidationResult>& straight,
                                const std::vector<ValidationResult>& resumed, int at,
                                double rtol) {
  std::vector<ValidationResult> after;
  for (const ValidationResult& v : straight)
    if (v.iteration > at) after.push_back(v);
  auto name = [](const ValidationResult& v) {
    return fmt::format("{}{} at iteration {}", v.test ? "test" : "validation",
                       v.set.empty() ? "" : "-" + v.set, v.iteration);
  };
  for (size_t i = 0; i < std::max(after.size(), resumed.size()); ++i) {
    if (i >= after.size())
      return fmt::format("the resumed run evaluated more: {}", name(resumed[i]));
    if (i >= resumed.size())
      return fmt::format("the resumed run did not evaluate {}", name(after[i]));
    const ValidationResult &a = after[i], &b = resumed[i];
    if (a.iteration != b.iteration || a.test != b.test || a.set != b.set)
      return fmt::format("the resumed run's evaluation {} is {}, the straight run's {}", i + 1,
                         name(b), name(a));
    if (!close(b.loss, a.loss, rtol))
      return fmt::format("{} lm loss {:.9g} (resumed) vs {:.9g} (straight)", name(a), b.loss,
                         a.loss);
  }
  return "";
}

// A run's iteration stats and evaluations.
struct RunResult {
  std::vector<IterationStats> stats;
  std::vector<ValidationResult> validations;
};

// Runs `cfg` from a fresh Trainer with the CPU generator reset to its state as the command
// started (the Trainer seeds it from --seed in any case; nothing of an earlier run carries
// over); returns every iteration's stats and every evaluation.
RunResult run(const TrainConfig& cfg, const ProcessGroups& groups, const at::Tensor& rng_at_start,
              const char* what) {
  if (groups.rank() == 0) {
    fmt::print("verify-resume: {}\n", what);
    std::fflush(stdout);
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(rng_at_start);
  Trainer t(cfg, groups);
  RunResult r;
  r.stats = t.train();
  r.validations = t.validations();
  return r;
}

// The two runs' configurations: the straight one (base) and the restarted one (after).
struct Runs {
  TrainConfig base, after;
};

// Every flag and both layouts, checked locally on every rank (no collective).
Runs check_runs(const TrainFlags& f, const VerifyArgs& v, int world) {
  if (v.at < 1 || v.to <= v.at)
    fail_usage("--at K and --to N need 1 <= K < N (got --at {} --to {})", v.at, v.to);
  // The train flags that verify-resume sets itself are refused, not silently replaced.
  auto refuse = [](bool given, const char* flag, const char* why) {
    if (given) fail_usage("verify-resume sets {} itself ({}); drop it", flag, why);
  };
  if (f.cfg.skip_train) fail_usage("--skip-train: verify-resume trains, saves and resumes; drop it");
  refuse(!f.cfg.save.empty(), "--save", "its checkpoints go to --workdir");
  refuse(f.cfg.save_interval != 0, "--save-interval", "it saves at --at and --to");
  refuse(!f.cfg.log_jsonl.empty(), "--log-jsonl", "it compares the runs' iterations itself");
  refuse(f.cfg.exit_interval != 0, "--exit-interval", "the second run stops at --at");
  refuse(f.cfg.exit_duration_mins != 0, "--exit-duration-in-mins", "the second run stops at --at");
  TrainConfig base = f.cfg;
  base.train_iters = v.to;
  base.save_interval = 0;
  base.exit_interval = 0;
  base.exit_duration_mins = 0;
  base.log_jsonl.clear();
  base.quiet = true;
  TrainConfig after = base;
  after.layout.world_size = world;
  if (!v.load_layout.empty()) apply_load_layout(v.load_layout, &after);
  // Unset, the global batch is Megatron's micro-batch x dp, of both layouts at once: the
  // micro-batch x the least common multiple of their dp sizes, so that both runs take the
  // same batch (a resume never changes it).
  if (!f.global_batch_given) {
    const int d1 = data_parallel_size(base.layout, world);
    const int d2 = data_parallel_size(after.layout, world);
    if (d1 > 0 && d2 > 0)
      base.global_batch_size = after.global_batch_size = base.micro_batch_size * std::lcm(d1, d2);
  }
  if (base.train_samples >= 0)
    fail_usage("--train-samples: verify-resume trains to --to iterations; give the schedule in "
               "iterations (--lr-decay-iters, --lr-warmup-iters)");
  // Every run saves into the work directory (verify_resume sets the paths once it exists); a
  // placeholder until then, so that the flags that need a --save (--async-save) are validated
  // as they will run.
  base.save = after.save = after.load = "<verify-resume workdir>";
  validate_train_config(base, world);
  validate_train_config(after, world);
  // The restarted run starts at --at's samples: the batches it uses from there must divide its
  // layout (a run may be resumed on more ranks at a change of a --step-batch-size-schedule).
  if (const int d2 = data_parallel_size(after.layout, world); d2 > 0)
    train_batches(after).check_reachable(train_batches(base).samples_after(0, v.at), v.to - v.at,
                                         after.micro_batch_size, d2);
  return {base, after};
}

int verify_resume(const TrainFlags& f, const VerifyArgs& v, Runs runs, MpiRuntime& mpi) {
  const int world = mpi.world_size();
  TrainConfig& base = runs.base;
  TrainConfig& after = runs.after;
  const Backend backend = start_runtime(base, f.threads, f.backend, f.deterministic, mpi);

  LayoutConfig l1 = base.layout, l2 = after.layout;
  l1.world_size = l2.world_size = world;
  const Mesh mesh1(l1), mesh2(l2);
  const bool same_layout = layout_to_json(mesh1, base) == layout_to_json(mesh2, after);
  // Another layout sums the gradients in another order. In float32 that moves the results by
  // ~1e-7; in bf16 the summed gradients and the rounded weights part by a bf16 step once a master
  // weight crosses a rounding boundary (up to ~1e-4 in the loss and ~4e-3 in the grad norm
  // after a few iterations on CUDA, docs/performance.md). A broken restore (a fresh moment, a
  // wrong row) moves the checkpoint's tensors by far more than either.
  const double rtol =
      v.rtol >= 0 ? v.rtol : (same_layout ? 0.0 : (base.model.bf16 ? kBf16Rtol : 1e-6));

  auto groups1 = std::make_unique<ProcessGroups>(mesh1, backend);
  const bool rank0 = groups1->rank() == 0;
  std::string dir = v.workdir;
  const bool temp = dir.empty();
  if (rank0 && temp) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/weft-verify-resume-XXXXXX";
    if (!mkdtemp(tmpl.data())) fail("verify-resume: cannot create a directory {}", tmpl);
    dir = tmpl;
  }
  dir = broadcast_string(groups1->control(), dir);
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();

  TrainConfig straight = base;
  straight.save = dir + "/straight";
  TrainConfig stop = base;
  stop.save = dir + "/resumed";
  stop.exit_interval = v.at;
  after.save = stop.save;
  after.load = stop.save;
  after.ckpt_step = -1;
  after.finetune = false;  // the restart loads everything: that is what is verified
  after.no_load_optim = false;
  after.no_load_rng = false;

  const auto a = run(straight, *groups1, rng, fmt::format("iterations 1..{} straight", v.to).c_str());
  const auto b1 = run(stop, *groups1, rng, fmt::format("iterations 1..{}, save, stop", v.at).c_str());
  std::unique_ptr<ProcessGroups> groups2;
  if (!same_layout) {
    groups1.reset();
    groups2 = std::make_unique<ProcessGroups>(mesh2, backend);
  }
  const ProcessGroups& g2 = same_layout ? *groups1 : *groups2;
  const auto b2 = run(after, g2, rng,
                      fmt::format("restart from iteration {}{}, iterations {}..{}", v.at,
                                  same_layout ? "" : " on layout " + v.load_layout, v.at + 1,
                                  v.to).c_str());

  std::string why = static_cast<int>(b1.stats.size()) != v.at
                        ? fmt::format("the run before the restart stopped after {} iterations, "
                                      "not {}", b1.stats.size(), v.at)
                        : compare_stats(a.stats, b2.stats, v.at, v.to, rtol);
  if (why.empty()) why = compare_validations(a.validations, b2.validations, v.at, rtol);
  if (why.empty() && rank0) {
    const std::vector<std::string> d =
        ckpt_differences(straight.save, after.save, rtol, rtol == 0 ? 0 : -1);
    if (!d.empty())
      why = fmt::format("checkpoint at iteration {}: {} key(s) differ, first {}", v.to, d.size(),
                        d.front());
  }
  // Rank 0's verdict (it alone read the checkpoints) decides every rank's exit code.
  Communicator& control = g2.control();
  why = broadcast_string(control, why);
  const std::string tolerance = rtol == 0 ? "bitwise" : fmt::format("within rtol {:g}", rtol);
  if (rank0) {
    if (why.empty())
      fmt::print("verify-resume: PASS iterations {}..{} (losses, grad norms{}) and the "
                 "checkpoints at {} match {} ({}){}\n",
                 v.at + 1, v.to, b2.validations.empty() ? "" : ", evaluations", v.to, tolerance,
                 same_layout ? "same layout" : "restart on " + v.load_layout,
                 temp ? "" : "; files in " + dir);
    else
      fmt::print("verify-resume: FAIL: {} ({}; files in {})\n", why, tolerance, dir);
    std::fflush(stdout);
  }
  control.barrier();
  if (why.empty() && temp && rank0)
    if (Status s = remove_tree(dir); !s) fmt::print(stderr, "verify-resume: {}\n", s.message());
  return why.empty() ? 0 : 1;
}

}  // namespace

void add_verify_resume_command(CLI::App* app, int* argc, char*** argv) {
  auto v = std::make_shared<VerifyArgs>();
  CLI::App* c = app->add_subcommand(
      "verify-resume", "train N iterations straight and with a save + restart at K (optionally "
                       "on another layout); compare losses, grad norms and checkpoints");
  c->add_option("--at", v->at, "iteration to save and restart at (K)")->required();
  c->add_option("--to", v->to, "last iteration (N; sets --train-iters)")->required();
  c->add_option("--load-layout", v->load_layout,
                "layout flags of the restarted run, e.g. \"--pipeline-model-parallel-size 1\"");
  c->add_option("--workdir", v->workdir,
                "where the checkpoints go (default: a temporary directory, removed on PASS)");
  c->add_option("--rtol", v->rtol,
                "relative tolerance (default: 0, bitwise, on the same layout; across layouts 1e-6, "
                "with --bf16 1e-2)");
  ParsedTrainFlags train = add_train_flags(c);
  c->callback([v, train, argc, argv] {
    TrainFlags f = train();
    MpiRuntime mpi(argc, argv);
    set_error_rank(mpi.world_rank());
    if (mpi.world_rank() == 0)
      for (const std::string& w : f.warnings)
        std::fprintf(stderr, "weft verify-resume: warning: %s\n", w.c_str());
    // Phase 1, local: every flag and both layouts before any collective (an MPI_Abort here
    // could kill rank 0 before it printed the error: seen in CI).
    Runs runs;
    check_on_every_rank(mpi, [&] { runs = check_runs(f, *v, mpi.world_size()); });
    // Phase 2, collective: an error now ends the job (rank 0 prints a usage error, any rank
    // another error).
    int rc = 0;
    try {
      rc = verify_resume(f, *v, std::move(runs), mpi);
    } catch (const std::exception& e) {
      const bool usage = dynamic_cast<const UsageError*>(&e) != nullptr;
      if (!usage || mpi.world_rank() == 0)
        std::fprintf(stderr, "weft: %s: %s\n", usage ? "error" : "fatal", e.what());
      if (mpi.world_size() > 1) MpiRuntime::abort(usage ? 2 : 1);
      throw CLI::RuntimeError(usage ? 2 : 1);
    }
    if (rc) throw CLI::RuntimeError(rc);
  });
}

}  // namespace weft::app
