// TensorBoard event files for --tensorboard-dir: one events.out.tfevents.<time>.<host>.<pid>
// file per run, a sequence of TFRecords each holding one serialised tensorboard.Event.
//
// TFRecord framing (TensorFlow's record_writer): uint64 length (little endian), uint32 masked
// CRC-32C of those 8 bytes, the data, uint32 masked CRC-32C of the data; mask(c) =
// ((c >> 15) | (c << 17)) + 0xa282ead8. The first record is Event{file_version:
// "brain.Event:2"}; every scalar is one Event{step, summary{value{tag, simple_value}}}.
// The messages are serialised by the dlopen'ed module libweft_tb.so (train/tb/tb_module.h);
// framing and I/O are here. A record is flushed as a whole, so a reader sees whole records only
// (a crash may leave a torn last record, which TensorBoard skips).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace weft {

// Whether this build can write TensorBoard files (protobuf was found at build time).
bool tensorboard_available();

// The masked CRC-32C of TFRecord framing, and a whole framed record (exposed for tests).
uint32_t tfrecord_masked_crc(const void* data, size_t n);
std::string tfrecord_frame(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new event file in it, and writes the version record. Throws
  // UsageError naming --tensorboard-dir when the build has no protobuf, the module cannot be
  // loaded, or the file cannot be created.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends Event{wall_time now, step, one scalar}; the value is stored as float (TensorBoard's
  // simple_value). Throws Error when the write fails.
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_event(int64_t step, const char* file_version, const std::string& tag, float value);

  std::string path_;
  FILE* file_ = nullptr;
};

}  // namespace weft
