#include "collectives/chunks.hpp"

#include <algorithm>

namespace braid::collectives {

Chunks Chunks::even(size_t bytes, size_t max_chunks) {
  Chunks chunks;
  if (bytes == 0) return chunks;
  const size_t wanted = std::max<size_t>(2, (bytes + kMaxEvenBytes - 1) / kMaxEvenBytes);
  size_t chunk_bytes = round_up((bytes + wanted - 1) / wanted, kAlignment);
  const size_t least = max_chunks >= bytes ? 1 : (bytes + max_chunks - 1) / max_chunks;  // max_chunks may be SIZE_MAX
  chunk_bytes = std::max(chunk_bytes, round_up(least, kAlignment));
  for (size_t end = chunk_bytes;; end += chunk_bytes) {
    chunks.ends_.push_back(std::min(end, bytes));
    if (end >= bytes) break;
  }
  return chunks;
}

Chunks Chunks::tapered(size_t bytes, size_t max_chunks, size_t largest) {
  const size_t aligned = bytes / kAlignment * kAlignment;
  largest = std::max(largest / kAlignment * kAlignment, kAlignment);
  const size_t last = last_tapered(largest);
  if (aligned == 0) return even(bytes, max_chunks);
  for (;; largest *= 2) {
    std::vector<size_t> from_end;
    size_t next = last;
    for (size_t left = aligned; left > 0;) {
      const size_t chunk = std::min(next, left);
      from_end.push_back(chunk);
      left -= chunk;
      if (from_end.size() >= 2) next = std::min(next * 2, largest);
    }
    if (from_end.size() >= 2 && from_end.back() < last) {
      const size_t first = from_end.back();
      from_end.pop_back();
      from_end.back() += first;
    }
    if (from_end.size() <= max_chunks) {
      Chunks chunks;
      size_t end = 0;
      for (auto chunk = from_end.rbegin(); chunk != from_end.rend(); ++chunk) chunks.ends_.push_back(end += *chunk);
      chunks.ends_.back() = bytes;
      return chunks;
    }
    if (largest >= aligned) return even(bytes, max_chunks);  // no larger chunk would cut the count
  }
}

}  // namespace braid::collectives
