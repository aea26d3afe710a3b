// The one place where weft's code differs between libtorch releases (STYLE.md rule 5).
//
// weft builds against Debian's libtorch 1.13 (CPU machines) and PyTorch 2.x (GPU machines).
// Every API that differs between them is wrapped here behind one function, guarded on
// TORCH_VERSION_MAJOR/MINOR; the rest of the code calls only these wrappers. Invariant: each
// wrapper computes the same mathematical result on every supported version (only the kernel,
// and so the rounding, may differ).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/version.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>

#include <ATen/ops/matmul.h>

#if TORCH_VERSION_MAJOR >= 2
#include <ATen/ops/scaled_dot_product_attention.h>
#else
#include <ATen/ops/ones.h>
#include <ATen/ops/softmax.h>
#endif

#define WEFT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if WEFT_TORCH_AT_LEAST(2, 8) && __has_include(<ATen/ops/_grouped_mm.h>)
#include <ATen/ops/_grouped_mm.h>
#define WEFT_HAS_GROUPED_MM 1
#else
#define WEFT_HAS_GROUPED_MM 0
#endif

namespace weft::compat {

// Whether a and b are bfloat16 (or both float16) off CUDA: their products are widened (matmul
// below). Mixed dtypes are not: at::matmul refuses them on every device.
inline bool narrow_off_cuda(const at::Tensor& a, const at::Tensor& b) {
  return !a.is_cuda() && a.scalar_type() == b.scalar_type() &&
         (a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf);
}

// a @ b (at::matmul's broadcasting) with the products summed in float32 and the result rounded
// once to the operands' dtype: what CUDA's GEMMs do for bfloat16/float16. libtorch's CPU kernels
// of some releases (1.13's) sum bfloat16 products in bfloat16: a [64, 8192] x [8192, 64]
// product came out off by about its own mean magnitude. Off CUDA the operands are widened to
// float32 and the product rounded once, so that a CPU run computes what a GPU run does.
inline at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
  if (narrow_off_cuda(a, b)) {
    const c10::ScalarType out = a.scalar_type();
    return at::matmul(a.to(at::kFloat), b.to(at::kFloat)).to(out);
  }
  return at::matmul(a, b);
}

// A fresh CPU generator seeded with `seed`; its stream depends only on the seed.
inline at::Generator make_cpu_generator(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

// Causal scaled-dot-product attention, no dropout, scale 1/sqrt(head_dim) (or `scale` where
// positive). q, k: [b, heads, s, hd], v [b, heads, s, dv] with the same number of heads (callers
// expand GQA groups first). Returns [b, heads, s, dv] in q's dtype. Query i attends to keys 0..i.
// torch >= 2.0: the fused kernel (flash / memory-efficient / math, chosen by PyTorch).
// torch 1.13: a plain implementation; scores, mask and softmax in float32 (float64 for float64
// inputs), the two matmuls in the input dtype through ATen's own kernels. (So on the CPU with
// torch 1.13 a bf16 attention still sums its products in bf16: widening them as matmul below
// does would make autograd save float32 copies of q, k, v and the [s, s] probabilities, ~15%
// more activation memory at the test shapes. Not done.)
inline at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double scale = 0) {
#if WEFT_TORCH_AT_LEAST(2, 1)
  return at::scaled_dot_product_attention(
      q, k, v, {}, 0.0, /*is_causal=*/true,
      scale > 0 ? c10::optional<double>(scale) : c10::optional<double>());
#elif TORCH_VERSION_MAJOR >= 2  // 2.0's attention takes no scale: q carries the ratio to its own
  const double ratio = scale > 0 ? scale * std::sqrt(static_cast<double>(q.size(-1))) : 1.0;
  return at::scaled_dot_product_attention(ratio == 1.0 ? q : q * ratio, k, v, {}, 0.0,
                                          /*is_causal=*/true);
#else
  const auto acc = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t sq = q.size(-2), sk = k.size(-2);
  if (scale <= 0) scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).to(acc) * scale;
  at::Tensor future = at::ones({sq, sk}, q.options().dtype(at::kBool)).triu_(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1).to(v.scalar_type());
  return at::matmul(probs, v);
#endif
}

// Causal attention with grouped-query heads: q [b, nh, s, hd], k and v [b, ng, s, hd] with
// nh a multiple of ng (query head h uses key/value head h / (nh/ng)). torch >= 2.5 passes the
// groups to the fused kernel (enable_gqa, no copy); older versions expand k and v first.
inline at::Tensor causal_attention_gqa(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, double scale = 0) {
#if WEFT_TORCH_AT_LEAST(2, 5)
  // Values of another head dim than q's (MLA) come with a key/value head per query head; the
  // memory-efficient kernel takes them but not enable_gqa, so the flag is left off there.
  const bool gqa = v.size(-1) == q.size(-1) || q.size(1) != k.size(1);
  return at::scaled_dot_product_attention(
      q, k, v, {}, 0.0, /*is_causal=*/true,
      scale > 0 ? c10::optional<double>(scale) : c10::optional<double>(), /*enable_gqa=*/gqa);
#else
  const int64_t r = q.size(1) / k.size(1);
  auto expand = [r](const at::Tensor& t) {
    const int64_t b = t.size(0), ng = t.size(1), s = t.size(2), hd = t.size(3);
    return t.unsqueeze(2).expand({b, ng, r, s, hd}).reshape({b, ng * r, s, hd});
  };
  return causal_attention(q, r == 1 ? k : expand(k), r == 1 ? v : expand(v), scale);
#endif
}

// Whether the GEMM itself can write float32 `acc` from bfloat16/float16 a and b (CUDA,
// addmm's out_dtype, torch >= 2.8).
inline bool gemm_writes_float32(const at::Tensor& acc, const at::Tensor& a, const at::Tensor& b) {
  return acc.is_cuda() && acc.scalar_type() == at::kFloat && a.scalar_type() == b.scalar_type() &&
         (a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf) && acc.is_contiguous();
}

// acc += a @ b, with acc float32 (or bf16) and a, b in the compute dtype. Off CUDA, bf16/fp16
// operands are widened and summed in float32 (as matmul above), the sum added into acc and
// rounded once. On CUDA where the matmul can write float32 from bfloat16/float16 inputs (torch
// >= 2.8: addmm's out_dtype), the product is added by the GEMM itself; otherwise it is computed
// in the compute dtype and added as a cast (one more pass over the buffer). Same dtypes: a plain
// addmm_ (cuBLAS sums in float32 and rounds once).
inline void addmm_accumulate(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b) {
  if (narrow_off_cuda(a, b))  // float32 sums, one rounding (matmul above)
    return addmm_accumulate(acc, a.to(at::kFloat), b.to(at::kFloat));
  if (a.scalar_type() == acc.scalar_type() && b.scalar_type() == acc.scalar_type()) {
    acc.addmm_(a, b);
    return;
  }
#if WEFT_TORCH_AT_LEAST(2, 8)
  if (gemm_writes_float32(acc, a, b)) {
    at::addmm_out(acc, acc, a, b, at::kFloat);
    return;
  }
#endif
  acc.add_(at::mm(a, b));
}

// acc = a @ b, acc's old values ignored (NaN included), the dtypes as for addmm_accumulate: the
// first write of a weight gradient into a buffer that was not zeroed (a GEMM with beta 0).
inline void mm_write(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b) {
  if (narrow_off_cuda(a, b))  // float32 sums, one rounding (matmul above)
    return mm_write(acc, a.to(at::kFloat), b.to(at::kFloat));
  if (a.scalar_type() == acc.scalar_type() && b.scalar_type() == acc.scalar_type()) {
    at::mm_out(acc, a, b);
    return;
  }
#if WEFT_TORCH_AT_LEAST(2, 8)
  if (gemm_writes_float32(acc, a, b)) {
    at::addmm_out(acc, acc, a, b, at::kFloat, /*beta=*/0, /*alpha=*/1);
    return;
  }
#endif
  acc.copy_(at::mm(a, b));
}

// Grouped matmul (torch._grouped_mm), groups given by `offs` (int32 [G], cumulative ends, on
// the operands' device):
//   a [N, K] 2-D, b [G, K, M] 3-D: rows of a split into groups -> [N, M], group rows times b[g];
//   a [M, N] 2-D, b [N, K] 2-D: the shared dim N split into groups -> [G, M, K], a_g b_g.
// Operands row- or column-major in their last two dims. Only where this libtorch has the op and
// for bf16 CUDA operands (grouped_mm_usable); callers fall back to one mm per group.
inline bool grouped_mm_usable(const at::Tensor& a) {
#if WEFT_HAS_GROUPED_MM
  return a.is_cuda() && a.scalar_type() == at::kBFloat16;
#else
  (void)a;
  return false;
#endif
}
inline at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
#if WEFT_HAS_GROUPED_MM
  return at::_grouped_mm(a, b, offs);
#else
  (void)b, (void)offs;
  return a;  // unreachable: grouped_mm_usable() is false
#endif
}

}  // namespace weft::compat
