// Automatic registration (BRAID_AUTO_REGISTER, src/memory/automatic_registration.hpp), on every rank (threads or
// braid-run processes), with cudaMalloc buffers that are neither symmetric nor registered:
//   - all_reduce, all_gather, reduce_scatter, all_to_all and broadcast captured into one graph beyond the LL sizes:
//     one exchange per buffer the call looks up, made at capture time; replays with fresh inputs each round equal
//     the host reference; destroying the graph releases the peers' mappings;
//   - eager calls of the same buffers exchange nothing;
//   - PyTorch's caching-allocator pattern: a range of one allocation captured at one size, then at another size
//     from the same address, then the allocation freed and a new one made (a new CUDA buffer id, most often at the
//     same address) and captured again: every graph reads the memory its ranks passed;
//   - VMM memory made with POSIX-fd handles is mapped too; a buffer across two VMM allocations mapped side by side
//     (as PyTorch's expandable segments grow) is staged;
//   - a rank whose memory cannot be shared (cudaMallocAsync memory) makes the call staged
//     on every rank, with the right result.
// With BRAID_AUTO_REGISTER=0 in the environment the same tests expect no exchange and no mapping.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.hpp"
#include "vmm_buffer.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

void cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
}

bool automatic_on() {
  const char* value = std::getenv("BRAID_AUTO_REGISTER");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// Element i of rank r's input: never zero, distinct per (seed, rank, i).
int32_t input_value(uint32_t seed, int rank, size_t i) {
  return static_cast<int32_t>(((seed * 2654435761u) ^ (static_cast<uint32_t>(rank) * 40503u) ^ static_cast<uint32_t>(i * 7919u)) % 2000003u) + 1;
}

void upload(void* device, uint32_t seed, int rank, size_t count) {
  std::vector<int32_t> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = input_value(seed, rank, i);
  cuda(cudaMemcpy(device, values.data(), count * sizeof(int32_t), cudaMemcpyHostToDevice), "upload");
}

std::vector<int32_t> download(const void* device, size_t count) {
  std::vector<int32_t> values(count);
  cuda(cudaMemcpy(values.data(), device, count * sizeof(int32_t), cudaMemcpyDeviceToHost), "download");
  return values;
}

void poison(void* device, size_t count) { cuda(cudaMemset(device, 0xA5, count * sizeof(int32_t)), "poison"); }

uint32_t shared_seed(Communicator& comm) {
  const std::vector<std::string> all = comm.host_allgather(std::to_string(std::random_device{}()));
  return static_cast<uint32_t>(std::stoul(all[0]));
}

struct DeviceBuffer {
  void* pointer = nullptr;
  explicit DeviceBuffer(size_t bytes) { cuda(cudaMalloc(&pointer, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { free_when_ranks_end(pointer); }  // NOTE [shared-GPU waits] (world.hpp)
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  int32_t* ints() const { return static_cast<int32_t*>(pointer); }
};

struct StreamHandle {
  cudaStream_t stream = nullptr;
  StreamHandle() { cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~StreamHandle() { cudaStreamDestroy(stream); }
  Stream get() const { return reinterpret_cast<Stream>(stream); }
};

// A graph captured from `enqueue` on `stream` and instantiated. Processes capture in global mode (PyTorch's
// default); ranks as threads capture thread-locally (in global mode one thread's capture forbids the others'
// graph calls).
struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Graph(cudaStream_t stream, const std::function<void()>& enqueue) {
    const cudaStreamCaptureMode mode = in_process_mode() ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeThreadLocal;
    cuda(cudaStreamBeginCapture(stream, mode), "begin capture");
    try {
      enqueue();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream, &broken);
      if (broken != nullptr) cudaGraphDestroy(broken);
      throw;
    }
    cuda(cudaStreamEndCapture(stream, &graph), "end capture");
    exec = instantiate_on_every_rank(graph, stream);
  }
  ~Graph() { destroy(); }
  void destroy() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
  }
  void replay(cudaStream_t stream, int times) const {
    replay_graph(exec, stream, times);
  }
};

// Waits (bounded) until this rank maps no more peer allocations than `baseline`: a destroyed graph's mappings are
// released on a thread of braid's own, soon after.
void expect_mappings_released(Communicator& comm, uint64_t baseline) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (comm.registration_stats().peer_mappings > baseline && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(comm.registration_stats().peer_mappings, baseline) << "rank " << comm.rank() << ": mappings outlive their graphs";
}

// The sum over the ranks of element i of the inputs of `seed`.
int32_t rank_sum(uint32_t seed, int world, size_t i) {
  int32_t sum = 0;
  for (int r = 0; r < world; ++r) sum += input_value(seed, r, i);
  return sum;
}

// Runs `body` on every rank with the communicator's GPU current, a seed the ranks share and a stream of its own.
void on_every_rank(const std::function<void(Communicator&, uint32_t, StreamHandle&)>& body) {
  with_communicator([&](Communicator& comm) {
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    StreamHandle stream;
    body(comm, seed, stream);
  });
}

// Beyond every LL size: the calls look their buffers up.
constexpr size_t kCount = size_t(1) << 22;  // 16 MiB of int32

// The five collectives on cudaMalloc buffers, inputs from `seed`, checked against the host reference.
struct FiveCalls {
  Communicator& comm;
  const int world, rank;
  const size_t block = kCount / 2;                // all_gather and reduce_scatter: elements a rank
  const size_t pair = kCount / 2 / comm.size();   // all_to_all: elements a pair
  const int root;
  DeviceBuffer reduce_send{kCount * 4}, reduce_recv{kCount * 4};
  DeviceBuffer gather_send{block * 4}, gather_recv{block * 4 * comm.size()};
  DeviceBuffer scatter_send{block * 4 * comm.size()}, scatter_recv{block * 4};
  DeviceBuffer a2a_send{pair * 4 * comm.size()}, a2a_recv{pair * 4 * comm.size()};
  DeviceBuffer bcast_send{kCount * 4}, bcast_recv{kCount * 4};
  // Exchanges the calls make where they register automatically: all_reduce's and all_to_all's two buffers,
  // all_gather's output, reduce_scatter's input, broadcast's output.
  static constexpr uint64_t kExchanges = 7;

  explicit FiveCalls(Communicator& c) : comm(c), world(c.size()), rank(c.rank()), root(c.size() - 1) {}

  void enqueue(Stream stream) {
    comm.all_reduce(reduce_send.pointer, reduce_recv.pointer, kCount, DataType::kInt32, ReduceOp::kSum, stream);
    comm.all_gather(gather_send.pointer, gather_recv.pointer, block, DataType::kInt32, stream);
    comm.reduce_scatter(scatter_send.pointer, scatter_recv.pointer, block, DataType::kInt32, ReduceOp::kSum, stream);
    comm.all_to_all(a2a_send.pointer, a2a_recv.pointer, pair, DataType::kInt32, stream);
    comm.broadcast(bcast_send.pointer, bcast_recv.pointer, kCount, DataType::kInt32, root, stream);
  }

  void prepare(uint32_t seed) {
    upload(reduce_send.pointer, seed, rank, kCount);
    upload(gather_send.pointer, seed + 1, rank, block);
    upload(scatter_send.pointer, seed + 2, rank, block * world);
    upload(a2a_send.pointer, seed + 3, rank, pair * world);
    upload(bcast_send.pointer, seed + 4, rank, kCount);
    poison(reduce_recv.pointer, kCount);
    poison(gather_recv.pointer, block * world);
    poison(scatter_recv.pointer, block);
    poison(a2a_recv.pointer, pair * world);
    poison(bcast_recv.pointer, kCount);
    device_synchronize();
  }

  // Wrong elements of each call's output, named.
  std::string check(uint32_t seed) const {
    std::string report;
    auto count = [&](const char* name, const std::vector<int32_t>& got, auto&& expected) {
      size_t wrong = 0;
      for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != expected(i);
      if (wrong != 0) report += std::string(" ") + name + ": " + std::to_string(wrong) + " of " + std::to_string(got.size()) + " wrong;";
    };
    count("all_reduce", download(reduce_recv.pointer, kCount), [&](size_t i) { return rank_sum(seed, world, i); });
    count("all_gather", download(gather_recv.pointer, block * world),
          [&](size_t i) { return input_value(seed + 1, static_cast<int>(i / block), i % block); });
    count("reduce_scatter", download(scatter_recv.pointer, block),
          [&](size_t i) { return rank_sum(seed + 2, world, size_t(rank) * block + i); });
    count("all_to_all", download(a2a_recv.pointer, pair * world),
          [&](size_t i) { return input_value(seed + 3, static_cast<int>(i / pair), size_t(rank) * pair + i % pair); });
    count("broadcast", download(bcast_recv.pointer, kCount), [&](size_t i) { return input_value(seed + 4, root, i); });
    return report;
  }
};

TEST(AutomaticRegistration, CapturedCallsExchangeOnceAndReplayRight) {
  on_every_rank([](Communicator& comm, uint32_t seed, StreamHandle& stream) {
    FiveCalls calls(comm);
    const RegistrationStats before = comm.registration_stats();

    // Eager calls of the same buffers are staged: nothing is exchanged or mapped.
    calls.prepare(seed);
    comm.barrier();
    calls.enqueue(stream.get());
    cuda(cudaStreamSynchronize(stream.stream), "sync");
    comm.check();
    EXPECT_EQ(calls.check(seed), "") << "rank " << comm.rank() << ", eager";
    EXPECT_EQ(comm.registration_stats().automatic_exchanges, before.automatic_exchanges) << "eager calls exchange nothing";
    comm.barrier();

    Graph graph(stream.stream, [&] { calls.enqueue(stream.get()); });
    const RegistrationStats captured = comm.registration_stats();
    if (automatic_on()) {
      EXPECT_EQ(captured.automatic_exchanges - before.automatic_exchanges, FiveCalls::kExchanges);
      if (comm.size() > 1) EXPECT_GT(captured.peer_mappings, before.peer_mappings);  // one rank has no peer to map
    } else {
      EXPECT_EQ(captured.automatic_exchanges, before.automatic_exchanges);
      EXPECT_EQ(captured.peer_mappings, before.peer_mappings);
    }
    EXPECT_EQ(captured.exchanges, before.exchanges) << "no registered buffer was used";
    for (uint32_t round = 1; round <= 3; ++round) {
      calls.prepare(seed + 100 * round);
      comm.barrier();  // every rank's input is in place before any replay reads it
      graph.replay(stream.stream, 5);
      comm.check();
      EXPECT_EQ(calls.check(seed + 100 * round), "") << "rank " << comm.rank() << ", replays of round " << round;
      comm.barrier();  // no rank uploads the next inputs while a peer's replay still reads them
    }
    EXPECT_EQ(comm.registration_stats().automatic_exchanges, captured.automatic_exchanges) << "replays exchange nothing";
    graph.destroy();
    expect_mappings_released(comm, before.peer_mappings);
    comm.barrier();
  });
}

// all_reduce in place on `count` elements at `pointer`, captured and replayed twice with inputs of `seed`; returns
// the wrong elements. `mapped`, when given, receives the peer allocations mapped here while the graph lived.
size_t captured_all_reduce(Communicator& comm, int32_t* pointer, size_t count, uint32_t seed, cudaStream_t stream,
                           uint64_t* mapped = nullptr) {
  Graph graph(stream, [&] {
    comm.all_reduce(pointer, pointer, count, DataType::kInt32, ReduceOp::kSum, reinterpret_cast<Stream>(stream));
  });
  if (mapped != nullptr) *mapped = comm.registration_stats().peer_mappings;
  size_t wrong = 0;
  for (int round = 0; round < 2; ++round) {
    upload(pointer, seed + round, comm.rank(), count);
    device_synchronize();
    comm.barrier();
    graph.replay(stream, 1);  // in place: one replay, since a second would sum the sums
    comm.check();
    const std::vector<int32_t> got = download(pointer, count);
    for (size_t i = 0; i < count; ++i) wrong += got[i] != rank_sum(seed + round, comm.size(), i);
    comm.barrier();
  }
  return wrong;
}

TEST(AutomaticRegistration, CachingAllocatorReusesAndReallocatesAnAddress) {
  on_every_rank([](Communicator& comm, uint32_t seed, StreamHandle& stream) {
    const uint64_t baseline = comm.registration_stats().peer_mappings;
    // One segment serves two tensors in turn from its start: 16 MiB, then 12 MiB + 256 bytes.
    void* segment = nullptr;
    cuda(cudaMalloc(&segment, size_t(32) << 20), "cudaMalloc");
    int32_t* tensor = static_cast<int32_t*>(segment);
    EXPECT_EQ(captured_all_reduce(comm, tensor, kCount, seed, stream.stream), 0u) << "rank " << comm.rank() << ", first size";
    EXPECT_EQ(captured_all_reduce(comm, tensor, kCount * 3 / 4 + 64, seed + 10, stream.stream), 0u)
        << "rank " << comm.rank() << ", second size at the same address";
    expect_mappings_released(comm, baseline);
    comm.barrier();  // no peer maps the segment any more
    // The segment goes back to CUDA and a new allocation (a new buffer id) takes its place, most often at the same
    // address: the peers must map the new allocation, not reuse the old one's mapping.
    device_free(segment);  // NOTE [shared-GPU waits]
    void* again = nullptr;
    cuda(cudaMalloc(&again, size_t(24) << 20), "cudaMalloc");
    EXPECT_EQ(captured_all_reduce(comm, static_cast<int32_t*>(again), kCount + 12, seed + 20, stream.stream), 0u)
        << "rank " << comm.rank() << ", a new allocation" << (again == segment ? " at the same address" : "");
    expect_mappings_released(comm, baseline);
    comm.barrier();
    cudaFree(again);
  });
}

TEST(AutomaticRegistration, VmmMemoryIsMappedToo) {
  on_every_rank([](Communicator& comm, uint32_t seed, StreamHandle& stream) {
    const RegistrationStats before = comm.registration_stats();
    {
      VmmBuffer vmm(kCount * 4, comm.device());
      uint64_t mapped = 0;
      EXPECT_EQ(captured_all_reduce(comm, static_cast<int32_t*>(vmm.pointer()), kCount, seed, stream.stream, &mapped), 0u)
          << "rank " << comm.rank();
      EXPECT_EQ(comm.registration_stats().automatic_exchanges - before.automatic_exchanges, automatic_on() ? 2u : 0u);
      if (automatic_on() && comm.size() > 1) {  // one rank has no peer to map
        EXPECT_GT(mapped, before.peer_mappings) << "the peers' VMM allocations are mapped while the graph lives";
      } else {
        EXPECT_EQ(mapped, before.peer_mappings);
      }
      expect_mappings_released(comm, before.peer_mappings);
      comm.barrier();  // no peer maps this rank's allocation any more
    }
  });
}

// A tensor across two VMM allocations mapped side by side (PyTorch's expandable segments grow that way) lies in no
// one allocation, so it cannot be described for the peers: the call is staged on every rank, and right.
TEST(AutomaticRegistration, BufferAcrossTwoVmmAllocationsIsStaged) {
  on_every_rank([](Communicator& comm, uint32_t seed, StreamHandle& stream) {
    const RegistrationStats before = comm.registration_stats();
    VmmBuffer pair(kCount * 2, comm.device(), 2);
    uint64_t mapped = 0;
    // From the middle of the first allocation to the middle of the second.
    int32_t* tensor = reinterpret_cast<int32_t*>(static_cast<char*>(pair.pointer()) + pair.each / 2);
    EXPECT_EQ(captured_all_reduce(comm, tensor, pair.each / sizeof(int32_t), seed, stream.stream, &mapped), 0u)
        << "rank " << comm.rank();
    EXPECT_EQ(mapped, before.peer_mappings) << "nothing is mapped for a buffer no allocation holds";
    comm.barrier();
  });
}

TEST(AutomaticRegistration, MemoryOneRankCannotShareIsStagedOnEveryRank) {
  on_every_rank([](Communicator& comm, uint32_t seed, StreamHandle& stream) {
    const RegistrationStats before = comm.registration_stats();
    // Rank 0 passes memory of the default cudaMallocAsync pool, which no peer can map.
    void* buffer = nullptr;
    if (comm.rank() == 0) {
      cuda(cudaMallocAsync(&buffer, kCount * 4, stream.stream), "cudaMallocAsync");
      cuda(cudaStreamSynchronize(stream.stream), "sync");
    } else {
      cuda(cudaMalloc(&buffer, kCount * 4), "cudaMalloc");
    }
    uint64_t mapped = 0;  // while the graph lives: its mappings go with it
    EXPECT_EQ(captured_all_reduce(comm, static_cast<int32_t*>(buffer), kCount, seed, stream.stream, &mapped), 0u)
        << "rank " << comm.rank();
    const RegistrationStats after = comm.registration_stats();
    EXPECT_EQ(after.automatic_exchanges - before.automatic_exchanges, automatic_on() ? 2u : 0u)
        << "in place, the call looks up its buffer as send and as recv";
    EXPECT_EQ(mapped, before.peer_mappings) << "nothing is mapped when a rank cannot share";
    comm.barrier();
    if (comm.rank() == 0) {
      cuda(cudaFreeAsync(buffer, stream.stream), "cudaFreeAsync");
      cuda(cudaStreamSynchronize(stream.stream), "sync");
    } else {
      cudaFree(buffer);
    }
  });
}

}  // namespace
}  // namespace braid::testing
