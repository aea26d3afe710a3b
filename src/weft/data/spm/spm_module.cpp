// weft's SentencePiece module: the functions of spm_module.h over SentencePieceProcessor and
// SentencePieceTrainer. Built as a MODULE library only where SentencePiece was found; see
// spm_module.h for why it is loaded apart from the rest of weft.
#include "spm_module.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

void set_err(char* err, size_t n, const std::string& msg) {
  if (err == nullptr || n == 0) return;
  std::strncpy(err, msg.c_str(), n - 1);
  err[n - 1] = '\0';
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* weft_spm_load(const char* path, char* err,
                                                            size_t err_len) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  auto st = sp->Load(path);
  if (!st.ok()) {
    set_err(err, err_len, st.ToString());
    delete sp;
    return nullptr;
  }
  return sp;
}

__attribute__((visibility("default"))) void weft_spm_free(void* h) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(h);
}

__attribute__((visibility("default"))) void weft_spm_info(void* h, WeftSpmInfo* info) {
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(h);
  info->vocab_size = sp->GetPieceSize();
  info->bos = sp->bos_id();
  info->eos = sp->eos_id();
  info->pad = sp->pad_id();
  info->unk = sp->unk_id();
}

__attribute__((visibility("default"))) int64_t weft_spm_encode(void* h, const char* text,
                                                               size_t len, const int32_t** ids) {
  thread_local std::vector<int> out;
  out.clear();
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(h);
  if (!sp->Encode(absl::string_view(text, len), &out).ok()) return -1;
  static_assert(sizeof(int) == sizeof(int32_t));
  *ids = reinterpret_cast<const int32_t*>(out.data());
  return static_cast<int64_t>(out.size());
}

__attribute__((visibility("default"))) int64_t weft_spm_piece(void* h, int32_t id,
                                                              const char** piece) {
  thread_local std::string out;
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(h);
  if (id < 0 || id >= sp->GetPieceSize()) return -1;
  out = sp->IdToPiece(id);
  *piece = out.data();
  return static_cast<int64_t>(out.size());
}

__attribute__((visibility("default"))) int64_t weft_spm_decode(void* h, const int32_t* ids,
                                                               int64_t n, const char** text) {
  thread_local std::string out;
  out.clear();
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(h);
  std::vector<int> v(ids, ids + n);
  for (int id : v)
    if (id < 0 || id >= sp->GetPieceSize()) return -1;
  if (!sp->Decode(v, &out).ok()) return -1;
  *text = out.data();
  return static_cast<int64_t>(out.size());
}

__attribute__((visibility("default"))) int weft_spm_train(const char* const* keys,
                                                          const char* const* values, int n,
                                                          char* err, size_t err_len) {
  std::unordered_map<std::string, std::string> kw;
  for (int i = 0; i < n; ++i) {
    if (std::strcmp(keys[i], "random_seed") == 0)
      sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(std::strtoul(values[i], nullptr, 10)));
    else
      kw[keys[i]] = values[i];
  }
  auto st = sentencepiece::SentencePieceTrainer::Train(kw);
  if (!st.ok()) {
    set_err(err, err_len, st.ToString());
    return 1;
  }
  return 0;
}
}
