// Loading into device tensors at disk speed: chunks are read (in parallel, with their
// checksums, by CkptFileCache::read_chunks) into pinned host memory, then copied to the device
// asynchronously while the next batch is read. Two pinned buffers alternate; a batch ends when
// the filling buffer is full or the caller needs the destinations (flush).
//
//   DeviceLoadStager s(capacity);
//   if (void* p = s.reserve(dst)) reads.push_back({chunk, p});  // else: flush, then retry
//   ... read_chunks(reads) ...; s.issue();                      // copies of this batch queued
//   s.finish();                                                  // every copy has landed
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace weft {

class DeviceLoadStager {
 public:
  // `capacity`: bytes of each of the two pinned buffers (allocated on first use).
  explicit DeviceLoadStager(int64_t capacity) : capacity_(capacity) {}
  ~DeviceLoadStager();
  DeviceLoadStager(const DeviceLoadStager&) = delete;
  DeviceLoadStager& operator=(const DeviceLoadStager&) = delete;

  // Room in the filling buffer for `dst`'s bytes (contiguous, on a device): the pointer the
  // chunk is read into, or null when the buffer has no room left (issue() first; a tensor larger
  // than the capacity never fits). The copy to `dst` is queued by the next issue().
  void* reserve(const at::Tensor& dst);
  // Whether `dst` fits an empty buffer (else it never will: load it another way).
  bool can_hold(const at::Tensor& dst) const {
    return dst.numel() * dst.element_size() <= capacity_;
  }
  // Call once the reads into the reserved memory are complete: waits for the copies out of the
  // other buffer (queued by the previous issue(), normally long done), queues this batch's
  // host-to-device copies without waiting for them, and switches buffers.
  void issue();
  // Waits until every queued copy has landed (the pinned buffers may then be freed).
  void finish();

 private:
  int64_t capacity_;
  at::Tensor buf_[2];
  int cur_ = 0;
  int64_t used_ = 0;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies_;  // (device dst, pinned host view)
  bool in_flight_ = false;  // copies queued and not yet waited for
  c10::Device device_{c10::kCPU};
};

}  // namespace weft
