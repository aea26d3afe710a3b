// Safetensors reader and writer, from the format specification: u64 little-endian header size N,
// N bytes of JSON header padded with spaces so that 8 + N is a multiple of 8, then the data
// region with each entry's bytes at [begin, end) relative to its start. The writer emits
// "__metadata__" (when non-empty) and then the entries as JSON objects in the caller's order,
// each with "dtype", "shape", "data_offsets", and lays the data out back to back in that same
// order; entry bytes go from the caller's buffer straight to write(2), never copied. Invariant:
// a file this writer reports ok is complete and fsynced; one it reports failed does not exist.
// The reader accepts a header only if every entry has a known dtype, a non-negative shape,
// begin <= end <= data region size, end - begin == prod(shape) * dtype size, and no two
// non-empty entries overlap; every error names the file (and the entry, where there is one).
//
// Durability of the directory entry (fsync of the parent directory, rename into place) is the
// caller's job: docs/checkpoint-format.md "Commit protocol".
#include "weft/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>

#include "weft/checkpoint/crc32c.h"
#include <utility>

namespace weft {
namespace {

// Largest header this reader accepts (the reference implementation's limit); anything larger is
// a corrupt size field, not a header.
constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;
// Largest single write()/pread() request; Linux moves at most ~2 GiB per call anyway.
constexpr size_t kSafetensorsMaxIo = size_t{1} << 30;

std::string errno_text(int err) { return std::string(std::strerror(err)); }

Status st_error(const std::string& path, const std::string& what) {
  return Status::error("safetensors " + path + ": " + what);
}

Status st_entry_error(const std::string& path, const std::string& name, const std::string& what) {
  return Status::error("safetensors " + path + ": entry '" + name + "': " + what);
}

// prod(shape) * width, or false on a negative dimension or u64 overflow.
bool st_nbytes(const std::vector<int64_t>& shape, size_t width, uint64_t* out) {
  uint64_t n = width;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

// Writes all n bytes at the current offset; returns 0 or an errno value.
int st_write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min(n, kSafetensorsMaxIo));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;  // no progress and no error: treat as a full device
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

// Reads exactly n bytes at `offset`; returns 0, an errno value, or -1 on end of file.
int st_pread_all(int fd, void* data, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min(n, kSafetensorsMaxIo), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return -1;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return 0;
}

std::string pread_error_text(int err) {
  return err < 0 ? std::string("unexpected end of file (truncated?)") : errno_text(err);
}

// Closes fd on scope exit unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Parses one tensor entry object into *out; the returned string is empty on success, otherwise
// the reason it was refused.
std::string st_parse_entry(const nlohmann::json& j, SafetensorsEntry* out) {
  if (!j.is_object()) return "not a JSON object";
  const auto dt = j.find("dtype");
  if (dt == j.end() || !dt->is_string()) return "missing or non-string \"dtype\"";
  out->dtype = dt->get<std::string>();
  if (safetensors_dtype_size(out->dtype) == 0) return "unknown dtype \"" + out->dtype + "\"";
  const auto sh = j.find("shape");
  if (sh == j.end() || !sh->is_array()) return "missing or non-array \"shape\"";
  out->shape.clear();
  for (const auto& d : *sh) {
    if (d.is_number_unsigned()) {
      const auto v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return "shape dimension too large";
      out->shape.push_back(static_cast<int64_t>(v));
    } else if (d.is_number_integer()) {
      return "negative shape dimension " + std::to_string(d.get<int64_t>());
    } else {
      return "shape dimension is not an integer";
    }
  }
  const auto off = j.find("data_offsets");
  if (off == j.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return "\"data_offsets\" is not a pair of non-negative integers";
  out->begin = (*off)[0].get<uint64_t>();
  out->end = (*off)[1].get<uint64_t>();
  return {};
}

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::pair<const char*, size_t> kSizes[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1},
  };
  for (const auto& [name, size] : kSizes)
    if (dtype == name) return size;
  return 0;
}

namespace {

// The 8-byte size plus the padded JSON header for `entries` (data pointers not needed), checked
// entry by entry. The keys appear in the caller's order: "__metadata__" first, then the entries.
Status build_header(const std::string& path, const std::vector<SafetensorsWriteEntry>& entries,
                    const std::map<std::string, std::string>& metadata, bool need_data,
                    std::string* out) {
  std::string& bytes = *out;
  bytes.assign(8, '\0');
  std::set<std::string> names;
  uint64_t offset = 0;
  try {
    bytes += '{';
    if (!metadata.empty()) bytes += "\"__metadata__\":" + nlohmann::json(metadata).dump();
    for (const auto& e : entries) {
      if (e.name == "__metadata__") return st_entry_error(path, e.name, "reserved name");
      if (!names.insert(e.name).second) return st_entry_error(path, e.name, "duplicate name");
      const size_t width = safetensors_dtype_size(e.dtype);
      if (width == 0) return st_entry_error(path, e.name, "unknown dtype \"" + e.dtype + "\"");
      uint64_t expect = 0;
      if (!st_nbytes(e.shape, width, &expect))
        return st_entry_error(path, e.name, "bad shape " + shape_text(e.shape));
      if (expect != e.nbytes)
        return st_entry_error(path, e.name,
                              "nbytes " + std::to_string(e.nbytes) + " != " +
                                  std::to_string(expect) + " for shape " + shape_text(e.shape) +
                                  " " + e.dtype);
      if (need_data && e.nbytes > 0 && e.data == nullptr)
        return st_entry_error(path, e.name, "null data");
      nlohmann::ordered_json j;
      j["dtype"] = e.dtype;
      j["shape"] = e.shape;
      j["data_offsets"] = {offset, offset + e.nbytes};
      if (bytes.size() > 9) bytes += ',';
      bytes += nlohmann::json(e.name).dump() + ":" + j.dump();
      offset += e.nbytes;
    }
    bytes += '}';
  } catch (const nlohmann::json::exception& ex) {  // invalid UTF-8 in a name or metadata
    return st_error(path, std::string("cannot encode header: ") + ex.what());
  }
  bytes.append((8 - bytes.size() % 8) % 8, ' ');
  const uint64_t n = bytes.size() - 8;
  if (n >= kSafetensorsMaxHeader)  // readers (ours included) would refuse the file
    return st_error(path, "header of " + std::to_string(n) + " bytes is not below the " +
                              std::to_string(kSafetensorsMaxHeader) + "-byte limit");
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return Status::ok();
}

// Writes all n bytes at `offset`; returns 0 or an errno value.
int st_pwrite_all(int fd, const void* data, size_t n, uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, std::min(n, kSafetensorsMaxIo), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return 0;
}

}  // namespace

Status safetensors_write(const std::string& path, const std::vector<SafetensorsWriteEntry>& entries,
                         const std::map<std::string, std::string>& metadata) {
  // Everything is checked and the header built before the file is opened, so a bad argument
  // leaves an existing file untouched.
  std::string bytes;
  if (Status s = build_header(path, entries, metadata, /*need_data=*/true, &bytes); !s) return s;
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return st_error(path, "cannot create: " + errno_text(errno));
  FdCloser closer(fd);
  auto fail = [&](const std::string& what, int err) {
    ::close(closer.release());
    ::unlink(path.c_str());
    return st_error(path, what + ": " + errno_text(err) + " (partial file removed)");
  };
  if (int err = st_write_all(fd, bytes.data(), bytes.size())) return fail("writing header", err);
  for (const auto& e : entries)
    if (int err = st_write_all(fd, e.data, e.nbytes))
      return fail("writing entry '" + e.name + "'", err);
  if (::fsync(fd) != 0) return fail("fsync", errno);
  if (::close(closer.release()) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return st_error(path, "close: " + errno_text(err) + " (partial file removed)");
  }
  return Status::ok();
}

Status safetensors_write_streamed(const std::string& path,
                                  const std::vector<SafetensorsWriteEntry>& entries,
                                  const SafetensorsBlockSource& data,
                                  const SafetensorsMetadataFn& metadata, size_t block_bytes,
                                  std::vector<uint32_t>* crcs) {
  if (block_bytes == 0) return st_error(path, "block size 0");
  crcs->assign(entries.size(), 0);
  std::string head;
  if (Status s = build_header(path, entries, metadata(*crcs), /*need_data=*/false, &head); !s)
    return s;
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return st_error(path, "cannot create: " + errno_text(errno));
  FdCloser closer(fd);
  auto fail = [&](const std::string& what) {
    ::close(closer.release());
    ::unlink(path.c_str());
    return st_error(path, what + " (partial file removed)");
  };
  // Data first, after room for the header; the device starts writing every kWriteback bytes
  // (sync_file_range) while the next blocks are produced, so the final fsync waits only for the
  // tail.
  constexpr uint64_t kWriteback = uint64_t{256} << 20;
  uint64_t pos = head.size(), kicked = head.size();
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsWriteEntry& e = entries[i];
    for (size_t off = 0; off < e.nbytes; off += block_bytes) {
      const size_t n = std::min(block_bytes, e.nbytes - off);
      const void* p = nullptr;
      Status got = Status::ok();
      try {
        got = data(i, off, n, &p);
      } catch (...) {  // a source that throws: no partial file either, then its exception
        ::close(closer.release());
        ::unlink(path.c_str());
        throw;
      }
      if (!got) return fail("entry '" + e.name + "': " + got.message());
      (*crcs)[i] = crc32c_extend((*crcs)[i], p, n);
      if (int err = st_pwrite_all(fd, p, n, pos))
        return fail("writing entry '" + e.name + "': " + errno_text(err));
      pos += n;
      if (pos - kicked >= kWriteback) {
        ::sync_file_range(fd, static_cast<off_t>(kicked), static_cast<off_t>(pos - kicked),
                          SYNC_FILE_RANGE_WRITE);
        kicked = pos;
      }
    }
  }
  std::string final_head;
  if (Status s = build_header(path, entries, metadata(*crcs), false, &final_head); !s)
    return fail(s.message());
  if (final_head.size() != head.size())
    return fail("header length changed between sizing and writing (" +
                std::to_string(head.size()) + " vs " + std::to_string(final_head.size()) + ")");
  if (int err = st_pwrite_all(fd, final_head.data(), final_head.size(), 0))
    return fail("writing header: " + errno_text(err));
  if (::fsync(fd) != 0) return fail("fsync: " + errno_text(errno));
  if (::close(closer.release()) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return st_error(path, "close: " + errno_text(err) + " (partial file removed)");
  }
  return Status::ok();
}

Status safetensors_read_header(const std::string& path, SafetensorsHeader* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return st_error(path, "cannot open: " + errno_text(errno));
  FdCloser closer(fd);
  struct stat sb;
  if (::fstat(fd, &sb) != 0) return st_error(path, "fstat: " + errno_text(errno));
  const auto file_size = static_cast<uint64_t>(sb.st_size);
  if (file_size < 8)
    return st_error(path, "file is " + std::to_string(file_size) +
                              " bytes, shorter than the 8-byte header size (truncated?)");
  unsigned char size_le[8];
  if (int err = st_pread_all(fd, size_le, 8, 0))
    return st_error(path, "reading header size: " + pread_error_text(err));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(size_le[i]) << (8 * i);
  if (n >= kSafetensorsMaxHeader)
    return st_error(path, "header size " + std::to_string(n) + " is not below the " +
                              std::to_string(kSafetensorsMaxHeader) +
                              "-byte limit (not a safetensors file?)");
  if (n > file_size - 8)
    return st_error(path, "header size " + std::to_string(n) + " exceeds the file size " +
                              std::to_string(file_size) + " (truncated?)");
  std::string text(n, '\0');
  if (int err = st_pread_all(fd, text.data(), n, 8))
    return st_error(path, "reading header: " + pread_error_text(err));

  // nlohmann keeps the last of duplicate keys; a duplicated top-level name would hide an entry,
  // so the parser callback records them and the header is refused.
  std::set<std::string> seen;
  std::string duplicate;
  const auto note_keys = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& k) {
    if (depth == 1 && ev == nlohmann::json::parse_event_t::key && duplicate.empty() &&
        !seen.insert(k.get<std::string>()).second)
      duplicate = k.get<std::string>();
    return true;
  };
  const nlohmann::json j = nlohmann::json::parse(text, note_keys, /*allow_exceptions=*/false);
  if (j.is_discarded()) return st_error(path, "header is not valid JSON");
  if (!duplicate.empty()) return st_entry_error(path, duplicate, "name appears twice in header");
  if (!j.is_object()) return st_error(path, "header is not a JSON object");

  SafetensorsHeader h;
  h.data_start = 8 + n;
  h.file_size = file_size;
  const uint64_t data_size = file_size - h.data_start;
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return st_error(path, "\"__metadata__\" is not a JSON object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          return st_error(path, "\"__metadata__\" value for '" + k + "' is not a string");
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e;
    if (std::string why = st_parse_entry(value, &e); !why.empty())
      return st_entry_error(path, name, why);
    const std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
    if (e.begin > e.end) return st_entry_error(path, name, "data_offsets " + range + " reversed");
    if (e.end > data_size)
      return st_entry_error(path, name,
                            "data_offsets " + range + " run past the data region of " +
                                std::to_string(data_size) + " bytes (truncated?)");
    uint64_t expect = 0;
    if (!st_nbytes(e.shape, safetensors_dtype_size(e.dtype), &expect))
      return st_entry_error(path, name, "shape " + shape_text(e.shape) + " overflows 64 bits");
    if (expect != e.end - e.begin)
      return st_entry_error(path, name,
                            "data_offsets " + range + " hold " + std::to_string(e.end - e.begin) +
                                " bytes but shape " + shape_text(e.shape) + " " + e.dtype +
                                " needs " + std::to_string(expect));
    h.entries.emplace(name, std::move(e));
  }

  // No two non-empty entries may share a byte: sorted by begin, each starts at or after the
  // end of the one before. (Gaps are allowed by the specification's wording; we never write them.)
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> byoff;
  for (const auto& [name, e] : h.entries)
    if (e.end > e.begin) byoff.emplace_back(&name, &e);
  std::sort(byoff.begin(), byoff.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < byoff.size(); ++i)
    if (byoff[i].second->begin < byoff[i - 1].second->end)
      return st_entry_error(path, *byoff[i].first,
                            "bytes [" + std::to_string(byoff[i].second->begin) + ", " +
                                std::to_string(byoff[i].second->end) + ") overlap entry '" +
                                *byoff[i - 1].first + "' [" +
                                std::to_string(byoff[i - 1].second->begin) + ", " +
                                std::to_string(byoff[i - 1].second->end) + ")");
  *out = std::move(h);
  return Status::ok();
}

Status safetensors_read_entry(const std::string& path, const SafetensorsHeader& header,
                              const std::string& name, void* dst, size_t nbytes) {
  const auto it = header.entries.find(name);
  if (it == header.entries.end()) return st_entry_error(path, name, "no such entry");
  const SafetensorsEntry& e = it->second;
  if (e.begin > e.end || e.end - e.begin != nbytes)
    return st_entry_error(path, name,
                          "holds " + std::to_string(e.end - e.begin) +
                              " bytes, caller's buffer is " + std::to_string(nbytes));
  if (header.data_start > header.file_size || e.end > header.file_size - header.data_start)
    return st_entry_error(path, name, "data_offsets lie outside the file (header not from it?)");
  if (nbytes == 0) return Status::ok();
  if (dst == nullptr) return st_entry_error(path, name, "null destination");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return st_error(path, "cannot open: " + errno_text(errno));
  FdCloser closer(fd);
  ::posix_fadvise(fd, static_cast<off_t>(header.data_start + e.begin), static_cast<off_t>(nbytes),
                  POSIX_FADV_SEQUENTIAL);
  if (int err = st_pread_all(fd, dst, nbytes, header.data_start + e.begin))
    return st_entry_error(path, name, "read: " + pread_error_text(err));
  return Status::ok();
}

}  // namespace weft
