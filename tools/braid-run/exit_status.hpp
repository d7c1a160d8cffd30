// How a rank ended, as braid-run reports it: a wait status from waitid, braid-run's exit code for it, and the
// words for it and for a signal.
#pragma once

#include <signal.h>

#include <string>

namespace braid::run {

std::string signal_name(int signo);

// braid-run's exit code for a rank's wait status: its exit code, or 128 + signal (as a shell reports it).
int exit_code_of(int status);

std::string describe_exit(int status);

// A wait status (as waitpid gives it) from waitid's report of an exit.
int wait_status_of(const siginfo_t& info);

}  // namespace braid::run
