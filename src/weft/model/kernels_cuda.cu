// weft's fused CUDA kernels (see kernels.h). Written by hand rather than composed from ATen ops:
// each chain below is one pass over memory instead of five to ten ATen kernels, several of
// them on strided views (the profile of the 0.8B step on an H200 showed 57% of the device time
// in such copies, casts and elementwise kernels, against 33% in matmuls). No PyTorch headers
// here, so this file compiles quickly with nvcc and does not depend on ATen's internals.
//
// Conventions: T is float or __nv_bfloat16; loads convert to float, arithmetic is float, each
// store rounds once (round to nearest even). Grid-stride loops; reductions are fixed-shape
// trees, so every result is bitwise reproducible from run to run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "weft/model/kernels.h"

namespace weft::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 132 * 32;
constexpr int64_t kRmsMaxHidden = 8192;  // float32 dw accumulator in shared memory: 32 KiB
constexpr int64_t kRmsBwdBlocks = 1024;

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
// The value v takes once stored as T.
__device__ __forceinline__ float rounded(float v, const float*) { return v; }
__device__ __forceinline__ float rounded(float v, const __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16(v));
}

// Sum over the block; every thread gets the total. smem: 32 floats.
__device__ float block_sum(float v, float* smem) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the previous call's readers are done with smem
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? smem[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

int64_t grid_for(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

std::string launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}

__device__ __forceinline__ int64_t global_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// --- RMSNorm ------------------------------------------------------------------------------------

template <typename T>
__global__ void rms_fwd_kernel(const T* x, const T* w, T* y, float* rstd, int64_t h, float eps) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * h;
  T* yr = y + row * h;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    const float v = ld(xr + i);
    ss += v * v;
  }
  ss = block_sum(ss, smem);
  const float r = rsqrtf(ss / static_cast<float>(h) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x)
    st(yr + i, rounded(ld(xr + i) * r, xr) * ld(w + i));
}

// One block walks a contiguous range of rows; each thread owns the columns i = tid + k*blockDim
// for all of them, so its weight-gradient accumulators in shared memory are private to it.
template <typename T>
__global__ void rms_bwd_kernel(const T* dy, const T* x, const T* w, const float* rstd, T* dx,
                               float* dw_partial, int64_t rows, int64_t h, int64_t per_block) {
  extern __shared__ float dw[];
  __shared__ float smem[32];
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dw[i] = 0.f;
  const int64_t r0 = blockIdx.x * per_block, r1 = r0 + per_block < rows ? r0 + per_block : rows;
  for (int64_t row = r0; row < r1; ++row) {
    const T* dyr = dy + row * h;
    const T* xr = x + row * h;
    const float r = rstd[row];
    float dot = 0.f;
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dot += ld(dyr + i) * ld(w + i) * (ld(xr + i) * r);
    dot = block_sum(dot, smem) / static_cast<float>(h);
    T* dxr = dx + row * h;
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      const float d = ld(dyr + i), xh = ld(xr + i) * r;
      st(dxr + i, r * (d * ld(w + i) - xh * dot));
      dw[i] += d * rounded(xh, xr);
    }
  }
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dw_partial[blockIdx.x * h + i] = dw[i];
}

// --- SwiGLU -------------------------------------------------------------------------------------

template <typename T>
__global__ void swiglu_fwd_kernel(const T* fc1, T* act, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    const int64_t r = i / f, c = i - r * f;
    const float g = ld(fc1 + r * 2 * f + c), u = ld(fc1 + r * 2 * f + f + c);
    st(act + i, g / (1.f + expf(-g)) * u);
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(const T* dact, const T* fc1, T* dfc1, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    const int64_t r = i / f, c = i - r * f;
    const float g = ld(fc1 + r * 2 * f + c), u = ld(fc1 + r * 2 * f + f + c), d = ld(dact + i);
    const float s = 1.f / (1.f + expf(-g));
    st(dfc1 + r * 2 * f + c, d * u * (s * (1.f + g * (1.f - s))));
    st(dfc1 + r * 2 * f + f + c, d * g * s);
  }
}

// --- rotary embedding of the fused QKV ----------------------------------------------------------

// Work item: (batch, position, group, slot j in [0, r + 2), i in [0, hd / 2)); slot j < r is a
// query head, r the key head, r + 1 the value head. Element i pairs with i + hd/2.
struct Item {
  int64_t b, pos, g, j, i;
};
__device__ __forceinline__ Item item_of(int64_t t, const RopeShape& s) {
  Item it;
  const int64_t half = s.hd / 2;
  it.i = t % half;
  t /= half;
  it.j = t % (s.r + 2);
  t /= s.r + 2;
  it.g = t % s.ng;
  t /= s.ng;
  it.pos = t % s.s;
  it.b = t / s.s;
  return it;
}

template <typename T>
__global__ void rope_fwd_kernel(const T* qkv, const T* cos, const T* sin, T* q, T* k, T* v,
                                RopeShape s) {
  const int64_t half = s.hd / 2, n = s.b * s.s * s.ng * (s.r + 2) * half;
  for (int64_t t = global_index(); t < n; t += grid_stride()) {
    const Item it = item_of(t, s);
    const int64_t tok = it.b * s.s + it.pos;
    const T* src = qkv + ((tok * s.ng + it.g) * (s.r + 2) + it.j) * s.hd;
    const float x1 = ld(src + it.i), x2 = ld(src + it.i + half);
    if (it.j == s.r + 1) {
      T* dst = v + (tok * s.ng + it.g) * s.hd;
      st(dst + it.i, x1);
      st(dst + it.i + half, x2);
      continue;
    }
    const T* c = cos + it.pos * s.hd;
    const T* sn = sin + it.pos * s.hd;
    T* dst = it.j < s.r ? q + ((tok * s.ng + it.g) * s.r + it.j) * s.hd
                        : k + (tok * s.ng + it.g) * s.hd;
    st(dst + it.i, x1 * ld(c + it.i) - x2 * ld(sn + it.i));
    st(dst + it.i + half, x2 * ld(c + it.i + half) + x1 * ld(sn + it.i + half));
  }
}

template <typename T>
__global__ void rope_bwd_kernel(Strided dq, Strided dk, Strided dv, const T* cos, const T* sin,
                                T* dqkv, RopeShape s) {
  const int64_t half = s.hd / 2, n = s.b * s.s * s.ng * (s.r + 2) * half;
  for (int64_t t = global_index(); t < n; t += grid_stride()) {
    const Item it = item_of(t, s);
    const int64_t tok = it.b * s.s + it.pos;
    T* dst = dqkv + ((tok * s.ng + it.g) * (s.r + 2) + it.j) * s.hd;
    const Strided& g = it.j < s.r ? dq : it.j == s.r ? dk : dv;
    const int64_t head = it.j < s.r ? it.g * s.r + it.j : it.g;
    const T* src = static_cast<const T*>(g.data) + it.b * g.sb + it.pos * g.ss + head * g.sh;
    const float d1 = ld(src + it.i), d2 = ld(src + it.i + half);
    if (it.j == s.r + 1) {
      st(dst + it.i, d1);
      st(dst + it.i + half, d2);
      continue;
    }
    const T* c = cos + it.pos * s.hd;
    const T* sn = sin + it.pos * s.hd;
    st(dst + it.i, d1 * ld(c + it.i) + d2 * ld(sn + it.i + half));
    st(dst + it.i + half, d2 * ld(c + it.i + half) - d1 * ld(sn + it.i));
  }
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

int64_t rms_norm_blocks(int64_t rows) { return std::max<int64_t>(1, std::min(rows, kRmsBwdBlocks)); }
int64_t rms_norm_max_hidden() { return kRmsMaxHidden; }

std::string rms_norm_forward(Elem t, const void* x, const void* w, void* y, float* rstd,
                             int64_t rows, int64_t h, float eps, void* stream) {
  if (rows == 0) return {};
  const dim3 grid(static_cast<unsigned>(rows));
  if (t == Elem::kF32)
    rms_fwd_kernel<float><<<grid, kThreads, 0, as_stream(stream)>>>(
        static_cast<const float*>(x), static_cast<const float*>(w), static_cast<float*>(y), rstd, h, eps);
  else
    rms_fwd_kernel<__nv_bfloat16><<<grid, kThreads, 0, as_stream(stream)>>>(
        static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w),
        static_cast<__nv_bfloat16*>(y), rstd, h, eps);
  return launched();
}

std::string rms_norm_backward(Elem t, const void* dy, const void* x, const void* w,
                              const float* rstd, void* dx, float* dw_partial, int64_t rows,
                              int64_t h, void* stream) {
  if (h > kRmsMaxHidden) return "rms_norm_backward: hidden size above the kernel's limit";
  if (rows == 0) return {};
  const int64_t blocks = rms_norm_blocks(rows), per_block = (rows + blocks - 1) / blocks;
  const size_t smem = static_cast<size_t>(h) * sizeof(float);
  if (t == Elem::kF32)
    rms_bwd_kernel<float><<<static_cast<unsigned>(blocks), kThreads, smem, as_stream(stream)>>>(
        static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<const float*>(w),
        rstd, static_cast<float*>(dx), dw_partial, rows, h, per_block);
  else
    rms_bwd_kernel<__nv_bfloat16><<<static_cast<unsigned>(blocks), kThreads, smem, as_stream(stream)>>>(
        static_cast<const __nv_bfloat16*>(dy), static_cast<const __nv_bfloat16*>(x),
        static_cast<const __nv_bfloat16*>(w), rstd, static_cast<__nv_bfloat16*>(dx), dw_partial,
        rows, h, per_block);
  return launched();
}

std::string swiglu_forward(Elem t, const void* fc1, void* act, int64_t rows, int64_t f,
                           void* stream) {
  const unsigned grid = static_cast<unsigned>(grid_for(rows * f));
  if (t == Elem::kF32)
    swiglu_fwd_kernel<float><<<grid, kThreads, 0, as_stream(stream)>>>(
        static_cast<const float*>(fc1), static_cast<float*>(act), rows, f);
  else
    swiglu_fwd_kernel<__nv_bfloat16><<<grid, kThreads, 0, as_stream(stream)>>>(
        static_cast<const __nv_bfloat16*>(fc1), static_cast<__nv_bfloat16*>(act), rows, f);
  return launched();
}

std::string swiglu_backward(Elem t, const void* dact, const void* fc1, void* dfc1, int64_t rows,
                            int64_t f, void* stream) {
  const unsigned grid = static_cast<unsigned>(grid_for(rows * f));
  if (t == Elem::kF32)
    swiglu_bwd_kernel<float><<<grid, kThreads, 0, as_stream(stream)>>>(
        static_cast<const float*>(dact), static_cast<const float*>(fc1), static_cast<float*>(dfc1), rows, f);
  else
    swiglu_bwd_kernel<__nv_bfloat16><<<grid, kThreads, 0, as_stream(stream)>>>(
        static_cast<const __nv_bfloat16*>(dact), static_cast<const __nv_bfloat16*>(fc1),
        static_cast<__nv_bfloat16*>(dfc1), rows, f);
  return launched();
}

std::string rope_qkv_forward(Elem t, const void* qkv, const void* cos, const void* sin, void* q,
                             void* k, void* v, RopeShape s, void* stream) {
  const unsigned grid = static_cast<unsigned>(grid_for(s.b * s.s * s.ng * (s.r + 2) * (s.hd / 2)));
  if (t == Elem::kF32)
    rope_fwd_kernel<float><<<grid, kThreads, 0, as_stream(stream)>>>(
        static_cast<const float*>(qkv), static_cast<const float*>(cos),
        static_cast<const float*>(sin), static_cast<float*>(q), static_cast<float*>(k),
        static_cast<float*>(v), s);
  else
    rope_fwd_kernel<__nv_bfloat16><<<grid, kThreads, 0, as_stream(stream)>>>(
        static_cast<const __nv_bfloat16*>(qkv), static_cast<const __nv_bfloat16*>(cos),
        static_cast<const __nv_bfloat16*>(sin), static_cast<__nv_bfloat16*>(q),
        static_cast<__nv_bfloat16*>(k), static_cast<__nv_bfloat16*>(v), s);
  return launched();
}

std::string rope_qkv_backward(Elem t, Strided dq, Strided dk, Strided dv, const void* cos,
                              const void* sin, void* dqkv, RopeShape s, void* stream) {
  const unsigned grid = static_cast<unsigned>(grid_for(s.b * s.s * s.ng * (s.r + 2) * (s.hd / 2)));
  if (t == Elem::kF32)
    rope_bwd_kernel<float><<<grid, kThreads, 0, as_stream(stream)>>>(
        dq, dk, dv, static_cast<const float*>(cos), static_cast<const float*>(sin),
        static_cast<float*>(dqkv), s);
  else
    rope_bwd_kernel<__nv_bfloat16><<<grid, kThreads, 0, as_stream(stream)>>>(
        dq, dk, dv, static_cast<const __nv_bfloat16*>(cos), static_cast<const __nv_bfloat16*>(sin),
        static_cast<__nv_bfloat16*>(dqkv), s);
  return launched();
}

}  // namespace weft::kernels
