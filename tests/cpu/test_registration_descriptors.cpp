// The descriptors ranks exchange for registered (and automatically registered) buffers and import_global pass
// the checks of import_handle (NOTE [descriptors naming this process], memory/export_import.hpp): a descriptor
// naming this process, handed over as a peer's, is refused unless that peer is a thread of this process that
// offered it for the exchange. The refusals happen before any CUDA call, so exchange_tables runs here for real
// (a store, a bootstrap, a forging "rank 1" that writes the store); mapping an accepted descriptor needs a GPU, so
// the acceptance of thread-ranks' descriptors is checked at the shared function, unpack_for_import.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/job_secret.hpp"
#include "bootstrap/store.hpp"
#include "expect_error.hpp"
#include "memory/export_import.hpp"
#include "memory/memory_context.hpp"
#include "memory/memory_handle.hpp"
#include "memory/registration.hpp"

namespace braid::detail {
namespace {

constexpr double kTimeoutS = 10.0;

// A communicator id no other test uses (the offers of thread-ranks are kept per process, by this id).
std::string fresh_uid() {
  static std::atomic<int> counter{0};
  std::random_device random;
  return "descriptors-" + std::to_string(random()) + "-" + std::to_string(counter++);
}

// A cudaMalloc-kind descriptor of this host, made by process `pid` (the kind whose same-process path uses the
// address as it is).
MemoryDescriptor descriptor_of(uint32_t pid, uint64_t address, uint64_t id) {
  MemoryDescriptor d;
  d.kind = MemoryKind::kLegacyIpc;
  d.host_id = this_host_id();
  d.pid = pid;
  d.device = 0;
  d.pci_bus_id = "00000000:1B:00.0";
  d.allocation_base = address;
  d.allocation_bytes = 1 << 20;
  d.address = address;
  d.bytes = 4096;
  d.id = id;
  return d;
}

uint32_t this_pid() { return static_cast<uint32_t>(::getpid()); }

// A rank's memory context on its own connection to `server`, without fd passing (cudaMalloc-kind descriptors
// travel in the blobs alone).
std::unique_ptr<MemoryContext> context_of(const StoreServer& server, const std::string& uid, int rank, int size) {
  auto context = std::make_unique<MemoryContext>();
  context->rank = rank;
  context->size = size;
  context->device = 0;
  context->timeout_s = kTimeoutS;
  context->uid = uid;
  auto store = std::make_shared<StoreClient>("127.0.0.1", server.port(), kTimeoutS);
  context->bootstrap = std::make_unique<Bootstrap>(store, uid, rank, size, kTimeoutS);
  return context;
}

// A context that exchanges nothing: who a rank is, for unpack_for_import and the offers.
std::unique_ptr<MemoryContext> bare_context(const std::string& uid, int rank, int size) {
  auto context = std::make_unique<MemoryContext>();
  context->rank = rank;
  context->size = size;
  context->uid = uid;
  return context;
}

// Rank 0 (this process) exchanges its registered buffer while "rank 1", a writer of the store, hands over
// `forged` as its descriptor. Returns rank 0's error message ("" when none, with a test failure).
std::string exchange_against(const std::string& forged, const MemoryDescriptor& mine) {
  StoreServer server;
  const std::string uid = fresh_uid();
  std::unique_ptr<MemoryContext> rank0 = context_of(server, uid, 0, 2);
  std::thread forger([&] {
    std::unique_ptr<MemoryContext> rank1 = context_of(server, uid, 1, 2);
    rank1->bootstrap->allgather(forged, "registered buffer exchange");
  });
  const std::string message = expect_error(
      [&] { exchange_tables(*rank0, &mine, mine.address, "registered buffer exchange", false); },
      ErrorCode::kInvalidArgument);
  forger.join();
  return message;
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Before registration used these checks, rank 0 took the forged descriptor as rank 1's buffer and (on a GPU)
// mapped its address in place: a writer of the store could aim rank 0's kernels anywhere in its memory.
TEST(RegisteredBufferDescriptors, AForgedPeerDescriptorNamingThisProcessIsRefused) {
  const MemoryDescriptor mine = descriptor_of(this_pid(), 0x7f0000000000, 1);
  const std::string forged = pack(descriptor_of(this_pid(), 0x7f00dead0000, 2), job_secret());
  const std::string message = exchange_against(forged, mine);
  EXPECT_TRUE(contains(message, "registered buffer exchange: argument 'peer descriptor'")) << message;
  EXPECT_TRUE(contains(message, "from rank 1 names this process")) << message;
}

// Rank 0's own descriptor copied into rank 1's place is refused too: a rank never takes its own buffer as a peer's.
TEST(RegisteredBufferDescriptors, ThisRanksOwnDescriptorReplayedAsAPeersIsRefused) {
  const MemoryDescriptor mine = descriptor_of(this_pid(), 0x7f0000000000, 3);
  const std::string message = exchange_against(pack(mine, job_secret()), mine);
  EXPECT_TRUE(contains(message, "argument 'peer descriptor'")) << message;
  EXPECT_TRUE(contains(message, "names this process")) << message;
}

// A descriptor from a thread-rank of this process (one communicator, ranks as threads, as the gpu_threads tests
// run them) is what that rank offered: accepted from that rank only, and only while the offer lasts.
TEST(RegisteredBufferDescriptors, ThreadRanksOfferedDescriptorIsAcceptedFromThatRankOnly) {
  const std::string uid = fresh_uid();
  std::unique_ptr<MemoryContext> rank0 = bare_context(uid, 0, 3);
  std::unique_ptr<MemoryContext> rank1 = bare_context(uid, 1, 3);
  const std::string blob = pack(descriptor_of(this_pid(), 0x7f1000000000, 4), job_secret());
  offer_to_thread_ranks(*rank1, blob);  // before its exchange's allgather
  withdraw_earlier_offers(*rank1, blob);  // after it: this exchange's offer stays
  const MemoryDescriptor accepted =
      unpack_for_import(blob, "registered buffer exchange", "peer descriptor", BlobOrigin{rank0.get(), 1});
  EXPECT_EQ(accepted.address, 0x7f1000000000u);

  const std::string as_rank2 = expect_error(
      [&] { unpack_for_import(blob, "registered buffer exchange", "peer descriptor", BlobOrigin{rank0.get(), 2}); },
      ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(as_rank2, "argument 'peer descriptor'")) << as_rank2;
  EXPECT_TRUE(contains(as_rank2, "from rank 2")) << as_rank2;

  std::unique_ptr<MemoryContext> other_communicator = bare_context(fresh_uid(), 0, 3);
  expect_error(
      [&] {
        unpack_for_import(blob, "registered buffer exchange", "peer descriptor", BlobOrigin{other_communicator.get(), 1});
      },
      ErrorCode::kInvalidArgument);

  // Rank 1's next exchange has been gathered: every rank is past this one, and the offer is withdrawn.
  const std::string next = pack(descriptor_of(this_pid(), 0x7f2000000000, 5), job_secret());
  offer_to_thread_ranks(*rank1, next);
  withdraw_earlier_offers(*rank1, next);
  expect_error([&] { unpack_for_import(blob, "import_global", "peer handle", BlobOrigin{rank0.get(), 1}); },
               ErrorCode::kInvalidArgument);
  unpack_for_import(next, "import_global", "peer handle", BlobOrigin{rank0.get(), 1});

  // Rank 1's communicator is gone: so are its offers.
  rank1->registrations.reset();
  const std::string gone = expect_error(
      [&] { unpack_for_import(next, "import_global", "peer handle", BlobOrigin{rank0.get(), 1}); },
      ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(gone, "import_global: argument 'peer handle'")) << gone;
}

// Descriptors of other processes (the usual case: ranks are processes) and import_handle's rule are unchanged.
TEST(RegisteredBufferDescriptors, OtherProcessesDescriptorsAndImportHandleKeepTheirRules) {
  std::unique_ptr<MemoryContext> rank0 = bare_context(fresh_uid(), 0, 2);
  const uint32_t other_pid = this_pid() + 1;
  const std::string theirs = pack(descriptor_of(other_pid, 0x7f3000000000, 6), job_secret());
  EXPECT_EQ(unpack_for_import(theirs, "registered buffer exchange", "peer descriptor", BlobOrigin{rank0.get(), 1}).pid,
            other_pid);
  EXPECT_EQ(unpack_for_import(theirs, "import_handle", "blob").pid, other_pid);

  const std::string forged = pack(descriptor_of(this_pid(), 0x7f4000000000, 7), job_secret());
  const std::string message =
      expect_error([&] { unpack_for_import(forged, "import_handle", "blob"); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(message, "import_handle: argument 'blob'")) << message;
  EXPECT_TRUE(contains(message, "no such live export")) << message;
}

}  // namespace
}  // namespace braid::detail
