// Small blocking-socket helpers shared by the store and fd passing. Deadlines are absolute
// (steady clock); every call that can block is bounded by one.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace braid::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

Deadline deadline_after(double seconds);
// Milliseconds left until `deadline` (0 when passed), for poll().
int milliseconds_left(Deadline deadline);

// TCP: listen on host:port, on every address the name resolves to (an empty host: every interface, IPv4 and
// IPv6), with one port for all of them (port 0 picks one; *bound_port gets it); addresses this host lacks are
// skipped, one that another process holds fails the whole call (kSystemError naming it). Returns the listening
// descriptors. Connect with retries until the deadline.
// A host name that does not resolve is retried for resolve_timeout_s at most (BRAID_RESOLVE_TIMEOUT_S), which
// covers a name that appears late (a pod's DNS record) without waiting the whole deadline on a typo.
std::vector<int> tcp_listen(const std::string& host, int port, int* bound_port);
int tcp_connect(const std::string& host, int port, Deadline deadline);  // -1 when the deadline passes
// As above; on failure *last_error (if given) says why the last attempt failed, for error messages.
int tcp_connect(const std::string& host, int port, Deadline deadline, std::string* last_error);
int tcp_connect(const std::string& host, int port, Deadline deadline, std::string* last_error,
                double resolve_timeout_s);

// BRAID_RESOLVE_TIMEOUT_S of the process environment (default 30 s; kInvalidArgument naming the variable
// outside [0.001, 1e6]).
double resolve_timeout_s();

// Reads or writes exactly `bytes`, or returns false (peer closed, error, or deadline passed).
bool write_all(int fd, const void* data, size_t bytes, Deadline deadline);
bool read_all(int fd, void* data, size_t bytes, Deadline deadline);

// Whether `host` (a bind or dial address, IPv6 in brackets or not) is a loopback address: 127.0.0.0/8, ::1 or
// localhost.
bool is_loopback_host(const std::string& host);

// "host:port" -> (host, port); throws Error(kInvalidArgument) naming `what` on bad text.
std::pair<std::string, int> parse_host_port(const std::string& text, const char* what);

}  // namespace braid::net
