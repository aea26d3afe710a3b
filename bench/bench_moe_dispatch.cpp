// bench_moe_dispatch: what expert parallelism's token exchange costs per MoE layer on CPU, next
// to the expert compute it feeds, measured in the same run. Run it under mpirun with one rank
// per ep rank (world = ep, pp 1, one expert FSDP shard), e.g.
//   mpirun -np 4 bench_moe_dispatch --hidden 512 --moe-ffn 1408 --experts 8 --topk 2
//
// Each iteration draws one MoE layer's worth of work per rank: --tokens tokens routed top-k by
// random logits plus a per-expert bias shared by every rank (--skew, its standard deviation),
// so the load is uneven across experts and ranks as in a real router; the tokens*topk rows are
// random, already sorted by global expert (ExpertParallel::run's input). Timed phases, each
// from an MPI_Barrier to the rank's own return (std::chrono::steady_clock):
//   dispatch fwd       the exchanges of the alltoall dispatcher without the experts: the int64
//                      all-to-all of per-expert counts over the ep group, all_to_all_rows out
//                      to the experts' ranks and all_to_all_rows back;
//   dispatch fwd+bwd   the same, plus the backward of that two-exchange graph under a sum()
//                      loss (the gradient takes both exchanges in reverse);
//   expert fwd+bwd     grouped_expert_mlp on as many rows as this rank receives, split over its
//                      E/ep experts by the exchanged counts, forward and backward (the FSDP
//                      unit's gradient lands in its gradient shard; shard size 1: no comm);
//   full run fwd+bwd   ExpertParallel::run forward and backward (exchanges, permutations,
//                      experts): the layer as the trainer runs it.
// Each phase's time is the median over --iters iterations (after --warmup) on each rank, then
// the slowest rank's (MPI_Allreduce MAX). Baseline: the expert compute of the same layer;
// `/expert` is each phase over it, so dispatch /expert is the share of a layer's expert work
// the exchange adds when nothing overlaps it. `MB/rank` is the bytes each rank sends to other
// ranks in the timed exchanges (rows only: the counts are a few bytes, rows a rank keeps are a
// local copy), averaged over ranks and iterations; GB/s is those bytes over the phase's time,
// next to a local copy of a rank's rows out + in (the memory system's ceiling). The closing
// `baselines` line also gives the experts' GFLOP/s, which sets the ratio on a given machine.
// --tokens defaults to 128 so that a run under two cores with a reference BLAS stays well under a
// minute; pass e.g. --tokens 4096 for a realistic microbatch on a real machine.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "weft/comm/communicator.h"
#include "weft/comm/mpi_runtime.h"
#include "weft/comm/process_groups.h"
#include "weft/core/compat.h"
#include "weft/core/error.h"
#include "weft/mesh/mesh.h"
#include "weft/model/config.h"
#include "weft/model/moe.h"
#include "weft/model/transformer.h"
#include "weft/parallel/expert_parallel.h"
#include "weft/parallel/fsdp_unit.h"

namespace {

using Clock = std::chrono::steady_clock;

// The dispatcher's step 1 (see expert_parallel.cpp): per-expert counts to the experts' ranks,
// and what follows from them for the row exchanges.
struct Plan {
  std::vector<int64_t> send, recv;  // rows to / from each ep rank
  std::vector<int64_t> local;       // rows per local expert after the exchange
};

Plan exchange_counts(weft::Communicator& ep, const std::vector<int64_t>& counts, int local) {
  const int P = ep.size();
  const at::Tensor sent = at::tensor(counts, at::kLong);
  at::Tensor got_t = at::empty({P * local}, sent.options());
  ep.all_to_all(sent, std::vector<int64_t>(P, local), got_t, std::vector<int64_t>(P, local));
  const int64_t* got = got_t.data_ptr<int64_t>();
  Plan p{std::vector<int64_t>(P, 0), std::vector<int64_t>(P, 0), std::vector<int64_t>(local, 0)};
  for (int r = 0; r < P; ++r)
    for (int e = 0; e < local; ++e) {
      p.send[r] += counts[r * local + e];
      p.recv[r] += got[r * local + e];
      p.local[e] += got[r * local + e];
    }
  return p;
}

// Seconds from a world barrier to this rank's return from fn().
template <class Fn>
double timed(Fn&& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double max_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}

template <class T>
std::vector<T> gather_all(T x, MPI_Datatype type, int n) {
  std::vector<T> out(n);
  MPI_Allgather(&x, 1, type, out.data(), 1, type, MPI_COMM_WORLD);
  return out;
}

int run(int argc, char** argv, const weft::MpiRuntime& mpi) {
  CLI::App app{"all-to-all dispatch time per MoE layer against the expert compute"};
  int64_t hidden = 512, moe_ffn = 1408, tokens = 128;
  int experts = 8, topk = 2, iters = 10, warmup = 2, threads = 1;
  double skew = 0.5;
  app.add_option("--hidden", hidden, "hidden size h (rows are [tokens*topk, h] float32)");
  app.add_option("--moe-ffn", moe_ffn, "expert FFN size (fc1 [2*ffn, h], fc2 [h, ffn])");
  app.add_option("--experts", experts, "global experts E (a multiple of the ranks)");
  app.add_option("--topk", topk, "experts per token");
  app.add_option("--tokens", tokens,
                 "tokens per rank per layer (small default: see the file's opening)");
  app.add_option("--skew", skew, "std of the per-expert router logit bias (0: even load)");
  app.add_option("--iters", iters, "timed iterations (median)");
  app.add_option("--warmup", warmup, "untimed iterations first");
  app.add_option("--threads", threads, "intra-op threads per rank");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return mpi.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
  }
  const int P = mpi.world_size(), me = mpi.world_rank();
  if (hidden < 1 || moe_ffn < 1 || tokens < 1)
    weft::fail_usage("--hidden, --moe-ffn and --tokens must be >= 1");
  if (experts < 1 || experts % P != 0)
    weft::fail_usage("--experts {} must be a positive multiple of the {} ranks (ep = world)",
                     experts, P);
  if (topk < 1 || topk > experts)
    weft::fail_usage("--topk {} must be in [1, --experts {}]", topk, experts);
  if (iters < 1 || warmup < 0 || threads < 1)
    weft::fail_usage("--iters and --threads must be >= 1 and --warmup >= 0");
  at::set_num_threads(threads);

  weft::Mesh mesh(weft::LayoutConfig{.world_size = P, .pp = 1, .ep = P});
  weft::ProcessGroups groups(mesh, weft::Backend::kMpi);
  weft::Communicator& ep = *groups.get("ep");
  const int L = experts / P;

  weft::ModelConfig cfg;
  cfg.hidden_size = static_cast<int>(hidden);
  cfg.num_experts = experts;
  cfg.moe_router_topk = topk;
  cfg.moe_ffn_hidden_size = static_cast<int>(moe_ffn);
  weft::FsdpUnit unit("decoder.layers.0.mlp.experts",
                      weft::expert_param_specs(cfg, weft::layer_prefix(0), ep.rank() * L, L),
                      groups.get("expert_fsdp_shard"), at::kFloat, at::Device(at::kCPU));
  unit.load_full([&](const weft::ParamSpec& s) { return weft::init_param(s, cfg, 1234); });
  const at::Tensor grad_shard = at::zeros({unit.shard_numel()}, at::kFloat);
  unit.set_grad_target(grad_shard);
  unit.set_microbatch(0);
  std::vector<weft::ParamHandle> fc1, fc2;
  for (int i = 0; i < L; ++i) {
    fc1.push_back(unit.handle(i));
    fc2.push_back(unit.handle(L + i));
  }
  weft::ExpertParallel dispatcher(&unit, &ep, experts, cfg.expert_mlp());

  // The router bias is the same on every rank (hot experts are hot everywhere); tokens differ.
  const at::Tensor bias =
      at::randn({experts}, weft::compat::make_cpu_generator(7), at::kFloat) * skew;
  at::Generator gen = weft::compat::make_cpu_generator(1000 + static_cast<uint64_t>(me));
  const int64_t N = tokens * topk, row_bytes = hidden * 4;

  // Copy destination for the baseline, touched once (fresh pages are slow on some VMs).
  const at::Tensor copy_buf = at::zeros({N * (P + 1), hidden}, at::kFloat);
  std::vector<double> t_fwd, t_fb, t_exp, t_full, t_copy;
  double off_rank_rows = 0;  // rows sent to other ranks per layer (out + back), summed over iters
  int64_t recv_min = INT64_MAX, recv_max = 0;
  double recv_sum = 0;
  for (int it = 0; it < warmup + iters; ++it) {
    // One layer's input: top-k of random logits, rows sorted by global expert.
    const at::Tensor logits = at::randn({tokens, experts}, gen, at::kFloat) + bias;
    const at::Tensor chosen = std::get<1>(at::topk(logits, topk, -1));
    const at::Tensor counts_t = at::bincount(chosen.reshape({-1}), {}, experts);
    const std::vector<int64_t> counts(counts_t.data_ptr<int64_t>(),
                                      counts_t.data_ptr<int64_t>() + experts);
    const at::Tensor rows = at::randn({N, hidden}, gen, at::kFloat);
    const Plan plan = exchange_counts(ep, counts, L);  // untimed: sizes for the expert phase
    const int64_t R = std::accumulate(plan.recv.begin(), plan.recv.end(), int64_t{0});
    const at::Tensor arrived = at::randn({R, hidden}, gen, at::kFloat);
    const at::Tensor copy_src = at::cat({rows, arrived});
    const at::Tensor copy_dst = copy_buf.narrow(0, 0, N + R);
    grad_shard.zero_();

    const double a = timed([&] {
      const Plan p = exchange_counts(ep, counts, L);
      const at::Tensor x = rows.detach().requires_grad_(true);
      const at::Tensor there = weft::all_to_all_rows(ep, x, p.send, p.recv);
      const at::Tensor back = weft::all_to_all_rows(ep, there, p.recv, p.send);
    });
    const double ab = timed([&] {
      const Plan p = exchange_counts(ep, counts, L);
      const at::Tensor x = rows.detach().requires_grad_(true);
      const at::Tensor there = weft::all_to_all_rows(ep, x, p.send, p.recv);
      weft::all_to_all_rows(ep, there, p.recv, p.send).sum().backward();
    });
    const double b = timed([&] {
      const at::Tensor x = arrived.detach().requires_grad_(true);
      weft::grouped_expert_mlp(x, plan.local, fc1, fc2, cfg.expert_mlp()).sum().backward();
    });
    const double c = timed([&] {
      const at::Tensor x = rows.detach().requires_grad_(true);
      dispatcher.run(x, counts).sum().backward();
    });
    const double cp = timed([&] { copy_dst.copy_(copy_src); });
    WEFT_CHECK(!unit.has_pending_grads(0), "expert unit still awaits gradients");
    if (it < warmup) continue;
    t_fwd.push_back(a);
    t_fb.push_back(ab);
    t_exp.push_back(b);
    t_full.push_back(c);
    t_copy.push_back(cp);
    for (int r = 0; r < P; ++r)
      if (r != ep.rank()) off_rank_rows += static_cast<double>(plan.send[r] + plan.recv[r]);
    recv_min = std::min(recv_min, R);
    recv_max = std::max(recv_max, R);
    recv_sum += static_cast<double>(R);
  }

  const double fwd = max_over_ranks(median(t_fwd)), fb = max_over_ranks(median(t_fb));
  const double ex = max_over_ranks(median(t_exp)), full = max_over_ranks(median(t_full));
  // Off-rank bytes per rank per layer (fwd), mean over ranks.
  const double my_bytes = off_rank_rows / iters * static_cast<double>(row_bytes);
  double mean_bytes = 0;
  for (double v : gather_all(my_bytes, MPI_DOUBLE, P)) mean_bytes += v / P;
  // The local copy baseline: this rank's rows out + in, bytes over the median time.
  double copy_bw = (static_cast<double>(N) + recv_sum / iters) * row_bytes / median(t_copy);
  MPI_Allreduce(MPI_IN_PLACE, &copy_bw, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  // Expert fwd+bwd FLOPs: 3 GEMM passes (fwd, dgrad, wgrad) of 2*R*h*(2f + f).
  double gflops = 18.0 * recv_sum / iters * static_cast<double>(hidden * moe_ffn) / median(t_exp);
  MPI_Allreduce(MPI_IN_PLACE, &gflops, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  const std::vector<int64_t> rmin = gather_all<int64_t>(recv_min, MPI_INT64_T, P);
  const std::vector<int64_t> rmax = gather_all<int64_t>(recv_max, MPI_INT64_T, P);
  const std::vector<double> rmean = gather_all(recv_sum / iters, MPI_DOUBLE, P);

  if (me == 0) {
    std::printf("# bench_moe_dispatch: ep %d (world %d, %d intra-op thread(s) per rank), hidden "
                "%lld, moe-ffn %lld, %d experts (%d per rank), top-%d, skew %.2f, %lld tokens = "
                "%lld rows per rank per layer, float32, %d iters after %d warm-up, %s\n",
                P, P, threads, static_cast<long long>(hidden), static_cast<long long>(moe_ffn),
                experts, L, topk, skew, static_cast<long long>(tokens),
                static_cast<long long>(N), iters, warmup,
                weft::MpiRuntime::library_version().c_str());
    std::printf("# rows received per rank per layer (expert load):");
    for (int r = 0; r < P; ++r)
      std::printf(" r%d %lld..%lld (mean %.0f)", r, static_cast<long long>(rmin[r]),
                  static_cast<long long>(rmax[r]), rmean[r]);
    std::printf("\n# times per MoE layer: median over iters, slowest rank; /expert = over expert "
                "fwd+bwd; MB/rank = row bytes sent to other ranks (mean over ranks)\n");
    std::printf("%-34s %10s %9s %9s %8s\n", "phase", "ms", "/expert", "MB/rank", "GB/s");
    // bytes > 0: the phase's off-rank bytes; bw: whether moving them is all the phase does.
    auto row = [&](const char* name, double t, double bytes, bool bw) {
      std::printf("%-34s %10.3f %9.4g", name, t * 1e3, t / ex);
      if (bytes > 0) std::printf(" %9.2f", bytes / 1e6);
      else std::printf(" %9s", "-");
      if (bw) std::printf(" %8.2f\n", bytes / 1e9 / t);
      else std::printf(" %8s\n", "-");
    };
    row("dispatch fwd (counts+out+back)", fwd, mean_bytes, true);
    row("dispatch fwd+bwd", fb, 2 * mean_bytes, true);
    row("expert compute fwd+bwd", ex, 0, false);
    row("full ExpertParallel::run fwd+bwd", full, 2 * mean_bytes, false);
    row("  rest: full - dispatch - expert", full - fb - ex, 0, false);
    std::printf("# baselines: local copy of a rank's rows out + in %.2f GB/s (dispatch fwd moves "
                "off-rank bytes at %.3g of it); expert compute %.2f GFLOP/s (slowest rank)\n",
                copy_bw / 1e9, mean_bytes / fwd / copy_bw, gflops / 1e9);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  weft::MpiRuntime mpi(&argc, &argv);
  weft::set_error_rank(mpi.world_rank());
  try {
    return run(argc, argv, mpi);
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
