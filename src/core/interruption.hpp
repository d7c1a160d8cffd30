// Why a host client's waits ended early (the store client, fd passing, the host mailbox): set from any thread,
// raised by the waits.
// NOTE [ended host waits]: a communicator's host waits (its store client, fd passing, the exposure exchange and
// the exposure service's caller) end early in two ways. On the CUDA backend, when the peer watch sees a revocation
// or a peer's exit, they end with the error the communicator's next call raises (its first fatal failure), so a
// rank in barrier(), host_allgather(), alloc(), a buffer's first exchange or a registration's exposure stops
// waiting for ranks that are gone or revoked; the first end stays. abort() ends them with kAborted, replacing any
// earlier end, so that after abort() every host wait raises kAborted whatever came before (braid.hpp).
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <string_view>

#include "braid/error.hpp"

namespace braid {

class Interruption {
 public:
  // Ends the waits with `code` and `reason` (a sentence: "rank 0 revoked the communicator"). kAborted replaces an
  // earlier end; any other code is dropped where one came first. Never throws.
  void end(ErrorCode code, std::string_view reason) noexcept;
  // What abort() ends the waits with.
  void abort() noexcept { end(ErrorCode::kAborted, "the communicator was aborted (Communicator::abort)"); }

  bool ended() const noexcept { return ended_.load(std::memory_order_acquire); }
  // Throws Error(code, "<what> ended: <reason>"); only once ended() (kInternal before).
  [[noreturn]] void raise(std::string_view what) const;

 private:
  std::atomic<bool> ended_{false};
  mutable std::mutex mutex_;  // code_ and reason_
  ErrorCode code_ = ErrorCode::kSuccess;
  std::string reason_;
};

}  // namespace braid
