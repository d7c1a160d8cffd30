#include "core/interruption.hpp"

#include "core/error.hpp"

namespace braid {

void Interruption::end(ErrorCode code, std::string_view reason) noexcept {
  std::lock_guard lock(mutex_);
  if (ended_.load(std::memory_order_relaxed) && code != ErrorCode::kAborted) return;  // the first end stays
  code_ = code;
  try {
    reason_.assign(reason);
  } catch (...) {
    reason_.clear();  // the code alone, where the reason could not be kept
  }
  ended_.store(true, std::memory_order_release);
}

void Interruption::raise(std::string_view what) const {
  std::lock_guard lock(mutex_);
  if (!ended_.load(std::memory_order_relaxed)) braid::raise(ErrorCode::kInternal, "{}: raised before it ended", what);
  braid::raise(code_, "{} ended: {}", what, reason_.empty() ? error_code_name(code_) : reason_);
}

}  // namespace braid
