// The job secret of the store (bootstrap/job_secret.hpp): only clients that prove they know it are served, a
// client talks only to a server that proves it too, and the secret never shows in a message.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/store.hpp"
#include "bootstrap/tcp_peer.hpp"
#include "braid/error.hpp"
#include "core/config.hpp"
#include "expect_error.hpp"

namespace braid {
namespace {

const std::string kSecret = "the-job-secret-0123456789abcdef";
const std::string kOtherSecret = "another-secret-0123456789abcdef";


std::unique_ptr<StoreClient> client_of(const StoreServer& server, const std::string& secret) {
  return std::make_unique<StoreClient>("127.0.0.1", server.port(), 2.0, secret);
}

TEST(JobSecret, ClientsThatKnowTheSecretAreServed) {
  StoreServer server("127.0.0.1", 0, StoreLimits{}, kSecret);
  auto a = client_of(server, kSecret);
  auto b = client_of(server, kSecret);
  a->set("key", "value");
  EXPECT_EQ(b->get("key", 1.0), "value");
  EXPECT_EQ(b->add("n", 3), 3);
  EXPECT_TRUE(a->wait({"key", "n"}, 1.0).empty());
}

TEST(JobSecret, AClientWithoutTheSecretIsRefusedBeforeAnyKeyMoves) {
  StoreServer server("127.0.0.1", 0, StoreLimits{}, kSecret);
  client_of(server, kSecret)->set("key", "value");
  auto stranger = client_of(server, "");  // connects; its first request is refused, and the connection closed
  const std::string message = expect_error([&] { stranger->try_get("key"); }, ErrorCode::kRemoteError);
  EXPECT_NE(message.find("BRAID_JOB_SECRET"), std::string::npos) << message;
  EXPECT_EQ(message.find("value"), std::string::npos) << message;
  expect_error([&] { stranger->set("key", "overwritten"); }, ErrorCode::kRemoteError);
  EXPECT_EQ(client_of(server, kSecret)->try_get("key"), std::optional<std::string>("value"));
}

TEST(JobSecret, AWrongSecretIsRefusedEitherWay) {
  StoreServer server("127.0.0.1", 0, StoreLimits{}, kSecret);
  // The server cannot prove the client's secret: the client stops before it sends anything.
  std::string message = expect_error([&] { client_of(server, kOtherSecret); }, ErrorCode::kRemoteError);
  EXPECT_NE(message.find("does not know the job secret"), std::string::npos) << message;
  EXPECT_EQ(message.find(kSecret), std::string::npos) << message;
  EXPECT_EQ(message.find(kOtherSecret), std::string::npos) << message;
  // A client with a secret against a server with none: refused, naming the variable.
  StoreServer open_server("127.0.0.1", 0, StoreLimits{}, std::string());
  message = expect_error([&] { client_of(open_server, kSecret); }, ErrorCode::kRemoteError);
  EXPECT_NE(message.find("BRAID_JOB_SECRET"), std::string::npos) << message;
  EXPECT_EQ(message.find(kSecret), std::string::npos) << message;
  // The server still serves the job.
  auto job = client_of(server, kSecret);
  job->set("after", "ok");
  EXPECT_EQ(job->get("after", 1.0), "ok");
}

// Sends a frame of `body` on a raw connection and reads the first reply byte (the status), or -1 when the server
// closed the connection instead.
int raw_status(int fd, const std::string& body) {
  const uint32_t length = static_cast<uint32_t>(body.size());
  std::string frame(reinterpret_cast<const char*>(&length), 4);
  frame += body;
  if (!net::write_all(fd, frame.data(), frame.size(), net::deadline_after(2.0))) return -1;
  char header[5];
  if (!net::read_all(fd, header, sizeof(header), net::deadline_after(2.0))) return -1;
  return static_cast<unsigned char>(header[4]);
}

std::string frame_field(const std::string& bytes) {
  const uint32_t length = static_cast<uint32_t>(bytes.size());
  return std::string(reinterpret_cast<const char*>(&length), 4) + bytes;
}

TEST(JobSecret, AnUnprovenConnectionGetsNothingAndIsClosed) {
  StoreServer server("127.0.0.1", 0, StoreLimits{}, kSecret);
  client_of(server, kSecret)->set("key", "value");
  // A hand-made TRY_GET: refused (status 4), then closed.
  int fd = net::tcp_connect("127.0.0.1", server.port(), net::deadline_after(2.0));
  ASSERT_GE(fd, 0);
  EXPECT_EQ(raw_status(fd, std::string(1, '\x03') + frame_field("key")), 4);
  pollfd closed{fd, POLLIN, 0};
  ASSERT_EQ(poll(&closed, 1, 2000), 1);
  char byte;
  // What is left of the refusal's message, then the end of the stream.
  while (recv(fd, &byte, 1, 0) > 0) {
  }
  EXPECT_EQ(recv(fd, &byte, 1, 0), 0);
  close(fd);
  // A PROVE without a HELLO, and a HELLO whose nonce has the wrong size: refused.
  fd = net::tcp_connect("127.0.0.1", server.port(), net::deadline_after(2.0));
  EXPECT_EQ(raw_status(fd, std::string(1, '\x08') + frame_field(std::string(32, 'x'))), 4);
  close(fd);
  fd = net::tcp_connect("127.0.0.1", server.port(), net::deadline_after(2.0));
  EXPECT_EQ(raw_status(fd, std::string(1, '\x07') + frame_field("short")), 4);
  close(fd);
  // A large frame before the proof: dropped without a reply (nothing of it is buffered).
  fd = net::tcp_connect("127.0.0.1", server.port(), net::deadline_after(2.0));
  EXPECT_EQ(raw_status(fd, std::string(1, '\x01') + frame_field(std::string(4096, 'k')) + frame_field("v")), -1);
  close(fd);
  EXPECT_EQ(client_of(server, kSecret)->try_get("key"), std::optional<std::string>("value"));
}

// A connection that never proves the secret (one that sends nothing, say) is closed after prove_within_s, so
// idle strangers cannot hold the store's descriptors; the job's proven idle connections stay.
TEST(JobSecret, AConnectionThatNeverProvesTheSecretIsClosed) {
  StoreLimits limits;
  limits.prove_within_s = 0.3;
  StoreServer server("127.0.0.1", 0, limits, kSecret);
  auto job = client_of(server, kSecret);
  const auto start = std::chrono::steady_clock::now();
  const int idle = net::tcp_connect("127.0.0.1", server.port(), net::deadline_after(2.0));
  ASSERT_GE(idle, 0);
  pollfd readable{idle, POLLIN, 0};
  ASSERT_EQ(poll(&readable, 1, 5000), 1) << "the idle stranger was not closed";
  char byte;
  EXPECT_LE(recv(idle, &byte, 1, MSG_DONTWAIT), 0);
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.25);
  close(idle);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the proven client stayed idle longer still
  job->set("after", "idle");
  EXPECT_EQ(job->get("after", 1.0), "idle");
}

TEST(JobSecret, ProofsDependOnTheSecretTheRoleAndBothNonces) {
  const std::string client = store_nonce(), server = store_nonce();
  EXPECT_EQ(client.size(), kStoreNonceBytes);
  EXPECT_NE(client, server);
  const std::string proof = store_proof(kSecret, StoreRole::kClient, client, server);
  EXPECT_EQ(proof.size(), 32u);  // SHA-256
  EXPECT_TRUE(same_proof(proof, store_proof(kSecret, StoreRole::kClient, client, server)));
  EXPECT_FALSE(same_proof(proof, store_proof(kOtherSecret, StoreRole::kClient, client, server)));
  EXPECT_FALSE(same_proof(proof, store_proof(kSecret, StoreRole::kServer, client, server)));
  EXPECT_FALSE(same_proof(proof, store_proof(kSecret, StoreRole::kClient, server, client)));
  EXPECT_FALSE(same_proof(proof, proof.substr(1)));
  const std::string generated = generate_job_secret();
  EXPECT_EQ(generated.size(), 2 * kStoreNonceBytes);
  EXPECT_NE(generated, generate_job_secret());
}

TEST(JobSecret, TheVariableIsCheckedAndItsValueNeverShown) {
  std::vector<std::string> warnings;
  EXPECT_EQ(job_secret(Config::parse({}, &warnings)), "");
  EXPECT_EQ(job_secret(Config::parse({{"BRAID_JOB_SECRET", kSecret}}, &warnings)), kSecret);
  const std::string message = expect_error(
      [&] { job_secret(Config::parse({{"BRAID_JOB_SECRET", "tiny-secret"}}, &warnings)); },
      ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("BRAID_JOB_SECRET"), std::string::npos) << message;
  EXPECT_EQ(message.find("tiny-secret"), std::string::npos) << message;
  EXPECT_TRUE(net::is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(net::is_loopback_host("127.0.1.1"));
  EXPECT_TRUE(net::is_loopback_host("localhost"));
  EXPECT_TRUE(net::is_loopback_host("::1"));
  EXPECT_FALSE(net::is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(net::is_loopback_host("10.1.2.3"));
  EXPECT_FALSE(net::is_loopback_host("::"));
}

TEST(StoreUsers, TheKernelNamesTheOwnerOfALocalClient) {
  // A connection this process made to itself: the client end is its own uid's.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const int accepted = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  const net::PeerOwner owner = net::peer_owner(accepted);
  EXPECT_TRUE(owner.local);
  EXPECT_EQ(owner.uid, std::optional<uid_t>(::geteuid())) << owner.unknown_why;
  close(client);
  close(accepted);
  close(listener);
}

// A process of another uid on this host connects without any secret involved: the store closes the connection
// before it serves a byte, and the job's own clients go on.
TEST(StoreUsers, AClientOfAnotherUserOfThisHostIsClosed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another user (uid 65534)";
  StoreServer server("127.0.0.1", 0, StoreLimits{}, std::string());
  client_of(server, "")->set("key", "value");
  const int port = server.port();
  int done[2];
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the other user: only system calls from here on
    char result = 'e';
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
      result = 'u';  // root without the right to change uid (a restricted container)
    } else {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_port = htons(static_cast<uint16_t>(port));
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
        // TRY_GET "key": a reply byte means it was served; the end of the stream (or a reset, the store having
        // closed it with the request unread) means it was closed.
        const char frame[] = {8, 0, 0, 0, 3, 3, 0, 0, 0, 'k', 'e', 'y'};
        (void)!::write(fd, frame, sizeof(frame));
        pollfd ready{fd, POLLIN, 0};
        char status = 0;
        result = ::poll(&ready, 1, 5000) != 1 ? 't' : ::recv(fd, &status, 1, 0) == 1 ? 's' : 'c';
      } else {
        result = 'r';  // refused at connect: also kept out
      }
    }
    (void)!::write(done[1], &result, 1);
    ::_exit(0);
  }
  close(done[1]);
  char result = 0;
  ASSERT_EQ(::read(done[0], &result, 1), 1);
  close(done[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (result == 'u') GTEST_SKIP() << "this root may not change uid";
  EXPECT_TRUE(result == 'c' || result == 'r') << "the other user's client got '" << result
                                              << "' (s: served, t: no answer, e: error)";
  EXPECT_EQ(client_of(server, "")->try_get("key"), std::optional<std::string>("value"));
}

}  // namespace
}  // namespace braid
