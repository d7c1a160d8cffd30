// Notices, within milliseconds, that the process of a peer on this host exited without destroying its
// communicator (killed, crashed, exited early): a thread polls a pidfd of every peer that runs in another process
// of this host, and a board of shared memory (one word a rank) tells a peer that left cleanly from one that died.
// NOTE [peer exit]: the board is a memfd that rank 0 makes and the fd exchanger passes to every rank at init, so
// it has no name to leak; a rank marks its word when its CUDA backend is destroyed, before its process can exit.
// A peer whose word is unmarked when its pidfd turns readable died: `on_exit` runs once for it, on the watch's
// thread. Ranks that are threads of this process are not watched (they die with it).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "memory/memory_context.hpp"

namespace braid::detail {

class PeerWatch {
 public:
  // `pids`: [world], a rank's pid where this rank can watch it (this host, this pid namespace), else 0.
  // Collective over the ranks of `memory` (the board's fd exchange). Where pidfd_open is not available the watch
  // watches nothing and says so in the log.
  PeerWatch(MemoryContext& memory, const std::vector<int>& pids, std::function<void(int rank, int pid)> on_exit);
  ~PeerWatch();  // marks this rank's word, then stops the thread
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

 private:
  void run();

  int rank_ = -1;
  std::atomic<uint32_t>* board_ = nullptr;  // [world] words: 1 once the rank left cleanly
  size_t board_bytes_ = 0;
  std::vector<int> ranks_, pids_, pidfds_;  // the watched peers
  int wake_fd_ = -1;                        // an eventfd: the destructor's stop
  std::function<void(int, int)> on_exit_;
  std::thread thread_;
};

}  // namespace braid::detail
