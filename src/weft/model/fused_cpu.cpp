// The fused entry points of a build without CUDA (the counterpart of fused_cuda.cpp, linked in
// its place): compiled() is false, so usable() never sends a tensor here; a direct call fails.
#include "weft/core/error.h"
#include "weft/model/fused.h"
#include "weft/model/fused_impl.h"

namespace weft::fused {
namespace {

[[noreturn]] void not_compiled() {
  fail("fused CUDA kernels are not part of this build (CPU-only libtorch)");
}

}  // namespace

bool compiled() { return false; }
bool rms_norm_supports(int64_t) { return false; }

std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor&, const at::Tensor&, double) {
  not_compiled();
}
std::array<at::Tensor, 3> add_rms_norm_forward(const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, double) {
  not_compiled();
}
at::Tensor rms_norm_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, at::Tensor*, const at::Tensor&) {
  not_compiled();
}
at::Tensor swiglu_forward(const at::Tensor&) { not_compiled(); }
at::Tensor swiglu_backward(const at::Tensor&, const at::Tensor&) { not_compiled(); }
std::array<at::Tensor, 3> rope_forward_impl(const at::Tensor&, const at::Tensor&,
                                            const at::Tensor&) {
  not_compiled();
}
at::Tensor rope_backward_impl(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, at::IntArrayRef) {
  not_compiled();
}
std::pair<at::Tensor, at::Tensor> cross_entropy_forward_impl(const at::Tensor&, const at::Tensor&) {
  not_compiled();
}
at::Tensor cross_entropy_backward_impl(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const at::Tensor&) {
  not_compiled();
}
at::Tensor conv_silu_forward_impl(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  not_compiled();
}
std::array<at::Tensor, 3> conv_silu_backward_impl(const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, const at::Tensor&) {
  not_compiled();
}
int conv_silu_max_kernel_impl() { return 0; }
std::pair<at::Tensor, at::Tensor> gated_norm_forward_impl(const at::Tensor&, const at::Tensor&,
                                                          const at::Tensor&, int64_t, double) {
  not_compiled();
}
std::array<at::Tensor, 3> gated_norm_backward_impl(const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, int64_t) {
  not_compiled();
}
int64_t gated_norm_max_width_impl() { return 0; }
at::Tensor ssd_decay_forward_impl(const at::Tensor&, const at::Tensor&) { not_compiled(); }
std::pair<at::Tensor, at::Tensor> ssd_decay_backward_impl(const at::Tensor&, const at::Tensor&,
                                                          const at::Tensor&) {
  not_compiled();
}

}  // namespace weft::fused
