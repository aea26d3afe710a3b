// The C interface of weft's SentencePiece module (libweft_spm.so), which tokenizer.cpp loads
// with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why a module: Debian's libsentencepiece embeds its own protobuf-lite and exports it, while
// libtorch loads libprotobuf 3.21; linked into one symbol scope the two copies bind to each
// other and the process crashes during start-up. Loaded locally with deep binding,
// SentencePiece resolves to its own copy and nothing else sees it.
//
// Contract: only plain C types cross the boundary, no allocation is freed on the other side.
// Results returned as pointers live in thread-local storage of the module and stay valid until
// the same thread's next call of the same function. A handle may be used from many threads.
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {

struct WeftSpmInfo {
  int32_t vocab_size, bos, eos, pad, unk;  // -1: the model has no such piece
};

// Loads a .model file; nullptr on failure with the reason in err.
typedef void* (*weft_spm_load_fn)(const char* path, char* err, size_t err_len);
typedef void (*weft_spm_free_fn)(void* handle);
typedef void (*weft_spm_info_fn)(void* handle, WeftSpmInfo* info);
// Ids of `text`; returns the count (-1 on failure) and sets *ids.
typedef int64_t (*weft_spm_encode_fn)(void* handle, const char* text, size_t len,
                                      const int32_t** ids);
// The piece of `id`; returns its byte count (-1 for an id outside the model) and sets *piece.
typedef int64_t (*weft_spm_piece_fn)(void* handle, int32_t id, const char** piece);
// Text of `ids`; returns the byte count (-1 on failure) and sets *text.
typedef int64_t (*weft_spm_decode_fn)(void* handle, const int32_t* ids, int64_t n,
                                      const char** text);
// SentencePieceTrainer::Train with n key=value options; 0 on success, else err is set. The key
// random_seed is taken by the module (SetRandomGeneratorSeed) instead of passed on.
typedef int (*weft_spm_train_fn)(const char* const* keys, const char* const* values, int n,
                                 char* err, size_t err_len);
}
