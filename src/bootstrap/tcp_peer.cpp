#include "bootstrap/tcp_peer.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/inet_diag.h>
#include <net/if.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "bootstrap/socket.hpp"

namespace braid::net {
namespace {

// One end of a TCP connection as the kernel's diagnostics hold it: IPv4-mapped IPv6 addresses become IPv4, so
// a socket is matched whichever family it was opened in.
struct Endpoint {
  int family = 0;  // AF_INET or AF_INET6; 0 for a family TCP diagnostics do not serve
  uint16_t port = 0;  // host order
  uint32_t words[4] = {0, 0, 0, 0};  // the address as stored (network order); IPv4 in words[0]

  bool operator==(const Endpoint& other) const {
    return family == other.family && port == other.port && std::memcmp(words, other.words, sizeof(words)) == 0;
  }
};

Endpoint from_v6_words(const uint32_t words[4], uint16_t port) {
  Endpoint endpoint;
  endpoint.port = port;
  if (words[0] == 0 && words[1] == 0 && words[2] == htonl(0xffff)) {
    endpoint.family = AF_INET;
    endpoint.words[0] = words[3];
  } else {
    endpoint.family = AF_INET6;
    std::memcpy(endpoint.words, words, sizeof(endpoint.words));
  }
  return endpoint;
}

Endpoint from_sockaddr(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    Endpoint endpoint;
    endpoint.family = AF_INET;
    endpoint.port = ntohs(v4->sin_port);
    std::memcpy(endpoint.words, &v4->sin_addr, 4);
    return endpoint;
  }
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    uint32_t words[4];
    std::memcpy(words, &v6->sin6_addr, 16);
    return from_v6_words(words, ntohs(v6->sin6_port));
  }
  return Endpoint{};
}

bool is_loopback(const Endpoint& endpoint) {
  if (endpoint.family == AF_INET) return (ntohl(endpoint.words[0]) >> 24) == 127;
  static const uint32_t kLoopback6[4] = {0, 0, 0, htonl(1)};
  return endpoint.family == AF_INET6 && std::memcmp(endpoint.words, kLoopback6, sizeof(kLoopback6)) == 0;
}

bool same_address(const Endpoint& a, const Endpoint& b) {
  return a.family == b.family && std::memcmp(a.words, b.words, a.family == AF_INET ? 4 : 16) == 0;
}

// Whether `address` is loopback or an address of one of this network namespace's interfaces. When the
// interfaces cannot be listed, the answer is yes: the caller then insists on the kernel's word about the owner.
bool is_local_address(const Endpoint& address) {
  if (is_loopback(address)) return true;
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return true;
  bool local = false;
  for (const ifaddrs* entry = interfaces; entry != nullptr && !local; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr) continue;
    const Endpoint mine = from_sockaddr(entry->ifa_addr);
    local = mine.family != 0 && same_address(mine, address);
  }
  freeifaddrs(interfaces);
  return local;
}

// What a lookup found: the owner, or why there is none.
struct Lookup {
  std::optional<uid_t> uid;
  std::string error;  // empty: the kernel answered (and uid says whether it listed the socket)
};

// Asks the kernel for the TCP socket of `family` whose local end is `local` and remote end `remote`, bound to no
// device or to device `interface` (0: unbound only). Not found is no error.
Lookup query_exact(int family, const Endpoint& local, const Endpoint& remote, unsigned interface) {
  const int netlink = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (netlink < 0) return {std::nullopt, fmt::format("NETLINK_SOCK_DIAG: {}", std::strerror(errno))};
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof(message);
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST;
  message.request.sdiag_family = static_cast<__u8>(family);
  message.request.sdiag_protocol = IPPROTO_TCP;
  message.request.idiag_states = ~0u;
  message.request.id.idiag_sport = htons(local.port);
  message.request.id.idiag_dport = htons(remote.port);
  message.request.id.idiag_if = interface;
  // An IPv4 end asked for as IPv6 is written mapped (::ffff:a.b.c.d).
  const auto write_address = [family](const Endpoint& end, __be32 out[4]) {
    if (family == AF_INET6 && end.family == AF_INET) {
      out[0] = 0;
      out[1] = 0;
      out[2] = htonl(0xffff);
      out[3] = end.words[0];
    } else {
      std::memcpy(out, end.words, sizeof(end.words));
    }
  };
  write_address(local, message.request.id.idiag_src);
  write_address(remote, message.request.id.idiag_dst);
  message.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  Lookup result;
  if (send(netlink, &message, sizeof(message), 0) != static_cast<ssize_t>(sizeof(message))) {
    result.error = fmt::format("sending a NETLINK_SOCK_DIAG request: {}", std::strerror(errno));
  } else {
    pollfd ready{netlink, POLLIN, 0};
    alignas(nlmsghdr) char reply[8192];
    const int polled = poll(&ready, 1, 1000);
    const ssize_t received = polled == 1 ? recv(netlink, reply, sizeof(reply), 0) : -1;
    const auto* header = reinterpret_cast<const nlmsghdr*>(reply);
    if (received <= 0 || !NLMSG_OK(header, static_cast<size_t>(received))) {
      result.error = polled == 0 ? "NETLINK_SOCK_DIAG did not answer within 1 s"
                                 : fmt::format("reading NETLINK_SOCK_DIAG: {}", std::strerror(errno));
    } else if (header->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
               header->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      result.uid = static_cast<const inet_diag_msg*>(NLMSG_DATA(header))->idiag_uid;
    } else if (header->nlmsg_type == NLMSG_ERROR) {
      const int error = -static_cast<const nlmsgerr*>(NLMSG_DATA(header))->error;
      if (error != ENOENT) result.error = fmt::format("NETLINK_SOCK_DIAG: {}", std::strerror(error));
    }
  }
  close(netlink);
  return result;
}

// The socket `local` -> `remote` in either family it may be listed under (an IPv4 connection made through an
// IPv6 socket is listed as IPv6, mapped), bound to no device or to `interface`.
Lookup query_both_families(const Endpoint& local, const Endpoint& remote, unsigned interface) {
  Lookup lookup = query_exact(local.family, local, remote, interface);
  if (lookup.uid || !lookup.error.empty() || local.family != AF_INET) return lookup;
  return query_exact(AF_INET6, local, remote, interface);
}

// The same lookup through /proc/net/tcp and tcp6 (where NETLINK_SOCK_DIAG is not available): each line holds a
// socket's local and remote address:port in hex (each 32-bit word as the host stores it) and its uid.
Lookup scan_proc(const Endpoint& client, const Endpoint& server, const std::string& netlink_error) {
  Lookup result;
  bool read_any = false;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream table(path);
    if (!table) continue;
    read_any = true;
    std::string line;
    std::getline(table, line);  // the header
    while (std::getline(table, line)) {
      char local[64], remote[64];
      unsigned local_port = 0, remote_port = 0, state = 0;
      unsigned long uid = 0;
      if (std::sscanf(line.c_str(), " %*s %63[0-9A-Fa-f]:%x %63[0-9A-Fa-f]:%x %x %*s %*s %*s %lu", local,
                      &local_port, remote, &remote_port, &state, &uid) != 6) {
        continue;
      }
      const auto parse = [](const char* hex, unsigned port) {
        uint32_t words[4] = {0, 0, 0, 0};
        const size_t length = std::strlen(hex);
        if (length == 8) {
          std::sscanf(hex, "%8x", &words[0]);
          Endpoint endpoint;
          endpoint.family = AF_INET;
          endpoint.port = static_cast<uint16_t>(port);
          endpoint.words[0] = words[0];
          return endpoint;
        }
        if (length != 32) return Endpoint{};
        std::sscanf(hex, "%8x%8x%8x%8x", &words[0], &words[1], &words[2], &words[3]);
        return from_v6_words(words, static_cast<uint16_t>(port));
      };
      if (parse(local, local_port) == client && parse(remote, remote_port) == server) {
        result.uid = static_cast<uid_t>(uid);
        return result;
      }
    }
  }
  if (!read_any) result.error = netlink_error + "; /proc/net/tcp cannot be read either";
  return result;
}

// The owner of the client's socket: asked unbound first (the common case, one query), then bound to each of this
// namespace's devices (NOTE [blind owner lookup]). Where the kernel does not list even the server's own end, its
// answers cannot be trusted, and /proc/net/tcp is read instead.
Lookup find_owner(const Endpoint& client, const Endpoint& server) {
  Lookup lookup = query_both_families(client, server, 0);
  if (lookup.uid || !lookup.error.empty()) return lookup.uid ? lookup : scan_proc(client, server, lookup.error);
  if (struct if_nameindex* interfaces = if_nameindex()) {
    for (const struct if_nameindex* entry = interfaces; entry->if_index != 0 && !lookup.uid && lookup.error.empty(); ++entry) {
      lookup = query_both_families(client, server, entry->if_index);
    }
    if_freenameindex(interfaces);
  }
  if (lookup.uid) return lookup;
  if (!lookup.error.empty()) return scan_proc(client, server, lookup.error);
  const Lookup own_end = query_both_families(server, client, 0);
  if (!own_end.uid) return scan_proc(client, server, "NETLINK_SOCK_DIAG does not list the store's own socket");
  return Lookup{std::nullopt, {}};
}

}  // namespace

bool peer_is_local(int fd) {
  sockaddr_storage client{};
  socklen_t length = sizeof(client);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&client), &length) != 0) return true;
  const Endpoint endpoint = from_sockaddr(reinterpret_cast<const sockaddr*>(&client));
  return endpoint.family == 0 || is_local_address(endpoint);
}

PeerOwner peer_owner(int fd) {
  PeerOwner owner;
  sockaddr_storage server{}, client{};
  socklen_t server_length = sizeof(server), client_length = sizeof(client);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&server), &server_length) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&client), &client_length) != 0) {
    owner.unknown_why = fmt::format("the connection's addresses cannot be read: {}", std::strerror(errno));
    return owner;
  }
  const Endpoint client_end = from_sockaddr(reinterpret_cast<const sockaddr*>(&client));
  const Endpoint server_end = from_sockaddr(reinterpret_cast<const sockaddr*>(&server));
  if (client_end.family == 0 || server_end.family == 0) {
    owner.unknown_why = "the connection is not TCP over IPv4 or IPv6";
    return owner;
  }
  owner.local = is_local_address(client_end);
  if (!owner.local) return owner;
  Lookup lookup = find_owner(client_end, server_end);
  owner.uid = lookup.uid;
  if (!owner.uid) {
    owner.unknown_why = lookup.error.empty() ? "the kernel lists no socket for the client (it left already?)"
                                             : lookup.error;
  }
  return owner;
}

bool serves_peer(const PeerOwner& owner, uid_t store_uid) {
  return !owner.local || (owner.uid && *owner.uid == store_uid);
}

}  // namespace braid::net
