// remove_tree (see remove_tree.h): a depth-first nftw walk that unlinks files and removes
// directories after their contents.
#include "weft/core/remove_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace weft {
namespace {

thread_local std::string t_failure;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (::remove(path) == 0 || errno == ENOENT) return 0;
  t_failure = std::string(path) + ": " + std::strerror(errno);
  return 1;
}

}  // namespace

Status remove_tree(const std::string& path) {
  struct stat sb;
  if (::lstat(path.c_str(), &sb) != 0)
    return errno == ENOENT ? Status::ok()
                           : Status::error(path + ": " + std::strerror(errno));
  t_failure.clear();
  const int rc = ::nftw(path.c_str(), remove_entry, 32, FTW_DEPTH | FTW_PHYS);
  if (rc == 0) return Status::ok();
  if (!t_failure.empty()) return Status::error("cannot remove " + t_failure);
  return Status::error(path + ": " + std::strerror(errno));
}

}  // namespace weft
