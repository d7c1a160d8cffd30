// FdExchanger: ranks are threads of this process, each with its own exchanger on a fresh scope.
// Identity of a received fd is checked through its content (memfd) or by writing through it (pipe).
// Tests of other users are child processes that become uid 65534 (nobody): they need root, and skip without it.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#include <initializer_list>
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

constexpr uid_t kNobody = 65534;

// Drops this (child) process to uid and gid 65534 with no supplementary groups; false when not allowed.
// Only system calls: it runs between fork() and _exit().
bool become_nobody() {
  return ::setgroups(0, nullptr) == 0 && ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0;
}

// The address of the socket file at `path`.
socklen_t socket_address(const std::string& path, sockaddr_un* address) {
  *address = sockaddr_un{};
  address->sun_family = AF_UNIX;
  std::memcpy(address->sun_path, path.data(), path.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
}

void close_quietly_all(std::initializer_list<int> fds) {
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
}

// Waits at most `timeout_ms` for a byte on `fd`; 0 when none came.
char read_byte_within(int fd, int timeout_ms) {
  pollfd entry{fd, POLLIN, 0};
  char byte = 0;
  if (::poll(&entry, 1, timeout_ms) == 1 && ::read(fd, &byte, 1) == 1) return byte;
  return 0;
}

// A fresh directory of mode 0700 under /tmp, removed with what the test left in it.
class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    char pattern[] = "/tmp/braid-fd-test-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    EXPECT_NE(made, nullptr) << std::strerror(errno);
    path_ = made != nullptr ? made : "/nonexistent";
  }
  ~TemporaryDirectory() { remove_tree(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  static void remove_tree(const std::string& path) {
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0) return;
    if (S_ISDIR(info.st_mode)) {
      ::chmod(path.c_str(), 0700);
      if (DIR* dir = ::opendir(path.c_str())) {
        std::vector<std::string> names;
        while (dirent* entry = ::readdir(dir)) {
          const std::string name = entry->d_name;
          if (name != "." && name != "..") names.push_back(name);
        }
        ::closedir(dir);
        for (const std::string& name : names) remove_tree(path + "/" + name);
      }
      ::rmdir(path.c_str());
    } else {
      ::unlink(path.c_str());
    }
  }
  std::string path_;
};

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

// discard(tag) closes the fds that came with the tag and those that come later, and no other tag's.
TEST(FdPassing, DiscardClosesATagsFdsNowAndOnArrival) {
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, kTimeoutS);
  FdExchanger rank1(scope, 1, 2, 0.5);
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  const int kept = memfd_with("kept");
  rank0.send(1, pipe_fds[1], 3);  // in rank 1's backlog, not yet accepted
  rank1.discard(3);
  rank0.send(1, pipe_fds[1], 3);  // after the discard: closed once rank 1 accepts it
  rank0.send(1, kept, 4);
  ::close(pipe_fds[1]);
  const int got = rank1.receive(0, 4);  // accepts both messages
  EXPECT_EQ(read_content(got), "kept");
  // Every copy of the write end is closed, so the read end sees its end at once.
  pollfd read_end{pipe_fds[0], POLLIN, 0};
  ASSERT_EQ(::poll(&read_end, 1, 5000), 1) << "a discarded fd is still open";
  char byte;
  EXPECT_EQ(::read(pipe_fds[0], &byte, 1), 0);
  Error error = expect_error([&] { rank1.receive(0, 3); });
  EXPECT_EQ(error.code(), ErrorCode::kTimeout) << error.what();
  for (int fd : {pipe_fds[0], kept, got}) ::close(fd);
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

// interrupt() from another thread ends a receive that waits on a silent peer long before its timeout, with
// kAborted naming the peer; later receives end at once.
TEST(FdPassing, InterruptEndsAWaitingReceiveWithAborted) {
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 30.0);
  FdExchanger rank1(scope, 1, 2, 30.0);  // exists, never sends
  std::thread interrupter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rank0.interrupt();
  });
  auto start = std::chrono::steady_clock::now();
  Error error = expect_error([&] { rank0.receive(1, 7); });
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  interrupter.join();
  EXPECT_EQ(error.code(), ErrorCode::kAborted) << error.what();
  EXPECT_TRUE(contains(error.what(), "rank 1")) << error.what();
  EXPECT_GE(elapsed, 0.09);
  EXPECT_LT(elapsed, 5.0) << "the receive outlived the interrupt";  // loose: a loaded CI machine
  start = std::chrono::steady_clock::now();
  EXPECT_EQ(expect_error([&] { rank0.receive(1, 8); }).code(), ErrorCode::kAborted);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

// A fatal failure the peer watch saw ends a waiting receive with its code and reason (NOTE [ended host waits]);
// abort() replaces it.
TEST(FdPassing, InterruptWithAFailureEndsAWaitingReceiveWithIt) {
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 30.0);
  FdExchanger rank1(scope, 1, 2, 30.0);  // exists, never sends
  std::thread interrupter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rank0.interrupt(ErrorCode::kRevoked, "rank 1 revoked the communicator");
  });
  Error error = expect_error([&] { rank0.receive(1, 7); });
  interrupter.join();
  EXPECT_EQ(error.code(), ErrorCode::kRevoked) << error.what();
  EXPECT_TRUE(contains(error.what(), "rank 1's fd (tag 7) ended: rank 1 revoked the communicator")) << error.what();
  rank0.interrupt();
  EXPECT_EQ(expect_error([&] { rank0.receive(1, 8); }).code(), ErrorCode::kAborted);
}

// A send to a peer that never listens (its process died before it bound its socket) ends on interrupt() long
// before its timeout, with the interruption's code, naming the peer; later sends end at once.
TEST(FdPassing, InterruptEndsASendToAPeerThatNeverListens) {
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 30.0);  // no rank 1
  int fd = memfd_with("never delivered");
  std::thread interrupter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rank0.interrupt(ErrorCode::kRemoteError, "rank 1 exited");
  });
  auto start = std::chrono::steady_clock::now();
  Error error = expect_error([&] { rank0.send(1, fd, 5); });
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  interrupter.join();
  EXPECT_EQ(error.code(), ErrorCode::kRemoteError) << error.what();
  EXPECT_TRUE(contains(error.what(), "rank 1")) << error.what();
  EXPECT_TRUE(contains(error.what(), "rank 1 exited")) << error.what();
  EXPECT_GE(elapsed, 0.09);
  EXPECT_LT(elapsed, 5.0) << "the send outlived the interrupt";  // loose: a loaded CI machine
  rank0.interrupt();
  EXPECT_EQ(expect_error([&] { rank0.send(1, fd, 6); }).code(), ErrorCode::kAborted);
  ::close(fd);
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
  sockaddr_un address;
  const socklen_t length = socket_address(rank0.socket_path(1), &address);
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
  EXPECT_TRUE(contains(error.what(), rank0.socket_path(1))) << error.what();
  ::close(fd);
}

// Another user floods rank 0's socket with connections (before the private directory, 257 of them filled its
// backlog and rank 1's send failed): every connect() is refused with EACCES, and rank 1 still delivers an fd to
// rank 0 within 1 s. The flooder is a child process of uid 65534 that keeps whatever connections it made open
// until the delivery is over.
TEST(FdPassing, OtherUsersCannotReachTheSocket) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another user (uid 65534)";
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 1.0);
  FdExchanger rank1(scope, 1, 2, 1.0);
  sockaddr_un address;
  const socklen_t length = socket_address(rank0.socket_path(0), &address);
  struct Report {
    char status;  // 'u': may not change uid; 'd': done
    int refused;  // EACCES
    int connected;
    int other;    // any other error
  };
  int report[2], release[2];
  ASSERT_EQ(::pipe(report), 0);
  ASSERT_EQ(::pipe(release), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the flooder: only system calls from here on
    Report result{'u', 0, 0, 0};
    if (become_nobody()) {
      result.status = 'd';
      for (int attempt = 0; attempt < 300; ++attempt) {
        const int socket_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (::connect(socket_fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
          ++result.connected;  // kept open: it holds a place in the backlog
          continue;
        }
        ++(errno == EACCES ? result.refused : result.other);
        ::close(socket_fd);
      }
    }
    (void)!::write(report[1], &result, sizeof(result));
    pollfd entry{release[0], POLLIN, 0};
    ::poll(&entry, 1, 10000);  // until the parent is done, at most 10 s
    ::_exit(0);
  }
  ::close(report[1]);
  ::close(release[0]);
  Report result{};
  pollfd entry{report[0], POLLIN, 0};
  const bool reported = ::poll(&entry, 1, 10000) == 1 && ::read(report[0], &result, sizeof(result)) == sizeof(result);
  if (reported && result.status == 'd') {
    const int fd = memfd_with("rank 1's memory");
    const auto start = std::chrono::steady_clock::now();
    int got = -1;
    try {
      rank1.send(0, fd, 3);
      got = rank0.receive(1, 3);
    } catch (const Error& error) {
      ADD_FAILURE() << "rank 1 could not pass an fd to rank 0 under the flood: " << error.what();
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (got >= 0) {
      EXPECT_EQ(read_content(got), "rank 1's memory");
    }
    EXPECT_LT(elapsed, 1.0);
    close_quietly_all({fd, got});
  }
  (void)!::write(release[1], "x", 1);
  ::waitpid(child, nullptr, 0);
  close_quietly_all({report[0], release[1]});
  ASSERT_TRUE(reported) << "the flooder did not report";
  if (result.status == 'u') GTEST_SKIP() << "this process may not change uid (setuid refused)";
  EXPECT_EQ(result.refused, 300) << result.connected << " connections of uid 65534 got through, " << result.other
                                 << " failed otherwise";
  EXPECT_EQ(result.connected, 0);
}

// A socket file of another user that reached a rank's name some other way (here: renamed into the private
// directory by this root process) is refused by the sender, which passes it nothing (the kernel's SO_PEERCRED,
// checked behind the directory's permissions). The squatter is a child process of uid 65534 that listens in a
// directory of its own, accepts one connection and reports whether an fd came with it.
TEST(FdPassing, SenderRefusesAListenerOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to start a listener as another user (uid 65534)";
  TemporaryDirectory theirs;
  ASSERT_EQ(::chown(theirs.path().c_str(), kNobody, kNobody), 0) << std::strerror(errno);
  const std::string squatter_path = theirs / "listener";
  sockaddr_un address;
  const socklen_t length = socket_address(squatter_path, &address);
  int report[2], ready[2];
  ASSERT_EQ(::pipe(report), 0);
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the squatter: only system calls from here on
    char result = 'e';
    if (!become_nobody()) {
      (void)!::write(ready[1], "u", 1);  // root without the right to change uid (a restricted container)
    } else {
      const int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
      if (::bind(listener, reinterpret_cast<const sockaddr*>(&address), length) == 0 && ::listen(listener, 4) == 0) {
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
      } else {
        (void)!::write(ready[1], "e", 1);
      }
    }
    (void)!::write(report[1], &result, 1);
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(report[1]);
  const char state = read_byte_within(ready[0], 10000);
  if (state != 'r') {
    ::waitpid(child, nullptr, 0);
    close_quietly_all({ready[0], report[0]});
    if (state == 'u') GTEST_SKIP() << "this process may not change uid (setuid refused)";
    FAIL() << "the squatter did not listen on " << squatter_path;
  }
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 5.0);
  const std::string path = rank0.socket_path(1);
  ASSERT_EQ(::rename(squatter_path.c_str(), path.c_str()), 0) << std::strerror(errno);
  const int fd = memfd_with("rank 0's memory");
  Error error = expect_error([&] { rank0.send(1, fd, 7); });
  EXPECT_EQ(error.code(), ErrorCode::kSystemError) << error.what();
  EXPECT_TRUE(contains(error.what(), "another user")) << error.what();
  EXPECT_TRUE(contains(error.what(), path)) << error.what();
  const char result = read_byte_within(report[0], 15000);
  EXPECT_NE(result, 'f') << "the listener of another user received rank 0's fd";
  EXPECT_EQ(result, 'c') << "the squatter saw no connection: the test did not run its case";
  ::waitpid(child, nullptr, 0);
  ::unlink(path.c_str());
  close_quietly_all({fd, ready[0], report[0]});
}

// A connection of another user that reached rank 0's listener some other way (here: through a hard link this
// root process made in a directory the user may enter, to a socket it made writable) sends a well-formed message
// posing as rank 1, with an fd of its own: rank 0 drops it (SO_PEERCRED: another uid) and receives rank 1's real
// fd for that tag. The impostor is a child process of uid 65534.
TEST(FdPassing, ReceiverDropsAMessageOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to send as another user (uid 65534)";
  const std::string scope = fresh_scope();
  FdExchanger rank0(scope, 0, 2, 5.0);
  FdExchanger rank1(scope, 1, 2, 5.0);
  TemporaryDirectory open_to_them;
  ASSERT_EQ(::chmod(open_to_them.path().c_str(), 0755), 0);
  const std::string link = open_to_them / "rank0";
  ASSERT_EQ(::link(rank0.socket_path(0).c_str(), link.c_str()), 0) << std::strerror(errno);
  ASSERT_EQ(::chmod(link.c_str(), 0777), 0);
  sockaddr_un address;
  const socklen_t length = socket_address(link, &address);
  int done[2];
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the impostor: only system calls from here on
    char result = 'e';
    if (!become_nobody()) {
      result = 'u';  // root without the right to change uid (a restricted container)
    } else {
      const int forged = ::memfd_create("forged", 0);
      (void)!::write(forged, "forged", 6);
      const int connection = ::socket(AF_UNIX, SOCK_STREAM, 0);
      if (::connect(connection, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
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
  const char result = read_byte_within(done[0], 10000);
  ::waitpid(child, nullptr, 0);
  ::close(done[0]);
  if (result == 'u') GTEST_SKIP() << "this process may not change uid (setuid refused): no other user could send";
  ASSERT_EQ(result, 's') << "the impostor could not send its message: the test did not run its case";
  const int real = memfd_with("real");
  rank1.send(0, real, 5);
  const int got = rank0.receive(1, 5);
  EXPECT_EQ(read_content(got), "real") << "rank 0 took the other user's fd for rank 1's";
  close_quietly_all({got, real});
}

// The socket directory is trusted only when it is a real directory of this user that no one else may enter;
// otherwise the exchanger is not made, and the error names the directory.
TEST(FdPassing, SocketDirectoryThatIsASymbolicLinkIsRefused) {
  TemporaryDirectory base;
  ASSERT_EQ(::mkdir((base / "real").c_str(), 0700), 0);
  const std::string link = base / "link";
  ASSERT_EQ(::symlink((base / "real").c_str(), link.c_str()), 0);
  Error error = expect_error([&] { FdExchanger exchanger(fresh_scope(), 0, 1, 1.0, link); });
  EXPECT_EQ(error.code(), ErrorCode::kSystemError) << error.what();
  EXPECT_TRUE(contains(error.what(), link)) << error.what();
  EXPECT_TRUE(contains(error.what(), "symbolic link")) << error.what();
}

TEST(FdPassing, SocketDirectoryOthersMayEnterIsRefusedAndLeftAsItIs) {
  TemporaryDirectory base;
  const std::string open = base / "open";
  ASSERT_EQ(::mkdir(open.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open.c_str(), 0755), 0);
  Error error = expect_error([&] { FdExchanger exchanger(fresh_scope(), 0, 1, 1.0, open); });
  EXPECT_EQ(error.code(), ErrorCode::kSystemError) << error.what();
  EXPECT_TRUE(contains(error.what(), open)) << error.what();
  EXPECT_TRUE(contains(error.what(), "mode 0755")) << error.what();
  struct stat info {};
  ASSERT_EQ(::stat(open.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0755u) << "the exchanger changed the mode of a directory it did not make";
}

TEST(FdPassing, SocketDirectoryOfAnotherUserIsRefused) {
  TemporaryDirectory base;
  std::string theirs = base / "theirs";
  uid_t owner = kNobody;
  if (::geteuid() == 0) {
    ASSERT_EQ(::mkdir(theirs.c_str(), 0700), 0);
    ASSERT_EQ(::chown(theirs.c_str(), kNobody, kNobody), 0) << std::strerror(errno);
  } else {
    theirs = "/";  // root's
    owner = 0;
  }
  Error error = expect_error([&] { FdExchanger exchanger(fresh_scope(), 0, 1, 1.0, theirs); });
  EXPECT_EQ(error.code(), ErrorCode::kSystemError) << error.what();
  EXPECT_TRUE(contains(error.what(), theirs)) << error.what();
  EXPECT_TRUE(contains(error.what(), "owned by uid " + std::to_string(owner))) << error.what();
}

// A missing directory is made with mode 0700 whatever the umask; the socket file goes when the exchanger does.
TEST(FdPassing, MissingSocketDirectoryIsMadePrivate) {
  TemporaryDirectory base;
  const std::string directory = base / "made";
  const mode_t umask_before = ::umask(0277);  // mkdir alone would make it 0500
  std::string path;
  {
    FdExchanger exchanger(fresh_scope(), 0, 1, 1.0, directory);
    ::umask(umask_before);
    path = exchanger.socket_path(0);
    EXPECT_EQ(path.rfind(directory + "/braid-fd-", 0), 0u) << path;
    struct stat info {};
    ASSERT_EQ(::lstat(directory.c_str(), &info), 0);
    EXPECT_TRUE(S_ISDIR(info.st_mode));
    EXPECT_EQ(info.st_mode & 07777, 0700u);
    ASSERT_EQ(::lstat(path.c_str(), &info), 0);
    EXPECT_TRUE(S_ISSOCK(info.st_mode));
  }
  ::umask(umask_before);
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the socket file stayed after its exchanger closed";
}

// A socket file left by a rank that died (bound, nobody listening) is replaced; a file that is not a socket is not.
TEST(FdPassing, StaleSocketFileIsReplacedOtherFilesAreNot) {
  TemporaryDirectory base;
  const std::string scope = fresh_scope();
  std::string path;
  {
    FdExchanger probe(scope, 0, 2, 1.0, base.path());
    path = probe.socket_path(0);
  }
  const int dead = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address;
  const socklen_t length = socket_address(path, &address);
  ASSERT_EQ(::bind(dead, reinterpret_cast<const sockaddr*>(&address), length), 0) << std::strerror(errno);
  ::close(dead);  // the file stays, with no socket behind it
  {
    FdExchanger rank0(scope, 0, 2, 1.0, base.path());
    FdExchanger rank1(scope, 1, 2, 1.0, base.path());
    const int fd = memfd_with("after the stale file");
    rank1.send(0, fd, 1);
    const int got = rank0.receive(1, 1);
    EXPECT_EQ(read_content(got), "after the stale file");
    close_quietly_all({fd, got});
  }
  const int file = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  ::close(file);
  Error error = expect_error([&] { FdExchanger rank0(scope, 0, 2, 1.0, base.path()); });
  EXPECT_EQ(error.code(), ErrorCode::kSystemError) << error.what();
  EXPECT_TRUE(contains(error.what(), path)) << error.what();
  struct stat info {};
  ASSERT_EQ(::lstat(path.c_str(), &info), 0) << "a file that is not a socket was removed";
  EXPECT_TRUE(S_ISREG(info.st_mode));
}

// The default directory: $XDG_RUNTIME_DIR/braid where XDG_RUNTIME_DIR is a directory of this user, else
// /tmp/braid-<euid>.
TEST(FdPassing, DefaultSocketDirectory) {
  const char* saved = std::getenv("XDG_RUNTIME_DIR");
  const std::string saved_value = saved != nullptr ? saved : "";
  const std::string fallback = "/tmp/braid-" + std::to_string(::geteuid());
  TemporaryDirectory runtime;
  ::setenv("XDG_RUNTIME_DIR", runtime.path().c_str(), 1);
  EXPECT_EQ(FdExchanger::default_directory(), runtime / "braid");
  ::setenv("XDG_RUNTIME_DIR", (runtime / "missing").c_str(), 1);
  EXPECT_EQ(FdExchanger::default_directory(), fallback);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(runtime.path().c_str(), kNobody, kNobody), 0);
    ::setenv("XDG_RUNTIME_DIR", runtime.path().c_str(), 1);
  } else {
    ::setenv("XDG_RUNTIME_DIR", "/", 1);  // root's
  }
  EXPECT_EQ(FdExchanger::default_directory(), fallback) << "took a runtime directory of another user";
  ::unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(FdExchanger::default_directory(), fallback);
  if (saved != nullptr) ::setenv("XDG_RUNTIME_DIR", saved_value.c_str(), 1);
  FdExchanger exchanger(fresh_scope(), 0, 1, 1.0);
  EXPECT_EQ(exchanger.directory(), FdExchanger::default_directory());
}

TEST(FdPassing, ScopesDoNotCollide) {
  const std::string scope_a = fresh_scope();
  const std::string scope_b = fresh_scope();
  FdExchanger a(scope_a, 0, 2, kTimeoutS);
  FdExchanger b(scope_b, 0, 2, kTimeoutS);  // same rank, other scope: fine
  EXPECT_NE(a.socket_path(0), b.socket_path(0));

  Error error = expect_error([&] { FdExchanger again(scope_a, 0, 2, kTimeoutS); });
  EXPECT_EQ(error.code(), ErrorCode::kSystemError) << error.what();
  EXPECT_TRUE(contains(error.what(), a.socket_path(0))) << error.what();
  EXPECT_TRUE(contains(error.what(), "already in use")) << error.what();
}

TEST(FdPassing, LongScopeIsShortenedUniquely) {
  const std::string base = fresh_scope() + std::string(200, 'x');
  FdExchanger a(base + "a", 0, 1, kTimeoutS);
  FdExchanger b(base + "b", 0, 1, kTimeoutS);  // differs only past the truncation point
  EXPECT_NE(a.socket_path(0), b.socket_path(0));
  EXPECT_LE(a.socket_path(0).size(), 107u);  // sun_path's 108 bytes, less the terminating NUL
  EXPECT_EQ(a.socket_path(0).rfind(a.directory() + "/braid-fd-", 0), 0u) << a.socket_path(0);
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
