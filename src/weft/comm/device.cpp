// Device helpers (see device.h): the CPU side, and dispatch to device_cuda.cpp in CUDA builds.
#include "weft/comm/device.h"

#include <ATen/Context.h>
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

void set_deterministic_mode() {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

}  // namespace weft
