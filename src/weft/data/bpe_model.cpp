// Byte-level BPE (bpe_model.h). Written here rather than taken from a library: Debian packages
// no BPE tokenizer for C++, and the merge loop is small. Merges run on a linked list of symbols
// with a min-heap of candidate pairs keyed (rank, position), the order in which GPT-2's encoder
// and Hugging Face tokenizers merge.
#include "weft/data/bpe_model.h"

#include <array>
#include <queue>

#include "weft/core/error.h"

namespace weft {
namespace {

struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::array<int16_t, 512> byte_of_cp;  // -1: not a stand-in
  ByteLevelTables() {
    byte_of_cp.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const int cp = printable ? b : next++;
      byte_of_cp[static_cast<size_t>(cp)] = static_cast<int16_t>(b);
      std::string& s = chars[static_cast<size_t>(b)];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {  // every stand-in is below U+0800: two bytes
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

const std::string& byte_level_char(uint8_t byte) { return tables().chars[byte]; }

bool byte_level_bytes(std::string_view token, std::string* bytes) {
  const auto& t = tables();
  bytes->clear();
  for (size_t i = 0; i < token.size();) {
    const auto c = static_cast<unsigned char>(token[i]);
    int cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;  // three- and four-byte characters are never stand-ins
    }
    if (cp >= 512 || t.byte_of_cp[static_cast<size_t>(cp)] < 0) return false;
    bytes->push_back(static_cast<char>(t.byte_of_cp[static_cast<size_t>(cp)]));
  }
  return true;
}

BpeModel::BpeModel(const std::vector<std::pair<std::string, int32_t>>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   bool ignore_merges, const std::string& what)
    : ignore_merges_(ignore_merges), what_(what) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  std::string bytes;
  for (const auto& [token, id] : vocab) {
    if (id < 0) fail_usage("{}: token {:?} has the negative id {}", what, token, id);
    token_ids_[token] = id;
    max_id_ = std::max(max_id_, id);
    if (byte_level_bytes(token, &bytes)) {
      bytes_ids_[bytes] = id;
      if (bytes.size() == 1) byte_ids_[static_cast<uint8_t>(bytes[0])] = id;
      id_bytes_[id] = bytes;
    } else {
      id_bytes_[id] = token;  // not byte-level text: decodes as written
    }
  }
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const int32_t ia = token_id(a), ib = token_id(b), iab = token_id(a + b);
    if (ia < 0 || ib < 0 || iab < 0)
      fail_usage("{}: merge {} \"{} {}\" names a token that is not in the vocabulary ({:?})", what,
                 r, a, b, ia < 0 ? a : ib < 0 ? b : a + b);
    // A repeated pair keeps its first (lowest) rank, as the reference implementations do.
    merges_.try_emplace(pair_key(ia, ib), Merge{static_cast<int32_t>(r), iab});
  }
}

int32_t BpeModel::token_id(const std::string& token) const {
  auto it = token_ids_.find(token);
  return it == token_ids_.end() ? -1 : it->second;
}

const std::string* BpeModel::token_bytes(int32_t id) const {
  auto it = id_bytes_.find(id);
  return it == id_bytes_.end() ? nullptr : &it->second;
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (piece.size() > kCachePieceBytes) return merge(piece, out);
  const size_t h = std::hash<std::string_view>()(piece);
  CacheShard& shard = cache_[h % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(std::string(piece));
    if (it != shard.map.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out->size();
  merge(piece, out);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() < kCacheShardEntries)
    shard.map.emplace(std::string(piece), std::vector<int32_t>(out->begin() + static_cast<std::ptrdiff_t>(before), out->end()));
}

void BpeModel::merge(std::string_view piece, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    auto it = bytes_ids_.find(std::string(piece));
    if (it != bytes_ids_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const int n = static_cast<int>(piece.size());
  struct Symbol {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto b = static_cast<uint8_t>(piece[static_cast<size_t>(i)]);
    if (byte_ids_[b] < 0)
      fail_usage("{}: the vocabulary has no token for the byte 0x{:02x} of a text", what_, b);
    sym[static_cast<size_t>(i)] = {byte_ids_[b], i - 1, i + 1 < n ? i + 1 : -1, true};
  }
  if (n == 1) {
    out->push_back(sym[0].id);
    return;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t left, right;  // the ids the pair had when it was queued
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto queue_pair = [&](int pos) {
    const int next = sym[static_cast<size_t>(pos)].next;
    if (next < 0) return;
    const int32_t l = sym[static_cast<size_t>(pos)].id, r = sym[static_cast<size_t>(next)].id;
    auto it = merges_.find(pair_key(l, r));
    if (it != merges_.end()) heap.push({it->second.rank, pos, l, r});
  };
  for (int i = 0; i + 1 < n; ++i) queue_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& s = sym[static_cast<size_t>(c.pos)];
    if (!s.alive || s.id != c.left || s.next < 0) continue;
    Symbol& t = sym[static_cast<size_t>(s.next)];
    if (t.id != c.right) continue;  // stale: a neighbour merged since
    s.id = merges_.at(pair_key(c.left, c.right)).merged;
    t.alive = false;
    s.next = t.next;
    if (s.next >= 0) sym[static_cast<size_t>(s.next)].prev = c.pos;
    if (s.prev >= 0) queue_pair(s.prev);
    queue_pair(c.pos);
  }
  for (int i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) out->push_back(sym[static_cast<size_t>(i)].id);
}

}  // namespace weft
