// An allgather among the ranks of one communicator on one host through shared memory (a HostBoard): a few
// microseconds where the store's takes several network round trips (bootstrap.hpp). The large eager calls exchange
// their buffers' announcements through it (NOTE [exchanged exposures], collectives/call_buffers.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bootstrap/fd_passing.hpp"
#include "bootstrap/host_board.hpp"

namespace braid {

// NOTE [host mailbox]
// Every rank owns two slots of the board; allgather number s (1, 2, ...) posts into slot s % 2: the post's bytes,
// then its number with release order. A rank reads a peer's post once that slot holds s (acquire), so it never reads
// a post half written. Two slots suffice: a rank posts s + 2 into the slot of s only after its allgather s + 1 saw
// every peer's post s + 1, and a peer posts s + 1 only after it read every post of s. So a slot holds s - 2 or s
// while a rank waits for s; anything else is a rank out of step (kInternal).
class HostMailbox {
 public:
  static constexpr size_t kMostPostBytes = 240;
  static constexpr double kPollInterval_s = 0.05;

  // Collective over the ranks of `fds` (the board's fd exchange, with `tag`).
  HostMailbox(FdExchanger& fds, int rank, int size, uint64_t tag, double timeout_s);

  // Every rank contributes `mine` (at most kMostPostBytes); returns every rank's, indexed by rank. `what` names the
  // exchange in errors. `poll` (optional) runs every kPollInterval_s while waiting and may throw to end the wait.
  // Throws Error(kInvalidArgument) for a longer `mine`, Error(kTimeout) naming the ranks that did not post within
  // the timeout, the interruption's error once interrupt() was called.
  std::vector<std::string> allgather(const std::string& mine, const char* what,
                                     const std::function<void()>& poll = {});
  // Ends every allgather waiting now or later (from any thread): they raise `code` with `reason` (NOTE [ended host
  // waits]), or kAborted for interrupt().
  void interrupt(ErrorCode code, std::string_view reason) noexcept { interrupted_.end(code, reason); }
  void interrupt() noexcept { interrupted_.abort(); }

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> number;  // the allgather whose post the slot holds; 0: none yet
    uint32_t length;
    char bytes[kMostPostBytes];
  };
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "the slots are shared between processes");

  using Clock = std::chrono::steady_clock;

  Slot& slot(int rank, uint64_t number) const;
  // Waits until rank `peer` posted `number`; false at `deadline`.
  bool wait_for(int peer, uint64_t number, const char* what, const std::function<void()>& poll,
                Clock::time_point deadline);

  int rank_;
  int size_;
  double timeout_s_;
  HostBoard board_;
  uint64_t number_ = 0;  // allgathers are collective, so every rank's count agrees
  Interruption interrupted_;
};

}  // namespace braid
