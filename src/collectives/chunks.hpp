// The chunks a copy-engine schedule cuts one part of a call into, the same on both ranks: all but the last end on
// a 256-byte boundary (no element straddles two). Every copy costs the engine a fixed time, so chunks are as large
// as the overlap allows (docs/dev/selection.md).
#pragma once

#include <cstddef>
#include <vector>

namespace braid::collectives {

class Chunks {
 public:
  static constexpr size_t kAlignment = 256;
  static constexpr size_t kMaxEvenBytes = size_t(64) << 20;
  static constexpr size_t kMaxTaperedBytes = size_t(128) << 20;
  static constexpr size_t kLastTaperedBytes = size_t(8) << 20;

  // Even chunks of at most kMaxEvenBytes, at least two, at most `max_chunks`.
  static Chunks even(size_t bytes, size_t max_chunks);
  // From the end: two of last_tapered(largest), then each twice the next, up to `largest` (larger where `max_chunks`
  // would not suffice); a first chunk smaller than the last joins the next, so no chunk is larger than `largest` +
  // last_tapered(largest) where `max_chunks` suffices. The bytes beyond the last 256-byte boundary go with the last
  // chunk. Where nothing overlaps a part's last chunk, its cost shrinks with it.
  static Chunks tapered(size_t bytes, size_t max_chunks, size_t largest = kMaxTaperedBytes);

  static size_t last_tapered(size_t largest) { return largest < kLastTaperedBytes ? largest : kLastTaperedBytes; }

  size_t count() const { return ends_.size(); }
  size_t offset(size_t c) const { return c == 0 ? 0 : ends_[c - 1]; }
  size_t bytes_of(size_t c) const { return ends_[c] - offset(c); }
  size_t total() const { return ends_.empty() ? 0 : ends_.back(); }

 private:
  std::vector<size_t> ends_;
};

inline size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace braid::collectives
