// Unicode services the byte-level BPE tokenizers need, from ICU (Debian libicu-dev): regular
// expressions with Unicode properties (\p{L}, \p{N}, lookahead, (?i:...)) over UTF-8 text, and
// NFC normalisation. Written against ICU's C API so that no ICU type leaks into weft's headers.
//
// Invariant: every offset is a byte offset into the UTF-8 text given, and a match never splits
// a UTF-8 sequence. Without ICU at build time every entry point throws one UsageError saying so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft {

// The code point of the UTF-8 character starting at `at` in `s`, and its length in bytes; 0
// (and *cp untouched) when the byte there leads no character that fits in `s` (continuation
// bytes are not checked). Needs no ICU.
size_t utf8_char_at(std::string_view s, size_t at, uint32_t* cp);

// `bytes` as valid UTF-8: each maximal invalid subpart becomes U+FFFD, as Python's
// decode("utf-8", errors="replace") and Rust's from_utf8_lossy write it. Needs no ICU.
std::string utf8_with_replacements(const std::string& bytes);

// True when weft was built with ICU (the HuggingFaceTokenizer and GPT2BPETokenizer need it).
bool unicode_text_available();

// A compiled pattern. find_all is thread-safe: each call matches on its own clone.
class UnicodeRegex {
 public:
  // Throws UsageError "<what>: <ICU's reason>" on a pattern ICU cannot compile.
  UnicodeRegex(const std::string& pattern, const std::string& what);
  ~UnicodeRegex();
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  // The non-empty matches of the pattern in `text`, left to right, as [begin, end) byte
  // offsets. Text that is not valid UTF-8 matches as ICU's replacement characters would.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `text` in Unicode normalisation form C; ASCII text is returned unchanged without a copy
// through ICU. Throws UsageError on text that is not valid UTF-8 (a normalised text has no
// bytes to keep for it).
std::string unicode_nfc(std::string_view text);

}  // namespace weft
