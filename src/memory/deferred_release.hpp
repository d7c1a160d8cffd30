// Drops objects whose destruction makes CUDA calls (unmapping a peer's memory) for callers that may make none: a
// CUDA graph's user-object destructor runs on a thread of CUDA's own, where CUDA calls are not allowed.
#pragma once

#include <memory>

namespace braid::detail {

// Hands `object` to a thread of braid's own, which drops it soon after (in relaxed capture mode, so another
// thread's capture in global mode does not forbid its calls). Makes no CUDA call; safe from any thread.
void release_later(std::shared_ptr<const void> object);

}  // namespace braid::detail
