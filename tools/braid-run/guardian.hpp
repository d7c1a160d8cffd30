// The guardian: kills every rank's process group when braid-run is gone, however it went.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "system.hpp"

namespace braid::run {

// NOTE [guardian]
// braid-run forks the guardian first, before the store's thread, any signal handler or any rank. The two
// share a SOCK_SEQPACKET socket pair: each rank, between its fork and its exec, sends its process-group id
// (its pid) on braid-run's end, so the guardian knows the group before the group can have a descendant;
// braid-run sends the id negated once it is done with the group, just before it reaps the group's leader
// (NOTE [group ids]). The guardian reads until end of file, which comes when every copy of braid-run's end is
// closed: braid-run exited in any way, SIGKILL included (a rank's copy is closed at its exec, or dies with it
// through PR_SET_PDEATHSIG). Then it SIGKILLs every group it still knows and exits. It keeps nothing of the
// job alive: its own process group and every signal blocked (a terminal's ^C or hangup reaches braid-run's
// group only), /dev/null for stdin, stdout and stderr, no other descriptor, "/" as its directory. After fork
// it makes only async-signal-safe calls.

// A group id to watch (> 0) or to forget (< 0), as one message. Async-signal-safe; the guardian being gone
// only loses the message (no SIGPIPE). The socket buffer holds far more messages than a job ever sends.
void send_group_message(int channel, int32_t message);

class Guardian {
 public:
  Guardian();

  // Closing the channel lets the guardian exit (it kills the groups it still knows: none after a normal
  // end); it is reaped here when it does so at once, else by whoever adopts it.
  ~Guardian();

  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  pid_t pid() const { return pid_; }
  // braid-run's end, which each rank inherits until its exec to announce its group.
  int channel() const { return channel_.get(); }
  // The group is done: the guardian no longer kills it.
  void forget(pid_t group) const { send_group_message(channel_.get(), -static_cast<int32_t>(group)); }
  // braid-run reaped the guardian (it died early: nothing kills the ranks if braid-run is killed now).
  void mark_gone() { gone_ = true; }

 private:
  pid_t pid_ = -1;
  UniqueFd channel_;
  bool gone_ = false;
};

}  // namespace braid::run
