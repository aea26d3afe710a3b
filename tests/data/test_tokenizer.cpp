// The tokenizer (SentencePiece, trained here on a small text the test writes), its identity,
// SHA-256 against the FIPS 180-4 vectors, and preprocess_corpus: output independent of the
// worker count, equal to encoding each document directly, and every bad input refused with the
// file (and line) named and nothing left behind. Built only where SentencePiece was found.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "weft/core/error.h"
#include "weft/data/indexed_dataset.h"
#include "weft/data/preprocess.h"
#include "weft/data/sha256.h"
#include "weft/data/tokenizer.h"

namespace weft {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A deterministic English-like text: `n` lines of words drawn by a fixed LCG.
std::vector<std::string> make_lines(int n, uint32_t seed) {
  static const char* words[] = {"the", "model", "trains", "on", "tokens", "and", "a", "shard",
                                "of", "data", "moves", "between", "ranks", "quickly", "while",
                                "pipeline", "stages", "wait", "for", "gradients", "weft", "loss",
                                "optimizer", "moments", "checkpoint", "restarts", "exactly",
                                "experts", "route", "tokens", "through", "router", "softmax",
                                "embedding", "tied", "layers", "attention", "heads", "rotary",
                                "learning", "rate", "warmup", "cosine", "decay", "batch", "size",
                                "sequence", "length", "vocabulary", "merges", "bytes", "index",
                                "documents", "samples", "epochs", "shuffle", "seed", "split",
                                "validation", "test", "blend", "weights", "cache", "mmap", "file"};
  std::vector<std::string> lines;
  uint32_t x = seed;
  for (int i = 0; i < n; ++i) {
    std::string line;
    int len = 3 + static_cast<int>((x >> 7) % 12);
    for (int w = 0; w < len; ++w) {
      x = x * 1664525u + 1013904223u;
      if (w) line += ' ';
      line += words[(x >> 9) % (sizeof(words) / sizeof(words[0]))];
    }
    line += (x & 1) ? "." : "!";
    lines.push_back(line);
  }
  return lines;
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("weft_tok_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream f(dir_ / "corpus.txt");
    for (const auto& l : make_lines(2000, 7)) f << l << "\n";
    f.close();
    train_sentencepiece((dir_ / "corpus.txt").string(), 300, (dir_ / "tok").string(), 2);
    model_ = (dir_ / "tok.model").string();
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }
  // Runs preprocess_corpus and expects a UsageError mentioning every string in `parts`.
  void expect_refused(PreprocessOptions o, const std::vector<std::string>& parts) {
    auto tok = make_tokenizer("SentencePieceTokenizer", model_);
    o.log_interval = 0;
    try {
      preprocess_corpus(o, *tok);
      ADD_FAILURE() << "accepted bad input";
    } catch (const UsageError& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
    for (const auto& e : fs::directory_iterator(dir_))
      EXPECT_EQ(e.path().string().find(o.output_prefix), std::string::npos)
          << "left behind: " << e.path();
  }

  static fs::path dir_;
  static std::string model_;
};
fs::path TokenizerTest::dir_;
std::string TokenizerTest::model_;

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 s;  // one million 'a', fed in uneven pieces
  std::string a(997, 'a');
  for (int left = 1000000; left > 0; left -= 997) s.update(a.data(), std::min(left, 997));
  EXPECT_EQ(s.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_F(TokenizerTest, EncodeDecodeRoundTrip) {
  auto tok = make_tokenizer("GPTSentencePieceTokenizer", model_);
  EXPECT_EQ(tok->vocab_size(), 300);
  for (const std::string& s : {std::string("the model trains on tokens."),
                               std::string("weft  moves data between ranks!"), std::string("")}) {
    std::vector<int32_t> ids = tok->encode(s);
    for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < 300);
    EXPECT_EQ(tok->decode(ids), s);
  }
  EXPECT_LT(tok->encode("the model trains on tokens.").size(), 10u);  // merges were learnt
}

TEST_F(TokenizerTest, IdentityAndSpecialIds) {
  auto tok = make_tokenizer("GPTSentencePieceTokenizer", model_);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eod(), 2);  // eos
  EXPECT_EQ(tok->pad(), 3);
  nlohmann::json id = tok->identity();
  EXPECT_EQ(id["type"], "GPTSentencePieceTokenizer");
  EXPECT_EQ(id["model_file"], "tok.model");
  EXPECT_EQ(id["sha256"], sha256_file_hex(model_));
  EXPECT_EQ(id["vocab_size"], 300);
  EXPECT_EQ(id["eod"], 2);
  EXPECT_EQ(id["bos"], 1);
  EXPECT_EQ(id["pad"], 3);
}

// Megatron's default tokenizer system encodes the three SentencePiece types alike. Its legacy
// classes (--legacy-tokenizer) differ: SentencePieceTokenizer appends <CLS> <SEP> <EOD> <MASK>
// to the 300 pieces (the model's <pad>, <s>, </s> are pieces already), ends documents with
// <EOD> and reads those specials in a text as their ids; Llama2Tokenizer starts with bos.
TEST_F(TokenizerTest, MegatronSentencePieceFlavours) {
  auto legacy = [&](const char* type) {
    TokenizerFiles f;
    f.type = type;
    f.model = model_;
    f.legacy = true;
    return make_tokenizer(f);
  };
  auto gpt = make_tokenizer("GPTSentencePieceTokenizer", model_);
  for (const char* type : {"SentencePieceTokenizer", "Llama2Tokenizer"}) {
    auto plain = make_tokenizer(type, model_);
    EXPECT_EQ(plain->encode("the model<EOD>"), gpt->encode("the model<EOD>")) << type;
    EXPECT_EQ(plain->vocab_size(), 300) << type;
    EXPECT_EQ(plain->eod(), 2) << type;
  }
  EXPECT_EQ(legacy("GPTSentencePieceTokenizer")->encode("the model<EOD>"),
            gpt->encode("the model<EOD>"));
  auto meg = legacy("SentencePieceTokenizer");
  auto llama = legacy("Llama2Tokenizer");
  EXPECT_EQ(meg->identity()["legacy"], true);
  EXPECT_EQ(meg->vocab_size(), 304);
  EXPECT_EQ(meg->eod(), 302);
  EXPECT_EQ(meg->bos(), 1);
  EXPECT_EQ(meg->pad(), 3);
  EXPECT_EQ(meg->identity()["type"], "SentencePieceTokenizer");
  EXPECT_EQ(meg->identity()["vocab_size"], 304);
  EXPECT_FALSE(same_tokenizer(meg->identity(), make_tokenizer("SentencePieceTokenizer", model_)->identity()));
  EXPECT_FALSE(same_tokenizer(meg->identity(), gpt->identity()));
  auto cat = [](std::vector<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  const std::string a = "the model", b = " trains", c = "on tokens.";
  EXPECT_EQ(meg->encode(a + "<EOD>" + b + "</s><MASK>" + c),
            cat({gpt->encode(a), {302}, gpt->encode(b), {2, 303}, gpt->encode(c)}));
  EXPECT_EQ(meg->encode(a), gpt->encode(a));
  // GPTSentencePieceTokenizer reads the same text as characters: no id past its 300 pieces.
  for (int32_t id : gpt->encode(a + "<EOD>")) EXPECT_LT(id, 300);
  EXPECT_EQ(meg->decode(cat({gpt->encode(a), {302}, gpt->encode(c)})), a + " <EOD> " + c);
  EXPECT_EQ(llama->encode(a), cat({{1}, gpt->encode(a)}));
  EXPECT_EQ(llama->eod(), 2);
  EXPECT_EQ(llama->vocab_size(), 300);
  EXPECT_EQ(llama->identity()["type"], "Llama2Tokenizer");
}

TEST_F(TokenizerTest, SameTokenizer) {
  auto tok = make_tokenizer("SentencePieceTokenizer", model_);
  fs::copy_file(model_, path("copy.model"), fs::copy_options::overwrite_existing);
  auto copy = make_tokenizer("SentencePieceTokenizer", path("copy.model"));
  EXPECT_TRUE(same_tokenizer(tok->identity(), copy->identity()));  // the path does not matter
  nlohmann::json other = tok->identity();
  other["eod"] = 3;
  EXPECT_FALSE(same_tokenizer(tok->identity(), other));
  other = tok->identity();
  other.erase("sha256");
  EXPECT_FALSE(same_tokenizer(tok->identity(), other));
  // Training is deterministic (the model file records its trainer options, the output name
  // among them, so compare two runs with equal options); a different vocab size gives a
  // different tokenizer.
  train_sentencepiece(path("corpus.txt"), 300, path("again"), 2);
  const std::string first = sha256_file_hex(path("again.model"));
  train_sentencepiece(path("corpus.txt"), 300, path("again"), 2);
  EXPECT_EQ(sha256_file_hex(path("again.model")), first);
  auto again = make_tokenizer("SentencePieceTokenizer", path("again.model"));
  for (const auto& line : make_lines(50, 3)) EXPECT_EQ(again->encode(line), tok->encode(line));
  train_sentencepiece(path("corpus.txt"), 280, path("smaller"), 2);
  auto smaller = make_tokenizer("SentencePieceTokenizer", path("smaller.model"));
  EXPECT_FALSE(same_tokenizer(tok->identity(), smaller->identity()));
}

TEST_F(TokenizerTest, BadTokenizerArguments) {
  try {
    make_tokenizer("WordPieceTokenizer", model_);
    ADD_FAILURE();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer-type WordPieceTokenizer"), std::string::npos);
  }
  try {  // GPT-2's BPE reads --vocab-file and --merge-file, not --tokenizer-model
    make_tokenizer("GPT2BPETokenizer", model_);
    ADD_FAILURE();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab-file is required"), std::string::npos) << e.what();
  }
  try {
    make_tokenizer("SentencePieceTokenizer", path("missing.model"));
    ADD_FAILURE();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(path("missing.model")), std::string::npos) << e.what();
  }
  try {
    make_tokenizer("SentencePieceTokenizer", path("corpus.txt"));
    ADD_FAILURE();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(path("corpus.txt")), std::string::npos) << e.what();
  }
  EXPECT_THROW(train_sentencepiece(path("nope.txt"), 300, path("x"), 1), UsageError);
}

// --- preprocess_corpus ---------------------------------------------------------------------

TEST_F(TokenizerTest, PreprocessIsIndependentOfWorkersAndMatchesDirectEncoding) {
  // 3000 documents (several batches): strings, lists of strings, empty texts, a second key.
  auto lines = make_lines(3000, 99);
  std::string jsonl;
  for (size_t i = 0; i < lines.size(); ++i) {
    nlohmann::json j;
    if (i % 7 == 3) j["text"] = nlohmann::json::array({lines[i], lines[(i + 1) % lines.size()]});
    else if (i % 11 == 5) j["text"] = "";
    else j["text"] = lines[i] + "\nsecond line";
    j["title"] = "doc " + std::to_string(i);
    jsonl += j.dump() + "\n";
    if (i == 10) jsonl += "\n";  // a blank line is no document
  }
  write("corpus.jsonl", jsonl);
  auto tok = make_tokenizer("SentencePieceTokenizer", model_);
  PreprocessOptions o;
  o.input = path("corpus.jsonl");
  o.json_keys = {"text", "title"};
  o.append_eod = true;
  o.log_interval = 0;
  o.workers = 1;
  o.output_prefix = path("w1");
  PreprocessResult r1 = preprocess_corpus(o, *tok);
  o.workers = 3;
  o.output_prefix = path("w3");
  PreprocessResult r3 = preprocess_corpus(o, *tok);
  EXPECT_EQ(r1.documents, 3000);
  EXPECT_EQ(r1.tokens, r3.tokens);
  ASSERT_EQ(r1.output_prefixes[0], path("w1_text_document"));
  ASSERT_EQ(r3.output_prefixes[1], path("w3_title_document"));
  for (const char* key : {"text", "title"})
    for (const char* ext : {".bin", ".idx"}) {
      auto a = slurp(path(std::string("w1_") + key + "_document" + ext));
      EXPECT_FALSE(a.empty());
      EXPECT_EQ(a, slurp(path(std::string("w3_") + key + "_document" + ext))) << key << ext;
    }
  // Megatron's Encoder: each non-empty sentence one sequence, eod after the document's last.
  IndexedDataset ds(path("w3_text_document"));
  EXPECT_EQ(ds.dtype(), IndexedDtype::kUInt16);
  ASSERT_EQ(ds.num_documents(), 3000);
  for (int64_t d = 0; d < 3000; ++d) {
    std::vector<std::string> sents;
    if (d % 7 == 3) sents = {lines[d], lines[(d + 1) % lines.size()]};
    else if (d % 11 == 5) sents = {};
    else sents = {lines[d] + "\nsecond line"};
    std::vector<std::vector<int64_t>> want;
    for (const auto& s : sents) {
      auto ids = tok->encode(s);
      if (!ids.empty()) want.emplace_back(ids.begin(), ids.end());
    }
    if (!want.empty()) want.back().push_back(tok->eod());
    const int64_t s0 = ds.document_indices()[d], s1 = ds.document_indices()[d + 1];
    ASSERT_EQ(s1 - s0, static_cast<int64_t>(want.size())) << "document " << d;
    for (int64_t s = s0; s < s1; ++s) EXPECT_EQ(ds.sequence(s), want[s - s0]) << "document " << d;
  }
}

TEST_F(TokenizerTest, PreprocessTextFile) {
  write("plain.txt", "the model trains\r\n\nweft loss\n");
  auto tok = make_tokenizer("SentencePieceTokenizer", model_);
  PreprocessOptions o;
  o.input = path("plain.txt");
  o.output_prefix = path("plain");
  std::vector<std::string> logged;
  o.log = [&](const std::string& s) { logged.push_back(s); };
  preprocess_corpus(o, *tok);
  ASSERT_FALSE(logged.empty());
  EXPECT_NE(logged.back().find("processed 3 documents"), std::string::npos) << logged.back();
  IndexedDataset ds(path("plain_text_document"));
  EXPECT_EQ(ds.num_documents(), 3);  // the empty line is an empty document, as in Megatron
  EXPECT_EQ(ds.num_sequences(), 2);
  auto want = tok->encode("weft loss");
  EXPECT_EQ(ds.sequence(1), std::vector<int64_t>(want.begin(), want.end()));
}

TEST_F(TokenizerTest, PreprocessRefusesBadInput) {
  PreprocessOptions o;
  o.output_prefix = path("bad");
  o.workers = 2;
  o.input = path("absent.jsonl");
  expect_refused(o, {path("absent.jsonl"), "--input"});

  std::string good;
  for (int i = 0; i < 1500; ++i) good += nlohmann::json{{"text", "the loss"}}.dump() + "\n";
  write("nokey.jsonl", good + "{\"body\": \"x\"}\n" + good);
  o.input = path("nokey.jsonl");
  expect_refused(o, {path("nokey.jsonl") + ":1501:", "\"text\""});

  write("broken.jsonl", good + "{\"text\": \"unterminated\n" + good);
  o.input = path("broken.jsonl");
  expect_refused(o, {path("broken.jsonl") + ":1501:", "not valid JSON"});

  write("empty.jsonl", "{\"text\": \"\"}\n");
  o.input = path("empty.jsonl");
  expect_refused(o, {path("empty.jsonl"), "no tokens"});

  o.input = path("plain.txt");
  write("plain.txt", "x\n");
  o.json_keys = {"body"};
  expect_refused(o, {"--json-keys"});
}

}  // namespace
}  // namespace weft
