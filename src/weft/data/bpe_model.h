// Byte-level BPE, the model behind GPT-2's vocab.json/merges.txt and the "BPE" model of a
// Hugging Face tokenizer.json with a ByteLevel pre-tokenizer (GPT-2, Llama 3, Qwen 2/3,
// Mistral NeMo, DeepSeek V3): a piece of text is split into its bytes, each byte written as
// GPT-2's printable stand-in character (byte_level_char), and the adjacent pair with the lowest
// merge rank is merged until no pair has a rank.
//
// Invariant: encode_piece merges as Hugging Face tokenizers do (the lowest rank first, the
// leftmost of equal ranks first), in O(n log n) for a piece of n bytes, so a long run without
// spaces cannot stall preprocessing. GPT-2's own loop (all occurrences of the best pair at
// once) gives the same tokens whenever each merge's parts come from earlier merges, as in every
// trained merges file; a hand-made file that ranks "ab a" before "a b" can differ.
// The model works on token ids and raw bytes only; the stand-in characters appear only while
// the vocabulary and merges are read.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace weft {

// GPT-2's bytes_to_unicode: bytes 33-126, 161-172 and 174-255 stand for themselves, the other
// 68 bytes for U+0100 upwards in byte order. Returns the stand-in's UTF-8 encoding.
const std::string& byte_level_char(uint8_t byte);

// The bytes a byte-level token string stands for; false when a character of it is not a
// stand-in (such a token, e.g. an added "<|endoftext|>" written in other characters, is
// matched by its text instead).
bool byte_level_bytes(std::string_view token, std::string* bytes);

class BpeModel {
 public:
  // vocab: token string (stand-in characters) -> id; merges: (left, right) token strings in
  // rank order. ignore_merges (tokenizer.json's flag, Llama 3's): a piece that is itself a token
  // is that token without merging. Throws UsageError "<what>: ..." on a merge whose parts or
  // result are not in the vocabulary.
  BpeModel(const std::vector<std::pair<std::string, int32_t>>& vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
           const std::string& what);

  // Appends the ids of one pre-tokenized piece (raw bytes) to *out. Throws UsageError naming
  // the byte when the vocabulary has no token for one of the piece's bytes.
  void encode_piece(std::string_view bytes, std::vector<int32_t>* out) const;

  // The raw bytes of a vocabulary id (nullptr for an id not in the vocabulary).
  const std::string* token_bytes(int32_t id) const;
  // The id of a vocabulary token given by its string (stand-in characters); -1 if absent.
  int32_t token_id(const std::string& token) const;
  int32_t max_id() const { return max_id_; }
  size_t size() const { return token_ids_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void merge(std::string_view piece, std::vector<int32_t>* out) const;

  // Pieces already merged (words recur): kCacheShards maps, each behind its own mutex so that
  // preprocessing workers rarely wait; a shard stops growing at kCacheShardEntries.
  static constexpr int kCacheShards = 16;
  static constexpr size_t kCacheShardEntries = 1 << 14, kCachePieceBytes = 64;
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> map;
  };
  std::unique_ptr<CacheShard[]> cache_{new CacheShard[kCacheShards]};

  std::unordered_map<std::string, int32_t> token_ids_;      // stand-in string -> id
  std::unordered_map<std::string, int32_t> bytes_ids_;      // raw bytes -> id
  std::unordered_map<int32_t, std::string> id_bytes_;       // id -> raw bytes
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t byte_ids_[256];
  bool ignore_merges_ = false;
  std::string what_;  // names the files in messages
  int32_t max_id_ = -1;
};

}  // namespace weft
