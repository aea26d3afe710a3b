// weft's TensorBoard module (see tb_module.h): serialises Event protos with libprotobuf-lite
// from the minimal event.proto/summary.proto beside this file. Framing, checksums and file I/O
// stay in weft (train/tensorboard.cpp); this module only turns values into message bytes.
#include "tb_module.h"

#include <string>

#include "event.pb.h"

extern "C" __attribute__((visibility("default"))) int64_t weft_tb_encode_event(
    double wall_time, int64_t step, const char* file_version, const char* tag, float value,
    const char** out) {
  thread_local std::string bytes;
  weft_tb::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  if (file_version != nullptr) {
    event.set_file_version(file_version);
  } else {
    weft_tb::Summary::Value* v = event.mutable_summary()->add_value();
    v->set_tag(tag != nullptr ? tag : "");
    v->set_simple_value(value);
  }
  bytes.clear();
  if (!event.SerializeToString(&bytes)) return -1;
  *out = bytes.data();
  return static_cast<int64_t>(bytes.size());
}
