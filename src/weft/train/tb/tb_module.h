// The C interface of weft's TensorBoard module (libweft_tb.so), which train/tensorboard.cpp
// loads with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why a module: the Event/Summary messages are serialised with libprotobuf, and the libtorch
// that weft links may carry its own protobuf (PyTorch's wheels build one in); linked into one
// symbol scope two copies can bind to each other. Loaded locally with deep binding, the module
// resolves protobuf to the copy it was linked with, and nothing else sees it. The same pattern
// as the SentencePiece module (data/spm/spm_module.h).
//
// Contract: only plain C types cross the boundary. The bytes returned through *out live in
// thread-local storage of the module and stay valid until the same thread's next call.
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {

// Serialises one tensorboard.Event (wire format of event.proto): with file_version != nullptr
// the file's version record, else a summary holding one scalar (tag, simple_value). Returns
// the byte count, or -1 on failure.
typedef int64_t (*weft_tb_encode_event_fn)(double wall_time, int64_t step,
                                           const char* file_version, const char* tag, float value,
                                           const char** out);
}
