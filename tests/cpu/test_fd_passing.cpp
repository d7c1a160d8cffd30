// FdExchanger: ranks are threads of this process, each with its own exchanger on a fresh scope.
// Identity of a received fd is checked through its content (memfd) or by writing through it (pipe).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/fd_passing.hpp"
#include "braid/error.hpp"

namespace braid {
namespace {

constexpr double kTimeoutS = 20.0;  // generous: the ranks are threads on a small, busy machine

// A scope no other test or process on this host uses.
std::string fresh_scope() {
  static std::atomic<int> counter{0};
  std::random_device random;
  return "test-" + std::to_string(::getpid()) + "-" + std::to_string(random()) + "-" + std::to_string(counter++);
}

// Runs fn(rank) on `size` threads and fails the test with the first exception any of them threw.
void run_ranks(int size, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < size; ++rank) {
    if (!errors[rank]) continue;
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "rank " << rank << ": " << error.what();
    }
  }
}

std::string rank_content(int rank) { return "content of rank " + std::to_string(rank); }

// A memfd holding `content`.
int memfd_with(const std::string& content) {
  int fd = ::memfd_create("braid-test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::pwrite(fd, content.data(), content.size(), 0), static_cast<ssize_t>(content.size()));
  return fd;
}

std::string read_content(int fd) {
  char buffer[128] = {};
  ssize_t n = ::pread(fd, buffer, sizeof(buffer), 0);
  return n > 0 ? std::string(buffer, n) : std::string();
}

int open_fd_count() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count;
}

template <typename Body>
Error expect_error(Body body) {
  try {
    body();
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "expected braid::Error";
  return Error(ErrorCode::kSuccess, "");
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Every rank shares a memfd with rank-specific content; every rank reads every other's.
void exchange_memfds(int size) {
  const std::string scope = fresh_scope();
  run_ranks(size, [&](int rank) {
    FdExchanger exchanger(scope, rank, size, kTimeoutS);
    exchanger.admit(std::vector<int>(size, static_cast<int>(::getpid())));  // every rank is this process
    int mine = memfd_with(rank_content(rank));
    std::vector<int> fds = exchanger.all_exchange(mine, 7);
    ASSERT_EQ(fds.size(), static_cast<size_t>(size));
    EXPECT_EQ(fds[rank], -1);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      EXPECT_EQ(read_content(fds[peer]), rank_content(peer)) << "rank " << rank << " from " << peer;
      EXPECT_NE(::fcntl(fds[peer], F_GETFD) & FD_CLOEXEC, 0) << "received fd is not close-on-exec";
      ::close(fds[peer]);
    }
    ::close(mine);
  });
}

TEST(FdPassing, AllExchangeTwoRanks) { exchange_memfds(2); }
TEST(FdPassing, AllExchangeFourRanks) { exchange_memfds(4); }
TEST(FdPassing, AllExchangeEightRanks) { exchange_memfds(8); }

TEST(FdPassing, PipeWriteEnds) {
  // Each rank hands out its pipe's write end; every peer writes its rank byte through it.
  const int size = 4;
  const std::string scope = fresh_scope();
  run_ranks(size, [&](int rank) {
    FdExchanger exchanger(scope, rank, size, kTimeoutS);
    int pipe_fds[2];
    ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
    std::vector<int> write_ends = exchanger.all_exchange(pipe_fds[1], 1);
    ::close(pipe_fds[1]);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      char byte = static_cast<char>('0' + rank);
      EXPECT_EQ(::write(write_ends[peer], &byte, 1), 1);
      ::close(write_ends[peer]);
    }
    // Every write end is closed once all peers are done, so reading to EOF collects all bytes.
    std::string got;
    char buffer[16];
    ssize_t n;
    while ((n = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0) got.append(buffer, n);
    ::close(pipe_fds[0]);
    std::sort(got.begin(), got.end());
    std::string expected;
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) expected += static_cast<char>('0' + peer);
    }
    EXPECT_EQ(got, expected) << "rank " << rank;
  });
}

TEST(FdPassing, TagsOutOfOrder) {
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, kTimeoutS);
  FdExchanger rank1(scope, 1, 2, kTimeoutS);
  int two = memfd_with("tag two");
  int one = memfd_with("tag one");
  rank0.send(1, two, 2);  // queued at rank 1's listener; send does not wait for receive
  rank0.send(1, one, 1);
  int got_one = rank1.receive(0, 1);
  int got_two = rank1.receive(0, 2);
  EXPECT_EQ(read_content(got_one), "tag one");
  EXPECT_EQ(read_content(got_two), "tag two");
  for (int fd : {one, two, got_one, got_two}) ::close(fd);
}

TEST(FdPassing, SilentPeerTimesOut) {
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 0.5);
  FdExchanger rank1(scope, 1, 2, 0.5);  // exists, never sends
  auto start = std::chrono::steady_clock::now();
  Error error = expect_error([&] { rank0.receive(1, 42); });
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(error.code(), ErrorCode::kTimeout) << error.what();
  EXPECT_TRUE(contains(error.what(), "rank 1")) << error.what();
  EXPECT_TRUE(contains(error.what(), "tag 42")) << error.what();
  EXPECT_GE(elapsed, 0.45);
  EXPECT_LT(elapsed, 5.0);
}

// No process has this id (pids stay below 2^22 on Linux).
constexpr int kNoSuchPid = 0x7ffffff0;

// Once the ranks' processes are known, a listener of the right user but another process (here: this process,
// where rank 1's process is said to be another) gets nothing.
TEST(FdPassing, SenderRefusesAListenerOfAnotherProcess) {
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 0.5);
  FdExchanger rank1(scope, 1, 2, 0.5);
  rank0.admit({static_cast<int>(::getpid()), kNoSuchPid});
  int fd = memfd_with("secret");
  Error error = expect_error([&] { rank0.send(1, fd, 9); });
  EXPECT_EQ(error.code(), ErrorCode::kSystemError) << error.what();
  EXPECT_TRUE(contains(error.what(), "not rank 1's process " + std::to_string(kNoSuchPid))) << error.what();
  EXPECT_TRUE(contains(error.what(), "sent nothing")) << error.what();
  Error nothing = expect_error([&] { rank1.receive(0, 9); });  // nothing reached the listener
  EXPECT_EQ(nothing.code(), ErrorCode::kTimeout) << nothing.what();
  ::close(fd);
}

// And a receiver takes fds only from the rank's process: one that claims to be rank 1 from another process
// (here: this one) is dropped, its fd closed, and the receive times out.
TEST(FdPassing, ReceiverDropsFdsFromAnotherProcess) {
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 0.5);
  FdExchanger rank1(scope, 1, 2, 0.5);
  rank0.admit({static_cast<int>(::getpid()), kNoSuchPid});
  int fd = memfd_with("forged");
  const int before = open_fd_count();
  rank1.send(0, fd, 11);
  Error error = expect_error([&] { rank0.receive(1, 11); });
  EXPECT_EQ(error.code(), ErrorCode::kTimeout) << error.what();
  EXPECT_EQ(open_fd_count(), before) << "the dropped message's fd stayed open";
  ::close(fd);
}

// A listener whose backlog is full (connections that are never accepted: a flood) makes a send fail with an
// error that says so, not with "not listening".
TEST(FdPassing, AFullBacklogIsNamed) {
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 0.5);
  FdExchanger rank1(scope, 1, 2, 0.5);  // never receives
  const std::string name = rank0.socket_name(1);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  const socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  std::vector<int> flood;
  bool full = false;
  for (int i = 0; i < 1024 && !full; ++i) {
    int socket_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(socket_fd, 0);
    if (::connect(socket_fd, reinterpret_cast<sockaddr*>(&address), length) != 0) {
      full = errno == EAGAIN;
      ::close(socket_fd);
      continue;
    }
    flood.push_back(socket_fd);
  }
  ASSERT_TRUE(full) << "the backlog took " << flood.size() << " connections without filling";
  int fd = memfd_with("x");
  Error error = expect_error([&] { rank0.send(1, fd, 4); });
  EXPECT_EQ(error.code(), ErrorCode::kTimeout) << error.what();
  EXPECT_TRUE(contains(error.what(), "backlog")) << error.what();
  EXPECT_FALSE(contains(error.what(), "not listening")) << error.what();
  for (int socket_fd : flood) ::close(socket_fd);
  ::close(fd);
}

TEST(FdPassing, AbsentPeerSendTimesOut) {
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 0.5);  // rank 1 never binds
  int fd = memfd_with("x");
  Error error = expect_error([&] { rank0.send(1, fd, 3); });
  EXPECT_EQ(error.code(), ErrorCode::kTimeout) << error.what();
  EXPECT_TRUE(contains(error.what(), rank0.socket_name(1))) << error.what();
  ::close(fd);
}

// Another user binds rank 1's socket name before rank 1 does (abstract names carry no permissions): rank 0's
// send must refuse that listener and pass it nothing. The squatter is a child process of uid 65534 (nobody)
// that accepts one connection and reports whether an fd came with it.
TEST(FdPassing, SenderRefusesAListenerOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to start a listener as another user (uid 65534)";
  const std::string scope = fresh_scope();
  const std::string name = "braid-fd-" + scope + "-1";  // FdExchanger's name for rank 1 of a short scope
  int report[2], ready[2];
  ASSERT_EQ(::pipe(report), 0);
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the squatter: only system calls from here on
    char result = 'e';
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
      (void)!::write(ready[1], "u", 1);  // root without the right to change uid (a restricted container)
    } else {
      const int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::memcpy(address.sun_path + 1, name.data(), name.size());
      const socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
      if (::bind(listener, reinterpret_cast<sockaddr*>(&address), length) == 0 && ::listen(listener, 4) == 0) {
        (void)!::write(ready[1], "r", 1);
        pollfd entry{listener, POLLIN, 0};
        result = 'n';  // no connection
        if (::poll(&entry, 1, 10000) == 1) {
          const int connection = ::accept(listener, nullptr, nullptr);
          char byte;
          alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
          iovec io{&byte, 1};
          msghdr message{};
          message.msg_iov = &io;
          message.msg_iovlen = 1;
          message.msg_control = control;
          message.msg_controllen = sizeof(control);
          const ssize_t n = ::recvmsg(connection, &message, 0);
          result = n > 0 && message.msg_controllen > 0 ? 'f' : 'c';  // an fd came, or only a connection
        }
      }
    }
    (void)!::write(report[1], &result, 1);
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(report[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the squatter did not bind @" << name;
  if (byte == 'u') {
    ::waitpid(child, nullptr, 0);
    GTEST_SKIP() << "this process may not change uid (setuid refused): no listener of another user could be made";
  }
  FdExchanger rank0(scope, 0, 2, 5.0);
  ASSERT_EQ(rank0.socket_name(1), name);
  const int fd = memfd_with("rank 0's memory");
  Error error = expect_error([&] { rank0.send(1, fd, 7); });
  EXPECT_EQ(error.code(), ErrorCode::kSystemError) << error.what();
  EXPECT_TRUE(contains(error.what(), "another user")) << error.what();
  EXPECT_TRUE(contains(error.what(), name)) << error.what();
  char result = 0;
  ASSERT_EQ(::read(report[0], &result, 1), 1);
  EXPECT_NE(result, 'f') << "the listener of another user received rank 0's fd";
  EXPECT_EQ(result, 'c') << "the squatter saw no connection (n) or could not bind (e): the test did not run its case";
  int status = 0;
  ::waitpid(child, &status, 0);
  for (int descriptor : {fd, ready[0], report[0]}) ::close(descriptor);
}

// Another user connects to rank 0's socket first and sends a well-formed message posing as rank 1, with an fd of
// its own: rank 0 drops it (another uid) and receives rank 1's real fd for that tag. The impostor is a child
// process of uid 65534 (nobody).
TEST(FdPassing, ReceiverDropsAMessageOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to send as another user (uid 65534)";
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 5.0);
  FdExchanger rank1(scope, 1, 2, 5.0);
  const std::string name = rank0.socket_name(0);
  int done[2];
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the impostor: only system calls from here on
    char result = 'e';
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
      result = 'u';  // root without the right to change uid (a restricted container)
    } else {
      const int forged = ::memfd_create("forged", 0);
      (void)!::write(forged, "forged", 6);
      const int connection = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::memcpy(address.sun_path + 1, name.data(), name.size());
      const socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
      if (::connect(connection, reinterpret_cast<sockaddr*>(&address), length) == 0) {
        struct {
          uint32_t magic;
          int32_t sender;
          uint64_t tag;
        } header{0x62726664, 1, 5};  // FdExchanger's header: "brfd", rank 1, tag 5
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
        iovec io{&header, sizeof(header)};
        msghdr message{};
        message.msg_iov = &io;
        message.msg_iovlen = 1;
        message.msg_control = control;
        message.msg_controllen = sizeof(control);
        cmsghdr* cmsg = CMSG_FIRSTHDR(&message);
        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(cmsg), &forged, sizeof(int));
        result = ::sendmsg(connection, &message, 0) == static_cast<ssize_t>(sizeof(header)) ? 's' : 'f';
      }
    }
    (void)!::write(done[1], &result, 1);
    ::_exit(0);
  }
  ::close(done[1]);
  char result = 0;
  ASSERT_EQ(::read(done[0], &result, 1), 1);
  ::waitpid(child, nullptr, 0);
  ::close(done[0]);
  if (result == 'u') GTEST_SKIP() << "this process may not change uid (setuid refused): no other user could send";
  ASSERT_EQ(result, 's') << "the impostor could not send its message: the test did not run its case";
  const int real = memfd_with("real");
  rank1.send(0, real, 5);
  const int got = rank0.receive(1, 5);
  EXPECT_EQ(read_content(got), "real") << "rank 0 took the other user's fd for rank 1's";
  ::close(got);
  ::close(real);
}

TEST(FdPassing, ScopesDoNotCollide) {
  const std::string scope_a = fresh_scope();
  const std::string scope_b = fresh_scope();
  FdExchanger a(scope_a, 0, 2, kTimeoutS);
  FdExchanger b(scope_b, 0, 2, kTimeoutS);  // same rank, other scope: fine
  EXPECT_NE(a.socket_name(0), b.socket_name(0));

  Error error = expect_error([&] { FdExchanger again(scope_a, 0, 2, kTimeoutS); });
  EXPECT_EQ(error.code(), ErrorCode::kSystemError) << error.what();
  EXPECT_TRUE(contains(error.what(), a.socket_name(0))) << error.what();
  EXPECT_TRUE(contains(error.what(), "already in use")) << error.what();
}

TEST(FdPassing, LongScopeIsShortenedUniquely) {
  const std::string base = fresh_scope() + std::string(200, 'x');
  FdExchanger a(base + "a", 0, 1, kTimeoutS);
  FdExchanger b(base + "b", 0, 1, kTimeoutS);  // differs only past the truncation point
  EXPECT_NE(a.socket_name(0), b.socket_name(0));
  EXPECT_LE(a.socket_name(0).size(), 107u);
}

TEST(FdPassing, RejectsBadArguments) {
  EXPECT_EQ(expect_error([] { FdExchanger bad(fresh_scope(), 2, 2, 1.0); }).code(), ErrorCode::kInvalidArgument);
  FdExchanger rank0(fresh_scope(), 0, 2, 1.0);
  EXPECT_EQ(expect_error([&] { rank0.receive(5, 0); }).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(expect_error([&] { rank0.send(-1, 0, 0); }).code(), ErrorCode::kInvalidArgument);
}

TEST(FdPassing, NoFdLeak) {
  const int before_exchangers = open_fd_count();
  {
    const std::string scope = fresh_scope();
    FdExchanger rank0(scope, 0, 2, kTimeoutS);
    FdExchanger rank1(scope, 1, 2, kTimeoutS);
    int fd0 = memfd_with(rank_content(0));
    int fd1 = memfd_with(rank_content(1));
    const int before = open_fd_count();
    for (uint64_t tag = 0; tag < 200; ++tag) {
      std::thread peer([&] {
        std::vector<int> fds = rank1.all_exchange(fd1, tag);
        EXPECT_EQ(read_content(fds[0]), rank_content(0));
        ::close(fds[0]);
      });
      std::vector<int> fds = rank0.all_exchange(fd0, tag);
      EXPECT_EQ(read_content(fds[1]), rank_content(1));
      ::close(fds[1]);
      peer.join();
    }
    EXPECT_EQ(open_fd_count(), before);
    // An fd that was sent but never received is released with its exchanger.
    rank0.send(1, fd0, 9999);
    ::close(fd0);
    ::close(fd1);
  }
  EXPECT_EQ(open_fd_count(), before_exchangers);
}

}  // namespace
}  // namespace braid
