// The Mamba-2 mixer against an independent reference: plain libtorch autograd over leaf tensors,
// the conv as torch::conv1d with one group per channel, and the SSD as the per-time-step
// recurrence h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t, with no chunking. Output
// and every gradient (input and all nine parameters) agree to 1e-10 in float64 and 1e-5 in
// float32, for chunk sizes that divide the sequence, that do not, that exceed it, and for 1, 2
// and 4 groups. Also the hybrid layer pattern parser and its refusals.
//
// With WEFT_MAMBA_DUMP=FILE, MixerDumpForTransformers writes one float32 case (one group) as
// safetensors for tests/gpu/hf_mamba2_check.py, which compares it with transformers' Mamba-2.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "weft/checkpoint/safetensors.h"
#include "weft/core/error.h"
#include "weft/model/full_params.h"
#include "weft/model/fused.h"
#include "weft/model/hybrid.h"
#include "weft/model/mamba.h"
#include "weft/model/transformer.h"

namespace weft {
namespace {

ModelConfig mamba_config(int groups, int chunk) {
  ModelConfig c;
  c.num_layers = 1;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.num_query_groups = 1;
  c.layer_symbols = "M";
  c.mamba_state_dim = 6;
  c.mamba_head_dim = 4;
  c.mamba_num_groups = groups;
  c.mamba_chunk_size = chunk;  // heads: 2 * 16 / 4 = 8
  return c;
}

double rel_err(const torch::Tensor& got, const torch::Tensor& want) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-30);
  return (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>() / scale;
}

// The reference mixer over leaves named by their suffix ("in_proj.weight", ...).
torch::Tensor reference_mixer(const torch::Tensor& x, std::map<std::string, torch::Tensor>& w,
                              const ModelConfig& cfg) {
  const int64_t b = x.size(0), s = x.size(1);
  const int64_t nh = cfg.mamba_heads(), hd = cfg.mamba_head_dim, di = nh * hd;
  const int64_t ng = cfg.mamba_num_groups, ds = cfg.mamba_state_dim, conv = di + 2 * ng * ds;
  auto rms = [](const torch::Tensor& t, double eps) {
    return t * torch::rsqrt(t.pow(2).mean(-1, true) + eps);
  };
  const torch::Tensor xn = rms(x, cfg.norm_epsilon) * w["in_proj.layer_norm_weight"];
  const torch::Tensor proj = torch::matmul(xn, w["in_proj.weight"].t());
  const torch::Tensor z = proj.narrow(-1, 0, di);
  torch::Tensor xbc = proj.narrow(-1, di, conv).transpose(1, 2);  // [b, conv, s]
  xbc = torch::conv1d(xbc, w["conv1d.weight"], w["conv1d.bias"], 1, 3, 1, conv)
            .narrow(-1, 0, s)
            .transpose(1, 2);
  xbc = torch::silu(xbc);
  const torch::Tensor xs = xbc.narrow(-1, 0, di).reshape({b, s, nh, hd});
  const torch::Tensor B = xbc.narrow(-1, di, ng * ds).reshape({b, s, ng, ds});
  const torch::Tensor C = xbc.narrow(-1, di + ng * ds, ng * ds).reshape({b, s, ng, ds});
  const torch::Tensor dt =
      torch::softplus(proj.narrow(-1, 2 * di + 2 * ng * ds, nh) + w["dt_bias"]);  // [b, s, nh]
  const torch::Tensor A = -torch::exp(w["A_log"]);
  std::vector<torch::Tensor> heads;
  for (int64_t h = 0; h < nh; ++h) {
    const int64_t g = h / (nh / ng);
    torch::Tensor state = torch::zeros({b, hd, ds}, x.options());
    std::vector<torch::Tensor> ys;
    for (int64_t t = 0; t < s; ++t) {
      const torch::Tensor dth = dt.select(1, t).select(1, h);                  // [b]
      const torch::Tensor xt = xs.select(1, t).select(1, h);                   // [b, hd]
      const torch::Tensor Bt = B.select(1, t).select(1, g), Ct = C.select(1, t).select(1, g);
      state = state * torch::exp(dth * A[h]).view({b, 1, 1}) +
              dth.view({b, 1, 1}) * xt.unsqueeze(2) * Bt.unsqueeze(1);
      ys.push_back(torch::matmul(state, Ct.unsqueeze(2)).squeeze(2) + w["D"][h] * xt);
    }
    heads.push_back(torch::stack(ys, 1));  // [b, s, hd]
  }
  const torch::Tensor y = torch::stack(heads, 2).reshape({b, s, di});
  const torch::Tensor gated = (y * torch::silu(z)).reshape({b, s, ng, di / ng});
  const torch::Tensor normed = rms(gated, 1e-5).reshape({b, s, di}) * w["norm.weight"];
  return torch::matmul(normed, w["out_proj.weight"].t());
}

struct Case {
  int groups, chunk;
};

void check_mixer(torch::ScalarType dtype, double tol,
                 const torch::Device& dev = torch::Device(torch::kCPU)) {
  for (const Case cs : {Case{1, 4}, Case{2, 5}, Case{4, 13}, Case{2, 32}, Case{1, 1}}) {
    SCOPED_TRACE(::testing::Message() << "groups " << cs.groups << " chunk " << cs.chunk);
    const ModelConfig cfg = mamba_config(cs.groups, cs.chunk);
    const auto opt = torch::TensorOptions().dtype(dtype);
    FullParams p;
    const auto specs = block_param_specs(cfg, "l.", 'M', false);
    std::map<std::string, torch::Tensor> leaves;
    for (const auto& sp : specs) {
      torch::Tensor v = init_param(sp, cfg, 21).to(dtype);
      if (sp.init == InitKind::kOnes) v = v + 0.3 * torch::rand_like(v);  // norms, D that matter
      if (sp.name.find("in_proj.weight") != std::string::npos) v = v * 8;  // dt of order one
      p.add(sp, v.to(dev).clone());
      leaves[sp.name.substr(std::string("l.mixer.").size())] = v.clone().requires_grad_(true);
    }
    const LayerHandles h = layer_handles(&p, 0, specs, "l.", nullptr);
    torch::manual_seed(5);
    const torch::Tensor x0 = torch::randn({2, 13, cfg.hidden_size}, opt);
    const torch::Tensor R = torch::randn({2, 13, cfg.hidden_size}, opt);
    torch::Tensor x = x0.to(dev).clone().requires_grad_(true);
    torch::Tensor xr = x0.clone().requires_grad_(true);
    const torch::Tensor y = mamba_mixer(x, h.mamba, cfg).cpu();
    (y * R).sum().backward();
    const torch::Tensor yr = reference_mixer(xr, leaves, cfg);
    (yr * R).sum().backward();
    EXPECT_LT(rel_err(y, yr), tol) << "output";
    EXPECT_LT(rel_err(x.grad().cpu(), xr.grad()), tol) << "input gradient";
    for (int i = 0; i < p.size(); ++i) {
      const std::string n = p.spec(i).name.substr(std::string("l.mixer.").size());
      EXPECT_LT(rel_err(p.grad(i).cpu(), leaves[n].grad()), tol) << n;
      EXPECT_EQ(p.pending_uses(i), 0) << n;
    }
  }
}

TEST(Mamba, MixerMatchesRecurrenceFloat64) { check_mixer(torch::kDouble, 1e-10); }
TEST(Mamba, MixerMatchesRecurrenceFloat32) { check_mixer(torch::kFloat, 1e-5); }
// On CUDA in float32 the fused SSD decay and gated-norm kernels run (fused.h): same bound.
TEST(MambaCuda, MixerMatchesRecurrenceFloat32) {
  if (!torch::cuda::is_available() || !fused::compiled()) GTEST_SKIP() << "no CUDA fused kernels";
  check_mixer(torch::kFloat, 1e-5, torch::Device(torch::kCUDA, 0));
}

// bf16 models run the scan's matmul operands in bf16 (float32 decays and accumulation). Against
// the float64 scan (checked above against the recurrence): output and input gradients within
// kBf16Tol of the largest value. bf16 keeps 8 bits, a relative rounding of 2^-9 = 0.2% per
// operand; sums over a chunk average those out. Measured (see the test's output) on the CPU
// since its bf16 products are summed in float32 (compat::matmul): 0.48% for the output, at most
// 0.66% for the gradients (B's). Before that, libtorch 1.13's bf16 GEMMs put them at up to 1.24%
// on an AMD EPYC machine; the bound stays 2%, which a gradient off by a constant factor fails.
void check_bf16_scan(const torch::Device& dev) {
  constexpr double kBf16Tol = 2e-2;
  torch::manual_seed(11);
  const int64_t b = 2, s = 300, H = 8, P = 16, G = 2, N = 16;
  const torch::Tensor x = torch::randn({b, s, H, P}, torch::kDouble);
  const torch::Tensor dt = torch::softplus(torch::randn({b, s, H}, torch::kDouble) - 1);
  const torch::Tensor A = -torch::exp(torch::rand({H}, torch::kDouble) * std::log(16.0));
  const torch::Tensor B = torch::randn({b, s, G, N}, torch::kDouble);
  const torch::Tensor C = torch::randn({b, s, G, N}, torch::kDouble);
  const torch::Tensor R = torch::randn({b, s, H, P}, torch::kDouble);
  auto run = [&](torch::ScalarType in, c10::ScalarType io, std::vector<torch::Tensor>* grads) {
    std::vector<torch::Tensor> leaves;
    const torch::Device d = in == torch::kDouble ? torch::Device(torch::kCPU) : dev;
    for (const torch::Tensor& t : {x, dt, B, C})
      leaves.push_back(t.to(d, in).clone().requires_grad_(true));
    const torch::Tensor y =
        ssd_chunked(leaves[0], leaves[1], A.to(d, in), leaves[2], leaves[3], 64, io).cpu();
    (y.to(torch::kDouble) * R).sum().backward();
    for (const torch::Tensor& l : leaves) grads->push_back(l.grad().cpu());
    return y;
  };
  std::vector<torch::Tensor> g64, g16;
  const torch::Tensor y64 = run(torch::kDouble, c10::ScalarType::Undefined, &g64);
  const torch::Tensor y16 = run(torch::kFloat, torch::kBFloat16, &g16);
  const double ey = rel_err(y16, y64);
  EXPECT_LT(ey, kBf16Tol) << "output";
  EXPECT_GT(ey, 0) << "the bf16 path did not run in bf16";
  const char* names[] = {"x", "dt", "B", "C"};
  for (int i = 0; i < 4; ++i) {
    const double e = rel_err(g16[i], g64[i]);
    EXPECT_LT(e, kBf16Tol) << names[i] << " gradient";
    std::printf("bf16 scan on %s: %s gradient rel err %.3g (output %.3g)\n",
                dev.str().c_str(), names[i], e, ey);
  }
}

TEST(Mamba, BFloat16ScanNearFloat64) { check_bf16_scan(torch::Device(torch::kCPU)); }

// On CUDA the decay-weighted C.B blocks come from weft's fused kernel (fused.h): the whole bf16
// scan against the float64 scan as above, then the kernel alone against the ATen chain it
// replaces, forward and both gradients, in float32 and bfloat16, for Q = 64 and a Q (37) that
// takes the kernels' scalar path.
TEST(MambaCuda, BFloat16ScanNearFloat64) {
  if (!torch::cuda::is_available() || !fused::compiled()) GTEST_SKIP() << "no CUDA fused kernels";
  check_bf16_scan(torch::Device(torch::kCUDA, 0));
}

// The fused conv + SiLU and gated RMSNorm against the ATen chains they replace, in float32 and
// bfloat16, with inputs that are narrows of a wider projection (as in the mixer): output and
// every gradient.
TEST(MambaCuda, FusedConvAndGatedNormMatchTheAtenChains) {
  if (!torch::cuda::is_available() || !fused::compiled()) GTEST_SKIP() << "no CUDA fused kernels";
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(9);
  const int64_t b = 2, s = 150, C = 48, K = 4, ng = 3;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const bool bf16 = dtype == torch::kBFloat16;
    const torch::Tensor proj0 = torch::randn({b, s, 2 * C + 5}).to(dev, dtype);
    const torch::Tensor w0 = torch::randn({C, 1, K}, dev) * 0.5, b0 = torch::randn({C}, dev);
    const torch::Tensor y0 = torch::randn({b, s, C}, dev), nw0 = 1 + torch::rand({C}, dev);
    const torch::Tensor g1 = torch::randn({b, s, C}, dev), g2 = torch::randn({b, s, C}, dev);
    auto run = [&](bool fused_on) {
      const torch::Tensor proj = proj0.clone().requires_grad_(true);
      const torch::Tensor w = w0.clone().requires_grad_(true), bias = b0.clone().requires_grad_(true);
      const torch::Tensor y = y0.clone().requires_grad_(true), nw = nw0.clone().requires_grad_(true);
      const torch::Tensor x = proj.narrow(-1, 3, C), z = proj.narrow(-1, C + 4, C);
      torch::Tensor conv, normed;
      if (fused_on) {
        EXPECT_TRUE(fused::conv_silu_supports(x, w));
        EXPECT_TRUE(fused::gated_rms_norm_supports(y, z, ng));
        conv = fused::conv_silu(x, w, bias);
        normed = fused::gated_rms_norm(y, z, nw, ng, 1e-5);
      } else {
        conv = torch::silu(causal_conv1d(x.to(torch::kFloat), w, bias));
        const torch::Tensor g = (y * torch::silu(z.to(torch::kFloat))).reshape({b, s, ng, C / ng});
        normed = ((g * torch::rsqrt(g.pow(2).mean({-1}, true) + 1e-5)).reshape({b, s, C}) * nw)
                     .to(dtype);
      }
      ((conv * g1).sum() + (normed.to(torch::kFloat) * g2).sum()).backward();
      std::vector<torch::Tensor> out;
      for (const torch::Tensor& t : {conv, normed, proj.grad(), w.grad(), bias.grad(), y.grad(),
                                     nw.grad()})
        out.push_back(t.detach().cpu().to(torch::kDouble));
      return out;
    };
    const auto f = run(true), r = run(false);
    const char* names[] = {"conv", "gated norm", "d proj", "d conv w", "d conv bias", "d y",
                           "d norm w"};
    for (size_t i = 0; i < f.size(); ++i) {
      const double e = rel_err(f[i], r[i]);
      EXPECT_LE(e, bf16 ? 1e-2 : 2e-5) << names[i];
      std::printf("fused conv/norm %s: %s rel err %.3g\n", bf16 ? "bf16" : "fp32", names[i], e);
    }
  }
}

TEST(MambaCuda, FusedDecayBlocksMatchTheAtenChain) {
  if (!torch::cuda::is_available() || !fused::compiled()) GTEST_SKIP() << "no CUDA fused kernels";
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(5);
  for (int64_t Q : {64, 37}) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << "Q " << Q << " " << dtype);
      const int64_t b = 2, nc = 3, G = 2, R = 3;
      const torch::Tensor cb0 = torch::randn({b, nc, G, Q, Q}).to(dev, dtype);
      const torch::Tensor cs0 = (-torch::rand({b, nc, G, R, Q}) * 0.3).cumsum(-1).to(dev);
      const torch::Tensor dout = torch::randn({b, nc, G, R, Q, Q}).to(dev, dtype);
      auto run = [&](bool fused_on, std::vector<torch::Tensor>* out) {
        const torch::Tensor cb = cb0.clone().requires_grad_(true);
        const torch::Tensor cs = cs0.clone().requires_grad_(true);
        torch::Tensor y;
        if (fused_on) {
          y = fused::ssd_decay_weighted(cb, cs);
        } else {
          const torch::Tensor d = cs.unsqueeze(-1) - cs.unsqueeze(-2);
          const torch::Tensor upper = torch::ones({Q, Q}, torch::kBool).triu(1).to(dev);
          y = (cb.unsqueeze(3) * d.masked_fill(upper, -INFINITY).exp()).to(dtype);
        }
        (y.to(torch::kFloat) * dout.to(torch::kFloat)).sum().backward();
        *out = {y.cpu().to(torch::kDouble), cb.grad().cpu().to(torch::kDouble),
                cs.grad().cpu().to(torch::kDouble)};
      };
      std::vector<torch::Tensor> f, r;
      run(true, &f);
      run(false, &r);
      ASSERT_EQ(f[0].sizes(), r[0].sizes());
      const bool bf16 = dtype == torch::kBFloat16;
      // Forward: the same float32 products rounded once, so equal up to exp's last bit.
      EXPECT_LE(rel_err(f[0], r[0]), bf16 ? 4e-3 : 1e-6) << "output";
      EXPECT_EQ(f[0].triu(1).abs().max().item<double>(), 0.0) << "above the diagonal";
      // Gradients: float32 sums in another order (and rounded once to bf16 for dcb).
      EXPECT_LE(rel_err(f[1], r[1]), bf16 ? 1e-2 : 1e-5) << "cb gradient";
      EXPECT_LE(rel_err(f[2], r[2]), 1e-5) << "cs gradient";
      std::printf("fused SSD decay Q %lld %s: output %.3g, dcb %.3g, dcs %.3g\n",
                  static_cast<long long>(Q), bf16 ? "bf16" : "fp32", rel_err(f[0], r[0]),
                  rel_err(f[1], r[1]), rel_err(f[2], r[2]));
    }
  }
}

// The SSD's edge kernels (ssd_edges.h) against ssd.cpp's ATen passes: the whole scan with the
// fused kernels on and off (fused::set_enabled), output and every gradient, for float32 and
// bfloat16 matmul operands; several chunks with a padded last one (s 300: x becomes a contiguous
// copy), several unpadded chunks with x a strided view of a wider projection (s 256, as the mixer
// trains) and a single chunk; with and without D; head dims 16 and 64.
TEST(MambaCuda, SsdEdgeKernelsMatchTheAtenPasses) {
  if (!torch::cuda::is_available() || !fused::compiled()) GTEST_SKIP() << "no CUDA fused kernels";
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(13);
  const int64_t b = 2, H = 8, G = 2, N = 16;
  for (const auto& shape : {std::pair<int64_t, int64_t>{300, 16}, {256, 64}}) {
    const int64_t s = shape.first, P = shape.second;
    const torch::Tensor proj = torch::randn({b, s, H * P + 12}).to(dev);
    const torch::Tensor dt0 = torch::softplus(torch::randn({b, s, H}) - 1).to(dev);
    const torch::Tensor A0 = -torch::exp(torch::rand({H}) * std::log(16.0)).to(dev);
    const torch::Tensor D0 = torch::randn({H}).to(dev);
    const torch::Tensor B0 = torch::randn({b, s, G, N}).to(dev);
    const torch::Tensor C0 = torch::randn({b, s, G, N}).to(dev);
    const torch::Tensor R = torch::randn({b, s, H, P}).to(dev);
    for (const int64_t chunk : {64, 512}) {
      for (const bool with_d : {true, false}) {
        for (const auto io : {c10::ScalarType::Undefined, c10::ScalarType::BFloat16}) {
          SCOPED_TRACE(::testing::Message()
                       << "s " << s << " P " << P << " chunk " << chunk << " D " << with_d << " io "
                       << (io == c10::ScalarType::Undefined ? "f32" : "bf16"));
          // `dtype`: the leaves' and x's type (float64 gives the reference the float32 runs are
          // measured against).
          auto run = [&](bool fused_on, c10::ScalarType dtype) {
            fused::set_enabled(fused_on);
            const torch::Tensor p = proj.to(dtype).clone().requires_grad_(true);
            const torch::Tensor x = p.narrow(-1, 0, H * P).view({b, s, H, P});
            std::vector<torch::Tensor> leaves;
            for (const torch::Tensor& t : {dt0, A0, B0, C0, D0})
              leaves.push_back(t.to(dtype).clone().requires_grad_(true));
            const torch::Tensor y = ssd_chunked(x, leaves[0], leaves[1], leaves[2], leaves[3], chunk,
                                                io, with_d ? leaves[4] : torch::Tensor());
            (y * R.to(dtype)).sum().backward();
            fused::set_enabled(true);
            std::vector<torch::Tensor> out = {y.detach().cpu().to(torch::kDouble),
                                              p.grad().cpu().to(torch::kDouble)};
            for (int i = 0; i < (with_d ? 5 : 4); ++i)
              out.push_back(leaves[i].grad().cpu().to(torch::kDouble));
            return out;
          };
          const bool bf16 = io == c10::ScalarType::BFloat16;
          const auto f = run(true, torch::kFloat), r = run(false, torch::kFloat);
          // float32 operands: both paths against the float64 scan; the kernels' sums run in
          // another order than ATen's, so their error may differ by a small factor, not more (A's
          // gradient sums a whole chunk's cancelling terms: ~3e-5 for either at chunk 512).
          const auto ref = bf16 ? r : run(false, torch::kDouble);
          const char* names[] = {"output", "x", "dt", "A", "B", "C", "D"};
          for (size_t i = 0; i < f.size(); ++i) {
            const double e = rel_err(f[i], bf16 ? r[i] : ref[i]);
            const double bound = bf16 ? 1e-4 : std::max(1e-5, 4 * rel_err(r[i], ref[i]));
            EXPECT_LE(e, bound) << names[i];
            std::printf("ssd edges s %lld P %lld chunk %lld%s %s: %s rel err %.3g (bound %.3g)\n",
                        static_cast<long long>(s), static_cast<long long>(P),
                        static_cast<long long>(chunk), with_d ? " D" : "", bf16 ? "bf16" : "fp32",
                        names[i], e, bound);
          }
        }
      }
    }
  }
}

TEST(Mamba, CausalConvMatchesConv1d) {
  const torch::Tensor x = torch::randn({2, 9, 5}, torch::kDouble);
  const torch::Tensor w = torch::randn({5, 1, 4}, torch::kDouble);
  const torch::Tensor b = torch::randn({5}, torch::kDouble);
  const torch::Tensor want =
      torch::conv1d(x.transpose(1, 2), w, b, 1, 3, 1, 5).narrow(-1, 0, 9).transpose(1, 2);
  EXPECT_LT(rel_err(causal_conv1d(x, w, b), want), 1e-14);
}

TEST(Mamba, DumpForTransformers) {
  const char* path = std::getenv("WEFT_MAMBA_DUMP");
  if (!path) GTEST_SKIP() << "set WEFT_MAMBA_DUMP=FILE to write the transformers check's input";
  ModelConfig cfg = mamba_config(1, 8);
  cfg.hidden_size = 64;
  cfg.mamba_state_dim = 16;
  cfg.mamba_head_dim = 16;  // 8 heads, inner 128
  FullParams p;
  const auto specs = block_param_specs(cfg, "l.", 'M', false);
  for (const auto& sp : specs) {
    torch::Tensor v = init_param(sp, cfg, 8);
    if (sp.init == InitKind::kOnes) v = v + 0.3 * torch::rand_like(v);
    p.add(sp, v);
  }
  const LayerHandles h = layer_handles(&p, 0, specs, "l.", nullptr);
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({2, 37, cfg.hidden_size});
  torch::NoGradGuard no_grad;
  const torch::Tensor y = mamba_mixer(x, h.mamba, cfg).contiguous();
  std::vector<torch::Tensor> keep = {x, y};
  std::vector<SafetensorsWriteEntry> entries;
  auto add = [&](const std::string& name, const torch::Tensor& t) {
    keep.push_back(t.contiguous());
    entries.push_back({name, "F32", t.sizes().vec(), keep.back().data_ptr(),
                       static_cast<size_t>(t.numel()) * 4});
  };
  add("x", x);
  add("y", y);
  for (int i = 0; i < p.size(); ++i)
    add(p.spec(i).name.substr(std::string("l.mixer.").size()), p.value(i));
  const std::map<std::string, std::string> meta = {
      {"hidden", std::to_string(cfg.hidden_size)}, {"state", std::to_string(cfg.mamba_state_dim)},
      {"head_dim", std::to_string(cfg.mamba_head_dim)},
      {"groups", std::to_string(cfg.mamba_num_groups)},
      {"heads", std::to_string(cfg.mamba_heads())}, {"chunk", std::to_string(cfg.mamba_chunk_size)},
      {"eps", std::to_string(cfg.norm_epsilon)}};
  Status s = safetensors_write(path, entries, meta);
  ASSERT_TRUE(static_cast<bool>(s)) << s.message();
}

TEST(HybridPattern, ParsesStagesAndMtp) {
  ModelConfig c;
  apply_hybrid_layer_pattern("M-M*-E|M-ME*-/*E/*E", &c);
  EXPECT_EQ(c.layer_symbols, "M-M*-EM-ME*-");
  EXPECT_EQ(c.num_layers, 12);
  EXPECT_EQ(c.hybrid_stage_layers, (std::vector<int>{6, 6}));
  EXPECT_EQ(c.mtp_num_layers, 2);
  EXPECT_EQ(c.mtp_layer_symbols, "*E");
  ModelConfig d;
  apply_hybrid_layer_pattern("MM*-", &d);
  EXPECT_TRUE(d.hybrid_stage_layers.empty());
  EXPECT_EQ(d.mtp_num_layers, 0);
  for (const char* bad : {"MX*", "M||*", "M*/*E/*", "M*/*E/E*", "", "M*/"}) {
    ModelConfig e;
    EXPECT_THROW(apply_hybrid_layer_pattern(bad, &e), UsageError) << bad;
  }
}

// Megatron's allocation by ratios, against patterns computed by a Python transcription of
// Megatron's allocate_layers (Python floats and round, half to even); the 56-layer one is the
// 8B Mamba-2-Hybrid's.
TEST(HybridPattern, AllocatesByRatiosAsMegatron) {
  struct Case {
    int layers;
    double attention, mlp;
    const char* want;
  };
  const Case cases[] = {
      {48, 0.08, 0.5, "M-M-M--M-*M-M-M-M--*M-M-M-M-*M--M-M-M-*M-M--M-M-"},
      {56, 0.08, 0.5, "M-M-M--M-M*-M-M-M-M--M*-M-M-M-M-M*--M-M-M-M-M*-M--M-M-M-"},
      {10, 0.2, 0.0, "MMM*MM*MMM"},
      {10, 0.0, 0.3, "MM-MMM-MM-"},
      {48, 0.5, 0.2, "M*-*M*M*-*M*-*M*M*-*M*-**M*-*M*M*-*M*-*M*M*-*M*-"},
      {10, 0.25, 0.25, "MMM*-M*MM-"},  // round(2.5) = 2
      {4, 0.125, 0.375, "M-M-"},        // round(0.5) = 0, round(1.5) = 2
      {6, 0, 0, "MMMMMM"},
      {5, 1.0, 0.0, "*****"},
  };
  for (const Case& c : cases)
    EXPECT_EQ(allocate_hybrid_layers(c.layers, c.attention, c.mlp), c.want)
        << c.layers << " " << c.attention << " " << c.mlp;
  EXPECT_THROW(allocate_hybrid_layers(8, 0.6, 0.5), UsageError);
  EXPECT_THROW(allocate_hybrid_layers(8, -0.1, 0), UsageError);
  EXPECT_THROW(allocate_hybrid_layers(0, 0.1, 0), UsageError);
  // A given pattern must hold the allocation's counts (stages and MTP depths aside).
  EXPECT_NO_THROW(check_pattern_against_ratios("MM*M|M*MM/*-", 0.2, 0.0));  // 8 layers, 2 attention
  EXPECT_THROW(check_pattern_against_ratios("MM*M|MMMM", 0.2, 0.0), UsageError);
  EXPECT_NO_THROW(check_pattern_against_ratios("MX", 0, 0));  // no ratios: nothing to check
}

}  // namespace
}  // namespace weft
