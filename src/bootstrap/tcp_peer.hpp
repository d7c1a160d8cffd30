// Who is on the other end of an accepted TCP connection. A client whose address is this host's (loopback, or an
// address of one of this network namespace's interfaces) has a socket the kernel lists, with the uid that owns it;
// the store serves such a client only when that uid is its own, and refuses it when the kernel cannot say (fail
// closed). A client of another host, or of another network namespace (a container), is not listed here: only a
// job secret can tell about it.
//
// NOTE [blind owner lookup]
// The owner is found with NETLINK_SOCK_DIAG's exact-socket query (what `ss` uses), by the connection's addresses
// and ports. The kernel's lookup behind it matches a socket bound to a device (SO_BINDTODEVICE, open to any user)
// only when the query names that device, so a query that names none does not find such a client, which would
// then look remote. So where the unbound query finds nothing, the same query is asked for each of the network
// namespace's devices; a socket that none of them finds is not served. (A port-filtered dump of every socket
// would find it too, but walks the kernel's whole connection table: milliseconds for each connection, which a
// flood of connections would turn into seconds of a store that serves nobody.) Without NETLINK_SOCK_DIAG, or where
// it does not list even the store's own end, /proc/net/tcp and tcp6 are read instead (every socket, with its uid).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace braid::net {

struct PeerOwner {
  bool local = true;         // the client's address is this host's (also when that cannot be told: fail closed)
  std::optional<uid_t> uid;  // for a local client: the uid owning its socket; nullopt where the kernel did not say
  std::string unknown_why;   // why uid is missing, for the store's warning
};

// The owner of the client end of accepted connection `fd`.
PeerOwner peer_owner(int fd);

// Whether the store serves that client: any client of another host (the job secret decides about it), a client of
// this host only when the kernel attributes its socket to `store_uid`.
bool serves_peer(const PeerOwner& owner, uid_t store_uid);

// Whether the address of `fd`'s peer is this host's (loopback or a local interface's).
bool peer_is_local(int fd);

}  // namespace braid::net
