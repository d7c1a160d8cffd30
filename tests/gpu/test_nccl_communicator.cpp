// A braid Communicator on the NCCL backend (CommOptions::backend = "nccl"), on every rank (threads or braid-run
// processes): every collective and all-to-all(v) through braid's API against a host reference on fresh inputs
// with poisoned outputs (all-to-all in place too, eager and in a graph); registered buffers registered with NCCL
// lazily, once, and released on deregister in either order; what the NCCL backend does not serve refused with
// kUnsupported; a rank that skips a call ends the others' wait within BRAID_TIMEOUT_S (the watchdog) with kTimeout
// naming the operation.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/nccl/nccl_backend.hpp"
#include "braid/braid.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

void cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
}

CommOptions nccl_options() {
  CommOptions options = test_options();
  options.backend = "nccl";
  return options;
}

int32_t value(uint32_t seed, int rank, size_t i) {
  return static_cast<int32_t>((seed * 2654435761u + static_cast<uint32_t>(rank) * 97u + static_cast<uint32_t>(i) * 31u) % 1000003u) - 500000;
}

struct Buffers {
  void* send = nullptr;
  void* recv = nullptr;
  size_t send_count, recv_count;
  Buffers(size_t s, size_t r) : send_count(s), recv_count(r) {
    cuda(cudaMalloc(&send, std::max<size_t>(s, 1) * 4), "cudaMalloc");
    cuda(cudaMalloc(&recv, std::max<size_t>(r, 1) * 4), "cudaMalloc");
  }
  ~Buffers() {
    cudaFree(send);
    cudaFree(recv);
  }
  void fill(uint32_t seed, int rank) {
    std::vector<int32_t> host(send_count);
    for (size_t i = 0; i < send_count; ++i) host[i] = value(seed, rank, i);
    cuda(cudaMemcpy(send, host.data(), send_count * 4, cudaMemcpyHostToDevice), "upload");
    cuda(cudaMemset(recv, 0xA5, recv_count * 4), "poison");
  }
  std::vector<int32_t> result() {
    cuda(cudaDeviceSynchronize(), "sync");
    std::vector<int32_t> host(recv_count);
    cuda(cudaMemcpy(host.data(), recv, recv_count * 4, cudaMemcpyDeviceToHost), "download");
    return host;
  }
};

uint32_t shared_seed(Communicator& comm) {
  return static_cast<uint32_t>(std::stoul(comm.host_allgather(std::to_string(std::random_device{}() % 100000))[0]));
}

// Every collective once at `count`, checked; returns the number of wrong elements.
size_t run_all(Communicator& comm, size_t count, uint32_t seed) {
  const int world = comm.size(), rank = comm.rank();
  size_t wrong = 0;
  auto expect = [&](const std::vector<int32_t>& got, auto reference, const char* what) {
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != reference(i);
    EXPECT_EQ(bad, 0u) << what << " count " << count;
    wrong += bad;
  };
  auto sum = [&](size_t i) {
    int32_t total = 0;
    for (int r = 0; r < world; ++r) total += value(seed, r, i);
    return total;
  };
  {
    Buffers b(count, count);
    b.fill(seed, rank);
    comm.all_reduce(b.send, b.recv, count, DataType::kInt32, ReduceOp::kSum, nullptr);
    expect(b.result(), sum, "all_reduce");
    b.fill(seed, rank);
    comm.broadcast(b.send, b.recv, count, DataType::kInt32, world - 1, nullptr);
    expect(b.result(), [&](size_t i) { return value(seed, world - 1, i); }, "broadcast");
    b.fill(seed, rank);
    comm.reduce(b.send, b.recv, count, DataType::kInt32, ReduceOp::kSum, 0, nullptr);
    if (rank == 0) expect(b.result(), sum, "reduce");
  }
  {
    Buffers b(count, count * world);
    b.fill(seed, rank);
    comm.all_gather(b.send, b.recv, count, DataType::kInt32, nullptr);
    expect(b.result(), [&](size_t i) { return value(seed, static_cast<int>(i / count), i % count); }, "all_gather");
  }
  {
    Buffers b(count * world, count);
    b.fill(seed, rank);
    comm.reduce_scatter(b.send, b.recv, count, DataType::kInt32, ReduceOp::kSum, nullptr);
    expect(b.result(), [&](size_t i) { return sum(rank * count + i); }, "reduce_scatter");
  }
  {
    Buffers b(count * world, count * world);
    b.fill(seed, rank);
    comm.all_to_all(b.send, b.recv, count, DataType::kInt32, nullptr);
    expect(b.result(), [&](size_t i) { return value(seed, static_cast<int>(i / count), rank * count + i % count); }, "all_to_all");
  }
  {
    // In place, eager and in a CUDA graph: every block replaced by the one its rank sent here (NCCL's own in-place
    // all-to-all races; NOTE [in-place all-to-all on NCCL]).
    Buffers b(count * world, count * world);
    cudaStream_t stream = nullptr;
    cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    auto in_place = [&](uint32_t in_seed) {
      return [&, in_seed](size_t i) { return value(in_seed, static_cast<int>(i / count), rank * count + i % count); };
    };
    auto downloaded = [&] {
      std::vector<int32_t> host(count * world);
      cuda(cudaStreamSynchronize(stream), "sync");
      cuda(cudaMemcpy(host.data(), b.send, host.size() * 4, cudaMemcpyDeviceToHost), "download");
      return host;
    };
    auto fill = [&](uint32_t in_seed) {  // on the legacy stream, done before the stream's next work
      b.fill(in_seed, rank);
      cuda(cudaDeviceSynchronize(), "sync");
    };
    fill(seed);
    comm.all_to_all(b.send, b.send, count, DataType::kInt32, stream);
    expect(downloaded(), in_place(seed), "all_to_all in place");
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    comm.all_to_all(b.send, b.send, count, DataType::kInt32, stream);
    cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (uint32_t replay = 1; replay <= 2; ++replay) {
      fill(seed + replay);
      cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      expect(downloaded(), in_place(seed + replay), "all_to_all in place, graph replay");
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  {
    // all_to_allv: rank r sends (r + q + 1) * count / world elements to rank q, packed.
    auto amount = [&](int from, int to) { return static_cast<size_t>(from + to + 1) * count / world; };
    std::vector<size_t> send_counts(world), recv_counts(world);
    size_t send_total = 0, recv_total = 0;
    for (int q = 0; q < world; ++q) {
      send_total += send_counts[q] = amount(rank, q);
      recv_total += recv_counts[q] = amount(q, rank);
    }
    Buffers b(send_total, recv_total);
    b.fill(seed, rank);
    comm.all_to_allv(b.send, send_counts.data(), nullptr, b.recv, recv_counts.data(), nullptr, DataType::kInt32, nullptr);
    const std::vector<int32_t> got = b.result();
    size_t at = 0, bad = 0;
    for (int q = 0; q < world; ++q) {
      size_t offset = 0;  // where q's block for this rank starts in q's send buffer
      for (int p = 0; p < rank; ++p) offset += amount(q, p);
      for (size_t i = 0; i < recv_counts[q]; ++i) bad += got[at++] != value(seed, q, offset + i);
    }
    EXPECT_EQ(bad, 0u) << "all_to_allv count " << count;
    wrong += bad;
  }
  comm.check();
  return wrong;
}

TEST(NcclCommunicator, EveryCollectiveMatchesTheReference) {
  SKIP_WHERE_RANKS_SHARE_GPUS();
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    for (size_t count : {size_t(1), size_t(7), size_t(4097), (size_t(1) << 20) + 3}) run_all(comm, count, seed + count);
  }, nccl_options());
}

TEST(NcclCommunicator, RegisteredBuffersRegisterWithNcclOnce) {
  SKIP_WHERE_RANKS_SHARE_GPUS();
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const uint32_t seed = shared_seed(comm);
    const size_t count = 1 << 20;
    Buffers b(count, count);
    RegisteredBuffer rs = comm.register_buffer(b.send, count * 4), rr = comm.register_buffer(b.recv, count * 4);
    EXPECT_EQ(comm.registration_stats().nccl_registered, 0u) << "registration is lazy";
    for (int i = 0; i < 5; ++i) {
      b.fill(seed + i, comm.rank());
      comm.all_reduce(b.send, b.recv, count, DataType::kInt32, ReduceOp::kSum, nullptr);
      const std::vector<int32_t> got = b.result();
      size_t bad = 0;
      for (size_t e = 0; e < count; ++e) {
        int32_t total = 0;
        for (int r = 0; r < comm.size(); ++r) total += value(seed + i, r, e);
        bad += got[e] != total;
      }
      EXPECT_EQ(bad, 0u);
    }
    // Both ranges registered with NCCL by their first use; none with BRAID_NCCL_REGISTER=no. NCCL 2.19 and later
    // register cudaMalloc memory, so a refusal under =try (the default) fails here too.
    const bool registering = detail::nccl_register_mode() != detail::NcclRegisterMode::kNo;
    const RegistrationStats stats = comm.registration_stats();
    EXPECT_EQ(stats.exchanges, 0u) << "the NCCL backend exchanges nothing of its own";
    EXPECT_EQ(stats.nccl_registered, registering ? 2u : 0u) << "NCCL refused a range? (the log says why)";
    comm.deregister(rs);
    EXPECT_EQ(comm.registration_stats().nccl_registered, registering ? 1u : 0u);
    // rr outlives the communicator: destroying it with a range still registered, then deregistering, both work.
  }, nccl_options());
}

TEST(NcclCommunicator, CudaOnlyFeaturesAreRefused) {
  SKIP_WHERE_RANKS_SHARE_GPUS();
  with_communicator([](Communicator& comm) {
    make_current(comm);
    try {
      comm.alloc(4096);
      ADD_FAILURE() << "alloc accepted on the NCCL backend";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kUnsupported) << error.what();
      EXPECT_NE(std::string(error.what()).find("NCCL"), std::string::npos) << error.what();
    }
  }, nccl_options());
}

// NCCL waits for a peer forever; braid's watchdog bounds it. A rank that skips an all_reduce leaves the others'
// NCCL kernels waiting: within the timeout the watchdog aborts their NCCL communicator, their stream
// synchronisation returns, and check() and every later call raise kTimeout naming the operation.
TEST(NcclCommunicator, TimeoutAbortsTheWaitAndNamesTheOperation) {
  SKIP_WHERE_RANKS_SHARE_GPUS();
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_rank([](const RankContext& context) {
    constexpr double kTimeoutS = 3.0;
    constexpr double kMarginS = 8.0;
    CommOptions options = nccl_options();
    options.timeout_s = kTimeoutS;
    Communicator comm = Communicator::init(context.rendezvous, options);
    make_current(comm);
    const int skipper = comm.size() - 1;
    Buffers buffers(1 << 16, 1 << 16);
    buffers.fill(1, comm.rank());
    cudaStream_t stream;
    cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    auto all_reduce = [&] {
      comm.all_reduce(buffers.send, buffers.recv, 1 << 16, DataType::kInt32, ReduceOp::kSum, reinterpret_cast<Stream>(stream));
    };
    all_reduce();  // everyone: the communicator works
    cuda(cudaStreamSynchronize(stream), "sync (first all_reduce)");
    comm.check();
    if (comm.rank() != skipper) {
      const auto start = std::chrono::steady_clock::now();
      all_reduce();
      // Returns once the watchdog aborted NCCL (the abort ends NCCL's kernels); an error here is the abort's.
      cudaStreamSynchronize(stream);
      cudaGetLastError();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_GE(seconds, 0.5 * kTimeoutS) << "rank " << comm.rank() << ": the wait ended before the timeout";
      EXPECT_LE(seconds, kTimeoutS + kMarginS) << "rank " << comm.rank() << ": the wait took " << seconds << " s";
      for (const char* call : {"check", "all_reduce after"}) {
        try {
          if (std::string(call) == "check") {
            comm.check();
          } else {
            all_reduce();
          }
          ADD_FAILURE() << "rank " << comm.rank() << ": " << call << " raised nothing after the timeout";
        } catch (const Error& error) {
          EXPECT_EQ(error.code(), ErrorCode::kTimeout) << call << ": " << error.what();
          EXPECT_NE(std::string(error.what()).find("ncclAllReduce"), std::string::npos) << call << ": " << error.what();
        }
      }
    }
    cudaStreamDestroy(stream);
  });
}

}  // namespace
}  // namespace braid::testing
