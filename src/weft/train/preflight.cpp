// Path checks before iteration 1 (see preflight.h).
#include "weft/train/preflight.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "weft/checkpoint/format.h"
#include "weft/core/error.h"
#include "weft/train/trainer.h"

namespace weft {
namespace fs = std::filesystem;
namespace {

// Creates `dir` with its missing parents and removes what it created when it goes out of
// scope (the checks leave no trace: a run refused later must not leave an empty --save behind;
// the trainer creates the directories again when it writes).
class ScopedDirs {
 public:
  explicit ScopedDirs(const fs::path& dir) {
    std::error_code ec;
    for (fs::path p = dir.lexically_normal(); !p.empty() && !fs::exists(p, ec);
         p = p.parent_path()) {
      created_.push_back(p);
      if (p == p.parent_path()) break;
    }
    fs::create_directories(dir, ec_);
  }
  ~ScopedDirs() {
    std::error_code ec;
    for (const fs::path& p : created_) fs::remove(p, ec);  // deepest first; only if empty
  }
  const std::error_code& error() const { return ec_; }

 private:
  std::vector<fs::path> created_;
  std::error_code ec_;
};

}  // namespace

void check_writable_dir(const std::string& dir, const std::string& flag) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    fail_usage("{} {}: exists and is not a directory", flag, dir);
  ScopedDirs made(dir);
  if (!fs::is_directory(dir, ec))
    fail_usage("{} {}: cannot create the directory{}", flag, dir,
               made.error() ? ": " + made.error().message() : std::string());
  // Unique per process, so that two jobs may probe one directory at once.
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  const std::string probe =
      (fs::path(dir) / fmt::format(".weft_probe_{}_{}", host, static_cast<long>(getpid()))).string();
  FILE* f = std::fopen(probe.c_str(), "wb");
  if (!f) fail_usage("{} {}: cannot write into the directory: {}", flag, dir, std::strerror(errno));
  const bool wrote = std::fputc('w', f) != EOF;
  const bool closed = std::fclose(f) == 0;
  const bool removed = std::remove(probe.c_str()) == 0;
  if (!wrote || !closed)
    fail_usage("{} {}: writing a file there failed: {}", flag, dir, std::strerror(errno));
  if (!removed)
    fail_usage("{} {}: cannot remove files there: {}", flag, dir, std::strerror(errno));
}

void check_appendable_file(const std::string& file, const std::string& flag) {
  std::error_code ec;
  const fs::path parent = fs::path(file).parent_path();
  ScopedDirs made(parent.empty() ? fs::path(".") : parent);
  if (!parent.empty() && !fs::is_directory(parent, ec))
    fail_usage("{} {}: cannot create its directory {}", flag, file, parent.string());
  if (fs::is_directory(file, ec)) fail_usage("{} {}: is a directory, not a file", flag, file);
  const bool existed = fs::exists(file, ec);
  FILE* f = std::fopen(file.c_str(), "a");
  if (!f) fail_usage("{} {}: cannot open for appending: {}", flag, file, std::strerror(errno));
  std::fclose(f);
  if (!existed) std::remove(file.c_str());
}

void check_load_dir(const std::string& dir, int step, const std::string& save,
                    bool exit_on_missing) {
  std::error_code ec;
  const bool same_as_save =
      !save.empty() && fs::path(dir).lexically_normal() == fs::path(save).lexically_normal();
  const bool also_save = !exit_on_missing && same_as_save;
  const char* why = exit_on_missing && same_as_save ? " (--exit-on-missing-checkpoint)" : "";
  if (!fs::is_directory(dir, ec)) {
    if (also_save && step < 0) return;  // nothing saved yet: train from scratch
    fail_usage("--load {}: no such directory{}", dir, why);
  }
  int iteration = step;
  if (iteration < 0) {
    if (!fs::exists(fs::path(dir) / kTrackerFile, ec)) {
      if (also_save) return;
      fail_usage("--load {}: holds no checkpoint (no {}){}; give the --save directory of an "
                 "earlier run, or drop --load to start from scratch", dir, kTrackerFile, why);
    }
    if (Status s = ckpt_read_tracker(dir, &iteration); !s) fail_usage("--load: {}", s.message());
  }
  const std::string it_dir = ckpt_iter_dir(dir, iteration);
  if (!fs::is_directory(it_dir, ec))
    fail_usage("--load {}: no checkpoint of iteration {} ({} is missing){}", dir, iteration,
               it_dir, step >= 0 ? " (--ckpt-step)" : "");
  nlohmann::json meta;
  CkptIndex index;
  if (Status s = ckpt_read_metadata(it_dir, &meta, &index); !s)
    fail_usage("--load {} (iteration {}): {}", dir, iteration, s.message());
}

int64_t free_bytes(const std::string& dir) {
  // The nearest existing ancestor: the directory itself is created only by the first save.
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec).lexically_normal();
  while (!fs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  struct statvfs st {};
  if (statvfs(p.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

void check_free_space(const std::string& dir, const std::string& flag, int64_t need) {
  const int64_t free = free_bytes(dir);
  if (free >= 0 && free < need)
    fail_usage("{} {}: one checkpoint needs {:.3f} GB but only {:.3f} GB are free there", flag,
               dir, need / 1e9, free / 1e9);
}

void check_train_paths(const TrainConfig& c, int rank) {
  if (!c.load.empty())  // reads only
    check_load_dir(c.load, c.ckpt_step, c.save, c.exit_on_missing_checkpoint);
  // Outputs are probed by rank 0 alone: the probes of several ranks in one directory would
  // race with the removal of what each created.
  if (rank != 0) return;
  if (!c.save.empty() && !c.skip_train) check_writable_dir(c.save, "--save");  // never written then
  if (!c.data_cache_path.empty() && c.real_data())
    check_writable_dir(c.data_cache_path, "--data-cache-path");
  if (c.profile.enabled && c.profile.pytorch && !c.profile.dir.empty())
    check_writable_dir(c.profile.dir, "--profile-dir");
  if (!c.log_jsonl.empty()) check_appendable_file(c.log_jsonl, "--log-jsonl");
  if (!c.dump_first_batch.empty()) check_appendable_file(c.dump_first_batch, "--dump-first-batch");
}

}  // namespace weft
