// Who is on the other end of an accepted TCP connection, where the kernel can say: a client of this host (in
// this network namespace) has a socket the kernel's socket diagnostics (NETLINK_SOCK_DIAG, what `ss` uses) find
// by the connection's addresses and ports, with the uid that owns it. A client of another host (or of another
// network namespace) has none here; only a job secret can tell about it.
#pragma once

#include <sys/types.h>

#include <optional>

namespace braid::net {

// The uid owning the client end of accepted connection `fd`, where that end is a socket of this host's network
// namespace; nullopt where the kernel finds none (another host, another namespace, or a client already gone).
std::optional<uid_t> local_peer_uid(int fd);

}  // namespace braid::net
