// Disk I/O measurement helpers (disk_io.h).
#include "disk_io.h"

#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "bench_mpi.h"

namespace weft::bench {
namespace fs = std::filesystem;

IoCounters io_counters() {
  IoCounters c;
  std::ifstream f("/proc/self/io");
  std::string key;
  int64_t v = 0;
  while (f >> key >> v) {
    if (key == "rchar:") c.rchar = v;
    else if (key == "wchar:") c.wchar = v;
    else if (key == "read_bytes:") c.read_bytes = v;
    else if (key == "write_bytes:") c.write_bytes = v;
  }
  return c;
}

IoCounters io_delta_over_ranks(const IoCounters& a, const IoCounters& b) {
  return {sum_over_ranks(b.rchar - a.rchar), sum_over_ranks(b.wchar - a.wchar),
          sum_over_ranks(b.read_bytes - a.read_bytes),
          sum_over_ranks(b.write_bytes - a.write_bytes)};
}

void check_errno(bool ok, const std::string& what) {
  if (!ok) weft::fail("bench_checkpoint: {}: {}", what, std::strerror(errno));
}

// Flushes the file's dirty pages (a no-op after the writer's fsync), then drops its pages from
// the page cache. Returns {bytes resident before, bytes resident after} per mincore.
std::pair<int64_t, int64_t> evict_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check_errno(fd >= 0, "open " + path);
  struct stat sb;
  check_errno(::fstat(fd, &sb) == 0, "fstat " + path);
  const int64_t size = sb.st_size;
  const long page = ::sysconf(_SC_PAGESIZE);
  auto resident = [&]() -> int64_t {
    if (size == 0) return 0;
    void* m = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
    check_errno(m != MAP_FAILED, "mmap " + path);
    std::vector<unsigned char> vec(static_cast<size_t>((size + page - 1) / page));
    check_errno(::mincore(m, static_cast<size_t>(size), vec.data()) == 0, "mincore " + path);
    ::munmap(m, static_cast<size_t>(size));
    int64_t n = 0;
    for (unsigned char v : vec) n += v & 1;
    return std::min(size, n * page);
  };
  check_errno(::fsync(fd) == 0, "fsync " + path);
  const int64_t before = resident();
  if (const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); rc != 0)
    weft::fail("bench_checkpoint: posix_fadvise(DONTNEED) {}: {}", path, std::strerror(rc));
  const int64_t after = resident();
  ::close(fd);
  return {before, after};
}


// Every regular file under `dir` (recursively), or `dir` itself when it is a file.
Eviction evict_tree(const std::string& dir) {
  Eviction e;
  auto one = [&](const fs::path& p) {
    auto [b, a] = evict_file(p.string());
    e.bytes += static_cast<int64_t>(fs::file_size(p));
    e.before += b;
    e.after += a;
  };
  if (fs::is_regular_file(dir)) {
    one(dir);
  } else {
    for (const auto& f : fs::recursive_directory_iterator(dir))
      if (f.is_regular_file()) one(f.path());
  }
  return e;
}

int64_t tree_bytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& f : fs::recursive_directory_iterator(dir))
    if (f.is_regular_file()) n += static_cast<int64_t>(f.file_size());
  return n;
}

// Commits the file system's dirty data and journal (deletions included, which this ext4 mount
// turns into discards), so that a timed region starts from a quiet device.
void sync_fs(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  check_errno(fd >= 0, "open " + dir);
  check_errno(::syncfs(fd) == 0, "syncfs " + dir);
  ::close(fd);
}

// ---- raw sequential baseline ---------------------------------------------------------------

// Writes `bytes` to `path` in `block`-byte write() calls, then fsyncs. With `advance` the calls
// walk through `src` (a buffer of `bytes`); otherwise every call writes the same first block.
// Returns the seconds spent in fsync (the rest is write() into the page cache).
double raw_write(const std::string& path, const char* src, int64_t block, int64_t bytes,
                 bool advance) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  check_errno(fd >= 0, "create " + path);
  int64_t done = 0;
  while (done < bytes) {
    const size_t n = static_cast<size_t>(std::min(bytes - done, block));
    const ssize_t w = ::write(fd, advance ? src + done : src, n);
    if (w < 0 && errno == EINTR) continue;
    check_errno(w > 0, "write " + path);
    done += w;
  }
  const double t0 = MPI_Wtime();
  check_errno(::fsync(fd) == 0, "fsync " + path);
  const double t = MPI_Wtime() - t0;
  check_errno(::close(fd) == 0, "close " + path);
  return t;
}

// Reads `path` to its end in `block`-byte read() calls into `dst` (walking through it with
// `advance`, else reusing its first block); the file must hold exactly `bytes`.
void raw_read(const std::string& path, char* dst, int64_t block, int64_t bytes, bool advance) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check_errno(fd >= 0, "open " + path);
  int64_t got = 0;
  for (;;) {
    const int64_t room = advance ? std::min(block, bytes - got) : block;
    if (room <= 0) break;
    const ssize_t r = ::read(fd, advance ? dst + got : dst, static_cast<size_t>(room));
    if (r < 0 && errno == EINTR) continue;
    check_errno(r >= 0, "read " + path);
    if (r == 0) break;
    got += r;
  }
  ::close(fd);
  if (got != bytes) weft::fail("bench_checkpoint: {}: read {} bytes, wrote {}", path, got, bytes);
}

// Writes `bytes` to a scratch file with fsync, evicts it and deletes it (untimed), so that the
// page-cache pages the next timed write gets were freed a moment ago. On a VM with virtio-balloon
// free page reporting (this one), free memory is handed back to the host about 2 s after it
// is freed, and write() into such pages runs at 0.4-0.8 GB/s instead of 5-7 GB/s; without this
// step a timed write's speed depends on what ran before it, not on the code or the disk.
void prewarm_page_cache(const std::string& path, int64_t bytes, std::vector<char>& buf) {
  raw_write(path, buf.data(), static_cast<int64_t>(buf.size()), bytes, false);
  evict_file(path);
  ::unlink(path.c_str());
}


}  // namespace weft::bench
