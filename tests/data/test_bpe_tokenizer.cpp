// The byte-level BPE pieces on hand-made vocabularies whose answers are worked out by hand:
// GPT-2's byte stand-ins, the merge order (lowest rank first, leftmost of equal ranks), the
// split behaviours the reference script does not cover, added tokens, the template, NFC, the
// decode round trip, and a long piece that a quadratic merge loop would stall on. The
// comparison with an independent implementation on real-sized pipelines is
// tests/app/tokenizers.sh. Built where ICU was found.
#include <gtest/gtest.h>

#include <random>

#include "weft/core/error.h"
#include "weft/data/bpe_tokenizer.h"

namespace weft {
namespace {

using Ids = std::vector<int32_t>;
using Merges = std::vector<std::pair<std::string, std::string>>;

TEST(BpeBytes, Gpt2StandIns) {
  EXPECT_EQ(byte_level_char('a'), "a");
  EXPECT_EQ(byte_level_char('!'), "!");
  EXPECT_EQ(byte_level_char(' '), "\u0120");   // "Ġ"
  EXPECT_EQ(byte_level_char('\n'), "\u010a");  // "Ċ"
  EXPECT_EQ(byte_level_char(0), "\u0100");
  EXPECT_EQ(byte_level_char(127), "\u0121");
  EXPECT_EQ(byte_level_char(0xAD), "\u0143");  // the soft hyphen, the last of the 68
  EXPECT_EQ(byte_level_char(0xE9), "\u00e9");
  std::string bytes;
  for (int b = 0; b < 256; ++b) {
    ASSERT_TRUE(byte_level_bytes(byte_level_char(static_cast<uint8_t>(b)), &bytes));
    ASSERT_EQ(bytes, std::string(1, static_cast<char>(b)));
  }
  EXPECT_FALSE(byte_level_bytes("\u4e2d", &bytes));  // not a stand-in
}

// A vocabulary of the 256 bytes (id = byte) and then the merged tokens, in order.
struct Toy {
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  explicit Toy(const Merges& m) : merges(m) {
    for (int b = 0; b < 256; ++b) vocab.emplace_back(byte_level_char(static_cast<uint8_t>(b)), b);
    for (const auto& [a, c] : m) vocab.emplace_back(a + c, static_cast<int32_t>(vocab.size()));
  }
  int32_t id(const std::string& t) const {
    for (const auto& [s, i] : vocab)
      if (s == t) return i;
    return -1;
  }
};

TEST(BpeModel, LowestRankFirstThenLeftmost) {
  // "abc": a b (rank 0) before b c (rank 1) gives [ab, c]; listing b c first gives [a, bc].
  Toy t1(Merges{{"a", "b"}, {"b", "c"}});
  BpeModel m1(t1.vocab, t1.merges, false, "toy");
  Ids out;
  m1.encode_piece("abc", &out);
  EXPECT_EQ(out, (Ids{t1.id("ab"), 'c'}));
  Toy t2(Merges{{"b", "c"}, {"a", "b"}});
  BpeModel m2(t2.vocab, t2.merges, false, "toy");
  out.clear();
  m2.encode_piece("abc", &out);
  EXPECT_EQ(out, (Ids{'a', t2.id("bc")}));
  // Equal pairs: the leftmost merges first, so "aaa" is [aa, a], never [a, aa].
  Toy t3(Merges{{"a", "a"}});
  BpeModel m3(t3.vocab, t3.merges, false, "toy");
  out.clear();
  m3.encode_piece("aaa", &out);
  EXPECT_EQ(out, (Ids{t3.id("aa"), 'a'}));
  // Merges build on merges: aa aa -> aaaa.
  Toy t4(Merges{{"a", "a"}, {"aa", "aa"}});
  BpeModel m4(t4.vocab, t4.merges, false, "toy");
  out.clear();
  m4.encode_piece("aaaaa", &out);
  EXPECT_EQ(out, (Ids{t4.id("aaaa"), 'a'}));
}

TEST(BpeModel, IgnoreMergesTakesAWholeToken) {
  // "abc" is in the vocabulary, but no merge chain reaches it from a b c with these ranks.
  Toy t(Merges{{"b", "c"}, {"a", "b"}, {"ab", "c"}});
  BpeModel plain(t.vocab, t.merges, false, "toy"), ignore(t.vocab, t.merges, true, "toy");
  Ids a, b;
  plain.encode_piece("abc", &a);
  ignore.encode_piece("abc", &b);
  EXPECT_EQ(a, (Ids{'a', t.id("bc")}));
  EXPECT_EQ(b, (Ids{t.id("abc")}));
}

TEST(BpeModel, LongPieceMergesInNLogN) {
  // 400k bytes of one letter: a quadratic merge loop would take hours here.
  Toy t(Merges{{"x", "x"}, {"xx", "xx"}, {"xxxx", "xxxx"}});
  BpeModel m(t.vocab, t.merges, false, "toy");
  Ids out;
  m.encode_piece(std::string(400000 + 3, 'x'), &out);
  ASSERT_EQ(out.size(), 50000u + 2);
  EXPECT_EQ(out.front(), t.id("xxxxxxxx"));
  EXPECT_EQ(out[50000], t.id("xx"));
  EXPECT_EQ(out[50001], 'x');
}

TEST(BpeModel, RefusesAMergeOutsideTheVocabulary) {
  Toy t(Merges{{"a", "b"}});
  t.merges.emplace_back("q", "zz");
  try {
    BpeModel m(t.vocab, t.merges, false, "--merge-file m.txt");
    FAIL() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--merge-file m.txt: merge 1 \"q zz\""), std::string::npos)
        << e.what();
  }
}

BpePipeline pipeline(const Toy& t) {
  BpePipeline p;
  p.model = std::make_shared<BpeModel>(t.vocab, t.merges, false, "toy");
  p.eod = 0;
  return p;
}

PreTokenizerStep split(const std::string& re, PreTokenizerStep::Behavior b) {
  PreTokenizerStep s;
  s.regex = std::make_shared<UnicodeRegex>(re, "test");
  s.behavior = b;
  return s;
}

TEST(BpeTokenizer, SplitBehaviours) {
  Toy t(Merges{{"a", "b"}, {"b", ","}, {",", "a"}});
  using B = PreTokenizerStep::Behavior;
  auto encode = [&](B b) {
    BpePipeline p = pipeline(t);
    p.pre.push_back(split(",", b));
    return make_bpe_tokenizer(std::move(p))->encode("ab,ab");
  };
  // Isolated: [ab] [,] [ab]; Removed: [ab] [ab]; with the previous: [ab,] [ab] -> ab , ab (the
  // rank of a b is lowest); with the next: [ab] [,ab] -> ab , ab as well, but the pieces differ:
  // check with "b,a" merges that only a joined piece can make.
  EXPECT_EQ(encode(B::kIsolated), (Ids{t.id("ab"), ',', t.id("ab")}));
  EXPECT_EQ(encode(B::kRemoved), (Ids{t.id("ab"), t.id("ab")}));
  Toy u(Merges{{"b", ","}, {",", "a"}});
  auto encode_u = [&](B b) {
    BpePipeline p = pipeline(u);
    p.pre.push_back(split(",", b));
    return make_bpe_tokenizer(std::move(p))->encode("ab,ab");
  };
  EXPECT_EQ(encode_u(B::kMergedWithPrevious), (Ids{'a', u.id("b,"), 'a', 'b'}));
  EXPECT_EQ(encode_u(B::kMergedWithNext), (Ids{'a', 'b', u.id(",a"), 'b'}));
  EXPECT_EQ(encode_u(B::kIsolated), (Ids{'a', 'b', ',', 'a', 'b'}));
}

TEST(BpeTokenizer, AddedTokensTemplateAndNfc) {
  Toy t(Merges{{"\u00c3", "\u00a9"}});  // the UTF-8 bytes of "é" (c3 a9) as stand-ins
  BpePipeline p = pipeline(t);
  p.nfc = true;
  p.added = {{"<s>", 300}, {"<sep>", 301, true, true}, {"<sep>x", 302}};
  p.prefix = {300};
  p.suffix = {299};
  p.bos = 300;
  auto tok = make_bpe_tokenizer(std::move(p));
  const int32_t e_acute = t.id("\u00c3\u00a9");
  // "e" + combining acute is "é" after NFC: one merged token.
  EXPECT_EQ(tok->encode("e\u0301"), (Ids{300, e_acute, 299}));
  // lstrip/rstrip swallow the spaces around <sep>; the longer "<sep>x" wins where it matches.
  EXPECT_EQ(tok->encode("a  <sep> b<sep>x"), (Ids{300, 'a', 301, 'b', 302, 299}));
  EXPECT_EQ(tok->vocab_size(), 303);
  EXPECT_EQ(tok->decode({300, 'h', 'i', 301, e_acute}), "<s>hi<sep>\u00e9");
  EXPECT_EQ(tok->identity()["vocab_size"], 303);
}

TEST(BpeTokenizer, DecodeInvertsEncodeOnRandomUtf8) {
  Toy t(Merges{{"\u0120", "t"}, {"h", "e"}, {"\u0120t", "he"}});
  BpePipeline p = pipeline(t);
  PreTokenizerStep s;
  s.kind = PreTokenizerStep::Kind::kByteLevel;
  s.regex = std::make_shared<UnicodeRegex>(kGpt2SplitPattern, "gpt2");
  p.pre.push_back(s);
  auto tok = make_bpe_tokenizer(std::move(p));
  EXPECT_EQ(tok->encode(" the"), (Ids{t.id("\u0120the")}));
  std::mt19937 rng(5);
  const char32_t pool[] = {U'a', U' ', U'\n', U'7', U'\u00e9', U'\u4e2d', U'\U0001F600', U'\'',
                           U'\t', U'!', U'\u0301'};
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    for (int k = 0; k < 30; ++k) {
      char32_t c = pool[rng() % (sizeof(pool) / sizeof(pool[0]))];
      if (c < 0x80) s.push_back(static_cast<char>(c));
      else if (c < 0x800) s += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
      else if (c < 0x10000)
        s += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
              static_cast<char>(0x80 | (c & 0x3F))};
      else
        s += {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
              static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
    }
    ASSERT_EQ(tok->decode(tok->encode(s)), s);
  }
}

TEST(BpeTokenizer, ByteLevelPrefixSpaceAndUnicodeStrip) {
  Toy t(Merges{{"\u0120", "h"}, {"\u0120h", "i"}});
  BpePipeline p = pipeline(t);
  PreTokenizerStep s;
  s.kind = PreTokenizerStep::Kind::kByteLevel;
  s.add_prefix_space = true;
  s.regex = std::make_shared<UnicodeRegex>(kGpt2SplitPattern, "gpt2");
  p.pre.push_back(s);
  p.added = {{"<u>", 300, true, true}};
  auto tok = make_bpe_tokenizer(std::move(p));
  const int32_t sp_hi = t.id("\u0120hi");
  EXPECT_EQ(tok->encode("hi"), (Ids{sp_hi}));     // " " prepended: one token
  EXPECT_EQ(tok->encode(" hi"), (Ids{sp_hi}));    // already there: not doubled
  // lstrip/rstrip take Unicode white space (no-break, ideographic, em space), not U+200B.
  EXPECT_EQ(tok->encode("hi\u00a0\u3000<u>\u2003 hi"), (Ids{sp_hi, 300, sp_hi}));
  const Ids zw = tok->encode("hi<u>\u200bhi");
  ASSERT_GE(zw.size(), 3u);
  EXPECT_EQ(zw[1], 300);
  EXPECT_NE(zw[2], sp_hi);  // U+200B stays text (a prefix space is added to that piece)
}

TEST(BpeTokenizer, DecodeReplacesInvalidUtf8AsPythonDoes) {
  Toy t(Merges{});
  auto tok = make_bpe_tokenizer(pipeline(t));
  auto dec = [&](std::initializer_list<int> bytes) {
    Ids ids(bytes.begin(), bytes.end());
    return tok->decode(ids);
  };
  const std::string r = "\uFFFD";
  // Each expectation is Python's bytes(...).decode("utf-8", "replace").
  EXPECT_EQ(dec({0xE4, 0xB8, 'a'}), r + "a");            // a cut three-byte character: one
  EXPECT_EQ(dec({0xE4, 0xB8, 0xAD}), "\u4e2d");          // whole: kept
  EXPECT_EQ(dec({0x80, 0x80}), r + r);                    // lone continuation bytes: one each
  EXPECT_EQ(dec({0xC0, 0xAF}), r + r);                    // overlong lead: invalid alone
  EXPECT_EQ(dec({0xED, 0xA0, 0x80}), r + r + r);          // a surrogate
  EXPECT_EQ(dec({0xF0, 0x9F, 0x98}), r);                  // a cut emoji
  EXPECT_EQ(dec({0xF4, 0x90, 0x80, 0x80}), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(dec({'x', 0xE4}), "x" + r);
}

TEST(UnicodeRegex, OffsetsAreBytesAndPropertiesWork) {
  UnicodeRegex re(R"(\p{L}+|\p{N}+)", "test");
  const std::string s = "\u00e9t\u00e9 42 \u4e2d\u6587!";
  auto m = re.find_all(s);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(s.substr(m[0].first, m[0].second - m[0].first), "\u00e9t\u00e9");
  EXPECT_EQ(s.substr(m[1].first, m[1].second - m[1].first), "42");
  EXPECT_EQ(s.substr(m[2].first, m[2].second - m[2].first), "\u4e2d\u6587");
  EXPECT_THROW(UnicodeRegex("(", "test"), UsageError);
  EXPECT_EQ(unicode_nfc("A\u030a"), "\u00c5");
  EXPECT_EQ(unicode_nfc("\u212b"), "\u00c5");  // the Angstrom sign composes to Å
}

}  // namespace
}  // namespace weft
