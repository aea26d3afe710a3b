// CUDA side of the device helpers (see device.h); built only with the CUDA path.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "weft/core/error.h"

namespace weft {

int cuda_device_count_impl() { return c10::cuda::device_count(); }

void set_cuda_device_impl(int index) {
  const int n = c10::cuda::device_count();
  if (n == 0) fail_usage("--device cuda: no CUDA device is visible to this rank");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index % n));
}

void cuda_synchronize_impl(int index) {
  c10::cuda::device_synchronize();
  (void)index;
}

double cuda_peak_memory_mb_impl(int index) {
  const int dev = index >= 0 ? index : c10::cuda::current_device();
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(dev));
  const auto& peak = stats.allocated_bytes[0].peak;  // index 0: the aggregate over pools
  return static_cast<double>(peak) / (1024.0 * 1024.0);
}

// An event recorded on the current stream of device `index` (the caller's current device when
// -1), destroyed with its last owner.
std::shared_ptr<void> cuda_record_event_impl(int index) {
  cudaEvent_t event = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err != cudaSuccess) fail("cudaEventCreateWithFlags: {}", cudaGetErrorString(err));
  std::shared_ptr<void> owned(event, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
  err = cudaEventRecord(event,
                        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index)).stream());
  if (err != cudaSuccess) fail("cudaEventRecord: {}", cudaGetErrorString(err));
  return owned;
}

void cuda_wait_event_impl(void* event) {
  const cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(event));
  if (err != cudaSuccess) fail("waiting for a device-to-host copy: {}", cudaGetErrorString(err));
}

std::string cuda_device_pci_id_impl() {
  char id[64] = {0};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), c10::cuda::current_device()) != cudaSuccess) return "";
  return id;
}

}  // namespace weft
