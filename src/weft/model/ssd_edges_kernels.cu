// The chunked SSD's edge kernels (ssd_edges_kernels.h). One thread per 4 consecutive channels of
// one (row, head); the P / 4 threads of a (row, head) are consecutive lanes of a warp, so the
// per-(row, head) sums over channels are shuffle trees in a fixed order. Written by hand because
// ATen runs each of these products as a separate strided, type-casting kernel at a third of the
// memory's rate (bench/gpu/run.sh profhyb).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "weft/model/ssd_edges_kernels.h"

namespace weft::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 132 * 16;

__device__ __forceinline__ void load4(const float* p, float (&v)[4]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float (&v)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = __bfloat162float(h[k]);
}
__device__ __forceinline__ void store4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float (&v)[4]) {
  uint2 raw;
  __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __float2bfloat16(v[k]);
  *reinterpret_cast<uint2*>(p) = raw;
}
__device__ __forceinline__ float rounded(float v, const float*) { return v; }
__device__ __forceinline__ float rounded(float v, const __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16(v));
}

// Where the vector v (4 channels) sits in each layout.
struct At {
  int64_t natural, x, head, folded, cs, cs_last, dt;
  int64_t h;
  int pv;
};

__device__ __forceinline__ At locate(int64_t v, const SsdGeometry& d) {
  const int64_t PV = d.P / 4, H = d.G * d.R;
  At a;
  a.pv = static_cast<int>(v % PV);
  const int64_t t = v / PV;
  a.h = t % H;
  const int64_t row = t / H, q = row % d.Q, chunk = row / d.Q;
  const int64_t g = a.h / d.R, r = a.h % d.R, p = a.pv * 4;
  a.natural = (row * H + a.h) * d.P + p;
  a.x = row * d.xs + a.h * d.P + p;
  a.head = ((chunk * H + a.h) * d.Q + q) * d.P + p;
  a.folded = ((chunk * d.G + g) * d.Q + q) * d.R * d.P + r * d.P + p;
  a.cs = (chunk * H + a.h) * d.Q + q;
  a.cs_last = (chunk * H + a.h) * d.Q + d.Q - 1;
  a.dt = row * H + a.h;
  return a;
}

__host__ __device__ __forceinline__ int64_t total_vectors(const SsdGeometry& d) { return d.chunks * d.Q * d.G * d.R * (d.P / 4); }

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)));
}

std::string launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}

template <typename F>
void dispatch_io(Elem io, F&& f) {
  if (io == Elem::kF32) f.template operator()<float>();
  else f.template operator()<__nv_bfloat16>();
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Calls f(locate(v, d)) for every vector v of the geometry, grid-stride.
template <typename F>
__device__ __forceinline__ void for_each_vector(const SsdGeometry& d, F&& f) {
  const int64_t n = total_vectors(d);
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f(locate(v, d));
}

template <typename IO>
__global__ void scale_inputs_kernel(SsdGeometry d, const float* __restrict__ x,
                                    const float* __restrict__ dt, const float* __restrict__ cs,
                                    IO* __restrict__ u, IO* __restrict__ wu) {
  for_each_vector(d, [&](const At& a) {
    float xv[4], uv[4];
    load4(x + a.x, xv);
    const float s = dt[a.dt];
#pragma unroll
    for (int k = 0; k < 4; ++k) uv[k] = rounded(xv[k] * s, u);
    store4(u + a.head, uv);
    if (wu != nullptr) {
      const float te = expf(cs[a.cs_last] - cs[a.cs]);
#pragma unroll
      for (int k = 0; k < 4; ++k) uv[k] *= te;
      store4(wu + a.folded, uv);
    }
  });
}

template <typename IO>
__global__ void combine_outputs_kernel(SsdGeometry d, const IO* __restrict__ y_diag,
                                       const IO* __restrict__ Z, const float* __restrict__ cs,
                                       const float* __restrict__ x, const float* __restrict__ D,
                                       float* __restrict__ y) {
  for_each_vector(d, [&](const At& a) {
    float out[4], t[4];
    load4(y_diag + a.head, t);
    if (Z != nullptr) {
      float z[4];
      load4(Z + a.folded, z);
      const float e = expf(cs[a.cs]);
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = z[k] * e + t[k];
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] = t[k];
    }
    if (D != nullptr) {
      load4(x + a.x, t);
      const float dh = D[a.h];
#pragma unroll
      for (int k = 0; k < 4; ++k) out[k] += t[k] * dh;
    }
    store4(y + a.natural, out);
  });
}

template <typename IO>
__global__ void grad_inputs_kernel(SsdGeometry d, const float* __restrict__ dy,
                                   const float* __restrict__ cs, IO* __restrict__ dyh,
                                   IO* __restrict__ dZ) {
  for_each_vector(d, [&](const At& a) {
    float g[4];
    load4(dy + a.natural, g);
    store4(dyh + a.head, g);
    if (dZ != nullptr) {
      const float e = expf(cs[a.cs]);
#pragma unroll
      for (int k = 0; k < 4; ++k) g[k] *= e;
      store4(dZ + a.folded, g);
    }
  });
}

// Sum over the `width` consecutive lanes of a (row, head), a power of two: a fixed tree.
__device__ __forceinline__ float lanes_sum(float s, int width) {
  for (int o = width / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// The loop runs warp-uniformly (every lane of a warp the same number of rounds) so that the
// shuffles see all 32 lanes; lanes past the end compute zeros and store nothing.
template <typename IO>
__global__ void grad_outputs_kernel(SsdGeometry d, const IO* __restrict__ du,
                                    const IO* __restrict__ dwu, const IO* __restrict__ u,
                                    const float* __restrict__ cs, const float* __restrict__ x,
                                    const float* __restrict__ dt, const float* __restrict__ dy,
                                    const float* __restrict__ D, float* __restrict__ dx,
                                    float* __restrict__ ddt, float* __restrict__ g2,
                                    float* __restrict__ dd) {
  const int64_t n = total_vectors(d);
  const int width = static_cast<int>(d.P / 4);
  const int64_t lane = threadIdx.x % 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x - lane; v0 < n;
       v0 += stride) {
    const int64_t v = v0 + lane;
    const bool live = v < n;
    const At a = locate(live ? v : 0, d);
    float s_dt = 0.f, s_te = 0.f, s_d = 0.f, te = 1.f;
    if (live) {
      float g[4], xv[4];
      load4(du + a.head, g);
      load4(x + a.x, xv);
      if (dwu != nullptr) {
        float w[4], uv[4];
        load4(dwu + a.folded, w);
        load4(u + a.head, uv);
        te = expf(cs[a.cs_last] - cs[a.cs]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          s_te += w[k] * uv[k];
          g[k] += w[k] * te;
        }
      }
      const float s = dt[a.dt];
      float out[4], dyv[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        s_dt += g[k] * xv[k];
        out[k] = g[k] * s;
      }
      if (D != nullptr) {
        load4(dy + a.natural, dyv);
        const float dh = D[a.h];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          out[k] += dyv[k] * dh;
          s_d += dyv[k] * xv[k];
        }
      }
      store4(dx + a.natural, out);
    }
    s_dt = lanes_sum(s_dt, width);
    s_te = lanes_sum(s_te, width);
    s_d = lanes_sum(s_d, width);
    if (live && a.pv == 0) {
      ddt[a.dt] = s_dt;
      if (g2 != nullptr) g2[a.cs] = s_te * te;
      if (dd != nullptr) dd[a.dt] = s_d;
    }
  }
}

}  // namespace

bool ssd_edges_supported_p(int64_t P) {
  const int64_t w = P / 4;
  return P % 4 == 0 && w >= 1 && w <= 32 && (w & (w - 1)) == 0;
}

std::string ssd_scale_inputs(Elem io, const SsdGeometry& d, const float* x, const float* dt,
                             const float* cs, void* u, void* wu, void* stream) {
  const int64_t n = total_vectors(d);
  if (n == 0) return {};
  dispatch_io(io, [&]<typename IO>() {
    scale_inputs_kernel<IO><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(
        d, x, dt, cs, static_cast<IO*>(u), static_cast<IO*>(wu));
  });
  return launched();
}

std::string ssd_combine_outputs(Elem io, const SsdGeometry& d, const void* y_diag, const void* Z,
                                const float* cs, const float* x, const float* D, float* y,
                                void* stream) {
  const int64_t n = total_vectors(d);
  if (n == 0) return {};
  dispatch_io(io, [&]<typename IO>() {
    combine_outputs_kernel<IO><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(
        d, static_cast<const IO*>(y_diag), static_cast<const IO*>(Z), cs, x, D, y);
  });
  return launched();
}

std::string ssd_grad_inputs(Elem io, const SsdGeometry& d, const float* dy, const float* cs,
                            void* dyh, void* dZ, void* stream) {
  const int64_t n = total_vectors(d);
  if (n == 0) return {};
  dispatch_io(io, [&]<typename IO>() {
    grad_inputs_kernel<IO><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(
        d, dy, cs, static_cast<IO*>(dyh), static_cast<IO*>(dZ));
  });
  return launched();
}

std::string ssd_grad_outputs(Elem io, const SsdGeometry& d, const void* du, const void* dwu,
                             const void* u, const float* cs, const float* x, const float* dt,
                             const float* dy, const float* D, float* dx, float* ddt, float* g2,
                             float* dd, void* stream) {
  const int64_t n = total_vectors(d);
  if (n == 0) return {};
  dispatch_io(io, [&]<typename IO>() {
    grad_outputs_kernel<IO><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(
        d, static_cast<const IO*>(du), static_cast<const IO*>(dwu), static_cast<const IO*>(u), cs,
        x, dt, dy, D, dx, ddt, g2, dd);
  });
  return launched();
}

}  // namespace weft::kernels
