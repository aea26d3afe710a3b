// The device a rank computes on: choosing it, synchronizing with it, reading results back from
// it, and its peak memory.
// CPU builds answer for the CPU (no devices, max RSS); the CUDA build (device_cuda.cpp) answers
// for CUDA devices. Nothing here includes CUDA headers.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace weft {

int cuda_device_count();                 // 0 when weft is built without CUDA
void set_cuda_device(int index);         // the current device of this thread (and autograd's)
void device_synchronize(c10::Device d);  // waits for all work queued on d (no-op on CPU)
double device_peak_memory_mb(c10::Device d);  // CUDA: peak allocated; CPU: peak RSS
// The PCI address of this thread's current CUDA device ("0000:1b:00.0"): the same physical GPU
// gives the same address whatever CUDA_VISIBLE_DEVICES a rank sees. "" without CUDA.
std::string cuda_device_pci_id();
// Deterministic kernels for parity and restart tests: cuBLAS workspace configuration and
// ATen's deterministic algorithms (warn-only, so ops without a deterministic variant still run).
// Call before the first CUDA work.
void set_deterministic_mode();

// A copy of a tensor into host memory that the host waits for later. On CUDA it is queued on
// the current stream (into pinned memory), so it follows the work queued before it and not the
// work queued after: the trainer reads its losses and gradient norm while the optimizer it
// queued next still runs. For a CPU tensor the copy is made at once.
class HostCopy {
 public:
  explicit HostCopy(const at::Tensor& t);
  at::Tensor wait();  // blocks until the copy is done; returns the host tensor

 private:
  at::Tensor host_;
  std::shared_ptr<void> event_;  // the CUDA event recorded after the copy; null when done
};

}  // namespace weft
