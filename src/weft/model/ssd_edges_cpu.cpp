// The SSD edge entry points of a build without CUDA (the counterpart of ssd_edges_cuda.cpp):
// usable() is false, so ssd.cpp never calls the others; a direct call fails.
#include "weft/core/error.h"
#include "weft/model/ssd_edges.h"

namespace weft::ssd_edges {
namespace {

[[noreturn]] void not_compiled() {
  fail("fused CUDA kernels are not part of this build (CPU-only libtorch)");
}

}  // namespace

bool usable(const at::Tensor&, c10::ScalarType) { return false; }
std::array<at::Tensor, 2> scale_inputs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       c10::ScalarType, bool) {
  not_compiled();
}
at::Tensor combine_outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&) {
  not_compiled();
}
std::array<at::Tensor, 2> grad_inputs(const at::Tensor&, const at::Tensor&, c10::ScalarType,
                                      bool) {
  not_compiled();
}
std::array<at::Tensor, 4> grad_outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const at::Tensor&, const at::Tensor&) {
  not_compiled();
}

}  // namespace weft::ssd_edges
