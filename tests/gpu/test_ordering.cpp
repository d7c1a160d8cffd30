// A communicator's calls are ordered whatever stream each names (braid.hpp, "Ordering"), on every rank
// (threads or braid-run processes):
//   - collectives of every kind, datatype and size class (LL, staged, pipelined, zero copy on symmetric
//     arenas) spread over 2 and 4 streams of one communicator with no event between them, random per-rank
//     delays on the streams, every call checked against the host reference; the same on the NCCL backend;
//   - all-to-all, all-to-all-v (host and device counts) and send/recv batches spread over several streams, with
//     the table's protocols and with every all-to-all and send/recv pair on the copy engines;
//   - eager calls and replays of a captured graph on different streams, each depending on the one before
//     through the data (a call reads what the previous call wrote), checked every iteration.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "spin_kernel.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

uint64_t random_value(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull); }

// Streams of the current device, and a way to make all of them wait for one, or the host for all of them.
class Streams {
 public:
  explicit Streams(int count) : handles_(count) {}
  int size() const { return static_cast<int>(handles_.size()); }
  cudaStream_t at(int i) const { return handles_[i].get(); }
  // Every stream waits for what is enqueued on stream 0 so far.
  void fork_from_first() const {
    cudaEvent_t event;
    cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(event, at(0)), "cudaEventRecord");
    for (int i = 1; i < size(); ++i) cuda_check(cudaStreamWaitEvent(at(i), event, 0), "cudaStreamWaitEvent");
    cuda_check(cudaEventDestroy(event), "cudaEventDestroy");
  }
  void synchronize() const {
    for (int i = 0; i < size(); ++i) cuda_check(cudaStreamSynchronize(at(i)), "cudaStreamSynchronize");
  }

 private:
  std::vector<StreamHandle> handles_;
};

// A delay of this rank before a call, on the call's stream: none, a device spin of up to 20 us, or (rarely) a
// host pause, so that ranks and streams drift apart.
void delay_on(uint64_t key, size_t call, cudaStream_t stream) {
  const uint64_t r = random_value(key, call);
  if (r % 3 == 0) cuda_check(spin_on_stream(stream, static_cast<uint32_t>((r >> 8) % 20000)), "spin kernel launch");
}

// Size classes that take every protocol: LL (up to a few KiB), staged and pipelined (up to 256 KiB), and
// larger than the staging halves (4 MiB + 1 element).
size_t ordering_count(DataType type, uint64_t r1, uint64_t r2) {
  const size_t element = datatype_size(type);
  if (r1 % 50 == 0) return (size_t(4) << 20) / element + 1;
  const unsigned octave = static_cast<unsigned>(r2 % 18);
  const size_t bytes = (size_t(1) << octave) + (r2 >> 8) % (size_t(1) << octave);
  return std::max<size_t>(1, bytes / element);
}

// `calls` collectives in batches of up to 32, each call on a stream this rank picks at random (so ranks pick
// differently), with no event between the calls of a batch; every call's output checked.
void collectives_on_streams(Communicator& comm, int stream_count, bool symmetric, size_t calls) {
  constexpr size_t kArenaBytes = size_t(48) << 20;
  constexpr size_t kMaxBatch = 32;
  const int rank = comm.rank(), world = comm.size();
  const uint64_t seed = shared_seed(comm);
  const std::vector<Case> cases = random_cases(seed, world, calls, ordering_count);
  const uint64_t key = mix64(seed ^ mix64(0x5717EA35ull + static_cast<uint64_t>(rank)));
  std::unique_ptr<DeviceBuffer> device_send, device_recv;
  SymmetricMemory symmetric_send, symmetric_recv;
  Arenas arenas{nullptr, nullptr, kArenaBytes, kArenaBytes};
  if (symmetric) {
    symmetric_send = comm.alloc(kArenaBytes);
    symmetric_recv = comm.alloc(kArenaBytes);
    arenas.send = symmetric_send.local();
    arenas.recv = symmetric_recv.local();
  } else {
    device_send = std::make_unique<DeviceBuffer>(kArenaBytes);
    device_recv = std::make_unique<DeviceBuffer>(kArenaBytes);
    arenas.send = device_send->get();
    arenas.recv = device_recv->get();
  }
  Streams streams(stream_count);
  host_barrier();  // every rank made its arenas and streams before any rank calls (NOTE [shared-GPU waits])
  std::vector<unsigned char> initial_send, initial_recv, got_send, got_recv;
  size_t next = 0, failed = 0;
  while (next < cases.size()) {
    Batch batch(rank, world);
    while (next < cases.size() && batch.size() < kMaxBatch && batch.add(cases[next], kArenaBytes, kArenaBytes)) ++next;
    ASSERT_GT(batch.size(), 0u) << "a case does not fit the arenas: " << describe(cases[next]);
    const size_t first = next - batch.size();
    batch.initial_images(initial_send, initial_recv);
    upload(arenas, initial_send, initial_recv, streams.at(0));
    streams.fork_from_first();
    try {
      for (size_t i = 0; i < batch.size(); ++i) {
        const cudaStream_t stream = streams.at(static_cast<int>(random_value(key ^ 0x57ull, first + i) % stream_count));
        delay_on(key, first + i, stream);
        launch(comm, batch.at(i), batch.send_pointer(i, arenas.send, arenas.recv),
               batch.recv_pointer(i, arenas.send, arenas.recv), stream);
      }
      streams.synchronize();
      comm.check();
    } catch (const Error& error) {
      FAIL() << "rank " << rank << ": calls " << first << ".." << next - 1 << " (seed 0x" << std::hex << seed
             << std::dec << ") threw: " << error.what();
    }
    got_send.resize(initial_send.size());
    got_recv.resize(initial_recv.size());
    download(arenas, got_send, got_recv, streams.at(0));
    size_t batch_failed = 0;
    for (const std::string& line : batch.check(initial_send, initial_recv, got_send.data(), got_recv.data(),
                                               failed < 10 ? 10 - failed : 0, &batch_failed)) {
      ADD_FAILURE() << "rank " << rank << ", " << stream_count << " streams: " << line << " [case i of this batch is call "
                    << first << " + i]";
    }
    failed += batch_failed;
  }
  EXPECT_EQ(failed, 0u) << "rank " << rank << ": " << failed << " of " << cases.size() << " calls on " << stream_count
                        << " streams (" << (symmetric ? "symmetric" : "cudaMalloc") << " arenas) were wrong";
}

TEST(Ordering, CollectivesOnTwoStreams) {
  with_communicator([](Communicator& comm) { collectives_on_streams(comm, 2, false, 1000); });
}

TEST(Ordering, CollectivesOnFourStreamsSymmetricBuffers) {
  with_communicator([](Communicator& comm) { collectives_on_streams(comm, 4, true, 1000); });
}

// The copy-engine collectives forced on symmetric buffers (all-reduce, reduce-scatter, all-gather, broadcast and
// all-to-all push into the peers' outputs where their gates open): their side streams, forked and joined inside
// each call, must keep the communicator's order across the caller's streams too.
TEST(Ordering, CollectivesOnFourStreamsThroughTheCopyEngines) {
  CommOptions options = test_options();
  options.algorithms =
      "allreduce=copyengine,reducescatter=copyengine,allgather=copyengine,broadcast=copyengine,alltoall=copyengine";
  with_communicator([](Communicator& comm) { collectives_on_streams(comm, 4, true, 400); }, options);
}

TEST(Ordering, CollectivesOnTwoStreamsNcclBackend) {
  SKIP_WHERE_RANKS_SHARE_GPUS();
  CommOptions options = test_options();
  options.backend = "nccl";
  with_communicator([](Communicator& comm) { collectives_on_streams(comm, 2, false, 300); }, options);
}

// The value rank `from` sends to rank `to` at element i in iteration `round`: never zero, never the poison.
int32_t block_value(uint64_t seed, int round, int from, int to, size_t i) {
  const uint64_t r = random_value(seed ^ mix64(static_cast<uint64_t>(round) * 1000003u + from * 1009u + to), i);
  return static_cast<int32_t>((r & 0x3FFFFFFF) | 0x40000000);
}

// All-to-all, all-to-all-v (host counts), all-to-all-v (device counts) and a send/recv ring, four at a time,
// each on a random stream, with per-rank delays; after each round every output is compared with what the
// senders' values must give. `rounds` of them, with the communicator's `options` (a forced protocol).
void all_to_all_and_send_recv_on_four_streams(int rounds, const CommOptions& options) {
  with_communicator([rounds](Communicator& comm) {
    const int kRounds = rounds;
    constexpr int kOpsPerRound = 4;
    constexpr size_t kMaxElements = size_t(1) << 17;  // per peer block, int32
    const int rank = comm.rank(), world = comm.size();
    const uint64_t seed = shared_seed(comm);
    const uint64_t key = mix64(seed ^ mix64(0xA2Aull + static_cast<uint64_t>(rank)));
    Streams streams(4);
    struct Slot {
      std::unique_ptr<DeviceBuffer> send, recv, counts;  // counts: int64 [send counts | recv counts]
    };
    std::vector<Slot> slots(kOpsPerRound);
    for (Slot& slot : slots) {
      slot.send = std::make_unique<DeviceBuffer>(kMaxElements * world * 4);
      slot.recv = std::make_unique<DeviceBuffer>(kMaxElements * world * 4);
      slot.counts = std::make_unique<DeviceBuffer>(2 * world * sizeof(int64_t));
    }
    host_barrier();  // every rank made its streams and buffers before any rank calls (NOTE [shared-GPU waits])
    size_t wrong_rounds = 0;
    for (int round = 0; round < kRounds && wrong_rounds < 5; ++round) {
      struct Planned {
        int kind;        // 0 all_to_all, 1 all_to_allv, 2 all_to_allv_device, 3 send/recv ring
        size_t count;    // elements per block (all-to-all), else the base of the per-pair counts
        cudaStream_t stream;
      };
      std::vector<Planned> planned(kOpsPerRound);
      auto pair_count = [&](const Planned& p, int from, int to) -> size_t {
        if (p.kind == 0) return p.count;
        return (p.count + static_cast<size_t>(from) * 7 + static_cast<size_t>(to) * 3) % kMaxElements;
      };
      for (int k = 0; k < kOpsPerRound; ++k) {
        const uint64_t r = random_value(seed, static_cast<uint64_t>(round) * kOpsPerRound + k);  // the same on all ranks
        planned[k].kind = static_cast<int>(r % 4);
        const unsigned octave = static_cast<unsigned>((r >> 8) % 17);
        planned[k].count = std::max<size_t>(1, (size_t(1) << octave) + ((r >> 16) % (size_t(1) << octave)));
        planned[k].stream = streams.at(static_cast<int>(random_value(key, static_cast<uint64_t>(round) * kOpsPerRound + k) % 4));
      }
      // Inputs of every op, uploaded on stream 0, seen by every stream.
      for (int k = 0; k < kOpsPerRound; ++k) {
        const Planned& p = planned[k];
        std::vector<int32_t> send;
        std::vector<int64_t> counts(2 * world, 0);
        for (int q = 0; q < world; ++q) {
          const bool ring_peer = q == (rank + 1) % world;
          const size_t n = p.kind == 3 ? (ring_peer ? pair_count(p, rank, q) : 0) : pair_count(p, rank, q);
          for (size_t i = 0; i < n; ++i) send.push_back(block_value(seed, round * kOpsPerRound + k, rank, q, i));
          counts[q] = static_cast<int64_t>(n);
        }
        if (send.empty()) send.push_back(1);
        cuda_check(cudaMemcpyAsync(slots[k].send->get(), send.data(), send.size() * 4, cudaMemcpyHostToDevice, streams.at(0)),
                   "upload");
        cuda_check(cudaMemcpyAsync(slots[k].counts->get(), counts.data(), counts.size() * 8, cudaMemcpyHostToDevice,
                                   streams.at(0)), "upload counts");
        cuda_check(cudaMemsetAsync(slots[k].recv->get(), kPoison, slots[k].recv->bytes(), streams.at(0)), "poison");
      }
      cuda_check(cudaStreamSynchronize(streams.at(0)), "cudaStreamSynchronize");
      for (int k = 0; k < kOpsPerRound; ++k) {
        const Planned& p = planned[k];
        delay_on(key ^ 0xD1ull, static_cast<uint64_t>(round) * kOpsPerRound + k, p.stream);
        void* send = slots[k].send->get();
        void* recv = slots[k].recv->get();
        std::vector<size_t> send_counts(world), recv_counts(world);
        for (int q = 0; q < world; ++q) {
          send_counts[q] = pair_count(p, rank, q);
          recv_counts[q] = pair_count(p, q, rank);
        }
        switch (p.kind) {
          case 0: comm.all_to_all(send, recv, p.count, DataType::kInt32, p.stream); break;
          case 1:
            comm.all_to_allv(send, send_counts.data(), nullptr, recv, recv_counts.data(), nullptr, DataType::kInt32, p.stream);
            break;
          case 2: {
            int64_t* counts = static_cast<int64_t*>(slots[k].counts->get());
            comm.all_to_allv_device(send, counts, nullptr, recv, kMaxElements * world, counts + world, nullptr,
                                    DataType::kInt32, p.stream);
            break;
          }
          default: {
            const int next_rank = (rank + 1) % world, previous = (rank + world - 1) % world;
            const PointToPoint ops[2] = {
                {PointToPoint::kSend, next_rank, send, pair_count(p, rank, next_rank), DataType::kInt32},
                {PointToPoint::kRecv, previous, recv, pair_count(p, previous, rank), DataType::kInt32}};
            comm.send_recv(ops, 2, p.stream);
          }
        }
      }
      streams.synchronize();
      comm.check();
      for (int k = 0; k < kOpsPerRound; ++k) {
        const Planned& p = planned[k];
        std::vector<int32_t> expected;
        for (int q = 0; q < world; ++q) {
          if (p.kind == 3 && q != (rank + world - 1) % world) continue;
          for (size_t i = 0; i < pair_count(p, q, rank); ++i) expected.push_back(block_value(seed, round * kOpsPerRound + k, q, rank, i));
        }
        std::vector<int32_t> got(expected.size() + 1);
        cuda_check(cudaMemcpy(got.data(), slots[k].recv->get(), got.size() * 4, cudaMemcpyDeviceToHost), "download");
        size_t wrong = 0, first_wrong = 0;
        for (size_t i = 0; i < expected.size(); ++i) {
          if (got[i] != expected[i] && wrong++ == 0) first_wrong = i;
        }
        uint32_t after;
        std::memcpy(&after, &got[expected.size()], 4);
        const bool tail_poisoned = expected.size() == slots[k].recv->bytes() / 4 || after == 0xA5A5A5A5u;
        if (wrong != 0 || !tail_poisoned) {
          ++wrong_rounds;
          ADD_FAILURE() << "rank " << rank << ", round " << round << ", op " << k << " (kind " << p.kind << ", count "
                        << p.count << "): " << wrong << " of " << expected.size() << " elements wrong (first at "
                        << first_wrong << ")" << (tail_poisoned ? "" : "; wrote past its output");
        }
      }
    }
  }, options);
}

TEST(Ordering, AllToAllAndSendRecvOnFourStreams) { all_to_all_and_send_recv_on_four_streams(250, test_options()); }

// The same with every all-to-all and send/recv pair on the copy engines (through the peers' pipeline areas, on
// these cudaMalloc'd buffers): four streams of the caller's and the communicator's three side streams.
TEST(Ordering, AllToAllAndSendRecvOnFourStreamsThroughTheCopyEngines) {
  CommOptions options = test_options();
  options.algorithms = "alltoall=copyengine,sendrecv=copyengine";
  all_to_all_and_send_recv_on_four_streams(60, options);
}

// Eager calls and replays of a captured graph, each on its own stream, each reading what the previous one wrote:
// x -> (eager all_reduce, stream 1) a -> (graph: all_reduce, stream 2) b -> (eager all_reduce, stream 3) c.
// With int32 sums every stage is exact: c = world^2 * sum of the ranks' x.
TEST(Ordering, EagerAndCapturedCallsInterleaved) {
  with_communicator([](Communicator& comm) {
    constexpr int kIterations = 200;
    const int rank = comm.rank(), world = comm.size();
    const uint64_t seed = shared_seed(comm);
    const uint64_t delay_key = mix64(seed ^ mix64(0xE6E6ull + static_cast<uint64_t>(rank)));
    auto x_value = [&](int iteration, int r, size_t j) {
      return static_cast<int32_t>(random_value(seed ^ mix64(static_cast<uint64_t>(iteration) * 131 + r), j) % 2001) - 1000;
    };
    // An LL size and one the staged or pipelined kernels carry.
    for (const size_t n : {size_t(3001), size_t(1) << 18}) {
      DeviceBuffer x(n * 4), a(n * 4), b(n * 4), c(n * 4);
      Streams streams(3);
      const cudaStream_t first = streams.at(0), replayed = streams.at(1), last = streams.at(2);
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      cuda_check(cudaStreamBeginCapture(replayed, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      comm.all_reduce(a.get(), b.get(), n, DataType::kInt32, ReduceOp::kSum, replayed);
      cuda_check(cudaStreamEndCapture(replayed, &graph), "cudaStreamEndCapture");
      exec = instantiate_on_every_rank(graph, replayed);
      std::vector<int32_t> host_x(n), got(n);
      size_t wrong_iterations = 0;
      for (int iteration = 0; iteration < kIterations && wrong_iterations < 3; ++iteration) {
        for (size_t j = 0; j < n; ++j) host_x[j] = x_value(iteration, rank, j);
        cuda_check(cudaMemcpyAsync(x.get(), host_x.data(), n * 4, cudaMemcpyHostToDevice, first), "upload x");
        delay_on(delay_key, static_cast<uint64_t>(iteration), first);
        comm.all_reduce(x.get(), a.get(), n, DataType::kInt32, ReduceOp::kSum, first);
        cuda_check(cudaMemsetAsync(b.get(), kPoison, n * 4, replayed), "poison b");
        cuda_check(cudaGraphLaunch(exec, replayed), "cudaGraphLaunch");
        cuda_check(cudaMemsetAsync(c.get(), kPoison, n * 4, last), "poison c");
        comm.all_reduce(b.get(), c.get(), n, DataType::kInt32, ReduceOp::kSum, last);
        // The last call's stream only; then the copy to pageable memory, which must not wait for a collective
        // (NOTE [shared-GPU waits], world.hpp).
        cuda_check(cudaStreamSynchronize(last), "cudaStreamSynchronize (the last call's stream only)");
        cuda_check(cudaMemcpyAsync(got.data(), c.get(), n * 4, cudaMemcpyDeviceToHost, last), "download c");
        cuda_check(cudaStreamSynchronize(last), "cudaStreamSynchronize (the download)");
        size_t wrong = 0, first_wrong = 0;
        int64_t expected_first = 0;
        for (size_t j = 0; j < n; ++j) {
          int64_t sum = 0;
          for (int r = 0; r < world; ++r) sum += x_value(iteration, r, j);
          const int32_t expected = static_cast<int32_t>(sum * world * world);
          if (got[j] != expected && wrong++ == 0) {
            first_wrong = j;
            expected_first = expected;
          }
        }
        if (wrong != 0) {
          ++wrong_iterations;
          ADD_FAILURE() << "rank " << rank << ", " << n << " elements, iteration " << iteration << ": " << wrong
                        << " wrong; first at " << first_wrong << ": expected " << expected_first << ", got "
                        << got[first_wrong];
        }
        streams.synchronize();
        comm.check();
      }
      cuda_check(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
      cuda_check(cudaGraphDestroy(graph), "cudaGraphDestroy");
    }
  });
}

}  // namespace
}  // namespace braid::testing
