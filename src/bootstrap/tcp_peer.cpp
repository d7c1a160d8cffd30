#include "bootstrap/tcp_peer.hpp"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace braid::net {
namespace {

// An address and port as inet_diag_sockid holds them (network order), from a sockaddr; IPv4-mapped IPv6
// addresses become IPv4. Returns the family, or 0 for one TCP diagnostics do not serve.
int to_diag(const sockaddr_storage& address, __be16* port, __be32 words[4]) {
  std::memset(words, 0, 4 * sizeof(__be32));
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    *port = v4.sin_port;
    std::memcpy(words, &v4.sin_addr, 4);
    return AF_INET;
  }
  if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    *port = v6.sin6_port;
    if (IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) {
      std::memcpy(words, v6.sin6_addr.s6_addr + 12, 4);
      return AF_INET;
    }
    std::memcpy(words, v6.sin6_addr.s6_addr, 16);
    return AF_INET6;
  }
  return 0;
}

// Asks the kernel for the TCP socket of `family` whose local end is (src, sport) and remote end (dst, dport).
std::optional<uid_t> query(int family, __be16 sport, const __be32* src, __be16 dport, const __be32* dst) {
  const int netlink = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (netlink < 0) return std::nullopt;
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
  message.request.id.idiag_sport = sport;
  message.request.id.idiag_dport = dport;
  std::memcpy(message.request.id.idiag_src, src, sizeof(message.request.id.idiag_src));
  std::memcpy(message.request.id.idiag_dst, dst, sizeof(message.request.id.idiag_dst));
  message.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  std::optional<uid_t> uid;
  if (send(netlink, &message, sizeof(message), 0) == static_cast<ssize_t>(sizeof(message))) {
    pollfd ready{netlink, POLLIN, 0};
    alignas(nlmsghdr) char reply[8192];
    const ssize_t received = poll(&ready, 1, 1000) == 1 ? recv(netlink, reply, sizeof(reply), 0) : -1;
    if (received > 0) {
      const auto* header = reinterpret_cast<const nlmsghdr*>(reply);
      if (NLMSG_OK(header, static_cast<size_t>(received)) && header->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
          header->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
        uid = static_cast<const inet_diag_msg*>(NLMSG_DATA(header))->idiag_uid;
      }
    }
  }
  close(netlink);
  return uid;
}

}  // namespace

std::optional<uid_t> local_peer_uid(int fd) {
  sockaddr_storage server{}, client{};
  socklen_t server_length = sizeof(server), client_length = sizeof(client);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&server), &server_length) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&client), &client_length) != 0) {
    return std::nullopt;
  }
  __be16 client_port = 0, server_port = 0;
  __be32 client_address[4], server_address[4];
  const int family = to_diag(client, &client_port, client_address);
  if (family == 0 || to_diag(server, &server_port, server_address) != family) return std::nullopt;
  // The client's end: local = the client's address and port, remote = the server's. A client that dialled an
  // IPv4 address through an IPv6 socket is listed as IPv6 (mapped), so ask for that too.
  if (std::optional<uid_t> uid = query(family, client_port, client_address, server_port, server_address)) return uid;
  if (family != AF_INET) return std::nullopt;
  __be32 mapped_client[4] = {0, 0, htonl(0xffff), client_address[0]};
  __be32 mapped_server[4] = {0, 0, htonl(0xffff), server_address[0]};
  return query(AF_INET6, client_port, mapped_client, server_port, mapped_server);
}

}  // namespace braid::net
