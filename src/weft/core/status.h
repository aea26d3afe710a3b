// A recoverable error as a value: file I/O and parsing return Status (or a value plus Status)
// instead of throwing, so callers can add the rank, key and file before deciding to fail.
#pragma once

#include <string>
#include <utility>

namespace weft {

class Status {
 public:
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message)); }
  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  Status() = default;
  explicit Status(std::string m) : failed_(true), message_(std::move(m)) {}
  bool failed_ = false;
  std::string message_;
};

}  // namespace weft
