// Disk I/O measurement helpers of bench_checkpoint: /proc/self/io counters, page-cache eviction
// (posix_fadvise DONTNEED, checked with mincore), file-system sync, and the raw sequential
// write/read baseline. Linux only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace weft::bench {

// This process's I/O counters (/proc/self/io): bytes through read/write syscalls and bytes the
// block layer moved for it.
struct IoCounters {
  int64_t rchar = 0, wchar = 0, read_bytes = 0, write_bytes = 0;
};

// Now, for this process.
IoCounters io_counters();
// b - a, each counter summed over the ranks (collective).
IoCounters io_delta_over_ranks(const IoCounters& a, const IoCounters& b);
// Throws, naming `what` and errno's text, unless `ok`.
void check_errno(bool ok, const std::string& what);

// Flushes the file's dirty pages (a no-op after the writer's fsync), then drops its pages from
// the page cache. Returns {bytes resident before, bytes resident after} per mincore.
std::pair<int64_t, int64_t> evict_file(const std::string& path);

struct Eviction {
  int64_t bytes = 0, before = 0, after = 0;
};

// Every regular file under `dir` (recursively), or `dir` itself when it is a file.
Eviction evict_tree(const std::string& dir);

// The bytes of every regular file under `dir`.
int64_t tree_bytes(const std::string& dir);

// Commits the file system's dirty data and journal (deletions included, which this ext4 mount
// turns into discards), so that a timed region starts from a quiet device.
void sync_fs(const std::string& dir);

// ---- raw sequential baseline ---------------------------------------------------------------

// Writes `bytes` to `path` in `block`-byte write() calls, then fsyncs. With `advance` the calls
// walk through `src` (a buffer of `bytes`); otherwise every call writes the same first block.
// Returns the seconds spent in fsync (the rest is write() into the page cache).
double raw_write(const std::string& path, const char* src, int64_t block, int64_t bytes,
                 bool advance);

// Reads `path` to its end in `block`-byte read() calls into `dst` (walking through it with
// `advance`, else reusing its first block); the file must hold exactly `bytes`.
void raw_read(const std::string& path, char* dst, int64_t block, int64_t bytes, bool advance);

// Writes `bytes` to a scratch file with fsync, evicts it and deletes it (untimed), so that the
// page-cache pages the next timed write gets were freed a moment ago. On a VM with virtio-balloon
// free page reporting (this one), free memory is handed back to the host about 2 s after it
// is freed, and write() into such pages runs at 0.4-0.8 GB/s instead of 5-7 GB/s; without this
// step a timed write's speed depends on what ran before it, not on the code or the disk.
void prewarm_page_cache(const std::string& path, int64_t bytes, std::vector<char>& buf);

}  // namespace weft::bench
