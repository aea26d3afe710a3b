// See module.h.
#include "weft/core/module.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace weft {
namespace {

std::string exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.parent_path().string();
}

}  // namespace

void* open_module(const char* env_var, const char* built_path, const char* file_name,
                  std::string* error) {
  std::vector<std::string> tried;
  if (const char* env = std::getenv(env_var)) tried.push_back(env);
  tried.push_back(built_path);
  tried.push_back(exe_dir() + "/" + file_name);
  error->clear();
  for (const auto& path : tried) {
    if (void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)) return h;
    const char* e = ::dlerror();
    *error += (error->empty() ? "" : "; ") + std::string(e ? e : path + ": not loadable");
  }
  return nullptr;
}

}  // namespace weft
