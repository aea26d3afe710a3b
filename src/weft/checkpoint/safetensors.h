// Reading and writing safetensors files, implemented from the safetensors specification:
// 8 bytes little-endian u64 N, then N bytes of UTF-8 JSON header, then the data region. The
// header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets
// into the data region, end exclusive) and may hold "__metadata__", a map of string to string.
// Entries are laid out back to back in the order given, and the header is padded with spaces
// to a multiple of 8 bytes so that every tensor starts 8-byte aligned.
//
// Contract: safetensors_write writes the file completely and fsyncs it before returning ok;
// on any error it removes the partial file. Readers never trust the header: offsets, sizes and
// dtype widths are checked against the file size and each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "weft/core/status.h"

namespace weft {

// Safetensors dtype names: "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL".
size_t safetensors_dtype_size(const std::string& dtype);  // 0 for an unknown dtype

struct SafetensorsWriteEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // nbytes readable bytes; must stay valid during the call
  size_t nbytes = 0;           // must equal prod(shape) * dtype size
};

// Writes `entries` and `metadata` to `path` (truncating it), fsyncs the file.
Status safetensors_write(const std::string& path, const std::vector<SafetensorsWriteEntry>& entries,
                         const std::map<std::string, std::string>& metadata);

// Hands out entry `entry`'s bytes [offset, offset + n): *out must point at them until the next
// call (e.g. into memory the source owns, or a staging buffer it filled from a GPU).
using SafetensorsBlockSource =
    std::function<Status(size_t entry, size_t offset, size_t n, const void** out)>;
// The header's "__metadata__" given each entry's CRC-32C (zeros when sizing the header). Both
// calls must encode to the same length (e.g. checksums as fixed-width hex).
using SafetensorsMetadataFn =
    std::function<std::map<std::string, std::string>(const std::vector<uint32_t>& crcs)>;

// Like safetensors_write, with the data produced block by block (entries' `data` unused) and
// checksummed on the way: the data region is written first, behind room for the header, with
// the device's writeback started every 256 MiB; then the header with the final checksums at
// offset 0; then fsync. *crcs receives each entry's CRC-32C. Same failure contract, also when
// `data` throws (the partial file is removed, then the exception goes on).
Status safetensors_write_streamed(const std::string& path,
                                  const std::vector<SafetensorsWriteEntry>& entries,
                                  const SafetensorsBlockSource& data,
                                  const SafetensorsMetadataFn& metadata, size_t block_bytes,
                                  std::vector<uint32_t>* crcs);

struct SafetensorsEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // offsets into the data region
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data region (8 + N)
  uint64_t file_size = 0;
};

// Parses and checks the header of `path` (every entry inside the file, sizes matching shapes).
Status safetensors_read_header(const std::string& path, SafetensorsHeader* out);

// Reads the bytes of entry `name` into `dst` (exactly end - begin bytes).
Status safetensors_read_entry(const std::string& path, const SafetensorsHeader& header,
                              const std::string& name, void* dst, size_t nbytes);

}  // namespace weft
