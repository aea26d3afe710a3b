// Megatron's indexed dataset: PREFIX.bin (the token ids of every sequence, back to back, in one
// dtype) and PREFIX.idx (the index), byte-compatible with Megatron-LM's IndexedDatasetBuilder
// and MMapIndexedDataset. docs/data-format.md specifies both files.
//
// .idx, little-endian:
//   "MMIDIDX\0\0" (9 bytes) | u64 version = 1 | u8 dtype code | u64 sequence count S |
//   u64 document count D+1 | int32 sizes[S] | int64 pointers[S] (byte offsets into .bin) |
//   int64 document_indices[D+1] (sequence index where each document starts, then S)
// dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.
//
// The reader maps .bin (mmap) and never loads it whole; it copies the .idx arrays into aligned
// memory (20 bytes per sequence: in the file they sit at unaligned offsets after the 34-byte
// header). Every field is validated at open, with one message naming the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weft {

enum class IndexedDtype : uint8_t {
  kUInt8 = 1, kInt8 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5, kFloat64 = 6, kFloat32 = 7,
  kUInt16 = 8,
};
int indexed_dtype_size(IndexedDtype d);
// Megatron's DType.optimal_dtype: uint16 when vocab_size < 65500, else int32.
IndexedDtype optimal_indexed_dtype(int64_t vocab_size);

std::string idx_path(const std::string& prefix);  // PREFIX.idx
std::string bin_path(const std::string& prefix);  // PREFIX.bin

// Writes PREFIX.bin while sequences are added and PREFIX.idx at finalize(). Streaming: memory
// holds the index only. Files are written as PREFIX.bin.tmp / PREFIX.idx.tmp and renamed at
// finalize() (.bin first, .idx last), so a crash never leaves a dataset that looks complete; a
// builder destroyed without finalize() removes its temporary files. Not thread-safe.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(const std::string& prefix, IndexedDtype dtype);
  ~IndexedDatasetBuilder();
  // One sequence (Megatron's add_item); ids must fit the dtype (throws naming the value).
  void add_item(const int32_t* ids, int64_t n);
  void add_item(const std::vector<int32_t>& ids) { add_item(ids.data(), static_cast<int64_t>(ids.size())); }
  // Ends the current document (Megatron's end_document): the next sequence starts a new one.
  void end_document();
  // Appends another dataset with the same dtype (Megatron's add_index); its data must be stored
  // back to back from byte 0, as every builder writes it. An empty dataset is accepted here.
  void add_index(const std::string& other_prefix);
  void finalize();
  int64_t sequences() const;
  int64_t bytes_written() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Read-only, memory-mapped. Throws weft::UsageError naming the file for a missing file, a wrong
// magic, version or dtype code, counts that disagree with the file size, pointers or sizes
// beyond .bin, document indices that do not run from 0 to the sequence count without going
// back (equal neighbours, i.e. empty documents, are allowed as in Megatron), and a dataset with
// no sequence at all (refused here, so no consumer ever sees one).
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const;
  IndexedDtype dtype() const;
  int64_t num_sequences() const;
  int64_t num_documents() const;                     // document_indices().size() - 1
  const int32_t* sizes() const;                      // [num_sequences]
  const int64_t* pointers() const;                   // [num_sequences]
  const int64_t* document_indices() const;           // [num_documents + 1]
  // Copies `length` tokens of sequence `i` from `offset` into out, converted to int64.
  void read(int64_t i, int64_t offset, int64_t length, int64_t* out) const;
  std::vector<int64_t> sequence(int64_t i) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft
