// Loading weft's own plugin modules (libweft_spm.so, libweft_tb.so): libraries that carry a
// dependency whose symbols would clash with libtorch's (Debian's protobuf), so they are
// dlopen'ed with RTLD_LOCAL | RTLD_DEEPBIND instead of linked.
#pragma once

#include <string>

namespace weft {

// Opens the module from, in order: the path in environment variable `env_var` (when set),
// `built_path` (where the build put it), and `file_name` beside the running executable.
// Returns the handle, or nullptr with every attempt's dlerror() in *error.
void* open_module(const char* env_var, const char* built_path, const char* file_name,
                  std::string* error);

}  // namespace weft
