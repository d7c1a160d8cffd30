// The store against the attacks of another user of the host and of a hostile client: a device-bound client of
// another uid, a squatter on another address of "localhost", a relay that alters frames after the handshake,
// idle-connection floods, memory floods and allocation failures, and the messages a rank then reads.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/rendezvous.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/store.hpp"
#include "bootstrap/tcp_peer.hpp"
#include "braid/error.hpp"
#include "expect_error.hpp"

namespace braid {
namespace {

using Clock = std::chrono::steady_clock;
const std::string kSecret = "attack-test-secret-0123456789abcdef";
constexpr uid_t kOtherUid = 65534;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string u32(uint32_t value) { return std::string(reinterpret_cast<const char*>(&value), 4); }
std::string i64(int64_t value) { return std::string(reinterpret_cast<const char*>(&value), 8); }
std::string field(const std::string& bytes) { return u32(static_cast<uint32_t>(bytes.size())) + bytes; }
std::string frame(const std::string& body) { return u32(static_cast<uint32_t>(body.size())) + body; }
std::string set_frame(const std::string& key, const std::string& value) {
  return frame(std::string(1, 1) + field(key) + field(value));
}
std::string try_get_frame(const std::string& key) { return frame(std::string(1, 3) + field(key)); }

int connect_v4(int port) { return net::tcp_connect("127.0.0.1", port, net::deadline_after(2.0)); }

// A blocking connect to 127.0.0.1:port with system calls only (for forked children); -1 on failure.
int raw_connect_v4(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

bool send_bytes(int fd, const std::string& bytes) {
  return net::write_all(fd, bytes.data(), bytes.size(), net::deadline_after(5.0));
}

// Whether the server closed `fd` (end of stream or reset) within `seconds`, reading and dropping what it sent.
bool closed_within(int fd, double seconds) {
  const auto deadline = net::deadline_after(seconds);
  char buffer[4096];
  for (;;) {
    pollfd ready{fd, POLLIN, 0};
    if (poll(&ready, 1, net::milliseconds_left(deadline)) != 1) return false;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

// The peak resident memory of process `pid`, in bytes (VmHWM).
size_t peak_rss(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Runs `attack` in a forked child that became uid 65534 (only system calls there), and returns its one-letter
// result: 'u' where this root may not change uid. Needs root; the caller skips otherwise.
char as_other_user(const std::function<char()>& attack) {
  int done[2];
  if (pipe(done) != 0) return 'e';
  const pid_t child = fork();
  if (child == 0) {
    char result = 'u';
    if (setgroups(0, nullptr) == 0 && setgid(kOtherUid) == 0 && setuid(kOtherUid) == 0) result = attack();
    (void)!write(done[1], &result, 1);
    _exit(0);
  }
  close(done[1]);
  char result = 'e';
  if (read(done[0], &result, 1) != 1) result = 'e';
  close(done[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return result;
}

// What a TRY_GET of "key" on a fresh connection from this process (`bind_device`: bound to the loopback device
// first) gets: 's' served, 'c' closed, 'r' refused at connect, 't' no answer in 5 s.
char try_get_as_client(int port, bool bind_device) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (bind_device && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, "lo", 3) != 0) return 'd';
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) return 'r';
  const std::string request = try_get_frame("key");
  (void)!write(fd, request.data(), request.size());
  pollfd ready{fd, POLLIN, 0};
  char status = 0;
  const char result = poll(&ready, 1, 5000) != 1 ? 't' : recv(fd, &status, 1, 0) == 1 ? 's' : 'c';
  close(fd);
  return result;
}

#define SKIP_UNLESS_ROOT() \
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user (uid 65534)"

// A client of another uid whose socket is bound to the loopback device (SO_BINDTODEVICE, open to any user) is
// refused like any other: the owner lookup does not skip device-bound sockets.
TEST(StoreAttacks, ADeviceBoundClientOfAnotherUserIsRefused) {
  SKIP_UNLESS_ROOT();
  StoreServer server("127.0.0.1", 0, StoreLimits{}, std::string());
  StoreClient("127.0.0.1", server.port(), 2.0, std::string()).set("key", "value");
  const int port = server.port();
  const char plain = as_other_user([&] { return try_get_as_client(port, false); });
  const char bound = as_other_user([&] { return try_get_as_client(port, true); });
  if (plain == 'u') GTEST_SKIP() << "this root may not change uid";
  EXPECT_TRUE(plain == 'c' || plain == 'r') << "plain client: " << plain;
  EXPECT_TRUE(bound == 'c' || bound == 'r' || bound == 'd') << "device-bound client: " << bound;
  EXPECT_EQ(StoreClient("127.0.0.1", port, 2.0, std::string()).try_get("key"), std::optional<std::string>("value"));
}

// The owner of a device-bound client's socket is found (an exact-socket query would say "none": remote).
TEST(StoreAttacks, TheOwnerOfADeviceBoundLocalSocketIsFound) {
  SKIP_UNLESS_ROOT();  // binding to a device needs CAP_NET_RAW on older kernels
  std::vector<int> listeners = net::tcp_listen("127.0.0.1", 0, nullptr);
  ASSERT_EQ(listeners.size(), 1u);
  sockaddr_in address{};
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(listeners[0], reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(setsockopt(client, SOL_SOCKET, SO_BINDTODEVICE, "lo", 3), 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const int accepted = accept(listeners[0], nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  const net::PeerOwner owner = net::peer_owner(accepted);
  EXPECT_TRUE(owner.local);
  EXPECT_EQ(owner.uid, std::optional<uid_t>(geteuid())) << owner.unknown_why;
  close(client);
  close(accepted);
  close(listeners[0]);
}

// The decision fails closed: a local client whose owner the kernel does not name is refused.
TEST(StoreAttacks, ALocalClientOfUnknownOwnerIsRefused) {
  EXPECT_FALSE(net::serves_peer(net::PeerOwner{true, std::nullopt, "lookup failed"}, 1000));
  EXPECT_FALSE(net::serves_peer(net::PeerOwner{true, 1001, ""}, 1000));
  EXPECT_TRUE(net::serves_peer(net::PeerOwner{true, 1000, ""}, 1000));
  EXPECT_TRUE(net::serves_peer(net::PeerOwner{false, std::nullopt, ""}, 1000));
  // A client gone before the lookup is not found: refused, not taken for a remote one.
  const int listener = net::tcp_listen("127.0.0.1", 0, nullptr).front();
  const int port = [&] {
    sockaddr_in address{};
    socklen_t length = sizeof(address);
    getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
    return ntohs(address.sin_port);
  }();
  const int client = connect_v4(port);
  const int accepted = accept(listener, nullptr, nullptr);
  linger abort_close{1, 0};  // a reset: the client's socket is gone at once
  setsockopt(client, SOL_SOCKET, SO_LINGER, &abort_close, sizeof(abort_close));
  close(client);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const net::PeerOwner owner = net::peer_owner(accepted);
  EXPECT_TRUE(owner.local);
  EXPECT_FALSE(net::serves_peer(owner, geteuid())) << "uid " << (owner.uid ? int(*owner.uid) : -1);
  close(accepted);
  close(listener);
}

bool ipv6_loopback_available() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return ok;
}

bool localhost_has_ipv6() {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo("localhost", "1", &hints, &result) != 0) return false;
  bool v6 = false;
  for (addrinfo* entry = result; entry != nullptr; entry = entry->ai_next) v6 |= entry->ai_family == AF_INET6;
  freeaddrinfo(result);
  return v6;
}

// Listens on [::1]:port as a squatter would; -1 when that address is taken.
int squat_ipv6_loopback(int port) {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  address.sin6_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// In a child with a private mount namespace whose /etc/hosts lists ::1 first for localhost (Fedora and RHEL
// style), runs `check` and returns its exit code; -1 where this process may not make one (not root, say).
int with_ipv6_first_localhost(const std::function<int()>& check) {
  const pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    char hosts[] = "/tmp/braid-hosts-XXXXXX";
    const int fd = mkstemp(hosts);
    const std::string text = "::1 localhost\n127.0.0.1 localhost\n";
    if (fd < 0 || write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) _exit(200);
    close(fd);
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount(hosts, "/etc/hosts", nullptr, MS_BIND, nullptr) != 0) {
      unlink(hosts);
      _exit(200);
    }
    int code = 201;
    if (localhost_has_ipv6()) code = check();
    unlink(hosts);
    _exit(code);
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) >= 200) return -1;
  return WEXITSTATUS(status);
}

// A store for "localhost" holds every address of the name: nobody can listen on [::1] beside it, so a rank that
// dials ::1 first reaches the store; and a store whose [::1] is already taken refuses to start, naming the
// address, rather than leave the ranks to dial a squatter.
TEST(StoreAttacks, AStoreForLocalhostHoldsEveryAddressOfTheName) {
  if (!ipv6_loopback_available()) GTEST_SKIP() << "this host has no IPv6 loopback";
  const int code = with_ipv6_first_localhost([] {
    {
      StoreServer server(store_bind_host("localhost"), 0, StoreLimits{}, std::string());
      if (squat_ipv6_loopback(server.port()) >= 0) return 1;  // a squatter could listen beside the store
      StoreClient client("localhost", server.port(), 2.0, std::string());
      client.set("k", "v");
      if (client.get("k", 1.0) != "v") return 2;
    }
    std::vector<int> probe = net::tcp_listen("127.0.0.1", 0, nullptr);
    sockaddr_in address{};
    socklen_t length = sizeof(address);
    getsockname(probe[0], reinterpret_cast<sockaddr*>(&address), &length);
    const int port = ntohs(address.sin_port);
    close(probe[0]);
    const int squatter = squat_ipv6_loopback(port);
    if (squatter < 0) return 3;
    try {
      StoreServer server(store_bind_host("localhost"), port, StoreLimits{}, std::string());
      return 4;  // started beside a squatter on [::1]
    } catch (const Error& error) {
      if (std::string(error.what()).find("[::1]:" + std::to_string(port)) == std::string::npos) return 5;
    }
    close(squatter);
    return 0;
  });
  if (code < 0) GTEST_SKIP() << "cannot give a child its own /etc/hosts (needs root and mount namespaces)";
  EXPECT_EQ(code, 0) << "1: a squatter listened on [::1] beside the store; 2: the client missed the store; "
                        "3: no squatter; 4: the store started beside a squatter; 5: its error did not name [::1]";
}

// A relay between a rank and the store that passes the handshake through and then alters, replays or injects
// frames: each is caught by the frame MACs; the store's keys stay what the job wrote.
class Relay {
 public:
  // `tamper(index, frame)` may change each client-to-server frame after the handshake (index 0 is the first).
  Relay(int store_port, std::function<std::string(int, const std::string&)> tamper)
      : tamper_(std::move(tamper)) {
    listener_ = net::tcp_listen("127.0.0.1", 0, &port_).front();
    thread_ = std::thread([this, store_port] { run(store_port); });
  }
  ~Relay() {
    stop_ = true;
    shutdown(listener_, SHUT_RDWR);
    thread_.join();
    close(listener_);
  }
  int port() const { return port_; }

 private:
  static bool read_frame(int fd, std::string* out) {
    char header[4];
    if (!net::read_all(fd, header, 4, net::deadline_after(5.0))) return false;
    uint32_t length;
    std::memcpy(&length, header, 4);
    std::string body(length, '\0');
    if (!net::read_all(fd, body.data(), length, net::deadline_after(5.0))) return false;
    *out = std::string(header, 4) + body;
    return true;
  }
  void run(int store_port) {
    pollfd ready{listener_, POLLIN, 0};
    if (poll(&ready, 1, 5000) != 1 || stop_) return;
    const int client = accept(listener_, nullptr, nullptr);
    const int store = connect_v4(store_port);
    std::string request, reply;
    for (int index = -2; !stop_; ++index) {  // the first two requests: HELLO and PROVE
      if (!read_frame(client, &request)) break;
      if (index >= 0) request = tamper_(index, request);
      if (!send_bytes(store, request) || !read_frame(store, &reply) || !send_bytes(client, reply)) break;
    }
    close(client);
    close(store);
  }
  std::function<std::string(int, const std::string&)> tamper_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(StoreAttacks, ARelayCannotAlterReplayOrInjectFramesAfterTheHandshake) {
  StoreServer server("127.0.0.1", 0, StoreLimits{}, kSecret);
  const auto direct = [&] { return StoreClient("127.0.0.1", server.port(), 2.0, kSecret); };
  direct().set("key", "job");
  // Altered: the value of the first SET.
  {
    Relay relay(server.port(), [](int, const std::string& frame) {
      std::string altered = frame;
      altered[altered.size() - 40] ^= 1;  // a byte of the value, before the 32-byte MAC
      return altered;
    });
    StoreClient client("127.0.0.1", relay.port(), 2.0, kSecret);
    expect_error([&] { client.set("key", "rank"); }, ErrorCode::kRemoteError);
  }
  EXPECT_EQ(direct().try_get("key"), std::optional<std::string>("job"));
  // Replayed: the second request is the first again (a SET the relay wants repeated).
  {
    std::string first;
    Relay relay(server.port(), [&](int index, const std::string& frame) {
      if (index == 0) first = frame;
      return index == 1 ? first : frame;
    });
    StoreClient client("127.0.0.1", relay.port(), 2.0, kSecret);
    client.set("replayed", "1");
    expect_error([&] { client.set("other", "2"); }, ErrorCode::kRemoteError);
  }
  EXPECT_EQ(direct().try_get("other"), std::nullopt);
  // Injected: the relay's own unsealed SET in place of the client's request.
  {
    Relay relay(server.port(), [](int, const std::string&) { return set_frame("key", "relay"); });
    StoreClient client("127.0.0.1", relay.port(), 2.0, kSecret);
    expect_error([&] { client.try_get("key"); }, ErrorCode::kRemoteError);
  }
  EXPECT_EQ(direct().try_get("key"), std::optional<std::string>("job"));
}

// Without a secret, 1,000 idle connections of another uid, bound to the loopback device (which an exact-socket
// owner lookup misses), are closed at once; a rank connects and is served within a second meanwhile.
TEST(StoreAttacks, AnIdleFloodOfAnotherUserDoesNotDelayTheRanks) {
  SKIP_UNLESS_ROOT();
  StoreServer server("127.0.0.1", 0, StoreLimits{}, std::string());
  const int port = server.port();
  int report[2], go[2];
  ASSERT_EQ(pipe(report), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the other user: system calls only
    int opened = -1;  // -1: may not change uid
    std::vector<int> flood;
    if (setgroups(0, nullptr) == 0 && setgid(kOtherUid) == 0 && setuid(kOtherUid) == 0) {
      rlimit limit{};
      getrlimit(RLIMIT_NOFILE, &limit);
      limit.rlim_cur = limit.rlim_max;
      setrlimit(RLIMIT_NOFILE, &limit);
      for (int i = 0; i < 1000; ++i) {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) break;
        setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, "lo", 3);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_port = htons(static_cast<uint16_t>(port));
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) flood.push_back(fd);
      }
      opened = static_cast<int>(flood.size());
    }
    (void)!write(report[1], &opened, sizeof(opened));
    char byte;
    (void)!read(go[0], &byte, 1);  // the rank has been served: how many of the flood are still open?
    int open = 0;
    for (int fd : flood) {
      pollfd ready{fd, POLLIN, 0};
      char buffer[64];
      open += !(poll(&ready, 1, 0) == 1 && recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT) <= 0);
    }
    (void)!write(report[1], &open, sizeof(open));
    _exit(0);
  }
  close(report[1]);
  close(go[0]);
  int opened = 0, still_open = -1;
  ASSERT_EQ(read(report[0], &opened, sizeof(opened)), static_cast<ssize_t>(sizeof(opened)));
  const auto start = Clock::now();
  std::optional<std::string> value;
  double took = 0;
  try {
    StoreClient rank("127.0.0.1", port, 5.0, std::string());
    rank.set("rank", "in");
    value = rank.try_get("rank");
    took = seconds_since(start);
  } catch (const Error& error) {
    ADD_FAILURE() << "the rank was not served during the flood: " << error.what();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  (void)!write(go[1], "g", 1);
  EXPECT_EQ(read(report[0], &still_open, sizeof(still_open)), static_cast<ssize_t>(sizeof(still_open)));
  close(report[0]);
  close(go[1]);
  waitpid(child, nullptr, 0);
  if (opened < 0) GTEST_SKIP() << "this root may not change uid";
  EXPECT_GT(opened, 0);
  EXPECT_EQ(still_open, 0) << "of " << opened << " idle connections of uid 65534, " << still_open << " stayed open";
  EXPECT_EQ(value, std::optional<std::string>("in"));
  EXPECT_LT(took, 1.0) << "a rank took " << took << " s to connect and be served during the flood";
}

// With a secret, idle unproven connections are few (64 at most, the oldest closed first) and short-lived
// (prove_within_s); the job's ranks connect within a second during a flood of them.
TEST(StoreAttacks, UnprovenConnectionsAreBoundedInNumberAndTime) {
  StoreLimits limits;
  limits.prove_within_s = 1.0;
  StoreServer server("127.0.0.1", 0, limits, kSecret);
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(connect_v4(server.port()));
  const auto start = Clock::now();
  StoreClient rank("127.0.0.1", server.port(), 5.0, kSecret);
  rank.set("rank", "in");
  EXPECT_LT(seconds_since(start), 1.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int open = 0;
  for (int fd : idle) open += !closed_within(fd, 0.001);
  EXPECT_LE(open, 64) << "unproven connections kept open";
  int closed_later = 0;
  for (int fd : idle) closed_later += closed_within(fd, 2.5);
  EXPECT_EQ(closed_later, static_cast<int>(idle.size())) << "unproven connections outlived prove_within_s";
  for (int fd : idle) close(fd);
  EXPECT_EQ(rank.try_get("rank"), std::optional<std::string>("in"));
}

// A store served by a forked child, so that its memory is measured, or limited, apart from the test's; `prepare`
// runs in the child once the server listens. The child is killed when this goes.
class ChildStore {
 public:
  explicit ChildStore(StoreLimits limits, const std::function<void()>& prepare = {}) {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      StoreServer server("127.0.0.1", 0, limits, std::string());
      if (prepare) prepare();
      const int port = server.port();
      (void)!write(pipe_fds[1], &port, sizeof(port));
      sleep(120);
      _exit(0);
    }
    close(pipe_fds[1]);
    if (pid_ < 0 || read(pipe_fds[0], &port_, sizeof(port_)) != static_cast<ssize_t>(sizeof(port_))) port_ = 0;
    close(pipe_fds[0]);
  }
  ~ChildStore() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }  // 0: the child did not start serving
  bool alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// The memory floods of a proven client (no secret: any client of this uid is proven), against a server in a
// child process with a 64 MiB budget: oversized values, many large values, replies never read, WAITs of many
// keys, one huge frame. The child's peak resident memory stays within the budget (and a margin for the process
// itself), and a rank is served throughout.
TEST(StoreAttacks, MemoryFloodsStayWithinTheBudget) {
  constexpr size_t kBudget = size_t(64) << 20;
  StoreLimits limits;
  limits.budget_bytes = kBudget;
  limits.max_value_bytes = size_t(16) << 20;
  const ChildStore store(limits);
  ASSERT_NE(store.port(), 0);
  const pid_t child = store.pid();
  const int port = store.port();
  const size_t baseline = peak_rss(child);
  StoreClient rank("127.0.0.1", port, 5.0, std::string());
  const std::string chunk(1 << 20, 'x');
  // Streams a frame of `length` bytes (a SET of key `key`) without holding it here; returns the connection.
  const auto stream_set = [&](const std::string& key, uint32_t value_bytes) {
    const int fd = connect_v4(port);
    std::string head = std::string(1, 1) + field(key) + u32(value_bytes);
    head = u32(static_cast<uint32_t>(head.size() + value_bytes)) + head;
    bool ok = send_bytes(fd, head);
    for (uint32_t sent = 0; ok && sent < value_bytes; sent += chunk.size()) {
      ok = send_bytes(fd, chunk.substr(0, std::min<size_t>(chunk.size(), value_bytes - sent)));
    }
    return fd;
  };
  std::vector<int> hogs;
  // 24 SETs of 64 MiB: over the value cap, refused from their headers.
  for (int i = 0; i < 24; ++i) {
    hogs.push_back(stream_set("big" + std::to_string(i), 64u << 20));
    if (i % 8 == 7) rank.set("alive", std::to_string(i));
  }
  // SETs of 15 MiB until the budget refuses them (four fit at most).
  int stored = 0;
  for (int i = 0; i < 8; ++i) {
    const int fd = stream_set("value" + std::to_string(i), 15u << 20);
    std::string reply(5, '\0');
    if (net::read_all(fd, reply.data(), reply.size(), net::deadline_after(10.0)) && reply[4] == 0) ++stored;
    hogs.push_back(fd);
  }
  EXPECT_GE(stored, 1);
  EXPECT_LE(stored, 4);
  // 16 connections each GET a stored value and never read the reply.
  for (int i = 0; i < 16; ++i) {
    const int fd = connect_v4(port);
    send_bytes(fd, frame(std::string(1, 2) + field("value0") + i64(1000)));
    hogs.push_back(fd);
  }
  // 32 parked WAITs of 65,536 keys each.
  for (int i = 0; i < 32; ++i) {
    std::string body = std::string(1, 4) + u32(65536);
    for (int k = 0; k < 65536; ++k) body += field("w" + std::to_string(i) + "/" + std::to_string(k));
    body += i64(60000);
    const int fd = connect_v4(port);
    send_bytes(fd, frame(body));
    hogs.push_back(fd);
  }
  // One frame of 516 MiB.
  {
    const int fd = connect_v4(port);
    send_bytes(fd, u32(516u << 20) + std::string(1, 1));
    hogs.push_back(fd);
  }
  rank.set("after", "floods");
  EXPECT_EQ(rank.get("after", 5.0), "floods");
  const size_t peak = peak_rss(child);
  for (int fd : hogs) close(fd);
  EXPECT_EQ(StoreClient("127.0.0.1", port, 5.0, std::string()).try_get("after"), std::optional<std::string>("floods"));
  const size_t margin = size_t(32) << 20;  // the process's own growth: thread stacks, allocator slack
  EXPECT_LE(peak, baseline + kBudget + margin)
      << "peak resident memory " << (peak >> 20) << " MiB, baseline " << (baseline >> 20) << " MiB";
}

// The budget tests' store: 1 MiB for everything, a value as large as the budget allowed.
constexpr size_t kSmallBudget = size_t(1) << 20;
StoreLimits small_budget() {
  StoreLimits limits;
  limits.budget_bytes = kSmallBudget;
  limits.max_value_bytes = kSmallBudget;
  return limits;
}

// A client whose unfinished frame holds all but a few bytes of the budget is dropped when a rank's GET, read into
// those bytes, needs room to park its key: the rank is served, the hog's connection closed. The gap fits the GET's
// frame (17 bytes and its key) but not the parked key (the key and kStoreEntryOverheadBytes).
TEST(StoreAttacks, AClientHoldingTheBudgetIsDroppedForARanksSmallRequest) {
  StoreServer server("127.0.0.1", 0, small_budget(), std::string());
  const int port = server.port();
  StoreClient("127.0.0.1", port, 5.0, std::string()).set("k", "v");
  const size_t stored = 2 + kStoreEntryOverheadBytes;
  const size_t get_frame = 17 + 1, gap = get_frame + kStoreEntryOverheadBytes / 2;
  static_assert(17 + 1 + kStoreEntryOverheadBytes / 2 < 1 + kStoreEntryOverheadBytes, "the gap must not hold the key");
  // The hog: a SET frame's header, its whole length reserved, the rest never sent.
  const int hog = connect_v4(port);
  ASSERT_GE(hog, 0);
  ASSERT_TRUE(send_bytes(hog, u32(static_cast<uint32_t>(kSmallBudget - stored - gap - 4)) + std::string(1, 1)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the server reserves it
  const int rank = connect_v4(port);
  ASSERT_GE(rank, 0);
  ASSERT_TRUE(send_bytes(rank, frame(std::string(1, 2) + field("k") + i64(2000))));
  char reply[10] = {};
  ASSERT_TRUE(net::read_all(rank, reply, sizeof reply, net::deadline_after(2.0))) << "no reply to the rank's GET";
  EXPECT_EQ(reply[4], 0) << "the rank's GET was refused: " << std::string(reply + 5, 5);
  EXPECT_EQ(std::string(reply + 5, 5), u32(1) + "v");
  EXPECT_TRUE(closed_within(hog, 2.0)) << "the hog's connection stayed open";
  close(hog);
  close(rank);
}

// A store full of values: a client's request that does not fit is refused, and a rank waiting on a few keys is not
// dropped to make room for it (it holds far less than kStoreDroppableShare of the budget).
TEST(StoreAttacks, ARanksWaitingKeysAreNotDroppedForAnotherClientsRequest) {
  StoreServer server("127.0.0.1", 0, small_budget(), std::string());
  const int port = server.port();
  auto wait_frame = [](const std::vector<std::string>& keys) {
    std::string body = std::string(1, 4) + u32(static_cast<uint32_t>(keys.size()));
    for (const std::string& key : keys) body += field(key);
    return frame(body + i64(60000));
  };
  const int rank = connect_v4(port);
  ASSERT_GE(rank, 0);
  ASSERT_TRUE(send_bytes(rank, wait_frame({"rank/0", "rank/1", "rank/2", "rank/3"})));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // parked
  // Values of halving sizes until the budget has less room left than the smallest entry.
  int stored = 0;
  for (size_t size = kSmallBudget / 2; size >= 1; size /= 2) {
    for (int again = 0; again < 2; ++again) {
      try {
        StoreClient("127.0.0.1", port, 5.0, std::string()).set("v" + std::to_string(stored), std::string(size, 'v'));
        ++stored;
      } catch (const Error&) {
        break;
      }
    }
  }
  ASSERT_GT(stored, 10);
  const int other = connect_v4(port);
  ASSERT_GE(other, 0);
  ASSERT_TRUE(send_bytes(other, wait_frame({"a", "b"})));
  char reply[5] = {};
  ASSERT_TRUE(net::read_all(other, reply, sizeof reply, net::deadline_after(2.0))) << "no reply to the WAIT";
  EXPECT_NE(reply[4], 0) << "a WAIT fitted a full budget";
  EXPECT_FALSE(closed_within(rank, 0.5)) << "the rank waiting on 4 keys was dropped to make room";
  close(other);
  close(rank);
}

// An allocation that fails anyway (an address-space limit below the budget) drops that client, never the server.
TEST(StoreAttacks, AnAllocationFailureDropsTheClientNotTheServer) {
  StoreLimits limits;
  limits.budget_bytes = size_t(4) << 30;  // beyond what the address space allows
  limits.max_value_bytes = size_t(16) << 20;
  const ChildStore store(limits, [] {
    std::ifstream status("/proc/self/status");
    size_t vm_size = 0;
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmSize:", 0) == 0) vm_size = std::stoull(line.substr(7)) * 1024;
    }
    rlimit space{vm_size + (size_t(160) << 20), RLIM_INFINITY};
    setrlimit(RLIMIT_AS, &space);
  });
  ASSERT_NE(store.port(), 0);
  const int port = store.port();
  bool dropped = false;
  {
    StoreClient hog("127.0.0.1", port, 5.0, std::string());
    const std::string value(15u << 20, 'v');
    for (int i = 0; i < 40 && !dropped; ++i) {
      try {
        hog.set("hog" + std::to_string(i), value);
      } catch (const Error&) {
        dropped = true;
      }
    }
  }
  StoreClient rank("127.0.0.1", port, 5.0, std::string());
  rank.set("rank", "served");
  EXPECT_EQ(rank.try_get("rank"), std::optional<std::string>("served"));
  EXPECT_TRUE(store.alive()) << "the serving process died";
  EXPECT_TRUE(dropped) << "40 values of 15 MiB fit an address space of 160 MiB more";
}

// Reads one frame's body from `fd`; nullopt when the stream ends or 2 s pass.
std::optional<std::string> read_frame(int fd) {
  char header[4];
  if (!net::read_all(fd, header, 4, net::deadline_after(2.0))) return std::nullopt;
  uint32_t length;
  std::memcpy(&length, header, 4);
  if (length > (1u << 20)) return std::nullopt;
  std::string body(length, '\0');
  if (!net::read_all(fd, body.data(), length, net::deadline_after(2.0))) return std::nullopt;
  return body;
}

// 2,000 clients that prove the secret by hand, then send random frames, sealed with the right MAC, a wrong one,
// or none: each is served or dropped, never the others, and the good client's keys stay what it wrote.
TEST(StoreAttacks, FuzzedFramesAfterTheHandshakeLeaveTheServerCorrect) {
  StoreLimits limits;
  limits.slow_client_s = 0.2;
  limits.budget_bytes = size_t(64) << 20;
  StoreServer server("127.0.0.1", 0, limits, kSecret);
  StoreClient good("127.0.0.1", server.port(), 5.0, kSecret);
  good.set("fixed", "value");
  std::mt19937_64 random(20261129);
  int served = 0;
  for (int i = 0; i < 2000; ++i) {
    const int fd = connect_v4(server.port());
    ASSERT_GE(fd, 0);
    const std::string nonce = store_nonce();
    send_bytes(fd, frame(std::string(1, 7) + field(nonce)));
    const std::optional<std::string> hello = read_frame(fd);
    ASSERT_TRUE(hello && hello->size() == 1 + 4 + kStoreNonceBytes + 4 + 32 && (*hello)[0] == 0);
    const std::string server_nonce = hello->substr(5, kStoreNonceBytes);
    send_bytes(fd, frame(std::string(1, 8) + field(store_proof(kSecret, StoreRole::kClient, nonce, server_nonce))));
    ASSERT_TRUE(read_frame(fd).has_value());
    const std::string session = store_session_key(kSecret, nonce, server_nonce);
    for (uint64_t sequence = 0, frames = random() % 4 + 1; sequence < frames; ++sequence) {
      std::string body(1, static_cast<char>(random() % 9));
      const std::string key = "fuzz/" + std::to_string(random() % 16);
      body += field(key);
      if (body[0] == 1) body += field(std::string(random() % 64, 'v'));
      if (body[0] == 2 || body[0] == 4 || body[0] == 5) body += i64(static_cast<int64_t>(random() % 3));
      if (random() % 4 == 0) body.resize(random() % body.size());
      std::string mac;
      switch (random() % 3) {
        case 0: mac = store_frame_mac(session, FrameDirection::kRequest, sequence, body); break;
        case 1: mac = store_frame_mac(session, FrameDirection::kRequest, sequence + 1, body); break;
        default: break;
      }
      if (!send_bytes(fd, frame(body + mac))) break;
      const std::optional<std::string> answer = read_frame(fd);
      if (!answer) break;
      served += mac.size() == 32;
    }
    close(fd);
    if (i % 200 == 199) {
      ASSERT_EQ(good.try_get("fixed"), std::optional<std::string>("value")) << "after client " << i;
      good.set("progress", std::to_string(i));
      ASSERT_EQ(good.get("progress", 1.0), std::to_string(i));
    }
  }
  EXPECT_GT(served, 0) << "no fuzzed frame was answered: the fuzz never got past the MAC check";
}

// The messages a rank reads: a handshake out of order, a server that is not braid's store, a name that does not
// resolve within a short timeout.
TEST(StoreAttacks, MessagesSayWhatHappened) {
  StoreServer server("127.0.0.1", 0, StoreLimits{}, kSecret);
  {
    const int fd = connect_v4(server.port());
    send_bytes(fd, frame(std::string(1, 8) + field(std::string(32, 'p'))));  // PROVE before HELLO
    char header[4];
    ASSERT_TRUE(net::read_all(fd, header, 4, net::deadline_after(2.0)));
    uint32_t length;
    std::memcpy(&length, header, 4);
    std::string body(length, '\0');
    ASSERT_TRUE(net::read_all(fd, body.data(), length, net::deadline_after(2.0)));
    EXPECT_NE(body.find("PROVE came before HELLO"), std::string::npos) << body;
    EXPECT_EQ(body.find("does not match"), std::string::npos) << body;
    close(fd);
  }
  {
    // A squatter that accepts and closes: the rank is told it may not be braid's store.
    int port = 0;
    const int squatter = net::tcp_listen("127.0.0.1", 0, &port).front();
    std::thread closer([&] {
      pollfd ready{squatter, POLLIN, 0};
      if (poll(&ready, 1, 5000) == 1) close(accept(squatter, nullptr, nullptr));
    });
    const std::string message =
        expect_error([&] { StoreClient("127.0.0.1", port, 2.0, kSecret); }, ErrorCode::kRemoteError);
    closer.join();
    close(squatter);
    EXPECT_NE(message.find("not braid's store"), std::string::npos) << message;
  }
  {
    std::string error;
    const auto start = Clock::now();
    EXPECT_EQ(net::tcp_connect("no-such-host.invalid", 1, net::deadline_after(0.5), &error, 30.0), -1);
    EXPECT_LT(seconds_since(start), 5.0);
    EXPECT_EQ(error.find("30"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace braid
