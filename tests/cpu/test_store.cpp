// The TCP store: server, client, socket helpers and braid::StoreHost.
#include <dirent.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/socket.hpp"
#include "bootstrap/store.hpp"
#include "braid/braid.hpp"
#include "braid/error.hpp"
#include "expect_error.hpp"

namespace braid {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::unique_ptr<StoreClient> connect_to(const StoreServer& server, double timeout_s = 2.0) {
  return std::make_unique<StoreClient>("127.0.0.1", server.port(), timeout_s);
}


// A port nobody listens on: bind one, then let it go.
int free_port() {
  StoreServer probe("127.0.0.1", 0);
  return probe.port();
}

int open_fd_count() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
  closedir(dir);
  return count - 1;  // the DIR's own fd
}

// Whether the server closed `fd` within `seconds`: a read returns end of file or a reset (not: nothing came).
// What it sent before (a refusal) is read and dropped.
bool closed_by_server(int fd, double seconds) {
  const net::Deadline deadline = net::deadline_after(seconds);
  for (;;) {
    pollfd readable{fd, POLLIN, 0};
    if (poll(&readable, 1, net::milliseconds_left(deadline)) <= 0) return false;
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return true;
  }
}

// A hand-made GET request in the store's wire format (see store_wire.hpp), for clients that misbehave.
std::string raw_get_frame(const std::string& key, int64_t timeout_ms) {
  std::string body;
  body.push_back(2);  // GET
  const uint32_t length = static_cast<uint32_t>(key.size());
  body.append(reinterpret_cast<const char*>(&length), 4);  // little-endian host assumed (x86/arm)
  body += key;
  body.append(reinterpret_cast<const char*>(&timeout_ms), 8);
  const uint32_t body_length = static_cast<uint32_t>(body.size());
  return std::string(reinterpret_cast<const char*>(&body_length), 4) + body;
}

int raw_connect(const StoreServer& server) {
  const int fd = net::tcp_connect("127.0.0.1", server.port(), net::deadline_after(2.0));
  EXPECT_GE(fd, 0);
  return fd;
}

TEST(StoreTest, SetGetTryGetAddRemove) {
  StoreServer server;
  auto client = connect_to(server);
  EXPECT_EQ(client->address(), "127.0.0.1:" + std::to_string(server.port()));

  client->set("a", "alpha");
  EXPECT_EQ(client->get("a", 1.0), "alpha");
  EXPECT_EQ(client->try_get("a"), std::optional<std::string>("alpha"));
  EXPECT_EQ(client->try_get("b"), std::nullopt);
  client->set("a", "again");  // overwrite
  EXPECT_EQ(client->get("a", 1.0), "again");
  client->set("empty", "");
  EXPECT_EQ(client->try_get("empty"), std::optional<std::string>(""));

  EXPECT_EQ(client->add("n", 5), 5);  // absent counts as 0
  EXPECT_EQ(client->add("n", -7), -2);
  EXPECT_EQ(client->get("n", 1.0), "-2");  // kept as decimal text
  client->set("n10", "10");
  EXPECT_EQ(client->add("n10", 1), 11);
  const std::string message = expect_error([&] { client->add("a", 1); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("'a'"), std::string::npos) << message;

  EXPECT_TRUE(client->remove("a"));
  EXPECT_FALSE(client->remove("a"));
  EXPECT_EQ(client->try_get("a"), std::nullopt);
  EXPECT_EQ(client->try_get("n"), std::optional<std::string>("-2"));  // others untouched
}

TEST(StoreTest, GetBlocksUntilAnotherThreadSets) {
  StoreServer server;
  auto reader = connect_to(server);
  auto writer = connect_to(server);
  const auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    writer->set("late", "here");
  });
  EXPECT_EQ(reader->get("late", 5.0), "here");
  const double elapsed = seconds_since(start);
  setter.join();
  EXPECT_GE(elapsed, 0.25);
  EXPECT_LT(elapsed, 2.0);
}

// Communicator::abort interrupts its store client: a GET blocked on a key that never comes ends at once with
// kAborted, and so does every later request.
TEST(StoreTest, InterruptEndsABlockedGetWithAborted) {
  StoreServer server;
  auto client = connect_to(server);
  const auto start = Clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    client->interrupt();
  });
  expect_error([&] { client->get("never-set", 30.0); }, ErrorCode::kAborted);
  const double elapsed = seconds_since(start);
  aborter.join();
  EXPECT_GE(elapsed, 0.15);
  EXPECT_LT(elapsed, 1.0) << "the blocked GET outlived the interrupt";
  expect_error([&] { client->set("later", "x"); }, ErrorCode::kAborted);
  auto other = connect_to(server);  // the server and its other clients go on
  other->set("key", "value");
  EXPECT_EQ(other->get("key", 1.0), "value");
}

// A communicator's peer watch ends its store waits with the fatal failure it saw (NOTE [ended host waits]): a
// blocked GET ends with that code and reason, a second failure does not replace the first, and abort() does.
TEST(StoreTest, InterruptWithAFailureEndsAGetWithItUntilAnAbort) {
  StoreServer server;
  auto client = connect_to(server);
  const auto start = Clock::now();
  std::thread revoker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    client->interrupt(ErrorCode::kRevoked, "rank 1 revoked the communicator");
  });
  const std::string message = expect_error([&] { client->get("never-set", 30.0); }, ErrorCode::kRevoked);
  const double elapsed = seconds_since(start);
  revoker.join();
  EXPECT_LT(elapsed, 1.0) << "the blocked GET outlived the interrupt";
  EXPECT_NE(message.find("'never-set' ended: rank 1 revoked the communicator"), std::string::npos) << message;
  client->interrupt(ErrorCode::kRemoteError, "rank 2's process exited");  // the first end stays
  EXPECT_NE(expect_error([&] { client->set("later", "x"); }, ErrorCode::kRevoked).find("rank 1 revoked"),
            std::string::npos);
  client->interrupt();
  EXPECT_NE(expect_error([&] { client->add("later", 1); }, ErrorCode::kAborted).find("aborted"), std::string::npos);
  client->interrupt(ErrorCode::kRevoked, "rank 1 revoked the communicator");  // abort() stays
  expect_error([&] { client->try_get("later"); }, ErrorCode::kAborted);
}

TEST(StoreTest, GetTimesOutNamingTheKey) {
  StoreServer server;
  auto client = connect_to(server);
  const auto start = Clock::now();
  const std::string message = expect_error([&] { client->get("absent-key", 0.5); }, ErrorCode::kTimeout);
  const double elapsed = seconds_since(start);
  EXPECT_NE(message.find("'absent-key'"), std::string::npos) << message;
  EXPECT_NE(message.find(client->address()), std::string::npos) << message;
  EXPECT_GE(elapsed, 0.45);
  EXPECT_LT(elapsed, 2.0);
  client->set("after", "ok");  // the connection survives a timed-out GET
  EXPECT_EQ(client->get("after", 1.0), "ok");
}

TEST(StoreTest, WaitReturnsMissingKeys) {
  StoreServer server;
  auto client = connect_to(server);
  client->set("a", "1");
  client->set("b", "2");
  const std::vector<std::string> keys = {"a", "b", "c", "d"};

  auto start = Clock::now();
  EXPECT_EQ(client->wait(keys, 0.3), (std::vector<std::string>{"c", "d"}));
  EXPECT_GE(seconds_since(start), 0.25);
  EXPECT_TRUE(client->wait({"a", "b"}, 0.3).empty());
  EXPECT_TRUE(client->wait({}, 0.3).empty());

  auto writer = connect_to(server);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    writer->set("c", "3");
    writer->set("d", "4");
  });
  start = Clock::now();
  EXPECT_TRUE(client->wait(keys, 5.0).empty());
  EXPECT_LT(seconds_since(start), 2.0);
  setter.join();
}

TEST(StoreTest, AddIsAtomicAcrossClients) {
  StoreServer server;
  constexpr int kThreads = 8, kAdds = 1000;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto client = connect_to(server);
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(client->add("counter", 1));
    });
  }
  for (auto& thread : threads) thread.join();
  // Every intermediate value was handed out exactly once.
  std::set<int64_t> all;
  for (const auto& values : seen) all.insert(values.begin(), values.end());
  EXPECT_EQ(all.size(), size_t(kThreads * kAdds));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
  EXPECT_EQ(connect_to(server)->get("counter", 1.0), std::to_string(kThreads * kAdds));
}

TEST(StoreTest, OneClientSharedByThreads) {
  StoreServer server;
  auto client = connect_to(server);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 250; ++i) {
        client->add("shared", 1);
        const std::string key = "t" + std::to_string(t) + "/" + std::to_string(i);
        client->set(key, key);
        EXPECT_EQ(client->get(key, 1.0), key);  // replies never cross between threads
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(client->get("shared", 1.0), "1000");
}

TEST(StoreTest, BinaryAndLargeValues) {
  StoreServer server;
  auto client = connect_to(server);
  std::string every_byte;
  for (int c = 0; c < 256; ++c) every_byte.push_back(static_cast<char>(c));
  const std::string nul_key("k\0ey", 4);
  client->set(nul_key, every_byte);
  EXPECT_EQ(client->get(nul_key, 1.0), every_byte);
  EXPECT_EQ(client->try_get(std::string("k", 1)), std::nullopt);  // the key is not cut at the NUL

  std::string big(1 << 20, '\0');
  std::mt19937 random(42);
  for (char& c : big) c = static_cast<char>(random());
  client->set("big", big);
  EXPECT_EQ(client->get("big", 2.0), big);
  EXPECT_EQ(connect_to(server)->try_get("big"), std::optional<std::string>(big));
}

TEST(StoreTest, ClientConnectsBeforeServerStarts) {
  const int port = free_port();
  std::unique_ptr<StoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    server = std::make_unique<StoreServer>("127.0.0.1", port);
  });
  const auto start = Clock::now();
  StoreClient client("127.0.0.1", port, 5.0);
  EXPECT_GE(seconds_since(start), 0.25);
  starter.join();
  client.set("k", "v");
  EXPECT_EQ(client.get("k", 1.0), "v");
}

TEST(StoreTest, ClosedPortTimesOutWithClearError) {
  const int port = free_port();
  const auto start = Clock::now();
  const std::string message =
      expect_error([&] { StoreClient client("127.0.0.1", port, 1.0); }, ErrorCode::kTimeout);
  const double elapsed = seconds_since(start);
  EXPECT_NE(message.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << message;
  EXPECT_NE(message.find("within 1 s"), std::string::npos) << message;
  EXPECT_GE(elapsed, 0.9);
  EXPECT_LT(elapsed, 2.5);
}

TEST(StoreTest, ServerDestroyedWhileClientWaits) {
  auto server = std::make_unique<StoreServer>();
  auto client = connect_to(*server);
  const std::string address = client->address();
  ErrorCode code = ErrorCode::kSuccess;
  std::string message;
  std::thread waiter([&] {
    try {
      client->get("never", 10.0);
    } catch (const Error& error) {
      code = error.code();
      message = error.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = Clock::now();
  server.reset();
  waiter.join();
  EXPECT_LT(seconds_since(start), 2.0);  // not the 10 s the GET asked for
  EXPECT_TRUE(code == ErrorCode::kRemoteError || code == ErrorCode::kTimeout) << message;
  EXPECT_NE(message.find(address), std::string::npos) << message;
  // Later calls fail at once, naming the store.
  message = expect_error([&] { client->set("k", "v"); }, ErrorCode::kRemoteError);
  EXPECT_NE(message.find(address), std::string::npos) << message;
}

TEST(StoreTest, ClientVanishingMidWaitLeavesServerHealthy) {
  auto server = std::make_unique<StoreServer>();
  const int fd = raw_connect(*server);
  const std::string frame = raw_get_frame("awaited", 10'000);
  ASSERT_TRUE(net::write_all(fd, frame.data(), frame.size(), net::deadline_after(1.0)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the server park it
  close(fd);

  auto client = connect_to(*server);
  client->set("awaited", "now");  // would be delivered to the vanished client
  EXPECT_EQ(client->get("awaited", 1.0), "now");
  EXPECT_EQ(client->add("x", 2), 2);

  const auto start = Clock::now();
  server.reset();
  EXPECT_LT(seconds_since(start), 1.0);
}

TEST(StoreTest, GarbageFromOneClientDropsOnlyThatClient) {
  StoreServer server;
  auto good = connect_to(server);
  const int fd = raw_connect(server);
  const uint32_t huge = 0xffffffffu;  // a frame length beyond the limit
  ASSERT_TRUE(net::write_all(fd, &huge, sizeof(huge), net::deadline_after(1.0)));
  char reply[5];  // REFUSED, naming the limit, then the end of the stream
  ASSERT_TRUE(net::read_all(fd, reply, sizeof(reply), net::deadline_after(2.0)));
  EXPECT_EQ(reply[4], 4);
  EXPECT_TRUE(closed_by_server(fd, 2.0));
  close(fd);
  good->set("k", "v");
  EXPECT_EQ(good->get("k", 1.0), "v");
}

// Resident memory of this process (the server runs in it), in bytes.
size_t resident_bytes() {
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int read = std::fscanf(statm, "%lu %lu", &size, &resident);
  std::fclose(statm);
  return read == 2 ? resident * static_cast<size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

bool send_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// A client that asks for an 8 MiB value 100 times and never reads the replies: the server stops taking its
// requests once 16 MiB of replies wait, instead of buffering 800 MiB (it did), and serves others meanwhile.
TEST(StoreTest, UnreadRepliesDoNotGrowTheServer) {
  StoreServer server;
  auto client = connect_to(server);
  client->set("big", std::string(8u << 20, 'x'));
  const size_t before = resident_bytes();
  const int greedy = raw_connect(server);
  std::string requests;
  for (int i = 0; i < 100; ++i) requests += raw_get_frame("big", 0);
  std::thread sender([&] { send_all(greedy, requests); });  // may block: the server stops reading
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  client->set("small", "s");  // others are still served
  EXPECT_EQ(client->get("small", 2.0), "s");
  const size_t grown = resident_bytes() - std::min(before, resident_bytes());
  EXPECT_LT(grown, size_t(200) << 20) << "the server buffered " << (grown >> 20) << " MiB of unread replies";
  shutdown(greedy, SHUT_RDWR);
  sender.join();
  close(greedy);
}

// Many small requests in one burst are parsed in time linear in their bytes: with 4 MiB of 9-byte TRY_GETs (an
// empty key), moving the rest of the buffer after each request (quadratic time) would hold the server past this
// test's limit.
TEST(StoreTest, APipelinedBurstOfSmallRequestsIsParsedInLinearTime) {
  StoreServer server;
  auto client = connect_to(server, 30.0);
  const int burst = raw_connect(server);
  std::string requests;
  const std::string try_get_empty_key("\x05\x00\x00\x00\x03\x00\x00\x00\x00", 9);  // length 5: op, key length 0
  while (requests.size() < (4u << 20)) requests += try_get_empty_key;
  std::thread sender([&] { send_all(burst, requests); });
  std::thread reader([&] {  // the replies (NOT_FOUND each), read so the burst is not held back
    char buffer[1 << 16];
    while (recv(burst, buffer, sizeof buffer, 0) > 0) {
    }
  });
  sender.join();
  const auto start = std::chrono::steady_clock::now();
  client->set("after", "1");
  EXPECT_EQ(client->get("after", 30.0), "1");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0) << "the burst held the server for " << seconds << " s";
  shutdown(burst, SHUT_RDWR);
  reader.join();
  close(burst);
}


std::string frame_header(uint32_t body_length) { return std::string(reinterpret_cast<const char*>(&body_length), 4); }

// A client that begins a frame and never finishes it is dropped after the slow-client limit (it held its
// buffer forever); a client that sends nothing stays (ranks keep idle connections for the whole job).
TEST(StoreTest, AnUnfinishedFrameIsDroppedAfterTheSlowClientLimit) {
  StoreServer server("127.0.0.1", 0, StoreLimits{0.3});
  auto good = connect_to(server);
  const int slow = raw_connect(server), idle = raw_connect(server);
  ASSERT_TRUE(send_all(slow, frame_header(100) + "\x01"));  // 1 byte of a 100-byte body
  const auto start = Clock::now();
  EXPECT_TRUE(closed_by_server(slow, 5.0));
  EXPECT_GE(seconds_since(start), 0.2);
  EXPECT_FALSE(closed_by_server(idle, 0.5)) << "an idle connection was dropped";
  good->set("k", "v");
  EXPECT_EQ(good->get("k", 1.0), "v");
  close(slow);
  close(idle);
}

// Request frames of all clients together stay within the store's budget: a frame's length is reserved from its
// header. Four clients each begin a 6 MiB frame (and send 4 MiB of it) against an 8 MiB budget: one reservation
// fits, the other three are refused; a good client is served throughout.
TEST(StoreTest, BufferedRequestsOfAllClientsAreBounded) {
  StoreServer server("127.0.0.1", 0, StoreLimits{60.0, size_t(8) << 20});
  auto good = connect_to(server);
  std::vector<int> hogs;
  const std::string chunk = frame_header(6u << 20) + std::string(4u << 20, 'x');
  for (int i = 0; i < 4; ++i) {
    hogs.push_back(raw_connect(server));
    send_all(hogs.back(), chunk);  // fails once the server refused it
    good->set("k" + std::to_string(i), "v");
    EXPECT_EQ(good->get("k" + std::to_string(i), 2.0), "v");
  }
  int dropped = 0;
  for (int fd : hogs) dropped += closed_by_server(fd, 0.5);
  EXPECT_GE(dropped, 3);
  for (int fd : hogs) close(fd);
}

// A WAIT names at most kStoreMaxWaitKeys keys: the client refuses more, naming the argument, and a hand-made
// request for more makes the server drop that client.
TEST(StoreTest, AWaitForTooManyKeysIsRefused) {
  StoreServer server;
  auto good = connect_to(server);
  const std::vector<std::string> keys(kStoreMaxWaitKeys + 1, "k");
  const std::string message = expect_error([&] { good->wait(keys, 0.1); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("'keys'"), std::string::npos) << message;
  std::string body;
  body.push_back(4);  // WAIT
  const uint32_t count = kStoreMaxWaitKeys + 1;
  body.append(reinterpret_cast<const char*>(&count), 4);
  const int fd = raw_connect(server);
  ASSERT_TRUE(send_all(fd, frame_header(static_cast<uint32_t>(body.size())) + body));
  EXPECT_TRUE(closed_by_server(fd, 2.0));
  close(fd);
  EXPECT_TRUE(good->wait({}, 0.1).empty());
}

// Out of descriptors (EMFILE), the server neither spins nor floods the log: with RLIMIT_NOFILE at its floor in
// a child process that serves, three connections queued for a second cost the child less than a third of a
// CPU second and at most a minute's warnings (10 lines).
TEST(StoreTest, OutOfDescriptorsTheServerBacksOff) {
  int ports[2];
  ASSERT_EQ(pipe(ports), 0);
  char log_template[] = "/tmp/braid-store-emfile-XXXXXX";
  const int log_fd = mkstemp(log_template);
  ASSERT_GE(log_fd, 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(log_fd, 2);
    StoreServer server;
    const int port = server.port();
    rlimit none{3, 3};  // stdin, stdout, stderr: every new descriptor fails with EMFILE
    rlimit old{};
    getrlimit(RLIMIT_NOFILE, &old);
    none.rlim_max = old.rlim_max;
    setrlimit(RLIMIT_NOFILE, &none);
    if (write(ports[1], &port, sizeof(port)) != sizeof(port)) _exit(2);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    const double cpu = usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
                       (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
    _exit(cpu < 0.33 ? 0 : 1);
  }
  int port = 0;
  ASSERT_EQ(read(ports[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  std::vector<int> queued;
  for (int i = 0; i < 3; ++i) queued.push_back(net::tcp_connect("127.0.0.1", port, net::deadline_after(2.0)));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the serving child spun on accept (status " << status << ")";
  for (int fd : queued) close(fd);
  FILE* log = fdopen(log_fd, "r");
  std::rewind(log);
  int lines = 0;
  for (int c; (c = std::fgetc(log)) != EOF;) lines += c == '\n';
  std::fclose(log);
  unlink(log_template);
  close(ports[0]);
  close(ports[1]);
  EXPECT_LE(lines, 10) << "accept failures flooded the log";
  EXPECT_GE(lines, 1) << "accept failures were not reported at all";
}

// 10,000 hostile or broken clients (random bytes, frames with random ops, lengths and fields, truncated at
// random) against one server, with a well-behaved client checked after every 500: each hostile one is served
// or dropped, never the others, and the server's data stays what the good client wrote.
TEST(StoreTest, FuzzedClientsLeaveTheServerCorrect) {
  StoreServer server("127.0.0.1", 0, StoreLimits{0.2, size_t(64) << 20});
  auto good = connect_to(server, 10.0);
  std::mt19937_64 random(20261126);
  const auto u32 = [](uint32_t value) { return std::string(reinterpret_cast<const char*>(&value), 4); };
  const auto i64 = [](int64_t value) { return std::string(reinterpret_cast<const char*>(&value), 8); };
  const auto key = [&] { return std::string("fuzz/") + std::to_string(random() % 64); };
  for (int i = 0; i < 10000; ++i) {
    std::string bytes;
    switch (random() % 4) {
      case 0: {  // random bytes
        bytes.resize(random() % 64);
        for (char& c : bytes) c = static_cast<char>(random());
        break;
      }
      case 1: {  // a frame whose declared length lies
        const std::string body(random() % 32, 'b');
        bytes = u32(static_cast<uint32_t>(random() % 2 ? random() : body.size() + random() % 8)) + body;
        break;
      }
      default: {  // a well-formed frame of a random op (1-6, or an unknown one) with random fields
        std::string body(1, static_cast<char>(random() % 8));
        const std::string k = key();
        body += u32(static_cast<uint32_t>(k.size())) + k;
        if (body[0] == 1) body += u32(3) + "val";  // SET into fuzz/ keys only
        if (body[0] == 4) body = std::string(1, 4) + u32(1) + u32(static_cast<uint32_t>(k.size())) + k;
        if (body[0] == 2 || body[0] == 4) body += i64(static_cast<int64_t>(random() % 3) - 1);  // -1, 0, 1 ms
        if (body[0] == 5) body += i64(static_cast<int64_t>(random()));
        bytes = u32(static_cast<uint32_t>(body.size())) + body;
        if (random() % 4 == 0) bytes.resize(random() % bytes.size());  // truncated
      }
    }
    const int fd = raw_connect(server);
    send_all(fd, bytes);
    if (random() % 2) shutdown(fd, SHUT_WR);
    close(fd);
    if (i % 500 == 499) {
      const std::string value = "v" + std::to_string(i);
      good->set("good/key", value);
      ASSERT_EQ(good->get("good/key", 2.0), value) << "after " << i + 1 << " fuzzed clients";
      ASSERT_EQ(good->add("good/count", 1), (i + 1) / 500);
    }
  }
  EXPECT_FALSE(good->try_get("good/missing").has_value());
  EXPECT_EQ(good->try_get("good/key"), std::optional<std::string>("v9999"));
}

TEST(StoreTest, SixtyFourConcurrentClients) {
  StoreServer server;
  constexpr int kClients = 64;
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) keys.push_back("client/" + std::to_string(i));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto client = connect_to(server, 5.0);
        client->set(keys[i], std::to_string(i));
        if (!client->wait(keys, 5.0).empty()) ++failures;
        const int next = (i + 1) % kClients;
        if (client->get(keys[next], 1.0) != std::to_string(next)) ++failures;
        client->add("arrived", 1);
      } catch (const Error& error) {
        ADD_FAILURE() << error.what();
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(connect_to(server)->get("arrived", 1.0), std::to_string(kClients));
}

TEST(StoreTest, NoFileDescriptorLeaks) {
  const int before = open_fd_count();
  {
    StoreServer server;
    std::vector<std::unique_ptr<StoreClient>> clients;
    for (int i = 0; i < 4; ++i) clients.push_back(connect_to(server));
    clients[0]->set("k", "v");
    EXPECT_EQ(clients[1]->get("k", 1.0), "v");
    expect_error([&] { clients[2]->get("absent", 0.1); }, ErrorCode::kTimeout);
    clients.pop_back();  // one client leaves before the server does
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(open_fd_count(), before);
}

TEST(StoreTest, PortInUseNamesTheAddress) {
  StoreServer first;
  const std::string address = "127.0.0.1:" + std::to_string(first.port());
  const std::string message =
      expect_error([&] { StoreServer second("127.0.0.1", first.port()); }, ErrorCode::kSystemError);
  EXPECT_NE(message.find(address), std::string::npos) << message;
}

TEST(StoreHostTest, AddressReachesTheServer) {
  StoreHost host;
  const auto [name, port] = net::parse_host_port(host.address(), "address");
  EXPECT_EQ(name, "127.0.0.1");
  EXPECT_GT(port, 0);
  StoreClient client(name, port, 2.0);
  client.set("k", "v");
  EXPECT_EQ(client.get("k", 1.0), "v");

  StoreHost any("0.0.0.0");  // bound to every interface: dial it by loopback
  EXPECT_EQ(any.address().rfind("127.0.0.1:", 0), 0u) << any.address();
  const auto [any_name, any_port] = net::parse_host_port(any.address(), "address");
  EXPECT_EQ(StoreClient(any_name, any_port, 2.0).add("n", 3), 3);
}

TEST(StoreSocketTest, ParseHostPort) {
  EXPECT_EQ(net::parse_host_port("127.0.0.1:29500", "x"), std::make_pair(std::string("127.0.0.1"), 29500));
  EXPECT_EQ(net::parse_host_port("node-1:0", "x"), std::make_pair(std::string("node-1"), 0));
  EXPECT_EQ(net::parse_host_port("[::1]:80", "x"), std::make_pair(std::string("::1"), 80));
  for (const char* bad : {"nohost", "h:", ":80", "h:99999", "h:-1", "h:12x", "[::1]80", ""}) {
    const std::string message =
        expect_error([&] { net::parse_host_port(bad, "BRAID_STORE_ADDR"); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find("BRAID_STORE_ADDR"), std::string::npos) << message;
  }
}

// A name that does not resolve (.invalid never does, RFC 2606) fails once the resolve bound passes, long
// before the connect deadline, saying so; a name that resolves keeps being dialled until the deadline.
TEST(StoreSocketTest, AHostThatDoesNotResolveFailsAfterTheResolveBound) {
  const auto start = Clock::now();
  std::string error;
  EXPECT_EQ(net::tcp_connect("braid-no-such-host.invalid", 29500, net::deadline_after(120.0), &error, 0.3), -1);
  EXPECT_LT(seconds_since(start), 60.0) << "waited for the connect deadline, not the resolve bound";
  EXPECT_NE(error.find("cannot resolve 'braid-no-such-host.invalid'"), std::string::npos) << error;
  EXPECT_NE(error.find("BRAID_RESOLVE_TIMEOUT_S"), std::string::npos) << error;
  const int port = free_port();
  const auto dialled = Clock::now();
  EXPECT_EQ(net::tcp_connect("127.0.0.1", port, net::deadline_after(0.6), &error, 0.05), -1);
  EXPECT_GE(seconds_since(dialled), 0.5) << "a name that resolves is dialled until the deadline";
}

TEST(StoreSocketTest, DeadlineHelpers) {
  EXPECT_EQ(net::milliseconds_left(net::deadline_after(0)), 0);
  EXPECT_EQ(net::milliseconds_left(net::deadline_after(-5)), 0);
  const int left = net::milliseconds_left(net::deadline_after(2.0));
  EXPECT_GT(left, 1900);
  EXPECT_LE(left, 2000);
  EXPECT_GT(net::milliseconds_left(net::deadline_after(1e30)), 1'000'000);  // huge: no overflow
}

}  // namespace
}  // namespace braid
