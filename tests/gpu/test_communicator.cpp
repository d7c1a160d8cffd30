// Communicator init on real GPUs: topology, refused configurations, a missing rank, the C API; a CUDA error the
// caller left pending is the caller's.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid/braid.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Communicator, KnowsEveryPeerAsSameHostAndP2PReachable) {
  with_communicator([](Communicator& comm) {
    EXPECT_EQ(comm.size(), world_size());
    ASSERT_EQ(static_cast<int>(comm.peers().size()), comm.size());
    for (const PeerInfo& peer : comm.peers()) {
      EXPECT_TRUE(peer.same_host) << "peer " << peer.rank;
      EXPECT_TRUE(peer.p2p) << "peer " << peer.rank;
      EXPECT_GE(peer.device, 0) << "peer " << peer.rank;
      EXPECT_FALSE(peer.pci_bus_id.empty());
    }
    EXPECT_EQ(comm.peer(comm.rank()).device, comm.device());
    EXPECT_THROW(comm.peer(comm.size()), Error);
    std::printf("%s", comm.describe().c_str());
    comm.barrier();
  });
}

TEST(Communicator, MissingRankMakesTheOthersTimeOutNamingIt) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_rank([](const RankContext& context) {
    const int missing = context.world - 1;
    if (context.rank == missing) return;  // this rank never arrives
    const double timeout_s = 3.0;
    auto start = std::chrono::steady_clock::now();
    try {
      Communicator comm = Communicator::init(context.rendezvous, test_options(timeout_s));
      ADD_FAILURE() << "rank " << context.rank << ": init completed without rank " << missing;
    } catch (const Error& error) {
      double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_EQ(error.code(), ErrorCode::kTimeout) << error.what();
      EXPECT_TRUE(contains(error.what(), std::to_string(missing))) << error.what();
      EXPECT_TRUE(contains(error.what(), "did not arrive")) << error.what();
      EXPECT_LT(elapsed, timeout_s * 3 + 5) << "timed out too late";
      if (context.rank == 0) std::printf("rank 0 got, after %.1f s: %s\n", elapsed, error.what());
    }
  });
}

TEST(Communicator, DeviceOutOfRangeIsRefusedNamingIt) {
  for_each_rank([](const RankContext& context) {
    CommOptions options = test_options(5);
    options.device = 999;
    try {
      Communicator::init(context.rendezvous, options);
      ADD_FAILURE() << "device 999 accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      EXPECT_TRUE(contains(error.what(), "'device'")) << error.what();
    }
  });
}

TEST(Communicator, TwoRanksOnOneGpuAreRefused) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_rank([](const RankContext& context) {
    CommOptions options = test_options(20);
    options.device = 0;
    try {
      Communicator::init(context.rendezvous, options);
      ADD_FAILURE() << "rank " << context.rank << ": two ranks on GPU 0 accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
      EXPECT_TRUE(contains(error.what(), "both use GPU")) << error.what();
    }
  });
}

TEST(CApi, InitAllocPeersViewFreeDestroy) {
  for_each_rank([](const RankContext& context) {
    const std::string address = context.rendezvous.store_host + ":" + std::to_string(context.rendezvous.store_port);
    braidComm_t comm = nullptr;
    ASSERT_EQ(braidCommInitRank(&comm, address.c_str(), context.rank, context.world, 0, -1), braidSuccess)
        << braidGetLastError();
    int rank = -1, size = -1, device = -1;
    EXPECT_EQ(braidCommRank(comm, &rank), braidSuccess);
    EXPECT_EQ(braidCommSize(comm, &size), braidSuccess);
    EXPECT_EQ(braidCommDevice(comm, &device), braidSuccess);
    EXPECT_EQ(rank, context.rank);
    EXPECT_EQ(size, context.world);
    braidSymmetricMemory_t memory = nullptr;
    ASSERT_EQ(braidSymmetricAlloc(comm, 1 << 16, 1, &memory), braidSuccess) << braidGetLastError();
    void *local = nullptr, *peer = nullptr, *view = nullptr;
    void* const* table = nullptr;
    size_t stride = 0;
    EXPECT_EQ(braidSymmetricLocal(memory, &local), braidSuccess);
    EXPECT_EQ(braidSymmetricPeer(memory, (rank + 1) % size, &peer), braidSuccess);
    EXPECT_EQ(braidSymmetricDevicePeers(memory, &table), braidSuccess);
    EXPECT_EQ(braidSymmetricView(memory, &view, &stride), braidSuccess);
    EXPECT_NE(local, nullptr);
    EXPECT_NE(peer, nullptr);
    EXPECT_NE(table, nullptr);
    EXPECT_NE(view, nullptr);
    EXPECT_GE(stride, size_t(1) << 16);
    EXPECT_EQ(braidSymmetricPeer(memory, size, &peer), braidInvalidArgument);
    EXPECT_TRUE(contains(braidGetLastError(), "'rank'")) << braidGetLastError();
    braidSymmetricMemory_t none = nullptr;
    EXPECT_EQ(braidSymmetricAlloc(comm, 0, 0, &none), braidInvalidArgument);
    EXPECT_TRUE(contains(braidGetLastError(), "'bytes'")) << braidGetLastError();
    EXPECT_EQ(braidSymmetricAlloc(comm, 16, 0, nullptr), braidInvalidArgument);
    EXPECT_EQ(braidCommBarrier(comm), braidSuccess) << braidGetLastError();
    EXPECT_EQ(braidCommDestroy(comm), braidSuccess);  // communicator first, memory after
    EXPECT_EQ(braidSymmetricFree(memory), braidSuccess);
  });
}

// A CUDA error the caller left in its thread (a failed runtime call it did not check) belongs to the caller:
// collectives of LL and staged sizes neither raise it as their own nor clear it, and compute the right result.
TEST(Communicator, ACallersPendingCudaErrorIsLeftToTheCaller) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    for (size_t count : {size_t(4096), size_t(1) << 20}) {  // 16 KiB (LL) and 4 MiB of float (staged, barriers)
      float *send = nullptr, *recv = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), count * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&recv), count * sizeof(float)), cudaSuccess);
      const std::vector<float> ones(count, 1.0f);
      ASSERT_EQ(cudaMemcpy(send, ones.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaSetDevice(1 << 20), cudaErrorInvalidDevice);  // left pending, as a caller might
      EXPECT_NO_THROW(comm.all_reduce(send, recv, count, DataType::kFloat32, ReduceOp::kSum, nullptr))
          << "rank " << comm.rank() << ", " << count << " elements";
      EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice) << "the caller's error is still pending after the call";
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      comm.check();
      std::vector<float> got(count);
      ASSERT_EQ(cudaMemcpy(got.data(), recv, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      size_t wrong = 0;
      for (float value : got) wrong += value != static_cast<float>(comm.size());
      EXPECT_EQ(wrong, 0u) << "rank " << comm.rank() << ", " << count << " elements";
      cudaFree(send);
      cudaFree(recv);
      comm.barrier();
    }
  });
}

}  // namespace
}  // namespace braid::testing
