// TensorBoard event files (see tensorboard.h): TFRecord framing with CRC-32C, and the loader of
// the module that serialises the Event messages.
#include "weft/train/tensorboard.h"

#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "weft/checkpoint/crc32c.h"
#include "weft/core/error.h"
#include "weft/core/module.h"
#include "weft/train/tb/tb_module.h"

namespace weft {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

#if WEFT_WITH_TENSORBOARD

// The module's encoder, resolved once; the module stays loaded for the process lifetime.
weft_tb_encode_event_fn tb_encoder() {
  static weft_tb_encode_event_fn encode = nullptr;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = open_module("WEFT_TB_MODULE", WEFT_TB_MODULE_PATH, "libweft_tb.so", &error);
    if (h == nullptr) return;
    encode = reinterpret_cast<weft_tb_encode_event_fn>(::dlsym(h, "weft_tb_encode_event"));
    error = encode ? "" : "weft's TensorBoard module lacks weft_tb_encode_event";
  });
  if (encode == nullptr)
    fail_usage("--tensorboard-dir: cannot load weft's TensorBoard module libweft_tb.so ({}); set "
               "WEFT_TB_MODULE to its path", error);
  return encode;
}

#endif

void put_u32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

bool tensorboard_available() {
#if WEFT_WITH_TENSORBOARD
  return true;
#else
  return false;
#endif
}

uint32_t tfrecord_masked_crc(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  const uint64_t len = data.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  put_u32(&out, tfrecord_masked_crc(out.data(), 8));
  out.append(data);
  put_u32(&out, tfrecord_masked_crc(data.data(), data.size()));
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
#if !WEFT_WITH_TENSORBOARD
  fail_usage("--tensorboard-dir {}: weft was built without protobuf (install libprotobuf-dev "
             "protobuf-compiler and rebuild)", dir);
#else
  tb_encoder();  // a missing module is reported before any file is created
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  host[sizeof(host) - 1] = '\0';
  path_ = (std::filesystem::path(dir) /
           fmt::format("events.out.tfevents.{}.{}.{}", static_cast<int64_t>(now_seconds()), host,
                       ::getpid()))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr)
    fail_usage("--tensorboard-dir {}: cannot create {}{}", dir, path_,
               ec ? fmt::format(" ({})", ec.message()) : "");
  write_event(0, "brain.Event:2", "", 0.0f);
  flush();
#endif
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_event(step, nullptr, tag, static_cast<float>(value));
}

void TensorBoardWriter::flush() {
  if (file_ != nullptr && std::fflush(file_) != 0) fail("{}: write failed", path_);
}

void TensorBoardWriter::write_event(int64_t step, const char* file_version,
                                    const std::string& tag, float value) {
#if WEFT_WITH_TENSORBOARD
  const char* bytes = nullptr;
  const int64_t n =
      tb_encoder()(now_seconds(), step, file_version, tag.c_str(), value, &bytes);
  if (n < 0) fail("{}: cannot serialise the event of '{}'", path_, tag);
  const std::string record = tfrecord_frame(std::string_view(bytes, static_cast<size_t>(n)));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size())
    fail("{}: write failed", path_);
#else
  (void)step, (void)file_version, (void)tag, (void)value;
#endif
}

}  // namespace weft
