// weft's AdamW step as one CUDA kernel (see adamw_kernel.h). Written here rather than taken from
// PyTorch (at::_fused_adamw_): that kernel updates the float32 master, gradient and moments
// through a multi-tensor list, recomputes the step constants in float64 per element, writes the
// unscaled gradient back, and leaves the bfloat16 weights to a second pass; on the 0.8B step
// on the H200 it ran at 3.3 TB/s and the cast after it took another 1.3 ms. Here one
// pass moves 4 elements per thread and access (16-byte loads), computes in float32 with the
// constants precomputed on the host, and stores the rounded weights in the same pass.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "weft/optim/adamw_kernel.h"

namespace weft::adamw_kernel {
namespace {

constexpr int kThreads = 256;

template <Weights K>
__device__ __forceinline__ void store_weight(void* w, int64_t i, float p) {
  if constexpr (K == Weights::kBF16) static_cast<__nv_bfloat16*>(w)[i] = __float2bfloat16(p);
  if constexpr (K == Weights::kF32) static_cast<float*>(w)[i] = p;
}

// Gradient element i, and elements [4i, 4i + 4) in one 16-byte (float32) or 8-byte (bfloat16)
// load, widened to float32.
template <Grads G>
__device__ __forceinline__ float load_grad(const void* g, int64_t i) {
  if constexpr (G == Grads::kBF16)
    return __bfloat162float(static_cast<const __nv_bfloat16*>(g)[i]);
  else
    return static_cast<const float*>(g)[i];
}
template <Grads G>
__device__ __forceinline__ float4 load_grad4(const void* g, int64_t i) {
  if constexpr (G == Grads::kBF16) {
    const uint2 raw = static_cast<const uint2*>(g)[i];
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  } else {
    return static_cast<const float4*>(g)[i];
  }
}

// One element's update; p, m, v in and out. Every rounding is spelled out (the _rn intrinsics
// are never contracted into other operations): left to the compiler, the FMA contractions
// differed between the kernel's instantiations, and the same float32 gradients read from a bf16
// and from a float32 shard updated the master 1 ulp apart (test_optim on an H100).
__device__ __forceinline__ void update(float& p, float& m, float& v, float g, const Constants& c) {
  p = __fmaf_rn(-c.lr_decay, p, p);
  m = __fmaf_rn(c.beta1, m, __fmul_rn(c.one_minus_beta1, g));
  v = __fmaf_rn(c.beta2, v, __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
  p = __fsub_rn(p, __fdiv_rn(__fmul_rn(c.step_size, m), denom));
}

// Elements [0, n4 * 4) in float4 accesses (every pointer 16-byte aligned, the bfloat16 weights
// and gradients 8-byte aligned), the rest one at a time; the same arithmetic either way.
template <Weights K, Grads G, bool Vector>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* __restrict__ master, const void* __restrict__ grad,
                 float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                 void* __restrict__ weights, int64_t n, Constants c,
                 const float* __restrict__ grad_scale, const float* __restrict__ found_inf) {
  if (found_inf != nullptr && *found_inf != 0.f) return;
  const float scale = grad_scale != nullptr ? *grad_scale : 1.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n4 = Vector ? n / 4 : 0;
  for (int64_t i = first; i < n4; i += stride) {
    float4 p = reinterpret_cast<const float4*>(master)[i];
    const float4 g = load_grad4<G>(grad, i);
    float4 m = reinterpret_cast<const float4*>(exp_avg)[i];
    float4 v = reinterpret_cast<const float4*>(exp_avg_sq)[i];
    update(p.x, m.x, v.x, __fdiv_rn(g.x, scale), c);
    update(p.y, m.y, v.y, __fdiv_rn(g.y, scale), c);
    update(p.z, m.z, v.z, __fdiv_rn(g.z, scale), c);
    update(p.w, m.w, v.w, __fdiv_rn(g.w, scale), c);
    reinterpret_cast<float4*>(master)[i] = p;
    reinterpret_cast<float4*>(exp_avg)[i] = m;
    reinterpret_cast<float4*>(exp_avg_sq)[i] = v;
    if constexpr (K == Weights::kBF16) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
      uint2 raw;
      raw.x = *reinterpret_cast<const unsigned*>(&lo);
      raw.y = *reinterpret_cast<const unsigned*>(&hi);
      reinterpret_cast<uint2*>(weights)[i] = raw;
    } else if constexpr (K == Weights::kF32) {
      reinterpret_cast<float4*>(weights)[i] = p;
    }
  }
  for (int64_t i = n4 * 4 + first; i < n; i += stride) {
    float p = master[i], m = exp_avg[i], v = exp_avg_sq[i];
    update(p, m, v, __fdiv_rn(load_grad<G>(grad, i), scale), c);
    master[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    store_weight<K>(weights, i, p);
  }
}

// One thread per vector (or element): ceil(n / kThreads) blocks, which the hardware starts as
// earlier ones finish. Measured on the H200 over 820M parameters in one range, 5.90 ms against
// 6.47 ms for one wave of resident blocks striding over the range, and 6.34 against 6.87 ms in
// 64 ranges (4.17 against 3.81 TB/s); the grid-stride loop stays for ranges past the grid's
// limit.
int grid(int64_t wanted) {
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, std::numeric_limits<int32_t>::max()));
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// A range usually starts on the 16-byte grid; where it does not (a shard offset that is not a
// multiple of 4 elements), its first 1-3 elements go to a scalar launch of their own, so that
// the rest still moves in vectors. All buffers share the element offset, so one head aligns
// them all unless their bases disagree, which leaves the whole range scalar.
template <Weights K, Grads G>
void launch(float* master, const void* grad, float* m, float* v, void* w, int64_t n,
            const Constants& c, const float* scale, const float* inf, cudaStream_t s) {
  constexpr int64_t wsize = K == Weights::kBF16 ? 2 : 4;
  constexpr int64_t gsize = G == Grads::kBF16 ? 2 : 4;
  const int64_t head =
      std::min<int64_t>(n, (16 - reinterpret_cast<uintptr_t>(master) % 16) % 16 / 4);
  char* wb = static_cast<char*>(w);
  const char* gb = static_cast<const char*>(grad);
  const bool vec = n - head >= 4 && aligned(master + head, 16) &&
                   aligned(gb + head * gsize, 4 * gsize) &&
                   aligned(m + head, 16) && aligned(v + head, 16) &&
                   (K == Weights::kNone || aligned(wb + head * wsize, 4 * wsize));
  if (!vec) {
    adamw_kernel<K, G, false><<<grid((n + kThreads - 1) / kThreads), kThreads, 0, s>>>(
        master, grad, m, v, w, n, c, scale, inf);
    return;
  }
  if (head > 0)
    adamw_kernel<K, G, false><<<1, kThreads, 0, s>>>(master, grad, m, v, w, head, c, scale, inf);
  const int64_t rest = n - head;
  adamw_kernel<K, G, true><<<grid(((rest + 3) / 4 + kThreads - 1) / kThreads), kThreads, 0,
                             s>>>(master + head, gb + head * gsize, m + head, v + head,
                                  K == Weights::kNone ? nullptr : wb + head * wsize, rest, c,
                                  scale, inf);
}

template <Grads G>
void launch_kind(float* master, const void* grad, float* m, float* v, void* w, Weights kind,
                 int64_t n, const Constants& c, const float* scale, const float* inf,
                 cudaStream_t s) {
  switch (kind) {
    case Weights::kNone:
      launch<Weights::kNone, G>(master, grad, m, v, nullptr, n, c, scale, inf, s);
      break;
    case Weights::kBF16:
      launch<Weights::kBF16, G>(master, grad, m, v, w, n, c, scale, inf, s);
      break;
    case Weights::kF32:
      launch<Weights::kF32, G>(master, grad, m, v, w, n, c, scale, inf, s);
      break;
  }
}

}  // namespace

std::string step(float* master, const void* grad, Grads grad_kind, float* exp_avg,
                 float* exp_avg_sq, void* weights, Weights kind, int64_t n, const Constants& c,
                 const float* grad_scale, const float* found_inf, void* stream) {
  if (n <= 0) return {};
  const auto s = static_cast<cudaStream_t>(stream);
  if (grad_kind == Grads::kBF16)
    launch_kind<Grads::kBF16>(master, grad, exp_avg, exp_avg_sq, weights, kind, n, c, grad_scale,
                              found_inf, s);
  else
    launch_kind<Grads::kF32>(master, grad, exp_avg, exp_avg_sq, weights, kind, n, c, grad_scale,
                             found_inf, s);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}

}  // namespace weft::adamw_kernel
