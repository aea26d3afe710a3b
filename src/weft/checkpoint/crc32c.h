// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected 0x82F63B78), the checksum of every
// checkpoint chunk. Uses the SSE4.2 crc32 instruction where the CPU has it (checked at run
// time) and a table-driven implementation elsewhere; both give identical results.
#pragma once

#include <cstddef>
#include <cstdint>

namespace weft {

// Extends `crc` (start with 0) over `n` bytes at `data`; crc32c_extend(crc32c_extend(0,a),b)
// equals the CRC of a followed by b.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

}  // namespace weft
