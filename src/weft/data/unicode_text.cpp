// ICU behind weft's UnicodeRegex and unicode_nfc (unicode_text.h). Matching runs on a UText
// over the caller's UTF-8 bytes, so ICU reports native (byte) offsets and nothing is converted
// to UTF-16 on the hot path; ICU's matcher is not thread-safe, so each call borrows a clone
// from a small pool.
#include "weft/data/unicode_text.h"

#include <algorithm>
#include <mutex>

#include "weft/core/error.h"

#if WEFT_WITH_ICU
#include <unicode/unorm2.h>
#include <unicode/uregex.h>
#include <unicode/ustring.h>
#include <unicode/utext.h>
#endif

namespace weft {

size_t utf8_char_at(std::string_view s, size_t at, uint32_t* cp) {
  const auto c = static_cast<unsigned char>(s[at]);
  const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || at + len > s.size()) return 0;
  uint32_t v = len == 1 ? c : c & (0x7Fu >> len);
  for (size_t k = 1; k < len; ++k) v = (v << 6) | (static_cast<unsigned char>(s[at + k]) & 0x3F);
  *cp = v;
  return len;
}

// unicode_text.h: Megatron's GPT-2 and tiktoken decodes (Python's) and transformers'
// byte-level decoder (Rust's) write the same replacements.
std::string utf8_with_replacements(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  auto at = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  for (size_t i = 0; i < n;) {
    const unsigned char c = at(i);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    size_t j = 1;
    if (len > 0) {
      for (; j < len && i + j < n; ++j) {
        const unsigned char d = at(i + j);
        if (j == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) break;
      }
    }
    if (len > 0 && j == len) {
      out.append(bytes, i, len);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += (len > 0 && j == len) ? len : std::max<size_t>(j, 1);
  }
  return out;
}

#if WEFT_WITH_ICU

namespace {

// `s` in UTF-16; *substitutions (if given) counts the invalid UTF-8 sequences replaced by U+FFFD.
std::u16string to_utf16(std::string_view s, int32_t* substitutions = nullptr) {
  UErrorCode st = U_ZERO_ERROR;
  int32_t n = 0;
  u_strFromUTF8WithSub(nullptr, 0, &n, s.data(), static_cast<int32_t>(s.size()), 0xFFFD,
                       substitutions, &st);
  std::u16string out(static_cast<size_t>(n), u'\0');
  st = U_ZERO_ERROR;
  u_strFromUTF8WithSub(out.data(), n, nullptr, s.data(), static_cast<int32_t>(s.size()), 0xFFFD,
                       nullptr, &st);
  if (U_FAILURE(st)) fail("cannot convert {} bytes of text to UTF-16: {}", s.size(), u_errorName(st));
  return out;
}

std::string to_utf8(const std::u16string& s) {
  UErrorCode st = U_ZERO_ERROR;
  int32_t n = 0;
  u_strToUTF8(nullptr, 0, &n, s.data(), static_cast<int32_t>(s.size()), &st);
  std::string out(static_cast<size_t>(n), '\0');
  st = U_ZERO_ERROR;
  u_strToUTF8(out.data(), n, nullptr, s.data(), static_cast<int32_t>(s.size()), &st);
  if (U_FAILURE(st)) fail("cannot convert text to UTF-8: {}", u_errorName(st));
  return out;
}

}  // namespace

struct UnicodeRegex::Impl {
  URegularExpression* proto = nullptr;
  mutable std::mutex mu;
  mutable std::vector<URegularExpression*> pool;  // idle clones

  URegularExpression* borrow() const {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!pool.empty()) {
        URegularExpression* r = pool.back();
        pool.pop_back();
        return r;
      }
    }
    UErrorCode st = U_ZERO_ERROR;
    URegularExpression* r = uregex_clone(proto, &st);
    if (U_FAILURE(st)) fail("cannot clone a regular expression: {}", u_errorName(st));
    return r;
  }
  void give_back(URegularExpression* r) const {
    std::lock_guard<std::mutex> lock(mu);
    pool.push_back(r);
  }
};

bool unicode_text_available() { return true; }

UnicodeRegex::UnicodeRegex(const std::string& pattern, const std::string& what)
    : impl_(std::make_unique<Impl>()) {
  const std::u16string p = to_utf16(pattern);
  UParseError pe{};
  UErrorCode st = U_ZERO_ERROR;
  impl_->proto = uregex_open(p.data(), static_cast<int32_t>(p.size()), 0, &pe, &st);
  if (U_FAILURE(st))
    fail_usage("{}: the regular expression {:?} does not compile ({} at offset {})", what, pattern,
               u_errorName(st), pe.offset);
}

UnicodeRegex::~UnicodeRegex() {
  for (URegularExpression* r : impl_->pool) uregex_close(r);
  if (impl_->proto != nullptr) uregex_close(impl_->proto);
}

std::vector<std::pair<size_t, size_t>> UnicodeRegex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  if (text.empty()) return out;
  URegularExpression* re = impl_->borrow();
  UErrorCode st = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &st);
  uregex_setUText(re, ut, &st);
  while (U_SUCCESS(st) && uregex_findNext(re, &st)) {
    const int64_t b = uregex_start64(re, 0, &st), e = uregex_end64(re, 0, &st);
    if (U_SUCCESS(st) && e > b) out.emplace_back(static_cast<size_t>(b), static_cast<size_t>(e));
  }
  // Detach the text before the clone goes back to the pool: the UText dies here.
  UErrorCode ignored = U_ZERO_ERROR;
  uregex_setText(re, u"", 0, &ignored);
  utext_close(ut);
  impl_->give_back(re);
  if (U_FAILURE(st)) fail("regular expression matching failed: {}", u_errorName(st));
  return out;
}

std::string unicode_nfc(std::string_view text) {
  bool ascii = true;
  for (unsigned char c : text) ascii &= c < 0x80;
  if (ascii) return std::string(text);
  UErrorCode st = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&st);
  if (U_FAILURE(st)) fail("ICU has no NFC normaliser: {}", u_errorName(st));
  int32_t invalid = 0;
  const std::u16string u = to_utf16(text, &invalid);
  if (invalid > 0)
    fail_usage("a text to normalise (NFC) is not valid UTF-8 ({} invalid sequence(s) in {} bytes)",
               invalid, text.size());
  if (unorm2_quickCheck(nfc, u.data(), static_cast<int32_t>(u.size()), &st) == UNORM_YES &&
      U_SUCCESS(st))
    return std::string(text);
  st = U_ZERO_ERROR;
  const int32_t n = unorm2_normalize(nfc, u.data(), static_cast<int32_t>(u.size()), nullptr, 0, &st);
  std::u16string out(static_cast<size_t>(n), u'\0');
  st = U_ZERO_ERROR;
  unorm2_normalize(nfc, u.data(), static_cast<int32_t>(u.size()), out.data(), n, &st);
  if (U_FAILURE(st)) fail("NFC normalisation failed: {}", u_errorName(st));
  return to_utf8(out);
}

#else  // !WEFT_WITH_ICU

namespace {
constexpr const char* kNoIcu =
    "weft was built without ICU, which the BPE tokenizers need for their regular expressions "
    "and normalisation (install libicu-dev and rebuild)";
}

struct UnicodeRegex::Impl {};
bool unicode_text_available() { return false; }
UnicodeRegex::UnicodeRegex(const std::string&, const std::string&) { fail_usage("{}", kNoIcu); }
UnicodeRegex::~UnicodeRegex() = default;
std::vector<std::pair<size_t, size_t>> UnicodeRegex::find_all(std::string_view) const {
  fail_usage("{}", kNoIcu);
}
std::string unicode_nfc(std::string_view) { fail_usage("{}", kNoIcu); }

#endif

}  // namespace weft
