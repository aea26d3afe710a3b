// `weft ckpt export|import --format hf` as library calls: the checkpoint-side glue between a weft
// checkpoint (metadata config, tokenizer identity, fp32 master weights) and the Hugging Face
// layout of checkpoint/hf_export.h and checkpoint/hf_import.h (docs/hf-interop.md).
//
// Invariant: hf_import_checkpoint(dir, A) then hf_export_checkpoint(A, B) reproduces dir's
// tensors bitwise and, for a directory that hf_export_checkpoint wrote, byte-identical files.
#pragma once

#include <cstdint>
#include <string>

#include "weft/checkpoint/hf_export.h"

namespace weft {

// Exports the checkpoint `ckpt` (a save directory, its tracker's latest, or an iter_NNNNNNN
// directory) to `out`. Throws UsageError for bad input, Error on I/O failure.
void hf_export_checkpoint(const std::string& ckpt, const std::string& out,
                          const HfExportOptions& options);

// Imports the Hugging Face directory `hf_dir` as a weights-only weft checkpoint at `out`
// (iteration 0, world-1 layout, float32 weights), loadable with `weft train --load out
// --finetune` on any layout. Every name and shape is checked before anything is written; then
// one weight at a time is read, converted and written (host memory: a few times the largest
// tensor).
struct HfImportStats {
  int64_t tensors = 0;     // weft tensors written
  int64_t parameters = 0;  // their elements
  int64_t bytes = 0;       // their stored bytes
};
// `dtype` (`weft ckpt import --dtype`): how the weights are stored: "fp32" (the master's
// dtype), "bf16" (F32 and F16 sources rounded to nearest even, except NemotronH's expert bias,
// kept as its files hold it), or "source" (each weight in the dtype its files hold it in:
// exact, half the bytes of float32 for a bf16 model). Any of them loads into the float32
// master.
HfImportStats hf_import_checkpoint(const std::string& hf_dir, const std::string& out,
                                   const std::string& dtype = "fp32");

}  // namespace weft
