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
#include <cmath>

#include "weft/model/kernels.h"

namespace weft::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 132 * 32;
constexpr int64_t kRmsMaxHidden = 8192;  // rms_bwd_kernel: at most 8 vectors x 1024 threads
constexpr int64_t kGatedNormBwdBlocks = 1024;

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

// At most 32 blocks per SM of the H200, striding over the range. One thread per item (ceil(n /
// kThreads) blocks, as the AdamW kernel launches) made SwiGLU, the rotary kernels and the
// cross-entropy backward 16-34% slower at 0.8B on the H200, where the untouched memory-bound
// kernels moved 0-5% between the two machines (docs/performance.md).
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

// Vectors of N elements moved with one 16-byte (or, for N = 1, one scalar) access. The host
// picks N from the shapes alone (16 bytes when every row, half head and stride divides evenly,
// else 1) and makes sure the pointers are 16-byte aligned, so the arithmetic order, and so the
// rounding, depends only on the shapes (invariant 3).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ void vload(const T* p, float (&out)[N]) {
  const Vec<T, N> raw = *reinterpret_cast<const Vec<T, N>*>(p);
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = ld(&raw.v[k]);
}

template <typename T, int N>
__device__ __forceinline__ void vstore(T* p, const float (&in)[N]) {
  Vec<T, N> raw;
#pragma unroll
  for (int k = 0; k < N; ++k) st(&raw.v[k], in[k]);
  *reinterpret_cast<Vec<T, N>*>(p) = raw;
}

// --- RMSNorm ------------------------------------------------------------------------------------

// Row values of the forward: x, or with a residual `res` the sum s = round(x + res), which the
// kernel also stores into `sum`.
template <typename T, int N>
__device__ __forceinline__ void rms_fwd_load(const T* xr, const T* rr, int64_t c, float (&v)[N]) {
  vload<T, N>(xr + c, v);
  if (rr == nullptr) return;
  float a[N];
  vload<T, N>(rr + c, a);
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = rounded(v[k] + a[k], xr);
}

template <typename T, int N>
__global__ void rms_fwd_kernel(const T* x, const T* res, const T* w, T* sum, T* y, float* rstd,
                               int64_t h, float eps) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * h;
  const T* rr = res == nullptr ? nullptr : res + row * h;
  T* yr = y + row * h;
  float ss = 0.f;
  for (int64_t c = threadIdx.x * N; c < h; c += blockDim.x * N) {
    float v[N];
    rms_fwd_load<T, N>(xr, rr, c, v);
    if (rr != nullptr) vstore<T, N>(sum + row * h + c, v);
#pragma unroll
    for (int k = 0; k < N; ++k) ss += v[k] * v[k];
  }
  ss = block_sum(ss, smem);
  const float r = rsqrtf(ss / static_cast<float>(h) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t c = threadIdx.x * N; c < h; c += blockDim.x * N) {
    float v[N], wv[N], o[N];
    rms_fwd_load<T, N>(xr, rr, c, v);
    vload<T, N>(w + c, wv);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = rounded(v[k] * r, xr) * wv[k];
    vstore<T, N>(yr + c, o);
  }
}

// One block walks a contiguous range of rows; each thread owns the same V vectors of columns in
// every row, so its weight columns and weight-gradient sums stay in registers, and the next
// row's dy, x and rstd are loaded while the current row's dot product is reduced, so that loads
// stay in flight across the block-wide reduction and no row starts with a dependent load.
template <typename T, int N, int V>
__global__ void __launch_bounds__(1024)
    rms_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                   const float* __restrict__ rstd, const T* __restrict__ dres, T* __restrict__ dx,
                   float* __restrict__ dw_partial, int64_t rows, int64_t h, int64_t per_block) {
  using Raw = Vec<T, N>;  // rows stay in their storage type between the loads and their use
  __shared__ float smem[32];
  int64_t col[V];
  bool on[V];
  float acc[V][N];
  Raw d[V], xv[V], nd[V], nx[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    col[v] = (static_cast<int64_t>(v) * blockDim.x + threadIdx.x) * N;
    on[v] = col[v] < h;
#pragma unroll
    for (int k = 0; k < N; ++k) acc[v][k] = 0.f;
  }
  const int64_t r0 = blockIdx.x * per_block, r1 = r0 + per_block < rows ? r0 + per_block : rows;
  auto load = [&](int64_t row, Raw (&dd)[V], Raw (&xx)[V]) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (!on[v]) continue;
      dd[v] = *reinterpret_cast<const Raw*>(dy + row * h + col[v]);
      xx[v] = *reinterpret_cast<const Raw*>(x + row * h + col[v]);
    }
  };
  Raw wr[V];  // the weight's columns of this thread, loaded once
#pragma unroll
  for (int v = 0; v < V; ++v)
    if (on[v]) wr[v] = *reinterpret_cast<const Raw*>(w + col[v]);
  float r = 0.f, next_r = 0.f;  // rstd of the row, and of the next (prefetched with its data)
  if (r0 < r1) {
    load(r0, d, xv);
    r = rstd[r0];
  }
  for (int64_t row = r0; row < r1; ++row) {
    if (row + 1 < r1) {
      load(row + 1, nd, nx);
      next_r = rstd[row + 1];
    }
    float dot = 0.f;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (!on[v]) continue;
#pragma unroll
      for (int k = 0; k < N; ++k) dot += ld(&d[v].v[k]) * ld(&wr[v].v[k]) * (ld(&xv[v].v[k]) * r);
    }
    dot = block_sum(dot, smem) / static_cast<float>(h);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (!on[v]) continue;
      float o[N];
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float dk = ld(&d[v].v[k]), xh = ld(&xv[v].v[k]) * r;
        o[k] = r * (dk * ld(&wr[v].v[k]) - xh * dot);
        acc[v][k] += dk * rounded(xh, x);
      }
      if (dres != nullptr) {  // the gradient reaching x by the residual path, added as autograd
        float a[N];           // would: to the rounded norm gradient, rounded once more
        vload<T, N>(dres + row * h + col[v], a);
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = rounded(o[k], x) + a[k];
      }
      vstore<T, N>(dx + row * h + col[v], o);
    }
#pragma unroll
    for (int v = 0; v < V; ++v) {
      d[v] = nd[v];
      xv[v] = nx[v];
    }
    r = next_r;
  }
#pragma unroll
  for (int v = 0; v < V; ++v) {
    if (!on[v]) continue;
#pragma unroll
    for (int k = 0; k < N; ++k) dw_partial[blockIdx.x * h + col[v] + k] = acc[v][k];
  }
}

// --- SwiGLU -------------------------------------------------------------------------------------

// One vector per thread and round of the grid-stride loop. Two or four vectors per round
// (i, i + stride, ...), loaded before any is computed, were slower on the H200 at 0.8B: forward
// 86.2 and 134.4 us against 68.6 with one, backward 131.1 and 279.0 against 110.7
// (docs/performance.md); one vector per thread with a grid over the whole tensor was slower
// still (grid_for).
// Vector i (N elements) of act [rows, f]: its row r and column c, and the gate and up vectors
// of fc1 [rows, 2f] it is computed from. The division runs in the index type I: uint32_t
// wherever the vectors fit it (a 64-bit division is a long software sequence per vector).
template <typename I, typename T, int N>
__device__ __forceinline__ void swiglu_load(const T* __restrict__ fc1, int64_t f, int64_t i,
                                            int64_t& r, int64_t& c, float (&g)[N],
                                            float (&u)[N]) {
  const I fv = static_cast<I>(f / N), ii = static_cast<I>(i), q = ii / fv;
  r = static_cast<int64_t>(q);
  c = static_cast<int64_t>(ii - q * fv) * N;
  vload<T, N>(fc1 + r * 2 * f + c, g);
  vload<T, N>(fc1 + r * 2 * f + f + c, u);
}

template <typename I, typename T, int N>
__global__ void swiglu_fwd_kernel(const T* __restrict__ fc1, T* __restrict__ act, int64_t rows,
                                  int64_t f) {
  const int64_t n = rows * (f / N);
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    float g[N], u[N], o[N];
    int64_t row, c;
    swiglu_load<I, T, N>(fc1, f, i, row, c, g, u);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = g[k] / (1.f + expf(-g[k])) * u[k];
    vstore<T, N>(act + row * f + c, o);
  }
}

template <typename I, typename T, int N>
__global__ void swiglu_bwd_kernel(const T* __restrict__ dact, const T* __restrict__ fc1,
                                  T* __restrict__ dfc1, int64_t rows, int64_t f) {
  const int64_t n = rows * (f / N);
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    float g[N], u[N], d[N], dg[N], du[N];
    int64_t row, c;
    swiglu_load<I, T, N>(fc1, f, i, row, c, g, u);
    vload<T, N>(dact + row * f + c, d);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float s = 1.f / (1.f + expf(-g[k]));
      dg[k] = d[k] * u[k] * (s * (1.f + g[k] * (1.f - s)));
      du[k] = d[k] * g[k] * s;
    }
    vstore<T, N>(dfc1 + row * 2 * f + c, dg);
    vstore<T, N>(dfc1 + row * 2 * f + f + c, du);
  }
}

// --- cross-entropy ------------------------------------------------------------------------------

constexpr int kCeThreads = 512;
constexpr int64_t kIgnoreIndex = -100;

// Merges a (max, sum of exp(x - max)) pair into another; an empty pair has s == 0. Symmetric,
// so both partners of a butterfly shuffle get the same bits.
__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
  if (s2 == 0.f) return;
  if (s == 0.f) {
    m = m2;
    s = s2;
    return;
  }
  const float mx = fmaxf(m, m2);
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

__device__ void block_max_sum(float& m, float& s, float* sm, float* ss) {
  for (int o = 16; o > 0; o >>= 1)
    ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (lane < static_cast<int>(blockDim.x / 32)) {
    m = sm[lane];
    s = ss[lane];
  } else {
    m = -INFINITY;
    s = 0.f;
  }
  for (int o = 16; o > 0; o >>= 1)
    ms_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// Each thread loads kCeUnroll vectors of its row before it reduces them (one 16-byte load in
// flight per thread left the kernel at 1.7 TB/s at vocabulary 32000), then merges the chunk's
// (max, sum) into its own: one exp per element and two per chunk. The order depends only on v.
constexpr int kCeUnroll = 4;

template <typename T, int N>
__global__ void ce_fwd_kernel(const T* logits, const int64_t* labels, float* loss, float* lse,
                              int64_t v) {
  __shared__ float sm[32], ss[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * v;
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  float m = -INFINITY, s = 0.f;
  for (int64_t c0 = threadIdx.x * N; c0 < v; c0 += kCeUnroll * step) {
    float e[kCeUnroll][N];
#pragma unroll
    for (int u = 0; u < kCeUnroll; ++u) {
      if (c0 + u * step < v) {
        vload<T, N>(x + c0 + u * step, e[u]);
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) e[u][k] = -INFINITY;
      }
    }
    float cm = -INFINITY;
#pragma unroll
    for (int u = 0; u < kCeUnroll; ++u)
#pragma unroll
      for (int k = 0; k < N; ++k) cm = fmaxf(cm, e[u][k]);
    if (cm == -INFINITY) continue;  // nothing but -inf (or padding): an empty pair
    float cs = 0.f;
#pragma unroll
    for (int u = 0; u < kCeUnroll; ++u)
#pragma unroll
      for (int k = 0; k < N; ++k) cs += expf(e[u][k] - cm);
    ms_merge(m, s, cm, cs);
  }
  block_max_sum(m, s, sm, ss);
  if (threadIdx.x == 0) {
    const float l = m + logf(s);
    lse[row] = l;
    const int64_t y = labels[row];
    loss[row] = y == kIgnoreIndex ? 0.f : (y >= 0 && y < v ? l - ld(x + y) : NAN);
  }
}

// The row division in the index type I (uint32_t where the vectors fit it).
template <typename I, typename T, int N>
__global__ void ce_bwd_kernel(const T* logits, const int64_t* labels, const float* lse,
                              const float* g, T* dlogits, int64_t rows, int64_t v) {
  const int64_t vv = v / N, n = rows * vv;
  const float scale = *g;
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    const I q = static_cast<I>(i) / static_cast<I>(vv);
    const int64_t r = static_cast<int64_t>(q), c = (i - r * vv) * N;
    const int64_t y = labels[r];
    float e[N], o[N];
    vload<T, N>(logits + r * v + c, e);
    const float l = lse[r];
#pragma unroll
    for (int k = 0; k < N; ++k)
      o[k] = y == kIgnoreIndex ? 0.f : scale * (expf(e[k] - l) - (c + k == y ? 1.f : 0.f));
    vstore<T, N>(dlogits + r * v + c, o);
  }
}

// --- rotary embedding of the fused QKV ----------------------------------------------------------

// Flat index idx of the rope kernels' (token, vector) loop -> token tok = bi * S + pos, the
// vector's first element i within the half head, the head slot `head` of the token (group g,
// slot j of r + 2). Divisions in the index type I (uint32_t where the loop fits it: a 64-bit
// division is a long software sequence) and unsigned 32-bit for the small ones.
template <typename I, int N>
__device__ __forceinline__ void rope_index(int64_t idx, int per_tok, int64_t S, int hv, int slots,
                                           int64_t& tok, int64_t& bi, int64_t& pos, int& i,
                                           int& head, int& j, int& g) {
  const I ii = static_cast<I>(idx), tk = ii / static_cast<I>(per_tok), b = tk / static_cast<I>(S);
  tok = static_cast<int64_t>(tk);
  bi = static_cast<int64_t>(b);
  pos = tok - bi * S;
  const unsigned t = static_cast<unsigned>(ii - tk * static_cast<I>(per_tok));
  const unsigned uh = static_cast<unsigned>(hv), us = static_cast<unsigned>(slots);
  const unsigned hd = t / uh, gg = hd / us;
  i = static_cast<int>((t - hd * uh) * N);
  head = static_cast<int>(hd);
  j = static_cast<int>(hd - gg * us);
  g = static_cast<int>(gg);
}

// The cos and sin entries of both halves of one vector, from element `at` of the tables.
template <typename T, int N>
__device__ __forceinline__ void rope_load_tables(const T* cos, const T* sin, int64_t at, int half,
                                                 float (&c1)[N], float (&c2)[N], float (&s1)[N],
                                                 float (&s2)[N]) {
  vload<T, N>(cos + at, c1);
  vload<T, N>(cos + at + half, c2);
  vload<T, N>(sin + at, s1);
  vload<T, N>(sin + at + half, s2);
}

// Threads walk (token, t) pairs in one flat grid-stride loop, so every thread has work whatever
// the number of heads per token: t takes head slot t / hv (group g, slot j: j < r a query head,
// r the key head, r + 1 the value head) and the N elements from i = (t % hv) * N of both halves
// of the head (element i pairs with i + hd/2).
template <typename I, typename T, int N>
__global__ void rope_fwd_kernel(const T* qkv, const T* cos, const T* sin, T* q, T* k, T* v,
                                RopeShape s) {
  const int half = static_cast<int>(s.hd / 2), hv = half / N, slots = static_cast<int>(s.r + 2);
  const int per_tok = static_cast<int>(s.ng) * slots * hv;
  const int64_t n = s.b * s.s * per_tok;
  for (int64_t idx = global_index(); idx < n; idx += grid_stride()) {
    int64_t tok, bi, pos;
    int i, head, j, g;
    rope_index<I, N>(idx, per_tok, s.s, hv, slots, tok, bi, pos, i, head, j, g);
    const T* src = qkv + (tok * s.ng * slots + head) * s.hd;
    float x1[N], x2[N];
    vload<T, N>(src + i, x1);
    vload<T, N>(src + i + half, x2);
    if (j == slots - 1) {
      T* dst = v + (tok * s.ng + g) * s.hd;
      vstore<T, N>(dst + i, x1);
      vstore<T, N>(dst + i + half, x2);
      continue;
    }
    float c1[N], c2[N], s1[N], s2[N], o1[N], o2[N];
    rope_load_tables<T, N>(cos, sin, pos * s.hd + i, half, c1, c2, s1, s2);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      o1[e] = x1[e] * c1[e] - x2[e] * s1[e];
      o2[e] = x2[e] * c2[e] + x1[e] * s2[e];
    }
    T* dst = j < s.r ? q + ((tok * s.ng + g) * s.r + j) * s.hd : k + (tok * s.ng + g) * s.hd;
    vstore<T, N>(dst + i, o1);
    vstore<T, N>(dst + i + half, o2);
  }
}

template <typename I, typename T, int N>
__global__ void rope_bwd_kernel(Strided dq, Strided dk, Strided dv, const T* cos, const T* sin,
                                T* dqkv, RopeShape s) {
  const int half = static_cast<int>(s.hd / 2), hv = half / N, slots = static_cast<int>(s.r + 2);
  const int per_tok = static_cast<int>(s.ng) * slots * hv;
  const int64_t n = s.b * s.s * per_tok;
  for (int64_t idx = global_index(); idx < n; idx += grid_stride()) {
    int64_t tok, bi, pos;
    int i, head, j, g;
    rope_index<I, N>(idx, per_tok, s.s, hv, slots, tok, bi, pos, i, head, j, g);
    T* dst = dqkv + (tok * s.ng * slots + head) * s.hd;
    const Strided& gr = j < s.r ? dq : j == s.r ? dk : dv;
    const int64_t h = j < s.r ? g * s.r + j : g;
    const T* src = static_cast<const T*>(gr.data) + bi * gr.sb + pos * gr.ss + h * gr.sh;
    float d1[N], d2[N];
    vload<T, N>(src + i, d1);
    vload<T, N>(src + i + half, d2);
    if (j == slots - 1) {
      vstore<T, N>(dst + i, d1);
      vstore<T, N>(dst + i + half, d2);
      continue;
    }
    float c1[N], c2[N], s1[N], s2[N], o1[N], o2[N];
    rope_load_tables<T, N>(cos, sin, pos * s.hd + i, half, c1, c2, s1, s2);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      o1[e] = d1[e] * c1[e] + d2[e] * s2[e];
      o2[e] = d2[e] * c2[e] - d1[e] * s1[e];
    }
    vstore<T, N>(dst + i, o1);
    vstore<T, N>(dst + i + half, o2);
  }
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// --- Mamba-2 gated RMSNorm ------------------------------------------------------------------------
// Per row and group of gs = di / ng channels: g = y * silu(z), out = g * rstd * w with
// rstd = 1 / sqrt(mean(g^2) + eps). y and w float32, z and out in T; z rows have stride zs.
// One block per row, a warp per group (groups taken in turn by the block's warps), lanes over
// the group's channels, a fixed shuffle tree for the sums.

__device__ __forceinline__ float sigmoidf_(float v) { return 1.f / (1.f + expf(-v)); }

template <typename T>
__global__ void gated_norm_fwd_kernel(const float* y, const T* z, int64_t zs, const float* w,
                                      T* out, float* rstd, int64_t ng, int64_t gs, float eps) {
  const int64_t row = blockIdx.x, di = ng * gs;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const float* yr = y + row * di;
  const T* zr = z + row * zs;
  for (int64_t grp = warp; grp < ng; grp += warps) {
    const int64_t c0 = grp * gs;
    float ss = 0.f;
    for (int64_t c = c0 + lane; c < c0 + gs; c += 32) {
      const float zv = ld(zr + c), g = yr[c] * (zv * sigmoidf_(zv));
      ss += g * g;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / static_cast<float>(gs) + eps);
    if (lane == 0) rstd[row * ng + grp] = r;
    for (int64_t c = c0 + lane; c < c0 + gs; c += 32) {
      const float zv = ld(zr + c), g = yr[c] * (zv * sigmoidf_(zv));
      st(out + row * di + c, g * r * w[c]);
    }
  }
}

// Gradients: dy (float32) and dz (T) per row, and per block of rows the partial weight gradient
// sum(dout * g * rstd) into dw_partial [blocks, di] (each column owned by one thread of the
// block: shared-memory accumulators, no atomics), summed over blocks by the caller.
template <typename T>
__global__ void gated_norm_bwd_kernel(const T* dout, const float* y, const T* z, int64_t zs,
                                      const float* w, const float* rstd, float* dy, T* dz,
                                      float* dw_partial, int64_t rows, int64_t ng, int64_t gs,
                                      int64_t per_block) {
  extern __shared__ float dw[];
  const int64_t di = ng * gs;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t c = threadIdx.x; c < di; c += blockDim.x) dw[c] = 0.f;
  __syncthreads();
  const int64_t first = blockIdx.x * per_block, last = min(rows, first + per_block);
  for (int64_t row = first; row < last; ++row) {
    const float* yr = y + row * di;
    const T* zr = z + row * zs;
    const T* dr = dout + row * di;
    for (int64_t grp = warp; grp < ng; grp += warps) {
      const int64_t c0 = grp * gs;
      const float r = rstd[row * ng + grp];
      float dot = 0.f;  // sum of (dout * w) * xhat over the group
      for (int64_t c = c0 + lane; c < c0 + gs; c += 32) {
        const float zv = ld(zr + c), g = yr[c] * (zv * sigmoidf_(zv));
        dot += ld(dr + c) * w[c] * (g * r);
      }
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      const float mean = dot / static_cast<float>(gs);
      for (int64_t c = c0 + lane; c < c0 + gs; c += 32) {
        const float zv = ld(zr + c), s = sigmoidf_(zv), yv = yr[c], g = yv * (zv * s);
        const float xhat = g * r, d = ld(dr + c);
        const float dg = r * (d * w[c] - xhat * mean);
        dy[row * di + c] = dg * (zv * s);
        st(dz + row * di + c, dg * yv * s * (1.f + zv * (1.f - s)));
        dw[c] += d * xhat;
      }
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < di; c += blockDim.x) dw_partial[blockIdx.x * di + c] = dw[c];
}

// --- Mamba-2 depthwise causal conv + SiLU -------------------------------------------------------
// out[b, t, c] = silu(bias[c] + sum_j x[b, t - K + 1 + j, c] w[c, j]) (x = 0 before the start),
// x in T with rows xs elements apart (b * S + t indexes rows), everything else float32.
// One thread per channel walks a tile of kConvTile rows of one sequence, the K taps and the
// sliding window of inputs in registers (K is a template parameter, so nothing spills), loading
// kConvAhead rows at a time so that their loads are in flight together; no integer division per
// element. A warp reads 32 consecutive channels of a row.
constexpr int kConvMaxK = 8;
constexpr int64_t kConvTile = 64;  // rows per block
constexpr int kConvAhead = 8;      // rows loaded before any is used

__device__ __forceinline__ float silu_grad(float pre) {
  const float s = sigmoidf_(pre);
  return s * (1.f + pre * (1.f - s));
}

template <typename T, int K>
__global__ void conv_silu_fwd_kernel(const T* __restrict__ x, int64_t xs,
                                     const float* __restrict__ w, const float* __restrict__ bias,
                                     float* __restrict__ out, int64_t S, int64_t C, int64_t tiles) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t bi = blockIdx.x / tiles, t0 = (blockIdx.x % tiles) * kConvTile;
  const int64_t t1 = min(S, t0 + kConvTile), row0 = bi * S;
  float wk[K], win[K];  // win[j] = x[t - K + 1 + j] for the row t being computed
#pragma unroll
  for (int j = 0; j < K; ++j) {
    wk[j] = w[c * K + j];
    const int64_t tt = t0 - K + 1 + j;
    win[j] = j < K - 1 && tt >= 0 ? ld(x + (row0 + tt) * xs + c) : 0.f;
  }
  const float bc = bias[c];
  for (int64_t tb = t0; tb < t1; tb += kConvAhead) {
    float xv[kConvAhead];
#pragma unroll
    for (int u = 0; u < kConvAhead; ++u)
      xv[u] = tb + u < t1 ? ld(x + (row0 + tb + u) * xs + c) : 0.f;
#pragma unroll
    for (int u = 0; u < kConvAhead; ++u) {
      win[K - 1] = xv[u];
      float pre = bc;
#pragma unroll
      for (int j = 0; j < K; ++j) pre += wk[j] * win[j];
      if (tb + u < t1) out[(row0 + tb + u) * C + c] = pre * sigmoidf_(pre);
#pragma unroll
      for (int j = 0; j + 1 < K; ++j) win[j] = win[j + 1];
    }
  }
}

// The backward walks the tile forwards and K - 1 rows past it (their dpre, 0 past the end):
// at row t it has dpre[t - K + 1 .. t], emits dx[t - K + 1] = sum_j w[j] dpre[t - j], and for
// t inside the tile adds the per-tile partials dw[c, j] += dpre[t] x[t - K + 1 + j] and
// dbias[c] += dpre[t], summed over tiles by the caller.
template <typename T, int K>
__global__ void conv_silu_bwd_kernel(const float* __restrict__ dout, const T* __restrict__ x,
                                     int64_t xs, const float* __restrict__ w,
                                     const float* __restrict__ bias, T* __restrict__ dx,
                                     float* __restrict__ dw_partial,
                                     float* __restrict__ db_partial, int64_t S, int64_t C,
                                     int64_t tiles) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t bi = blockIdx.x / tiles, t0 = (blockIdx.x % tiles) * kConvTile;
  const int64_t t1 = min(S, t0 + kConvTile), row0 = bi * S, tend = t1 + K - 1;
  float wk[K], win[K], dq[K], dw[K];  // dq[j] = dpre[t - K + 1 + j]
#pragma unroll
  for (int j = 0; j < K; ++j) {
    wk[j] = w[c * K + j];
    const int64_t tt = t0 - K + 1 + j;
    win[j] = j < K - 1 && tt >= 0 ? ld(x + (row0 + tt) * xs + c) : 0.f;
    dq[j] = 0.f;
    dw[j] = 0.f;
  }
  const float bc = bias[c];
  float db = 0.f;
  for (int64_t tb = t0; tb < tend; tb += kConvAhead) {
    float xv[kConvAhead], dv[kConvAhead];
#pragma unroll
    for (int u = 0; u < kConvAhead; ++u) {
      const int64_t t = tb + u;
      const bool in = t < tend && t < S;
      xv[u] = in ? ld(x + (row0 + t) * xs + c) : 0.f;
      dv[u] = in ? dout[(row0 + t) * C + c] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kConvAhead; ++u) {
      const int64_t t = tb + u;
      win[K - 1] = xv[u];
      float pre = bc;
#pragma unroll
      for (int j = 0; j < K; ++j) pre += wk[j] * win[j];
      const float d = dv[u] * silu_grad(pre);  // 0 past the end: dout loaded as 0
      dq[K - 1] = d;
      if (t < t1) {
#pragma unroll
        for (int j = 0; j < K; ++j) dw[j] += d * win[j];
        db += d;
      }
      if (t >= t0 + K - 1 && t < tend) {
        float g = 0.f;
#pragma unroll
        for (int j = 0; j < K; ++j) g += wk[j] * dq[K - 1 - j];
        st(dx + (row0 + t - K + 1) * C + c, g);
      }
#pragma unroll
      for (int j = 0; j + 1 < K; ++j) win[j] = win[j + 1], dq[j] = dq[j + 1];
    }
  }
#pragma unroll
  for (int j = 0; j < K; ++j) dw_partial[(blockIdx.x * C + c) * K + j] = dw[j];
  db_partial[blockIdx.x * C + c] = db;
}

// --- SSD: the decay-weighted C.B block of a chunk -------------------------------------------------
// out[m, i, j] = cb[m / R, i, j] * exp(cs[m, i] - cs[m, j]) for j <= i, else 0; m runs over the
// (batch, chunk, group, head) blocks of Q x Q, R heads share one cb block. One thread per N
// consecutive j of a row.

template <typename T, int N>
__global__ void ssd_decay_fwd_kernel(const T* cb, const float* cs, T* out, int64_t M, int64_t R,
                                     int64_t Q) {
  const int64_t per_row = Q / N, total = M * Q * per_row;
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    const int64_t j0 = (idx % per_row) * N, i = (idx / per_row) % Q, m = idx / (per_row * Q);
    const float* c = cs + m * Q;
    float o[N];
    if (j0 > i) {
#pragma unroll
      for (int k = 0; k < N; ++k) o[k] = 0.f;
    } else {
      const float ci = c[i];
      float v[N];
      vload<T, N>(cb + ((m / R) * Q + i) * Q + j0, v);
#pragma unroll
      for (int k = 0; k < N; ++k) o[k] = j0 + k <= i ? v[k] * expf(ci - c[j0 + k]) : 0.f;
    }
    vstore<T, N>(out + (m * Q + i) * Q + j0, o);
  }
}

// dcb[g, i, j] = sum over the group's R heads r (in order) of dout[gR + r, i, j] * decay.
template <typename T, int N>
__global__ void ssd_decay_bwd_cb_kernel(const T* dout, const float* cs, T* dcb, int64_t G,
                                        int64_t R, int64_t Q) {
  const int64_t per_row = Q / N, total = G * Q * per_row;
  for (int64_t idx = global_index(); idx < total; idx += grid_stride()) {
    const int64_t j0 = (idx % per_row) * N, i = (idx / per_row) % Q, g = idx / (per_row * Q);
    float acc[N];
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = 0.f;
    if (j0 <= i) {
      for (int64_t r = 0; r < R; ++r) {
        const int64_t m = g * R + r;
        const float* c = cs + m * Q;
        const float ci = c[i];
        float d[N];
        vload<T, N>(dout + (m * Q + i) * Q + j0, d);
#pragma unroll
        for (int k = 0; k < N; ++k)
          if (j0 + k <= i) acc[k] += d[k] * expf(ci - c[j0 + k]);
      }
    }
    vstore<T, N>(dcb + (g * Q + i) * Q + j0, acc);
  }
}

// dcs[m, i] = sum_j p[i, j] - sum_k p[k, i] with p = dout * cb * decay on the causal entries.
// One block per m: warps take rows (lanes over j, then a fixed shuffle tree), threads take
// columns (a loop over rows), so every sum has a fixed order.
template <typename T>
__global__ void ssd_decay_bwd_cs_kernel(const T* dout, const T* cb, const float* cs, float* dcs,
                                        int64_t R, int64_t Q) {
  extern __shared__ float sh[];  // cs row [Q], row sums [Q]
  float* c = sh;
  float* rows = sh + Q;
  const int64_t m = blockIdx.x;
  const T* d = dout + m * Q * Q;
  const T* b = cb + (m / R) * Q * Q;
  for (int64_t i = threadIdx.x; i < Q; i += blockDim.x) c[i] = cs[m * Q + i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t i = warp; i < Q; i += warps) {
    float v = 0.f;
    for (int64_t j = lane; j <= i; j += 32) v += ld(d + i * Q + j) * ld(b + i * Q + j) * expf(c[i] - c[j]);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) rows[i] = v;
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < Q; j += blockDim.x) {
    float v = 0.f;
    for (int64_t i = j; i < Q; ++i) v += ld(d + i * Q + j) * ld(b + i * Q + j) * expf(c[i] - c[j]);
    dcs[m * Q + j] = rows[j] - v;
  }
}

}  // namespace

namespace {

int vector_width(Elem t) { return t == Elem::kBF16 ? 8 : 4; }

// Whether n vectors can be indexed in 32 bits.
bool fits_u32(int64_t n) { return n <= static_cast<int64_t>(UINT32_MAX); }

// rms_bwd_kernel's launch, a function of the shape alone (so is its arithmetic order): V
// vectors of N per thread, the fewest (1, 2, 4 or 8) that cover a row with at most 1024
// threads (the kernel is compiled for 1024-thread blocks, so every variant launches); threads
// a multiple of 32; blocks enough to fill an H200-sized GPU (132 SMs of 2048 threads) but at
// least 8 rows each, so that the float32 partial sums stay small against the rows read.
struct RmsBwdLaunch {
  int n, v, threads;
  int64_t blocks;
};
RmsBwdLaunch rms_bwd_launch(Elem t, int64_t rows, int64_t h) {
  RmsBwdLaunch l{};
  l.n = h % vector_width(t) == 0 ? vector_width(t) : 1;
  const int64_t nvec = h / l.n;
  l.v = 1;
  while (nvec > static_cast<int64_t>(l.v) * 1024) l.v *= 2;
  const int64_t per_thread = (nvec + l.v - 1) / l.v;
  l.threads = static_cast<int>((per_thread + 31) / 32 * 32);
  l.blocks = std::max<int64_t>(1, std::min<int64_t>((rows + 7) / 8, 132 * 2048 / l.threads));
  return l;
}

}  // namespace

int64_t rms_norm_blocks(Elem t, int64_t rows, int64_t h) {
  return rms_bwd_launch(t, rows, h).blocks;
}
int64_t rms_norm_max_hidden() { return kRmsMaxHidden; }

namespace {

// Calls f.template operator()<T, N>() for the element type and the vector width N (16 bytes
// when `wide`, else 1).
template <typename F>
void dispatch(Elem t, bool wide, F&& f) {
  if (t == Elem::kF32) {
    if (wide) f.template operator()<float, 4>();
    else f.template operator()<float, 1>();
  } else {
    if (wide) f.template operator()<__nv_bfloat16, 8>();
    else f.template operator()<__nv_bfloat16, 1>();
  }
}

// The rope kernels' flat loop over (token, vector) pairs: its length, and its blocks.
int64_t rope_vectors(const RopeShape& s, int n) {
  return s.b * s.s * s.ng * (s.r + 2) * (s.hd / 2 / n);
}
unsigned rope_blocks(const RopeShape& s, int n) {
  return static_cast<unsigned>(grid_for(rope_vectors(s, n)));
}

}  // namespace

std::string rms_norm_forward(Elem t, const void* x, const void* res, const void* w, void* sum,
                             void* y, float* rstd, int64_t rows, int64_t h, float eps,
                             void* stream) {
  if (rows == 0) return {};
  const bool wide = h % vector_width(t) == 0;
  dispatch(t, wide, [&]<typename T, int N>() {
    rms_fwd_kernel<T, N><<<static_cast<unsigned>(rows), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(x), static_cast<const T*>(res), static_cast<const T*>(w),
        static_cast<T*>(sum), static_cast<T*>(y), rstd, h, eps);
  });
  return launched();
}

std::string rms_norm_backward(Elem t, const void* dy, const void* x, const void* w,
                              const float* rstd, const void* dres, void* dx, float* dw_partial,
                              int64_t rows, int64_t h, void* stream) {
  if (h > kRmsMaxHidden) return "rms_norm_backward: hidden size above the kernel's limit";
  if (rows == 0) return {};
  const RmsBwdLaunch l = rms_bwd_launch(t, rows, h);
  const int64_t per_block = (rows + l.blocks - 1) / l.blocks;
  dispatch(t, l.n > 1, [&]<typename T, int N>() {
    auto go = [&]<int V>() {
      rms_bwd_kernel<T, N, V><<<static_cast<unsigned>(l.blocks), l.threads, 0,
                                as_stream(stream)>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(w), rstd,
          static_cast<const T*>(dres), static_cast<T*>(dx), dw_partial, rows, h, per_block);
    };
    if (l.v == 1) go.template operator()<1>();
    else if (l.v == 2) go.template operator()<2>();
    else if (l.v == 4) go.template operator()<4>();
    else go.template operator()<8>();
  });
  return launched();
}

std::string swiglu_forward(Elem t, const void* fc1, void* act, int64_t rows, int64_t f,
                           void* stream) {
  const bool wide = f % vector_width(t) == 0;
  dispatch(t, wide, [&]<typename T, int N>() {
    const auto grid = static_cast<unsigned>(grid_for(rows * f / N));
    const auto kernel = fits_u32(rows * f / N) ? swiglu_fwd_kernel<uint32_t, T, N>
                                                : swiglu_fwd_kernel<int64_t, T, N>;
    kernel<<<grid, kThreads, 0, as_stream(stream)>>>(static_cast<const T*>(fc1),
                                                     static_cast<T*>(act), rows, f);
  });
  return launched();
}

std::string swiglu_backward(Elem t, const void* dact, const void* fc1, void* dfc1, int64_t rows,
                            int64_t f, void* stream) {
  const bool wide = f % vector_width(t) == 0;
  dispatch(t, wide, [&]<typename T, int N>() {
    const auto grid = static_cast<unsigned>(grid_for(rows * f / N));
    const auto kernel = fits_u32(rows * f / N) ? swiglu_bwd_kernel<uint32_t, T, N>
                                                : swiglu_bwd_kernel<int64_t, T, N>;
    kernel<<<grid, kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(dact), static_cast<const T*>(fc1), static_cast<T*>(dfc1), rows, f);
  });
  return launched();
}

namespace {
bool rope_wide(Elem t, const RopeShape& s) { return (s.hd / 2) % vector_width(t) == 0; }
}  // namespace

std::string rope_qkv_forward(Elem t, const void* qkv, const void* cos, const void* sin, void* q,
                             void* k, void* v, RopeShape s, void* stream) {
  dispatch(t, rope_wide(t, s), [&]<typename T, int N>() {
    const auto kernel = fits_u32(rope_vectors(s, N)) ? rope_fwd_kernel<uint32_t, T, N>
                                                      : rope_fwd_kernel<int64_t, T, N>;
    kernel<<<rope_blocks(s, N), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(qkv), static_cast<const T*>(cos), static_cast<const T*>(sin),
        static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), s);
  });
  return launched();
}

std::string rope_qkv_backward(Elem t, Strided dq, Strided dk, Strided dv, const void* cos,
                              const void* sin, void* dqkv, RopeShape s, void* stream) {
  const int n = vector_width(t);
  bool wide = rope_wide(t, s);
  for (const Strided* g : {&dq, &dk, &dv})
    wide = wide && g->sb % n == 0 && g->ss % n == 0 && g->sh % n == 0;
  dispatch(t, wide, [&]<typename T, int N>() {
    const auto kernel = fits_u32(rope_vectors(s, N)) ? rope_bwd_kernel<uint32_t, T, N>
                                                      : rope_bwd_kernel<int64_t, T, N>;
    kernel<<<rope_blocks(s, N), kThreads, 0, as_stream(stream)>>>(
        dq, dk, dv, static_cast<const T*>(cos), static_cast<const T*>(sin),
        static_cast<T*>(dqkv), s);
  });
  return launched();
}

std::string cross_entropy_forward(Elem t, const void* logits, const int64_t* labels, float* loss,
                                  float* lse, int64_t rows, int64_t v, void* stream) {
  if (rows == 0) return {};
  dispatch(t, v % vector_width(t) == 0, [&]<typename T, int N>() {
    ce_fwd_kernel<T, N><<<static_cast<unsigned>(rows), kCeThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(logits), labels, loss, lse, v);
  });
  return launched();
}

std::string cross_entropy_backward(Elem t, const void* logits, const int64_t* labels,
                                   const float* lse, const float* g, void* dlogits, int64_t rows,
                                   int64_t v, void* stream) {
  if (rows == 0) return {};
  dispatch(t, v % vector_width(t) == 0, [&]<typename T, int N>() {
    const auto kernel = fits_u32(rows * v / N) ? ce_bwd_kernel<uint32_t, T, N>
                                                : ce_bwd_kernel<int64_t, T, N>;
    kernel<<<static_cast<unsigned>(grid_for(rows * v / N)), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(logits), labels, lse, g, static_cast<T*>(dlogits), rows, v);
  });
  return launched();
}

int64_t gated_norm_blocks(int64_t rows) {
  return std::max<int64_t>(1, std::min(rows, kGatedNormBwdBlocks));
}
int64_t gated_norm_max_width() { return 12 * 1024; }  // float32 dw accumulators: 48 KiB

std::string gated_norm_forward(Elem t, const float* y, const void* z, int64_t z_row_stride,
                               const float* w, void* out, float* rstd, int64_t rows, int64_t ng,
                               int64_t gs, float eps, void* stream) {
  if (rows == 0) return {};
  dispatch(t, false, [&]<typename T, int N>() {
    gated_norm_fwd_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, as_stream(stream)>>>(
        y, static_cast<const T*>(z), z_row_stride, w, static_cast<T*>(out), rstd, ng, gs, eps);
  });
  return launched();
}

std::string gated_norm_backward(Elem t, const void* dout, const float* y, const void* z,
                                int64_t z_row_stride, const float* w, const float* rstd,
                                float* dy, void* dz, float* dw_partial, int64_t rows, int64_t ng,
                                int64_t gs, void* stream) {
  if (rows == 0) return {};
  const int64_t blocks = gated_norm_blocks(rows), per_block = (rows + blocks - 1) / blocks;
  const size_t smem = static_cast<size_t>(ng * gs) * sizeof(float);
  dispatch(t, false, [&]<typename T, int N>() {
    gated_norm_bwd_kernel<T><<<static_cast<unsigned>(blocks), kThreads, smem, as_stream(stream)>>>(
        static_cast<const T*>(dout), y, static_cast<const T*>(z), z_row_stride, w, rstd, dy,
        static_cast<T*>(dz), dw_partial, rows, ng, gs, per_block);
  });
  return launched();
}

int conv_silu_max_kernel() { return kConvMaxK; }
int64_t conv_silu_tiles(int64_t B, int64_t S) { return B * ((S + kConvTile - 1) / kConvTile); }

namespace {

// Calls f.template operator()<K>() for the runtime K in 1..kConvMaxK.
template <typename F>
void dispatch_taps(int K, F&& f) {
  switch (K) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 5: f.template operator()<5>(); break;
    case 6: f.template operator()<6>(); break;
    case 7: f.template operator()<7>(); break;
    default: f.template operator()<kConvMaxK>(); break;
  }
}

}  // namespace

std::string conv_silu_forward(Elem t, const void* x, int64_t x_row_stride, const float* w,
                              const float* bias, float* out, int64_t B, int64_t S, int64_t C,
                              int K, void* stream) {
  if (B * S * C == 0) return {};
  if (K < 1 || K > kConvMaxK) return "conv_silu: kernel size out of range";
  const int64_t tiles = (S + kConvTile - 1) / kConvTile;
  const dim3 grid(static_cast<unsigned>(B * tiles), static_cast<unsigned>((C + kThreads - 1) / kThreads));
  dispatch(t, false, [&]<typename T, int N>() {
    dispatch_taps(K, [&]<int KK>() {
      conv_silu_fwd_kernel<T, KK><<<grid, kThreads, 0, as_stream(stream)>>>(
          static_cast<const T*>(x), x_row_stride, w, bias, out, S, C, tiles);
    });
  });
  return launched();
}

std::string conv_silu_backward(Elem t, const float* dout, const void* x, int64_t x_row_stride,
                               const float* w, const float* bias, void* dx, float* dw_partial,
                               float* db_partial, int64_t B, int64_t S, int64_t C, int K,
                               void* stream) {
  if (B * S * C == 0) return {};
  if (K < 1 || K > kConvMaxK) return "conv_silu: kernel size out of range";
  const int64_t tiles = (S + kConvTile - 1) / kConvTile;
  const dim3 grid(static_cast<unsigned>(B * tiles), static_cast<unsigned>((C + kThreads - 1) / kThreads));
  dispatch(t, false, [&]<typename T, int N>() {
    dispatch_taps(K, [&]<int KK>() {
      conv_silu_bwd_kernel<T, KK><<<grid, kThreads, 0, as_stream(stream)>>>(
          dout, static_cast<const T*>(x), x_row_stride, w, bias, static_cast<T*>(dx), dw_partial,
          db_partial, S, C, tiles);
    });
  });
  return launched();
}

std::string ssd_decay_forward(Elem t, const void* cb, const float* cs, void* out, int64_t M,
                              int64_t R, int64_t Q, void* stream) {
  if (M == 0 || Q == 0) return {};
  dispatch(t, Q % vector_width(t) == 0, [&]<typename T, int N>() {
    ssd_decay_fwd_kernel<T, N><<<static_cast<unsigned>(grid_for(M * Q * Q / N)), kThreads, 0,
                                 as_stream(stream)>>>(static_cast<const T*>(cb), cs,
                                                      static_cast<T*>(out), M, R, Q);
  });
  return launched();
}

std::string ssd_decay_backward(Elem t, const void* dout, const void* cb, const float* cs,
                               void* dcb, float* dcs, int64_t M, int64_t R, int64_t Q,
                               void* stream) {
  if (M == 0 || Q == 0) return {};
  dispatch(t, Q % vector_width(t) == 0, [&]<typename T, int N>() {
    ssd_decay_bwd_cb_kernel<T, N><<<static_cast<unsigned>(grid_for(M / R * Q * Q / N)), kThreads,
                                    0, as_stream(stream)>>>(static_cast<const T*>(dout), cs,
                                                            static_cast<T*>(dcb), M / R, R, Q);
    ssd_decay_bwd_cs_kernel<T><<<static_cast<unsigned>(M), kThreads,
                                 static_cast<size_t>(2 * Q) * sizeof(float), as_stream(stream)>>>(
        static_cast<const T*>(dout), static_cast<const T*>(cb), cs, dcs, R, Q);
  });
  return launched();
}

}  // namespace weft::kernels
