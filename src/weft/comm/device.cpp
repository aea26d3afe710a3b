// Device helpers (see device.h): the CPU side, and dispatch to device_cuda.cpp in CUDA builds.
#include "weft/comm/device.h"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <sys/resource.h>

#include <cstdlib>

#include "weft/core/error.h"

namespace weft {

#if defined(WEFT_WITH_CUDA)
int cuda_device_count_impl();
void set_cuda_device_impl(int index);
void cuda_synchronize_impl(int index);
double cuda_peak_memory_mb_impl(int index);
std::string cuda_device_pci_id_impl();
std::shared_ptr<void> cuda_record_event_impl(int index);
void cuda_wait_event_impl(void* event);
#endif

int cuda_device_count() {
#if defined(WEFT_WITH_CUDA)
  return cuda_device_count_impl();
#else
  return 0;
#endif
}

void set_cuda_device(int index) {
#if defined(WEFT_WITH_CUDA)
  set_cuda_device_impl(index);
#else
  fail_usage("--device cuda: this weft was built without CUDA (CPU-only libtorch)");
#endif
}

void device_synchronize(c10::Device d) {
#if defined(WEFT_WITH_CUDA)
  if (d.is_cuda()) cuda_synchronize_impl(d.has_index() ? d.index() : -1);
#else
  (void)d;
#endif
}

double device_peak_memory_mb(c10::Device d) {
#if defined(WEFT_WITH_CUDA)
  if (d.is_cuda()) return cuda_peak_memory_mb_impl(d.has_index() ? d.index() : -1);
#endif
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

std::string cuda_device_pci_id() {
#if defined(WEFT_WITH_CUDA)
  return cuda_device_pci_id_impl();
#else
  return "";
#endif
}

HostCopy::HostCopy(const at::Tensor& t) {
#if defined(WEFT_WITH_CUDA)
  if (t.is_cuda()) {
    host_ = at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
    host_.copy_(t, /*non_blocking=*/true);
    event_ = cuda_record_event_impl(t.device().index());
    return;
  }
#endif
  host_ = t.is_cpu() ? t.clone() : t.cpu();
}

at::Tensor HostCopy::wait() {
#if defined(WEFT_WITH_CUDA)
  if (event_) cuda_wait_event_impl(event_.get());
#endif
  event_.reset();
  return host_;
}

void set_deterministic_mode() {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

}  // namespace weft
