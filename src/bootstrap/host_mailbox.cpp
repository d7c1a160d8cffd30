#include "bootstrap/host_mailbox.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.hpp"

namespace braid {
namespace {

// The peers' hosts usually post within microseconds of each other: spin that long, then sleep between looks.
constexpr auto kSpinFor = std::chrono::microseconds(100);
constexpr auto kSleep = std::chrono::microseconds(20);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

HostMailbox::HostMailbox(FdExchanger& fds, int rank, int size, uint64_t tag, double timeout_s)
    : rank_(rank),
      size_(size),
      timeout_s_(timeout_s),
      board_(fds, rank, size, tag, static_cast<size_t>(size) * 2 * sizeof(Slot), "braid-host-mailbox") {}

HostMailbox::Slot& HostMailbox::slot(int rank, uint64_t number) const {
  return static_cast<Slot*>(board_.data())[static_cast<size_t>(rank) * 2 + number % 2];
}

bool HostMailbox::wait_for(int peer, uint64_t number, const char* what, const std::function<void()>& poll,
                           Clock::time_point deadline) {
  const Slot& theirs = slot(peer, number);
  const uint64_t previous = number >= 2 ? number - 2 : 0;
  const auto poll_interval = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kPollInterval_s));
  const Clock::time_point start = Clock::now();
  Clock::time_point next_poll = start + poll_interval;
  for (;;) {
    const uint64_t seen = theirs.number.load(std::memory_order_acquire);
    if (seen == number) return true;
    if (seen != previous) {
      raise(ErrorCode::kInternal, "host mailbox '{}' #{}: rank {}'s slot holds post #{}, neither #{} nor #{}", what,
            number, peer, seen, previous, number);
    }
    if (interrupted_.ended()) {
      interrupted_.raise(fmt::format("host mailbox '{}' #{}: the wait for rank {}", what, number, peer));
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    if (poll && now >= next_poll) {
      poll();
      next_poll = now + poll_interval;
    }
    if (now - start < kSpinFor) {
      cpu_relax();
    } else {
      std::this_thread::sleep_for(kSleep);
    }
  }
}

std::vector<std::string> HostMailbox::allgather(const std::string& mine, const char* what,
                                                const std::function<void()>& poll) {
  if (mine.size() > kMostPostBytes) {
    raise_invalid_argument("HostMailbox::allgather", "mine", "is {} bytes; a post holds at most {}", mine.size(),
                           kMostPostBytes);
  }
  const uint64_t number = ++number_;
  Slot& own = slot(rank_, number);
  std::memcpy(own.bytes, mine.data(), mine.size());
  own.length = static_cast<uint32_t>(mine.size());
  own.number.store(number, std::memory_order_release);

  std::vector<std::string> posts(size_);
  posts[rank_] = mine;
  const Clock::time_point deadline =  // one for the whole allgather, however many peers it waits for
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    if (!wait_for(peer, number, what, poll, deadline)) {
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_ && slot(r, number).number.load(std::memory_order_acquire) != number) missing.push_back(r);
      }
      raise(ErrorCode::kTimeout, "host mailbox '{}' #{}: rank(s) {} did not post within {} s", what, number,
            fmt::join(missing, ", "), timeout_s_);
    }
    const Slot& theirs = slot(peer, number);
    if (theirs.length > kMostPostBytes) {
      raise(ErrorCode::kInternal, "host mailbox '{}' #{}: rank {} posted {} bytes, more than a slot holds", what,
            number, peer, theirs.length);
    }
    posts[peer].assign(theirs.bytes, theirs.length);
  }
  return posts;
}

}  // namespace braid
