// DeviceLoadStager (device_staging.h).
#include "weft/checkpoint/device_staging.h"

#include <ATen/ops/empty.h>

#include "weft/comm/device.h"
#include "weft/core/error.h"

namespace weft {

DeviceLoadStager::~DeviceLoadStager() {
  try {
    finish();  // never free pinned memory a copy still reads
  } catch (...) {
  }
}

void* DeviceLoadStager::reserve(const at::Tensor& dst) {
  WEFT_CHECK(!dst.is_cpu() && dst.is_contiguous(), "DeviceLoadStager: needs a contiguous device tensor");
  const int64_t n = dst.numel() * dst.element_size();
  const int64_t at = (used_ + 63) / 64 * 64;
  if (n > capacity_ || at + n > capacity_) return nullptr;
  at::Tensor& b = buf_[cur_];
  if (!b.defined())
    b = at::empty({capacity_}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  used_ = at + n;
  device_ = dst.device();
  copies_.emplace_back(dst, b.narrow(0, at, n).view(dst.scalar_type()).view(dst.sizes()));
  return b.data_ptr<uint8_t>() + at;
}

void DeviceLoadStager::issue() {
  if (copies_.empty()) return;
  // The other buffer is refilled after this call: its copies must have landed. They were
  // queued one batch ago, so this waits for (almost) nothing.
  if (in_flight_) device_synchronize(device_);
  for (auto& [dst, host] : copies_) dst.copy_(host, /*non_blocking=*/true);
  copies_.clear();
  in_flight_ = true;
  cur_ ^= 1;
  used_ = 0;
}

void DeviceLoadStager::finish() {
  if (in_flight_) device_synchronize(device_);
  in_flight_ = false;
}

}  // namespace weft
