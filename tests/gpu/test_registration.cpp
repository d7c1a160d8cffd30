// Registered user buffers and exported memory handles, on every rank (threads or braid-run processes):
//   - all_reduce (int32 exact, float32) and all_to_all on cudaMalloc buffers registered vs not: identical results,
//     both equal to the host reference; sizes 1, 7, 4097, 1 MiB + 3 and one above the staging buffer; a sub-range
//     of a registered range (containment) and VMM memory made with POSIX-fd handles;
//   - the cache: the first use at an address exchanges once, later calls count hits and no exchange;
//   - calls of LL sizes look up no registration (no exchange, no mapping) and are right;
//   - 1,000 register/collective/deregister cycles with no growth in device memory or open fds, in both teardown
//     orders (deregister first; destroy the communicator first, 1,000 communicators);
//   - a buffer registered with two communicators is mapped once per communicator;
//   - first use inside a CUDA graph capture (global mode in processes, thread-local as threads), replayed 99 times;
//   - registration and deregistration from other host threads while collectives run;
//   - argument errors: null, zero length, past the allocation's end, host memory, another GPU's memory;
//   - export_handle/import_handle between ranks (processes under braid-run), import_global, put/get, and the
//     one-sided all_to_all against the two-sided one, NCCL's alltoall (an NCCL-backend communicator) and the
//     host reference; the one-sided all_to_all with each rank in turn a second late (no host call on the way
//     may wait for a busy peer GPU).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/job_secret.hpp"
#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "collectives/selection.hpp"
#include "memory/memory_handle.hpp"
#include "process_resources.hpp"
#include "test_helpers.hpp"
#include "vmm_buffer.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

void cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
}

// Element i of rank r's input: never zero, distinct per (seed, rank, i).
int32_t input_value(uint32_t seed, int rank, size_t i) {
  return static_cast<int32_t>(((seed * 2654435761u) ^ (static_cast<uint32_t>(rank) * 40503u) ^ static_cast<uint32_t>(i * 7919u)) % 2000003u) + 1;
}

std::vector<int32_t> input(uint32_t seed, int rank, size_t count) {
  std::vector<int32_t> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = input_value(seed, rank, i);
  return values;
}

void upload(void* device, const std::vector<int32_t>& values) {
  cuda(cudaMemcpy(device, values.data(), values.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "upload");
}

std::vector<int32_t> download(const void* device, size_t count) {
  std::vector<int32_t> values(count);
  cuda(cudaMemcpy(values.data(), device, count * sizeof(int32_t), cudaMemcpyDeviceToHost), "download");
  return values;
}

void poison(void* device, size_t bytes) { cuda(cudaMemset(device, 0xA5, bytes), "poison"); }

// " name 0.123 s": one step of a timed sequence.
std::string fmt_step(const char* name, double seconds) {
  char text[96];
  std::snprintf(text, sizeof text, " %s %.3f s", name, seconds);
  return text;
}

uint32_t shared_seed(Communicator& comm) {
  const std::vector<std::string> all = comm.host_allgather(std::to_string(std::random_device{}()));
  return static_cast<uint32_t>(std::stoul(all[0]));
}

// all_reduce sum of int32 on [send, recv) of `count` elements, checked against the reference.
void check_all_reduce(Communicator& comm, void* send, void* recv, size_t count, uint32_t seed, const std::string& what) {
  upload(send, input(seed, comm.rank(), count));
  poison(recv, count * sizeof(int32_t));
  comm.all_reduce(send, recv, count, DataType::kInt32, ReduceOp::kSum, cudaStreamPerThread);
  device_synchronize();
  comm.check();
  const std::vector<int32_t> got = download(recv, count);
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < count; ++i) {
    int32_t expected = 0;
    for (int r = 0; r < comm.size(); ++r) expected += input_value(seed, r, i);
    if (got[i] != expected && wrong++ == 0) first = i;
  }
  EXPECT_EQ(wrong, 0u) << what << ": " << wrong << " of " << count << " wrong, first at " << first;
}

void check_all_to_all(Communicator& comm, void* send, void* recv, size_t count, uint32_t seed, const std::string& what) {
  const int world = comm.size();
  upload(send, input(seed, comm.rank(), count * world));
  poison(recv, count * world * sizeof(int32_t));
  comm.all_to_all(send, recv, count, DataType::kInt32, cudaStreamPerThread);
  device_synchronize();
  comm.check();
  const std::vector<int32_t> got = download(recv, count * world);
  size_t wrong = 0;
  for (int q = 0; q < world; ++q) {
    for (size_t i = 0; i < count; ++i) wrong += got[q * count + i] != input_value(seed, q, comm.rank() * count + i);
  }
  EXPECT_EQ(wrong, 0u) << what;
}

struct DeviceBuffer {
  void* pointer = nullptr;
  explicit DeviceBuffer(size_t bytes) { cuda(cudaMalloc(&pointer, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { free_when_ranks_end(pointer); }  // NOTE [shared-GPU waits] (world.hpp)
  char* bytes() const { return static_cast<char*>(pointer); }
};

const size_t kSizes[] = {1, 7, 4097, (size_t(1) << 18) + 3, size_t(40) << 20 >> 2};  // the last: 40 MiB, above staging

// Elements of an int32 all-reduce that uses its registered buffers: 1 MiB and 16 bytes, beyond every size LL
// serves (an LL call looks up no buffer).
constexpr size_t kMappedCount = (size_t(1) << 18) + 4;

TEST(Registration, RegisteredMatchesUnregisteredAndReference) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    const int world = comm.size();
    for (size_t count : kSizes) {
      const size_t bytes = count * sizeof(int32_t) * world;
      DeviceBuffer send(bytes), recv(bytes);
      check_all_reduce(comm, send.pointer, recv.pointer, count, seed + 1, "unregistered all_reduce " + std::to_string(count));
      check_all_to_all(comm, send.pointer, recv.pointer, count, seed + 2, "unregistered all_to_all " + std::to_string(count));
      RegisteredBuffer rs = comm.register_buffer(send.pointer, bytes);
      RegisteredBuffer rr = comm.register_buffer(recv.pointer, bytes);
      check_all_reduce(comm, send.pointer, recv.pointer, count, seed + 1, "registered all_reduce " + std::to_string(count));
      check_all_to_all(comm, send.pointer, recv.pointer, count, seed + 2, "registered all_to_all " + std::to_string(count));
      // A sub-range one element in (unaligned: zero copy declines it, staging serves it, still correct) and one
      // 16 bytes in (aligned: zero copy through the same registration).
      if (count > 8) {
        check_all_reduce(comm, send.bytes() + 4, recv.bytes() + 4, count - 8, seed + 3, "registered, unaligned sub-range");
        check_all_reduce(comm, send.bytes() + 16, recv.bytes() + 16, count - 8, seed + 4, "registered, aligned sub-range");
      }
      comm.deregister(rs);
      comm.deregister(rr);
      EXPECT_FALSE(rs);
    }
  });
}

// Why the tests that count eager calls' exchanges skip under BRAID_EAGER_ZERO_COPY=1 (ExposedRanges.* test that mode).
constexpr const char* kCountsEagerExchanges =
    "counts the exchanges of eager calls, which BRAID_EAGER_ZERO_COPY=1 replaces";

TEST(Registration, CacheHitMakesNoExchange) {
  if (eager_zero_copy_on()) GTEST_SKIP() << kCountsEagerExchanges;
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    const size_t count = kMappedCount;
    DeviceBuffer send(count * 4), recv(count * 4);
    RegisteredBuffer rs = comm.register_buffer(send.pointer, count * 4);
    RegisteredBuffer rr = comm.register_buffer(recv.pointer, count * 4);
    EXPECT_EQ(comm.registration_stats().buffers, 2u);
    check_all_reduce(comm, send.pointer, recv.pointer, count, seed, "first use");
    const RegistrationStats first = comm.registration_stats();
    EXPECT_EQ(first.exchanges, 2u) << "one exchange for send, one for recv";
    EXPECT_EQ(first.peer_mappings, 2u * (comm.size() - 1)) << "each peer's two allocations mapped once";
    for (int i = 0; i < 10; ++i) check_all_reduce(comm, send.pointer, recv.pointer, count, seed + i, "later use");
    const RegistrationStats later = comm.registration_stats();
    EXPECT_EQ(later.exchanges, first.exchanges) << "a cache hit made a host exchange";
    EXPECT_EQ(later.cache_hits, first.cache_hits + 20);
    comm.deregister(rs);
    comm.deregister(rr);
    const RegistrationStats after = comm.registration_stats();
    EXPECT_EQ(after.buffers, 0u);
    EXPECT_EQ(after.peer_mappings, 0u) << "deregistering left peers' memory mapped";
  });
}

// LL sizes run the same kernels on every buffer, so a call of one looks up no registration: no exchange, no
// cache hit, no peer mapping, the right answer. The same buffers at a size beyond LL's then exchange once. The
// sizes are LL at every world (the smallest all-reduce cut-off is 64 KiB, at 7 and 8 ranks): checked first.
TEST(Registration, LLSizesLookUpNoBuffer) {
  if (eager_zero_copy_on()) GTEST_SKIP() << kCountsEagerExchanges;
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    const std::initializer_list<size_t> ll_counts = {1, 4097, 12289};
    for (size_t count : ll_counts) {
      ASSERT_TRUE(runs_ll(::braid::Collective::kAllReduce, count * 4, comm.size(), DataType::kInt32, ""))
          << "all-reduce of " << count << " int32 at " << comm.size() << " ranks";
      ASSERT_TRUE(runs_ll(::braid::Collective::kAllToAll, (count / comm.size() + 1) * comm.size() * 4, comm.size(),
                          DataType::kInt32, ""))
          << "all-to-all of " << count / comm.size() + 1 << " int32 a rank at " << comm.size() << " ranks";
    }
    ASSERT_FALSE(runs_ll(::braid::Collective::kAllReduce, kMappedCount * 4, comm.size(), DataType::kInt32, ""));
    DeviceBuffer send(kMappedCount * 4), recv(kMappedCount * 4);
    RegisteredBuffer rs = comm.register_buffer(send.pointer, kMappedCount * 4);
    RegisteredBuffer rr = comm.register_buffer(recv.pointer, kMappedCount * 4);
    for (size_t count : ll_counts) {
      check_all_reduce(comm, send.pointer, recv.pointer, count, seed + count, "LL size " + std::to_string(count));
      check_all_to_all(comm, send.pointer, recv.pointer, count / comm.size() + 1, seed + count, "LL all_to_all");
    }
    const RegistrationStats ll = comm.registration_stats();
    EXPECT_EQ(ll.exchanges, 0u);
    EXPECT_EQ(ll.cache_hits, 0u);
    EXPECT_EQ(ll.peer_mappings, 0u);
    check_all_reduce(comm, send.pointer, recv.pointer, kMappedCount, seed, "beyond LL");
    EXPECT_EQ(comm.registration_stats().exchanges, 2u);
  });
}

TEST(Registration, VmmMemory) {
  if (eager_zero_copy_on()) GTEST_SKIP() << kCountsEagerExchanges;
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    const size_t count = (size_t(1) << 20) + 3;
    VmmBuffer send(count * 4 * comm.size(), comm.device()), recv(count * 4 * comm.size(), comm.device());
    RegisteredBuffer rs = comm.register_buffer(send.pointer(), count * 4 * comm.size());
    RegisteredBuffer rr = comm.register_buffer(recv.pointer(), count * 4 * comm.size());
    check_all_reduce(comm, send.pointer(), recv.pointer(), count, seed, "VMM all_reduce");
    check_all_to_all(comm, send.pointer(), recv.pointer(), count, seed + 1, "VMM all_to_all");
    EXPECT_EQ(comm.registration_stats().exchanges, 2u);
  });
}

TEST(Registration, ThousandCyclesLeakNothing) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    const size_t count = kMappedCount;
    DeviceBuffer send(count * 4), recv(count * 4);
    auto cycle = [&](int i) {
      RegisteredBuffer rs = comm.register_buffer(send.pointer, count * 4);
      RegisteredBuffer rr = comm.register_buffer(recv.pointer, count * 4);
      check_all_reduce(comm, send.pointer, recv.pointer, count, seed + i, "cycle");
      comm.deregister(rs);
      if (i % 2) rr.reset();  // the handle's last copy going deregisters too
      else comm.deregister(rr);
    };
    // Ranks that are threads share the process's fds: each count waits until every rank's cycles are done. A
    // leak grows with the cycles (one fd a cycle: 1000 more); the driver may still open one or two of its own
    // after the warm cycles, so a few are allowed.
    constexpr size_t kDriverFds = 4;
    for (int i = 0; i < 20; ++i) cycle(i);  // warm: the driver's own pools settle
    device_synchronize();
    comm.barrier();
    const size_t fds = open_fds(), free = free_device_bytes();
    comm.barrier();
    for (int i = 0; i < 1000; ++i) cycle(i);
    device_synchronize();
    comm.barrier();
    EXPECT_LE(open_fds(), fds + kDriverFds) << "open fds grew over 1000 cycles";
    EXPECT_GE(free_device_bytes() + (size_t(4) << 20), free) << "device memory shrank over 1000 cycles";
    EXPECT_EQ(comm.registration_stats().peer_mappings, 0u);
  });
}

// 1,000 communicators made and destroyed, each running a collective on two cudaMalloc buffers; registered ones
// are deregistered only after their communicator is gone. A leak grows with the cycles: open fds must not grow
// after 20 warm cycles by more than a few per rank (ranks that are threads count the process's fds, while the other
// threads may be mid-cycle with a socket or an exchanged fd open; one fd leaked a cycle would add ~980), and device memory must not shrink by more than 2 MiB in both halves of the run (other
// tests' memory freed or taken back by the driver meanwhile moves it once, a leak in every half).
void communicator_cycles(const RankContext& context, bool registered) {
  const size_t count = kMappedCount;
  const size_t slack = size_t(2) << 20;
  size_t fds = 0, free_warm = 0, free_half = 0;
  for (int i = 0; i < 1000; ++i) {
    Communicator comm = Communicator::init(context.rendezvous, test_options());
    make_current(comm);
    // Freed in step at the cycle's end: a buffer free_when_ranks_end held back would count as a leak.
    LockstepBuffer send(count * 4), recv(count * 4);
    RegisteredBuffer rs, rr;
    if (registered) {
      rs = comm.register_buffer(send.get(), count * 4);
      rr = comm.register_buffer(recv.get(), count * 4);
    }
    check_all_reduce(comm, send.get(), recv.get(), count, 77 + i, "before destroy");
    comm.barrier();
    { Communicator gone = std::move(comm); }  // destroyed first; the handles outlive it
    if (registered) EXPECT_EQ(rs.bytes(), count * 4);
    rs.reset();  // deregistering after the communicator is gone
    rr.reset();
    if (i == 19) {  // warm: the driver's own pools settle
      fds = open_fds();
      free_warm = free_device_bytes();
    }
    if (i == 509) free_half = free_device_bytes();
  }
  const size_t free_end = free_device_bytes();
  const size_t in_flight = 4 * size_t(context.world);  // other ranks' fds of a cycle in progress
  EXPECT_LE(open_fds(), fds + in_flight) << "fds grew over 1000 communicators";
  const bool shrank_first = free_half + slack < free_warm, shrank_second = free_end + slack < free_half;
  EXPECT_FALSE(shrank_first && shrank_second) << "device memory shrank in both halves: " << free_warm << " -> "
                                              << free_half << " -> " << free_end << " bytes free";
}

TEST(Registration, CommunicatorDestroyedBeforeDeregister) {
  for_each_rank([](const RankContext& context) { communicator_cycles(context, true); });
}

// The same cycles with nothing registered: the baseline the registered run is compared with.
TEST(Registration, CommunicatorCyclesWithoutRegistration) {
  for_each_rank([](const RankContext& context) { communicator_cycles(context, false); });
}

TEST(Registration, TwoCommunicatorsMapOnceEach) {
  if (eager_zero_copy_on()) GTEST_SKIP() << kCountsEagerExchanges;
  for_each_rank([](const RankContext& context) {
    Communicator a = Communicator::init(context.rendezvous, test_options());
    Communicator b = Communicator::init(context.rendezvous, test_options());
    make_current(a);
    const size_t count = kMappedCount;
    DeviceBuffer send(count * 4), recv(count * 4);
    RegisteredBuffer as = a.register_buffer(send.pointer, count * 4), ar = a.register_buffer(recv.pointer, count * 4);
    RegisteredBuffer bs = b.register_buffer(send.pointer, count * 4), br = b.register_buffer(recv.pointer, count * 4);
    for (int i = 0; i < 3; ++i) {
      check_all_reduce(a, send.pointer, recv.pointer, count, 5 + i, "communicator a");
      check_all_reduce(b, send.pointer, recv.pointer, count, 9 + i, "communicator b");
    }
    EXPECT_EQ(a.registration_stats().peer_mappings, 2u * (a.size() - 1));
    EXPECT_EQ(b.registration_stats().peer_mappings, 2u * (b.size() - 1));
    EXPECT_EQ(a.registration_stats().exchanges, 2u);
    EXPECT_THROW(a.deregister(bs), Error) << "a registration of another communicator";
  });
}

TEST(Registration, FirstUseInsideGraphCapture) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    const size_t count = kMappedCount;
    DeviceBuffer send(count * 4), recv(count * 4);
    RegisteredBuffer rs = comm.register_buffer(send.pointer, count * 4);
    RegisteredBuffer rr = comm.register_buffer(recv.pointer, count * 4);
    cudaStream_t stream;
    cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    cudaGraph_t graph;
    // Processes capture in global mode (PyTorch's default). Ranks as threads must capture thread-locally: in
    // global mode one thread's capture forbids the other threads' graph instantiation and memory calls.
    const cudaStreamCaptureMode mode = in_process_mode() ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeThreadLocal;
    cuda(cudaStreamBeginCapture(stream, mode), "begin capture");
    comm.all_reduce(send.pointer, recv.pointer, count, DataType::kInt32, ReduceOp::kSum, reinterpret_cast<Stream>(stream));
    cuda(cudaStreamEndCapture(stream, &graph), "end capture");
    EXPECT_EQ(comm.registration_stats().exchanges, 2u) << "the exchange happens at capture time";
    cudaGraphExec_t exec = instantiate_on_every_rank(graph, stream);
    for (int replay = 0; replay < 99; replay += 33) {
      upload(send.pointer, input(seed + replay, comm.rank(), count));
      poison(recv.pointer, count * 4);
      device_synchronize();
      comm.barrier();  // every rank's input is in place before any replay reads it
      replay_graph(exec, stream, 33);
      comm.check();
      const std::vector<int32_t> got = download(recv.pointer, count);
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        int32_t expected = 0;
        for (int r = 0; r < comm.size(); ++r) expected += input_value(seed + replay, r, i);
        wrong += got[i] != expected;
      }
      EXPECT_EQ(wrong, 0u) << "replays from " << replay;
      comm.barrier();
    }
    EXPECT_EQ(comm.registration_stats().exchanges, 2u);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  });
}

TEST(Registration, OtherThreadsRegisterWhileCollectivesRun) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    const size_t count = kMappedCount;
    DeviceBuffer send(count * 4), recv(count * 4), spare(1 << 20);
    RegisteredBuffer rs = comm.register_buffer(send.pointer, count * 4);
    RegisteredBuffer rr = comm.register_buffer(recv.pointer, count * 4);
    std::atomic<bool> stop{false};
    std::atomic<int> cycles{0};
    const int device = comm.device();
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        cudaSetDevice(device);
        while (!stop.load()) {
          RegisteredBuffer mine = comm.register_buffer(spare.bytes() + t * 4096, 4096);
          (void)comm.registration_stats();
          comm.deregister(mine);
          cycles.fetch_add(1);
        }
      });
    }
    for (int i = 0; i < 50; ++i) check_all_reduce(comm, send.pointer, recv.pointer, count, seed + i, "beside registering threads");
    stop = true;
    for (auto& thread : threads) thread.join();
    EXPECT_GT(cycles.load(), 0);
    EXPECT_EQ(comm.registration_stats().buffers, 2u);
  });
}

TEST(Registration, BadArgumentsNameTheArgument) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    DeviceBuffer buffer(1 << 20);
    auto refused = [&](const std::function<void()>& call, ErrorCode code, const std::string& words) {
      try {
        call();
        ADD_FAILURE() << "accepted; expected an error mentioning '" << words << "'";
      } catch (const Error& error) {
        EXPECT_EQ(error.code(), code) << error.what();
        EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
      }
    };
    refused([&] { comm.register_buffer(nullptr, 16); }, ErrorCode::kInvalidArgument, "'pointer' is null");
    refused([&] { comm.register_buffer(buffer.pointer, 0); }, ErrorCode::kInvalidArgument, "'bytes' is 0");
    refused([&] { comm.register_buffer(buffer.bytes() + 16, 1 << 20); }, ErrorCode::kInvalidArgument, "past the end of its allocation");
    refused([&] { comm.register_buffer(reinterpret_cast<void*>(~uintptr_t(0) - 8), 64); }, ErrorCode::kInvalidArgument, "overflows");
    std::vector<char> host(4096);
    refused([&] { comm.register_buffer(host.data(), host.size()); }, ErrorCode::kInvalidArgument, "'pointer'");
    void* pinned = nullptr;
    cuda(cudaMallocHost(&pinned, 4096), "cudaMallocHost");
    refused([&] { comm.register_buffer(pinned, 4096); }, ErrorCode::kInvalidArgument, "host memory");
    cudaFreeHost(pinned);
    // cudaMallocAsync memory cannot be shared, whatever its pool's handle types: the driver gives its allocations
    // neither a legacy IPC handle nor an allocation handle.
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    props.location = {cudaMemLocationTypeDevice, comm.device()};
    cudaMemPool_t fd_pool = nullptr;
    cuda(cudaMemPoolCreate(&fd_pool, &props), "cudaMemPoolCreate");
    cudaMemPool_t default_pool = nullptr;
    cuda(cudaDeviceGetDefaultMemPool(&default_pool, comm.device()), "cudaDeviceGetDefaultMemPool");
    for (cudaMemPool_t pool : {default_pool, fd_pool}) {
      void* pooled = nullptr;
      cuda(cudaMallocFromPoolAsync(&pooled, 1 << 20, pool, nullptr), "cudaMallocFromPoolAsync");
      cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
      refused([&] { comm.register_buffer(pooled, 1 << 20); }, ErrorCode::kUnsupported, "cannot be shared");
      cuda(cudaFreeAsync(pooled, nullptr), "cudaFreeAsync");
    }
    cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
    cuda(cudaMemPoolDestroy(fd_pool), "cudaMemPoolDestroy");
    int devices = 0;
    cudaGetDeviceCount(&devices);
    if (devices > 1) {
      const int other = (comm.device() + 1) % devices;
      cuda(cudaSetDevice(other), "device");
      DeviceBuffer foreign(4096);
      make_current(comm);
      refused([&] { comm.register_buffer(foreign.pointer, 4096); }, ErrorCode::kInvalidArgument, "memory of GPU");
      cuda(cudaSetDevice(other), "device");
    }
    make_current(comm);
    RegisteredBuffer empty;
    refused([&] { comm.deregister(empty); }, ErrorCode::kInvalidArgument, "'buffer' is empty");
    EXPECT_EQ(comm.registration_stats().buffers, 0u);
  });
}

// ---- Exported handles ----

TEST(MemoryHandles, ImportPeersExportsAndOneSidedAllToAll) {
  SKIP_WHERE_RANKS_SHARE_GPUS();
  for_each_rank([](const RankContext& context) {
    Communicator comm = Communicator::init(context.rendezvous, test_options());
    CommOptions on_nccl = test_options();
    on_nccl.backend = "nccl";  // NCCL's alltoall on the same data, for comparison
    Communicator nccl = Communicator::init(context.rendezvous, on_nccl);
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    const int world = comm.size();
    const size_t count = 300001;  // elements a block
    const size_t bytes = count * 4 * world;
    DeviceBuffer cuda_send(bytes), recv(bytes), expected(bytes);
    VmmBuffer vmm_send(bytes, comm.device());
    for (void* send : {cuda_send.pointer, vmm_send.pointer()}) {
      const std::string what = send == cuda_send.pointer ? "cudaMalloc" : "VMM";
      ExportedHandle mine = export_handle(send, bytes);
      // Plain import_handle of every peer's blob (another process under braid-run: CUDA IPC, or pidfd_getfd).
      const std::vector<std::string> blobs = comm.host_allgather(mine.blob());
      upload(send, input(seed, comm.rank(), count * world));
      device_synchronize();
      comm.barrier();
      for (int q = 0; q < world; ++q) {
        ImportedMemory peer = import_handle(blobs[q], comm.device());
        EXPECT_EQ(peer.bytes(), bytes);
        const std::vector<int32_t> got = download(peer.data(), 64);
        const std::vector<int32_t> want = input(seed, q, 64);
        EXPECT_EQ(got, want) << what << ": rank " << q << "'s memory read through import_handle";
      }
      comm.barrier();
      // The global handle: one-sided all_to_all against the two-sided one.
      GlobalMemory global = comm.import_global(mine);
      ASSERT_EQ(global.world_size(), world);
      poison(recv.pointer, bytes);
      // A stream of its own: with ranks as threads, a copy from another GPU's cudaMalloc memory on the legacy
      // stream would be ordered against that GPU's legacy stream too (see PeerRange::same_process_peers).
      cudaStream_t stream;
      cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
      device_synchronize();
      comm.all_to_all(global, recv.pointer, count, DataType::kInt32, reinterpret_cast<Stream>(stream));
      comm.all_to_all(send, expected.pointer, count, DataType::kInt32, reinterpret_cast<Stream>(stream));
      cuda(cudaStreamSynchronize(stream), "sync");
      comm.check();
      const std::vector<int32_t> one_sided = download(recv.pointer, count * world);
      EXPECT_EQ(one_sided, download(expected.pointer, count * world)) << what << ": one-sided vs two-sided all_to_all";
      poison(expected.pointer, bytes);
      nccl.all_to_all(send, expected.pointer, count, DataType::kInt32, reinterpret_cast<Stream>(stream));
      cuda(cudaStreamSynchronize(stream), "sync");
      cudaStreamDestroy(stream);
      nccl.check();
      EXPECT_EQ(one_sided, download(expected.pointer, count * world)) << what << ": one-sided all_to_all vs NCCL's";
      size_t wrong = 0;
      for (int q = 0; q < world; ++q) {
        for (size_t i = 0; i < count; ++i) wrong += one_sided[q * count + i] != input_value(seed, q, comm.rank() * count + i);
      }
      EXPECT_EQ(wrong, 0u) << what << ": one-sided all_to_all vs reference";
      // put: a marker into word rank() of the next rank's range; get: the word the previous rank received.
      const int next = (comm.rank() + 1) % world, previous = (comm.rank() + world - 1) % world;
      DeviceBuffer marker(4);
      upload(marker.pointer, {1000 + comm.rank()});
      comm.barrier();
      comm.put(global, next, 4 * comm.rank(), marker.pointer, 4, cudaStreamPerThread);
      device_synchronize();
      comm.barrier();
      EXPECT_EQ(download(static_cast<char*>(send) + 4 * previous, 1)[0], 1000 + previous) << what << ": put";
      const int before_previous = (previous + world - 1) % world;
      upload(marker.pointer, {-1});  // poisoned: a get that moves nothing leaves -1
      comm.get(global, previous, 4 * before_previous, marker.pointer, 4, cudaStreamPerThread);
      device_synchronize();
      EXPECT_EQ(download(marker.pointer, 1)[0], 1000 + before_previous) << what << ": get";
      comm.barrier();
    }
  });
}

// One rank reaches the one-sided all_to_all a second after the others, which by then spin in its entry barrier on
// their GPUs. As threads of one process, no host call the late rank makes on the way (poisoning, a device
// synchronisation, the launches) may wait for a peer GPU to go idle: that would deadlock until the timeout. Each step's time is printed, so a step that waited names itself. Once for each rank as the late one,
// on cudaMalloc and VMM memory.
TEST(MemoryHandles, OneSidedAllToAllWithALateRank) {
  for_each_rank([](const RankContext& context) {
    Communicator comm = Communicator::init(context.rendezvous, test_options(10.0));
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    const int world = comm.size();
    const size_t count = 65537;
    const size_t bytes = count * 4 * world;
    DeviceBuffer cuda_send(bytes), recv(bytes), expected(bytes);
    VmmBuffer vmm_send(bytes, comm.device());
    // One stream for every round, made before any round: where ranks share a GPU, making a stream while a peer's
    // call spins can wait until that call ends (NOTE [streams made before the exchanges]).
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    for (void* send : {cuda_send.pointer, vmm_send.pointer()}) {
      for (int late = 0; late < world; ++late) {
        const std::string what = std::string(send == cuda_send.pointer ? "cudaMalloc" : "VMM") + ", rank " +
                                 std::to_string(late) + " late";
        upload(send, input(seed + late, comm.rank(), count * world));
        device_synchronize();
        ExportedHandle mine = export_handle(send, bytes);
        GlobalMemory global = comm.import_global(mine);
        if (comm.rank() == late) std::this_thread::sleep_for(std::chrono::seconds(1));
        std::string steps;
        auto start = std::chrono::steady_clock::now();
        auto step = [&](const char* name) {
          const auto now = std::chrono::steady_clock::now();
          steps += fmt_step(name, std::chrono::duration<double>(now - start).count());
          start = now;
        };
        poison(recv.pointer, bytes);
        poison(expected.pointer, bytes);
        step("poison");
        device_synchronize();
        step("device sync");
        try {
          comm.all_to_all(global, recv.pointer, count, DataType::kInt32, reinterpret_cast<Stream>(stream));
          step("one-sided launch");
          comm.all_to_all(send, expected.pointer, count, DataType::kInt32, reinterpret_cast<Stream>(stream));
          step("two-sided launch");
          cuda(cudaStreamSynchronize(stream), "sync");
          step("stream sync");
          comm.check();
        } catch (const std::exception& error) {
          ADD_FAILURE() << what << ", rank " << comm.rank() << ": " << error.what() << "; steps:" << steps;
          cudaStreamSynchronize(stream);
          throw;
        }
        std::printf("[ rank %d ] %s:%s\n", comm.rank(), what.c_str(), steps.c_str());
        const std::vector<int32_t> one_sided = download(recv.pointer, count * world);
        EXPECT_EQ(one_sided, download(expected.pointer, count * world)) << what << ": one-sided vs two-sided all_to_all";
        size_t wrong = 0;
        for (int q = 0; q < world; ++q) {
          for (size_t i = 0; i < count; ++i) wrong += one_sided[q * count + i] != input_value(seed + late, q, comm.rank() * count + i);
        }
        EXPECT_EQ(wrong, 0u) << what << ": one-sided all_to_all vs reference";
        comm.barrier();  // no rank changes its send buffer while a peer may still read it
      }
    }
  });
}

// put and get outside a peer's range: refused naming the argument, nothing moved (the destination keeps its poison).
TEST(MemoryHandles, PutAndGetOutsideARangeNameTheArgument) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), world = comm.size(), next = (rank + 1) % world;
    constexpr size_t kBytes = 4096;
    VmmBuffer exported(kBytes, comm.device());
    DeviceBuffer local(kBytes);
    poison(local.pointer, kBytes);
    device_synchronize();
    ExportedHandle mine = export_handle(exported.pointer(), kBytes);
    GlobalMemory global = comm.import_global(mine);
    ASSERT_EQ(global.bytes(next), kBytes);
    const Stream stream = cudaStreamPerThread;
    expect_invalid_argument(rank, "put at an offset past the range", {"'offset'"},
                            [&] { comm.put(global, next, kBytes + 1, local.pointer, 0, stream); });
    expect_invalid_argument(rank, "get at an offset past the range", {"'offset'"},
                            [&] { comm.get(global, next, kBytes + 1, local.pointer, 0, stream); });
    expect_invalid_argument(rank, "put past the range's end", {"'bytes'"},
                            [&] { comm.put(global, next, kBytes - 2, local.pointer, 4, stream); });
    expect_invalid_argument(rank, "get past the range's end", {"'bytes'"},
                            [&] { comm.get(global, next, 0, local.pointer, kBytes + 1, stream); });
    expect_invalid_argument(rank, "get from no rank", {"'peer'"},
                            [&] { comm.get(global, world, 0, local.pointer, 4, stream); });
    expect_invalid_argument(rank, "put to a negative rank", {"'peer'"},
                            [&] { comm.put(global, -1, 0, local.pointer, 4, stream); });
    // The one-sided all-to-all's recv inside this rank's own range, which the peers read during the call.
    const size_t count = kBytes / (sizeof(int32_t) * static_cast<size_t>(world));
    expect_invalid_argument(rank, "an all-to-all into this rank's own range", {"'recv'"},
                            [&] { comm.all_to_all(global, exported.pointer(), count, DataType::kInt32, stream); });
    {  // Another communicator of the same ranks (same size, same rank) refuses this one's global memory.
      Communicator sibling = comm.shrink({});
      expect_invalid_argument(rank, "an all-to-all on another communicator's global memory", {"'send'"},
                              [&] { sibling.all_to_all(global, local.pointer, count, DataType::kInt32, stream); });
      sibling.barrier();  // every rank done with it before any destroys it
    }
    device_synchronize();
    const std::vector<int32_t> kept = download(local.pointer, kBytes / 4);
    int32_t poisoned = 0;
    std::memset(&poisoned, kPoison, sizeof(poisoned));
    EXPECT_EQ(std::count(kept.begin(), kept.end(), poisoned), static_cast<long>(kBytes / 4)) << "rank " << rank;
    comm.barrier();  // every rank is done with the peers' exports before they go
  });
}

// One rank's handle is refused (empty): it still joins the exchange, so it throws kInvalidArgument naming mine and
// every other rank kMismatch naming it, all at once (well before the timeout); a good import then works.
TEST(MemoryHandles, AHandleRefusedOnOneRankFailsEveryRankAtOnce) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), world = comm.size(), refused = world - 1;
    constexpr size_t kBytes = 4096;
    VmmBuffer exported(kBytes, comm.device());
    ExportedHandle mine = export_handle(exported.pointer(), kBytes);
    const auto start = std::chrono::steady_clock::now();
    try {
      comm.import_global(rank == refused ? ExportedHandle() : mine);
      ADD_FAILURE() << "rank " << rank << ": the import succeeded though rank " << refused << "'s handle is empty";
    } catch (const Error& error) {
      const std::string message = error.what();
      if (rank == refused) {
        EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << message;
        EXPECT_NE(message.find("'mine'"), std::string::npos) << message;
      } else {
        EXPECT_EQ(error.code(), ErrorCode::kMismatch) << "rank " << rank << ": " << message;
        EXPECT_NE(message.find("rank " + std::to_string(refused)), std::string::npos) << message;
      }
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(waited, comm.timeout_s() / 2) << "rank " << rank << ": the refusal took " << waited << " s";
    GlobalMemory global = comm.import_global(mine);
    EXPECT_EQ(global.bytes((rank + 1) % world), kBytes) << "rank " << rank;
    comm.barrier();  // every rank is done with the peers' exports before they go
  });
}

TEST(MemoryHandles, CorruptBlobsAreRefused) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    DeviceBuffer buffer(4096);
    ExportedHandle mine = export_handle(buffer.pointer, 4096);
    std::string blob = mine.blob();
    EXPECT_THROW(import_handle(blob.substr(0, blob.size() - 1)), Error);
    blob[blob.size() / 2] ^= 0x40;
    EXPECT_THROW(import_handle(blob), Error);
    EXPECT_THROW(import_handle(""), Error);
  });
}

// A blob whose checksum (and, under braid-run, job signature) is right but whose allocation is bigger than the
// exporter's, for both kinds of memory: an importer in another process is refused by braid (cudaMalloc memory:
// the allocation its IPC handle opens is smaller) or by the driver (VMM memory: mapping more than the
// allocation fails); one in the exporter's process refuses it as none of its live exports. Either way nothing
// past the real allocation is mapped.
TEST(MemoryHandles, AHandleClaimingMoreThanItsAllocationIsRefused) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    DeviceBuffer legacy(4096);
    VmmBuffer vmm(4096, comm.device());
    for (void* pointer : {legacy.pointer, vmm.pointer()}) {
      const char* kind = pointer == legacy.pointer ? "cudaMalloc" : "VMM";
      ExportedHandle mine = export_handle(pointer, 4096);
      detail::MemoryDescriptor forged = detail::unpack(mine.blob(), "test", "blob", "");
      forged.allocation_bytes = size_t(1) << 32;
      forged.bytes = forged.allocation_bytes - forged.offset();
      const std::vector<std::string> blobs = comm.host_allgather(detail::pack(forged, job_secret()));
      const int peer = (comm.rank() + 1) % comm.size();
      try {
        import_handle(blobs[peer], comm.device());
        ADD_FAILURE() << "rank " << comm.rank() << " imported rank " << peer << "'s " << kind << " handle claiming 4 GiB";
      } catch (const Error& error) {
        EXPECT_NE(error.code(), ErrorCode::kInternal) << kind << ": " << error.what();
        std::printf("[%d] %s handle claiming 4 GiB refused: %s\n", comm.rank(), kind, error.what());
      }
      comm.barrier();  // every rank is done with the peers' exports before they go
    }
  });
}

}  // namespace
}  // namespace braid::testing
