// What the ranks of a communicator on one host tell each other outside the GPU: that a peer's process exited
// without destroying its communicator (killed, crashed, exited early), and that a rank revoked the communicator.
// A thread polls a pidfd of every peer that runs in another process of this host, and looks at a board of shared
// memory every kLookMs.
// NOTE [peer exit]: the board is a memfd that rank 0 makes and the fd exchanger passes to every rank at init, so
// it has no name to leak: one word a rank, marked when its CUDA backend is destroyed (before its process can
// exit), and one word naming the rank that revoked. A peer whose word is unmarked when its pidfd turns readable
// died: `on_exit` runs once for it, on the watch's thread. Ranks that are threads of this process are not watched
// (they die with it). A revocation runs `on_revoke` once on every rank's watch, within kLookMs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "bootstrap/host_board.hpp"
#include "memory/memory_context.hpp"

namespace braid::detail {

class PeerWatch {
 public:
  static constexpr int kLookMs = 10;

  // `pids`: [world], a rank's pid where this rank can watch it (this host, this pid namespace), else 0.
  // Collective over the ranks of `memory` (the board's fd exchange). Where pidfd_open is not available no exit is
  // noticed (the log says so); revocations still are.
  PeerWatch(MemoryContext& memory, const std::vector<int>& pids, std::function<void(int rank, int pid)> on_exit,
            std::function<void(int by)> on_revoke);
  ~PeerWatch();  // marks this rank's word, then stops the thread
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Revokes the communicator for every rank: false when a rank revoked it already (the first stays).
  bool revoke();

 private:
  void run();

  int rank_ = -1;
  int world_ = 0;
  HostBoard board_memory_;
  std::atomic<uint32_t>* board_;  // [world] words: 1 once the rank left cleanly; [world]: revoker + 1
  std::vector<int> ranks_, pids_, pidfds_;  // the watched peers
  int wake_fd_ = -1;                        // an eventfd: the destructor's stop
  std::function<void(int, int)> on_exit_;
  std::function<void(int)> on_revoke_;
  std::thread thread_;
};

}  // namespace braid::detail
