// Checks of the path flags that run before iteration 1, so that a typo in --save, --load or
// --log-jsonl costs seconds instead of a day of training that then fails at its first save.
// Not safe for several processes probing one new directory at once (each removes what it
// created): one rank probes the outputs.
//
// Each check is local (no collectives) and throws UsageError with one line naming the flag.
// Writability is tested by doing it (create the directory, create and remove a probe file),
// not by looking at permission bits, so read-only mounts, /proc and full quotas are caught.
// The callers agree on the outcome across ranks (see app/cmd_train.cpp and
// Trainer::check_save_space).
#pragma once

#include <cstdint>
#include <string>

namespace weft {

struct TrainConfig;

// `dir` exists as a directory or can be created (with its parents), and a probe file can be
// created in it and removed again. Generic: any flag that names an output directory. Leaves no
// trace: what it created (directories, the probe) is removed again.
void check_writable_dir(const std::string& dir, const std::string& flag);
// `file`'s directory exists or can be created, and `file` opens for appending (existing content
// is kept). Leaves no trace, like check_writable_dir.
void check_appendable_file(const std::string& file, const std::string& flag);
// --load DIR [--ckpt-step N]: DIR holds a checkpoint (its tracker file and the iteration it
// names, or iteration N), and the checkpoint's metadata reads. A DIR that is also --save may
// be empty or missing (the restart-from-the-latest pattern: the first run has nothing to load),
// unless `exit_on_missing` (--exit-on-missing-checkpoint).
void check_load_dir(const std::string& dir, int step, const std::string& save,
                    bool exit_on_missing = false);
// Bytes that an unprivileged user may still write on the filesystem holding `dir` (statvfs
// f_bavail * f_frsize; `dir` or its nearest existing ancestor); -1 when that cannot be found out.
int64_t free_bytes(const std::string& dir);
// Throws UsageError naming `flag` when the filesystem of `dir` has fewer than `need` free bytes.
void check_free_space(const std::string& dir, const std::string& flag, int64_t need);
// Every path flag of `cfg`: --load (read) on every rank; the outputs (--save, --data-cache-path,
// --profile-dir, --log-jsonl, --dump-first-batch) on rank 0 only, since every rank writes into
// the one --save directory (it must be shared) and the probes of several ranks would race.
void check_train_paths(const TrainConfig& cfg, int rank);

}  // namespace weft
