// The global batch per step (see batch_schedule.h).
#include "weft/train/batch_schedule.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "weft/core/error.h"

namespace weft {
namespace {

constexpr const char* kFlag = "--step-batch-size-schedule";

// Megatron's _parse_numeric_value: strip, upper-case, one K/M/B/T suffix, float(value) x the
// multiplier, truncated. Python's float() also takes '_' between two digits and a leading '+'.
int64_t parse_number(std::string s, const std::string& entry) {
  auto bad = [&](const char* why) -> int64_t {
    fail_usage("{} entry '{}': {} (expected THRESHOLD:BATCH_SIZE, each a number with an optional "
               "K, M, B or T suffix)", kFlag, entry, why);
  };
  auto digit = [&](size_t i) {
    return i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]));
  };
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '_') t += static_cast<char>(std::toupper(static_cast<unsigned char>(s[i])));
    else if (i == 0 || !digit(i - 1) || !digit(i + 1)) return bad("not a number");
  }
  double mult = 1;
  if (!t.empty()) {
    switch (t.back()) {
      case 'T': mult = 1e12; break;
      case 'B': mult = 1e9; break;
      case 'M': mult = 1e6; break;
      case 'K': mult = 1e3; break;
      default: break;
    }
    if (mult != 1) t.pop_back();
  }
  if (!t.empty() && t.front() == '+') {
    t.erase(0, 1);
    if (!t.empty() && (t.front() == '-' || t.front() == '+')) return bad("not a number");
  }
  if (t.empty()) return bad("a number is missing");
  double v = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size() || !std::isfinite(v))
    return bad("not a number");
  const double x = std::trunc(v * mult);
  if (std::fabs(x) > 9.0e18) return bad("out of range");
  return static_cast<int64_t>(x);
}

}  // namespace

BatchSchedule BatchSchedule::constant(int global_batch) {
  BatchSchedule s;
  s.entries_ = {{0, global_batch}};
  return s;
}

BatchSchedule BatchSchedule::parse(const std::string& text, int64_t seq_length) {
  if (seq_length < 1) fail_usage("{} needs --seq-length >= 1 (its thresholds count tokens)", kFlag);
  std::string spaced = text;
  std::replace(spaced.begin(), spaced.end(), ',', ' ');
  BatchSchedule s;
  s.from_flag_ = true;
  size_t i = 0;
  while (i < spaced.size()) {
    while (i < spaced.size() && std::isspace(static_cast<unsigned char>(spaced[i]))) ++i;
    size_t j = i;
    while (j < spaced.size() && !std::isspace(static_cast<unsigned char>(spaced[j]))) ++j;
    if (j == i) break;
    const std::string entry = spaced.substr(i, j - i);
    i = j;
    const size_t colon = entry.find(':');
    if (colon == std::string::npos)
      fail_usage("{} entry '{}' has no ':' (expected THRESHOLD:BATCH_SIZE, e.g. \"0:768 250B:1536\")",
                 kFlag, entry);
    const int64_t tokens = parse_number(entry.substr(0, colon), entry);
    const int64_t batch = parse_number(entry.substr(colon + 1), entry);
    if (batch < 1 || batch > std::numeric_limits<int>::max())
      fail_usage("{} entry '{}': the batch size must be a positive integer (got {})", kFlag,
                 entry, batch);
    // Python's floor division, also for a negative threshold (then refused below).
    int64_t samples = tokens / seq_length;
    if (tokens % seq_length != 0 && tokens < 0) --samples;
    s.entries_.emplace_back(samples, static_cast<int>(batch));
  }
  if (s.entries_.empty()) fail_usage("{} is empty; give at least \"0:BATCH_SIZE\"", kFlag);
  std::stable_sort(s.entries_.begin(), s.entries_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  if (s.entries_[0].first != 0)
    fail_usage("{}: the first threshold must be 0 tokens (got {} samples of --seq-length {})",
               kFlag, s.entries_[0].first, seq_length);
  for (size_t k = 1; k < s.entries_.size(); ++k) {
    const auto& [t0, b0] = s.entries_[k - 1];
    const auto& [t1, b1] = s.entries_[k];
    if (t1 == t0)
      fail_usage("{}: two entries start at sample {} (thresholds are tokens, divided by "
                 "--seq-length {} and rounded down); the thresholds must increase",
                 kFlag, t1, seq_length);
    if (b1 < b0)
      fail_usage("{}: the batch size falls from {} to {} at sample {}; it must not decrease "
                 "(Megatron asserts that the number of microbatches never does)",
                 kFlag, b0, b1, t1);
  }
  return s;
}

int BatchSchedule::batch_at(int64_t consumed) const {
  int b = entries_[0].second;
  for (const auto& [threshold, batch] : entries_) {
    if (consumed < threshold) break;
    b = batch;
  }
  return b;
}

int64_t BatchSchedule::steps_below_next(int64_t consumed, int64_t limit) const {
  const int b = batch_at(consumed);
  for (const auto& e : entries_)
    if (e.first > consumed) return std::min(limit, (e.first - consumed + b - 1) / b);
  return limit;
}

int64_t BatchSchedule::samples_after(int64_t consumed, int64_t iterations) const {
  // Segment by segment: the steps of one batch that start below the next threshold at once.
  while (iterations > 0) {
    const int64_t n = steps_below_next(consumed, iterations);
    consumed += n * batch_at(consumed);
    iterations -= n;
  }
  return consumed;
}

int64_t BatchSchedule::iterations_for(int64_t train_samples) const {
  if (!from_flag_) return train_samples / entries_[0].second;
  int64_t consumed = 0, iterations = 0;
  while (consumed < train_samples) {  // Megatron's loop, a segment at a time
    const int b = batch_at(consumed);
    const int64_t n = steps_below_next(consumed, (train_samples - consumed + b - 1) / b);
    consumed += n * b;
    iterations += n;
  }
  return iterations;
}

void BatchSchedule::check_reachable(int64_t consumed, int64_t iterations, int micro_batch,
                                    int dp) const {
  const int64_t per_step = static_cast<int64_t>(micro_batch) * dp;
  const int64_t first = consumed, steps = iterations;
  while (iterations > 0) {  // the batches the steps of this run use, segment by segment
    const int b = batch_at(consumed);
    if (b % per_step != 0) {
      if (!from_flag_)
        fail_usage("--global-batch-size {} is not divisible by --micro-batch-size * dp = "
                   "{}*{} = {}", b, micro_batch, dp, per_step);
      fail_usage("{}: the batch size {} (the step at sample {}; this run trains samples "
                 "{}..{}) is not divisible by --micro-batch-size * dp = {}*{} = {}",
                 kFlag, b, consumed, first, samples_after(first, steps) - 1, micro_batch, dp,
                 per_step);
    }
    const int64_t n = steps_below_next(consumed, iterations);
    consumed += n * b;
    iterations -= n;
  }
}

}  // namespace weft
