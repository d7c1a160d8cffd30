// Communicator init on real GPUs: topology, refused configurations, a missing rank, the C API; a CUDA error the
// caller left pending is the caller's.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "braid/braid.h"
#include "braid/braid.hpp"
#include "braid/fused_matmul.hpp"
#include "braid/moe.hpp"
#include "collective_reference.hpp"
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
  if (const char* shared = std::getenv("BRAID_ALLOW_SHARED_GPU"); shared != nullptr && std::string(shared) == "1") {
    GTEST_SKIP() << "BRAID_ALLOW_SHARED_GPU=1 lets ranks share a GPU";
  }
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
    // braidImportGlobal with a NULL mine on the last rank: refused after the ranks' exchange, so every rank fails
    // at once (that rank naming mine, the others braidMismatch naming it).
    void* exported_buffer = nullptr;
    ASSERT_EQ(cudaMalloc(&exported_buffer, 4096), cudaSuccess);
    braidExportedHandle_t exported = nullptr;
    ASSERT_EQ(braidExportHandle(exported_buffer, 4096, -1, &exported), braidSuccess) << braidGetLastError();
    braidGlobalMemory_t global = nullptr;
    const bool refusing = rank == size - 1;
    const braidResult_t imported = braidImportGlobal(comm, refusing ? nullptr : exported, &global);
    EXPECT_EQ(imported, refusing ? braidInvalidArgument : braidMismatch) << braidGetLastError();
    EXPECT_TRUE(contains(braidGetLastError(), refusing ? "'mine'" : "rank " + std::to_string(size - 1)))
        << braidGetLastError();
    EXPECT_EQ(global, nullptr);
    EXPECT_EQ(braidExportedHandleFree(exported), braidSuccess);
    EXPECT_EQ(braidCommBarrier(comm), braidSuccess) << braidGetLastError();
    EXPECT_EQ(cudaFree(exported_buffer), cudaSuccess);
    EXPECT_EQ(braidCommDestroy(comm), braidSuccess);  // communicator first, memory after
    EXPECT_EQ(braidSymmetricFree(memory), braidSuccess);
  });
}

// The C API's collectives, all-to-all, a send/recv ring and a registered buffer, on fresh random int32 inputs that
// every rank can recompute for every rank (seeded by rank), outputs poisoned first, against a host reference.
TEST(CApi, CollectivesAllToAllSendRecvAndRegistrationMatchTheHostReference) {
  for_each_rank([](const RankContext& context) {
    braidComm_t comm = nullptr;
    ASSERT_NO_FATAL_FAILURE(init_c_communicator(context, &comm));
    // The rank's own stream, not blocking on the legacy one: ranks sharing a GPU as threads share its legacy
    // stream, so every copy and memset here goes on the rank's stream too.
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    auto copy = [&](void* to, const void* from, size_t n, cudaMemcpyKind kind) {
      ASSERT_EQ(cudaMemcpyAsync(to, from, n, kind, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    };
    const int rank = context.rank, world = context.world;
    const uint32_t seed = static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count() / 1000000);
    // Every buffer first, then a barrier: where ranks share a GPU's context, a cudaMalloc waits for the kernels
    // in flight, and a peer's first collective would wait for this rank in turn.
    const size_t count = 4099 * static_cast<size_t>(world);  // odd, a multiple of the world for reduce-scatter
    const size_t bytes = count * sizeof(int32_t);
    int32_t *word = nullptr, *send = nullptr, *recv = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&word), sizeof(int32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&recv), bytes * world), cudaSuccess);
    ASSERT_EQ(braidCommBarrier(comm), braidSuccess) << braidGetLastError();
    // one seed for the job: rank 0's, broadcast from C over the host exchange the communicator already has
    const int32_t mine = static_cast<int32_t>(seed & 0x7fffffff);
    copy(word, &mine, sizeof(int32_t), cudaMemcpyHostToDevice);
    ASSERT_EQ(braidBroadcast(comm, word, word, 1, braidInt32, 0, stream), braidSuccess) << braidGetLastError();
    int32_t job_seed = 0;
    copy(&job_seed, word, sizeof(int32_t), cudaMemcpyDeviceToHost);
    auto input = [&](int of, size_t count) {
      std::vector<int32_t> values(count);
      uint64_t state = static_cast<uint64_t>(job_seed) * 1000003u + static_cast<uint64_t>(of) + 1;
      for (int32_t& v : values) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        v = static_cast<int32_t>((state >> 33) % 2001) - 1000;
      }
      return values;
    };
    std::vector<std::vector<int32_t>> every(world);
    for (int r = 0; r < world; ++r) every[r] = input(r, count);
    copy(send, every[rank].data(), bytes, cudaMemcpyHostToDevice);
    auto poison = [&] { ASSERT_EQ(cudaMemsetAsync(recv, 0x5a, bytes * world, stream), cudaSuccess); };
    auto result = [&](size_t n) {
      std::vector<int32_t> out(n);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(braidCommCheck(comm), braidSuccess) << braidGetLastError();
      copy(out.data(), recv, n * sizeof(int32_t), cudaMemcpyDeviceToHost);
      return out;
    };
    auto sum_at = [&](size_t i) {
      int32_t total = 0;
      for (int r = 0; r < world; ++r) total += every[r][i];
      return total;
    };
    size_t wrong = 0;

    poison();
    ASSERT_EQ(braidAllReduce(comm, send, recv, count, braidInt32, braidSum, stream), braidSuccess) << braidGetLastError();
    std::vector<int32_t> out = result(count);
    for (size_t i = 0; i < count; ++i) wrong += out[i] != sum_at(i);
    EXPECT_EQ(wrong, 0u) << "all-reduce";

    poison();
    const size_t block = count / world;
    ASSERT_EQ(braidReduceScatter(comm, send, recv, block, braidInt32, braidSum, stream), braidSuccess)
        << braidGetLastError();
    out = result(block);
    wrong = 0;
    for (size_t i = 0; i < block; ++i) wrong += out[i] != sum_at(rank * block + i);
    EXPECT_EQ(wrong, 0u) << "reduce-scatter";

    poison();
    ASSERT_EQ(braidAllGather(comm, send, recv, count, braidInt32, stream), braidSuccess) << braidGetLastError();
    out = result(count * world);
    wrong = 0;
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < count; ++i) wrong += out[r * count + i] != every[r][i];
    }
    EXPECT_EQ(wrong, 0u) << "all-gather";

    poison();
    const int root = world - 1;
    ASSERT_EQ(braidBroadcast(comm, send, recv, count, braidInt32, root, stream), braidSuccess) << braidGetLastError();
    out = result(count);
    EXPECT_EQ(out, every[root]) << "broadcast";

    poison();
    ASSERT_EQ(braidReduce(comm, send, recv, count, braidInt32, braidMax, root, stream), braidSuccess)
        << braidGetLastError();
    out = result(count);
    if (rank == root) {
      wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        int32_t top = every[0][i];
        for (int r = 1; r < world; ++r) top = std::max(top, every[r][i]);
        wrong += out[i] != top;
      }
      EXPECT_EQ(wrong, 0u) << "reduce max";
    }

    poison();
    ASSERT_EQ(braidAllToAll(comm, send, recv, block, braidInt32, stream), braidSuccess) << braidGetLastError();
    out = result(count);
    wrong = 0;
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < block; ++i) wrong += out[r * block + i] != every[r][rank * block + i];
    }
    EXPECT_EQ(wrong, 0u) << "all-to-all";

    poison();  // a ring: send to the next rank, receive from the previous one, in one batch
    const braidP2POp_t ops[2] = {{braidP2PSend, (rank + 1) % world, send, count, braidInt32},
                                 {braidP2PRecv, (rank + world - 1) % world, recv, count, braidInt32}};
    ASSERT_EQ(braidSendRecv(comm, ops, 2, stream), braidSuccess) << braidGetLastError();
    out = result(count);
    EXPECT_EQ(out, every[(rank + world - 1) % world]) << "send/recv ring";

    braidRegisteredBuffer_t registered_send = nullptr, registered_recv = nullptr;
    ASSERT_EQ(braidRegisterBuffer(comm, send, bytes, &registered_send), braidSuccess) << braidGetLastError();
    ASSERT_EQ(braidRegisterBuffer(comm, recv, bytes * world, &registered_recv), braidSuccess) << braidGetLastError();
    poison();
    ASSERT_EQ(braidAllReduce(comm, send, recv, count, braidInt32, braidSum, stream), braidSuccess) << braidGetLastError();
    out = result(count);
    wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += out[i] != sum_at(i);
    EXPECT_EQ(wrong, 0u) << "all-reduce of registered buffers";
    EXPECT_EQ(braidCommBarrier(comm), braidSuccess) << braidGetLastError();  // every rank done with the buffers
    EXPECT_EQ(braidDeregisterBuffer(registered_send), braidSuccess) << braidGetLastError();
    EXPECT_EQ(braidDeregisterBuffer(registered_recv), braidSuccess) << braidGetLastError();

    EXPECT_EQ(braidAllReduce(comm, send, recv, count, braidInt32, static_cast<braidRedOp_t>(9), stream),
              braidInvalidArgument);
    EXPECT_TRUE(contains(braidGetLastError(), "op")) << braidGetLastError();
    EXPECT_EQ(braidCommBarrier(comm), braidSuccess) << braidGetLastError();
    EXPECT_EQ(braidCommDestroy(comm), braidSuccess);
    EXPECT_EQ(cudaFree(send), cudaSuccess);
    EXPECT_EQ(cudaFree(recv), cudaSuccess);
    EXPECT_EQ(cudaFree(word), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  });
}

// A NULL count array is refused naming it before anything else: after an abort too, where every other call of the
// communicator returns braidAborted (braid.h: "ahead of a recorded fatal failure").
TEST(CApi, NullCountArraysAreRefusedAheadOfARecordedFailure) {
  for_each_rank([](const RankContext& context) {
    braidComm_t comm = nullptr;
    ASSERT_NO_FATAL_FAILURE(init_c_communicator(context, &comm));
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    const size_t world = static_cast<size_t>(context.world);
    std::vector<size_t> host_counts(world, 1);
    int32_t *send = nullptr, *recv = nullptr;
    int64_t* device_counts = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), world * sizeof(int32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&recv), world * sizeof(int32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device_counts), world * sizeof(int64_t)), cudaSuccess);
    ASSERT_EQ(braidCommAbort(comm), braidSuccess) << braidGetLastError();
    ASSERT_EQ(braidAllReduce(comm, send, recv, 1, braidInt32, braidSum, stream), braidAborted) << braidGetLastError();
    auto refused = [&](const char* what, braidResult_t result, const char* argument) {
      EXPECT_EQ(result, braidInvalidArgument) << what << ": " << braidGetLastError();
      EXPECT_NE(std::string(braidGetLastError()).find(std::string("'") + argument + "' is NULL"), std::string::npos)
          << what << ": " << braidGetLastError();
    };
    refused("braidAllToAllv", braidAllToAllv(comm, send, nullptr, nullptr, recv, host_counts.data(), nullptr,
                                             braidInt32, stream), "sendcounts");
    refused("braidAllToAllv", braidAllToAllv(comm, send, host_counts.data(), nullptr, recv, nullptr, nullptr,
                                             braidInt32, stream), "recvcounts");
    refused("braidAllToAllvDevice", braidAllToAllvDevice(comm, send, nullptr, nullptr, recv, world, device_counts,
                                                         nullptr, braidInt32, stream), "sendcounts");
    refused("braidAllToAllvDevice", braidAllToAllvDevice(comm, send, device_counts, nullptr, recv, world, nullptr,
                                                         nullptr, braidInt32, stream), "recvcounts");
    EXPECT_EQ(braidCommDestroy(comm), braidSuccess);
    cudaFree(send);
    cudaFree(recv);
    cudaFree(device_counts);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  });
}

// MoE through the C API: an expert-major float32 buffer, each token sent to two distinct experts, the dispatched
// rows combined as they came (an identity expert, unweighted): every token comes back doubled, bit for bit.
TEST(CApi, MoeDispatchAndCombineReturnEveryTokenTwice) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks: a token's two experts are on two ranks";
  for_each_rank([](const RankContext& context) {
    braidComm_t comm = nullptr;
    ASSERT_NO_FATAL_FAILURE(init_c_communicator(context, &comm));
    const int rank = context.rank, world = context.world;
    braidMoeShape_t shape;
    ASSERT_EQ(braidMoeShapeDefaults(&shape), braidSuccess);
    shape.hidden = 256;
    shape.datatype = shape.dispatch_datatype = braidFloat32;
    shape.max_tokens = 8;
    shape.top_k = 2;
    shape.experts = 2 * world;
    const size_t T = 7, H = shape.hidden, K = 2;  // T below max_tokens
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    float *x = nullptr, *weights = nullptr, *out = nullptr;
    int64_t* ids = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&x), T * H * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), T * H * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&weights), T * K * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&ids), T * K * sizeof(int64_t)), cudaSuccess);
    braidMoeShape_t mixed = shape;  // neither datatype nor an fp8 type: refused on every rank alike
    mixed.dispatch_datatype = braidFloat16;
    braidMoeBuffer_t moe = reinterpret_cast<braidMoeBuffer_t>(uintptr_t(1));
    EXPECT_EQ(braidMoeBufferCreate(comm, &mixed, &moe), braidInvalidArgument);
    EXPECT_NE(std::string(braidGetLastError()).find("'shape.dispatch_type'"), std::string::npos)
        << braidGetLastError();
    EXPECT_EQ(moe, nullptr) << "a failed constructor leaves its out-parameter NULL";
    ASSERT_EQ(braidMoeBufferCreate(comm, &shape, &moe), braidSuccess) << braidGetLastError();
    size_t rows = 0;
    ASSERT_EQ(braidMoeCapacityRows(moe, &rows), braidSuccess);
    EXPECT_GE(rows, T * K);
    std::vector<float> host_x(T * H), host_weights(T * K, 1.0f), host_out(T * H, -1.0f);
    std::vector<int64_t> host_ids(T * K);
    uint64_t state = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1);
    for (float& v : host_x) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<int>((state >> 33) % 2001) - 1000) / 8.0f;
    }
    for (size_t t = 0; t < T; ++t) {
      host_ids[t * K] = static_cast<int64_t>((t + rank) % shape.experts);
      host_ids[t * K + 1] = static_cast<int64_t>((t + rank + 1 + world) % shape.experts);  // another rank's expert
    }
    ASSERT_EQ(cudaMemcpy(x, host_x.data(), T * H * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(ids, host_ids.data(), T * K * sizeof(int64_t), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(weights, host_weights.data(), T * K * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(out, host_out.data(), T * H * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(braidCommBarrier(comm), braidSuccess) << braidGetLastError();  // every buffer made before any call
    braidMoeDispatchOutput_t got;
    ASSERT_EQ(braidMoeDispatch(moe, x, nullptr, ids, weights, T, nullptr, stream, &got), braidSuccess)
        << braidGetLastError();
    EXPECT_NE(got.x, nullptr);
    EXPECT_EQ(got.local_experts, 2);
    EXPECT_EQ(got.handle, 1u);
    EXPECT_EQ(braidMoeCombine(moe, got.x, out, 2, stream), braidInvalidArgument);  // nothing enqueued
    EXPECT_NE(std::string(braidGetLastError()).find("'weighted'"), std::string::npos) << braidGetLastError();
    ASSERT_EQ(braidMoeCombine(moe, got.x, out, 0, stream), braidSuccess) << braidGetLastError();
    int64_t counts[2] = {-1, -1};
    EXPECT_EQ(braidMoeCopyExpertCounts(moe, nullptr, stream), braidInvalidArgument);
    EXPECT_NE(std::string(braidGetLastError()).find("'host_counts' is NULL"), std::string::npos) << braidGetLastError();
    ASSERT_EQ(braidMoeCopyExpertCounts(moe, counts, stream), braidSuccess) << braidGetLastError();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(braidCommCheck(comm), braidSuccess) << braidGetLastError();
    // Expert e of rank r gets one row per (source rank, token) pair naming it: computed from every rank's ids.
    for (int j = 0; j < 2; ++j) {
      const int64_t expert = 2 * rank + j;
      int64_t expected = 0;
      for (int source = 0; source < world; ++source) {
        for (size_t t = 0; t < T; ++t) {
          expected += static_cast<int64_t>((t + source) % shape.experts) == expert;
          expected += static_cast<int64_t>((t + source + 1 + world) % shape.experts) == expert;
        }
      }
      EXPECT_EQ(counts[j], expected) << "rank " << rank << ", local expert " << j;
    }
    ASSERT_EQ(cudaMemcpy(host_out.data(), out, T * H * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    size_t wrong = 0;
    for (size_t i = 0; i < T * H; ++i) wrong += host_out[i] != 2.0f * host_x[i];
    EXPECT_EQ(wrong, 0u) << "rank " << rank << ": tokens not back twice";
    EXPECT_EQ(braidCommBarrier(comm), braidSuccess) << braidGetLastError();
    EXPECT_EQ(braidMoeBufferFree(moe), braidSuccess);
    EXPECT_EQ(braidCommDestroy(comm), braidSuccess);
    cudaFree(x);
    cudaFree(out);
    cudaFree(weights);
    cudaFree(ids);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  });
}

// Rank `rank`'s element i of the legacy-stream tests' all-reduces: in [1, 1000003], different on each rank.
int32_t legacy_test_value(int rank, size_t i) {
  return static_cast<int32_t>(mix64((uint64_t(rank) << 32) + i) % 1000003) + 1;
}

// This rank's values, uploaded to `send` (device, `count` elements).
void upload_legacy_test_values(int32_t* send, size_t count, int rank) {
  std::vector<int32_t> mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = legacy_test_value(rank, i);
  cuda_check(cudaMemcpy(send, mine.data(), count * sizeof(int32_t), cudaMemcpyHostToDevice), "upload the values");
}

// The elements of `recv` (device, `count`) that are not the sum of every rank's values.
size_t wrong_legacy_test_sums(const int32_t* recv, size_t count, int world) {
  std::vector<int32_t> got(count);
  cuda_check(cudaMemcpy(got.data(), recv, count * sizeof(int32_t), cudaMemcpyDeviceToHost), "download the sums");
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < world; ++r) sum += legacy_test_value(r, i);
    wrong += got[i] != static_cast<int32_t>(sum);
  }
  return wrong;
}

// Ranks that share a GPU as threads of one process refuse its legacy default stream (null and cudaStreamLegacy) in
// every kind of call that takes a stream, whatever its sizes: kInvalidArgument naming 'stream' and the call, before
// anything is enqueued, so the ranks stay in step: an all-reduce on a stream of their own then gives the right sum.
TEST(Communicator, RanksSharingAGpuAsThreadsRefuseTheLegacyStreamNamingTheCall) {
  if (!ranks_share_a_context()) GTEST_SKIP() << "no two ranks share a GPU as threads of one process here";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int me = comm.rank(), peer = (comm.rank() + 1) % comm.size();
    const size_t count = 4096;
    int32_t *send = nullptr, *recv = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), count * sizeof(int32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&recv), count * sizeof(int32_t) * comm.size()), cudaSuccess);
    upload_legacy_test_values(send, count, me);
    FusedMatmul fused = FusedMatmul::create(comm);
    const size_t rows = 16, k = 8, n = 8;  // bf16 operands: the int32 buffers hold them
    MoeShape shape;
    shape.hidden = 64;
    shape.max_tokens = 8;
    shape.top_k = 1;
    shape.experts = comm.size();
    MoeBuffer moe = MoeBuffer::create(comm, shape);
    const std::vector<std::pair<const char*, std::function<void(cudaStream_t)>>> calls = {
        {"Communicator::all_reduce",
         [&](cudaStream_t s) { comm.all_reduce(send, recv, count, DataType::kInt32, ReduceOp::kSum, s); }},
        {"Communicator::all_gather", [&](cudaStream_t s) { comm.all_gather(send, recv, count, DataType::kInt32, s); }},
        {"Communicator::all_reduce",  // nothing to move: refused all the same
         [&](cudaStream_t s) { comm.all_reduce(send, recv, 0, DataType::kInt32, ReduceOp::kSum, s); }},
        {"Communicator::send_recv", [&](cudaStream_t s) { comm.send_recv(nullptr, 0, s); }},
        {"Communicator::send", [&](cudaStream_t s) { comm.send(send, count, DataType::kInt32, peer, s); }},
        {"FusedMatmul::matmul_reduce_scatter",
         [&](cudaStream_t s) {
           fused.matmul_reduce_scatter(send, rows * comm.size(), k, send, Layout::kTransposed, n, recv,
                                       DataType::kBFloat16, ReduceOp::kSum, s);
         }},
        {"FusedMatmul::all_gather_matmul",
         [&](cudaStream_t s) {
           fused.all_gather_matmul(send, rows, k, send, Layout::kTransposed, n, recv, nullptr, DataType::kBFloat16, s);
         }},
        {"MoeBuffer::dispatch", [&](cudaStream_t s) { moe.dispatch(send, send, nullptr, 0, nullptr, s); }},
        // The stream is refused before the arguments (y null here).
        {"MoeBuffer::combine", [&](cudaStream_t s) { moe.combine(nullptr, recv, false, s); }},
        {"MoeBuffer::copy_expert_counts", [&](cudaStream_t s) { moe.copy_expert_counts(nullptr, s); }},
    };
    for (const auto& [function, call] : calls) {
      for (cudaStream_t legacy : {cudaStream_t(nullptr), cudaStreamLegacy}) {
        try {
          call(legacy);
          ADD_FAILURE() << "rank " << me << ": " << function << " on the legacy stream was accepted";
        } catch (const Error& error) {
          EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
          EXPECT_TRUE(contains(error.what(), "'stream'")) << error.what();
          EXPECT_TRUE(contains(error.what(), function)) << error.what();
        }
      }
    }
    StreamHandle stream;
    comm.all_reduce(send, recv, count, DataType::kInt32, ReduceOp::kSum, stream.get());
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    comm.check();
    EXPECT_EQ(wrong_legacy_test_sums(recv, count, comm.size()), 0u) << "rank " << me;
    cudaFree(send);
    cudaFree(recv);
    comm.barrier();
  });
}

// Ranks with a context of their own (a GPU each, or processes sharing a GPU) take the legacy default stream: an
// all-reduce there, null and cudaStreamLegacy alike, gives the right sum.
TEST(Communicator, RanksWithAContextOfTheirOwnTakeTheLegacyStream) {
  if (ranks_share_a_context()) GTEST_SKIP() << "ranks share a GPU as threads here: they refuse the legacy stream";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const size_t count = 5000;
    int32_t *send = nullptr, *recv = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), count * sizeof(int32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&recv), count * sizeof(int32_t)), cudaSuccess);
    upload_legacy_test_values(send, count, comm.rank());
    for (cudaStream_t legacy : {cudaStream_t(nullptr), cudaStreamLegacy}) {
      ASSERT_EQ(cudaMemset(recv, 0xFF, count * sizeof(int32_t)), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
      comm.all_reduce(send, recv, count, DataType::kInt32, ReduceOp::kSum, legacy);
      ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
      comm.check();
      EXPECT_EQ(wrong_legacy_test_sums(recv, count, comm.size()), 0u)
          << "rank " << comm.rank() << (legacy == nullptr ? ", null stream" : ", cudaStreamLegacy");
    }
    cudaFree(send);
    cudaFree(recv);
    comm.barrier();
  });
}

// A CUDA error the caller left in its thread (a failed runtime call it did not check) belongs to the caller:
// collectives of LL and staged sizes neither raise it as their own nor clear it, and compute the right result.
TEST(Communicator, ACallersPendingCudaErrorIsLeftToTheCaller) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    StreamHandle stream;  // a stream of the rank's own: ranks sharing a GPU refuse the legacy one
    for (size_t count : {size_t(4096), size_t(1) << 20}) {  // 16 KiB (LL) and 4 MiB of float (staged, barriers)
      float *send = nullptr, *recv = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), count * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&recv), count * sizeof(float)), cudaSuccess);
      const std::vector<float> ones(count, 1.0f);
      ASSERT_EQ(cudaMemcpy(send, ones.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaSetDevice(1 << 20), cudaErrorInvalidDevice);  // left pending, as a caller might
      EXPECT_NO_THROW(comm.all_reduce(send, recv, count, DataType::kFloat32, ReduceOp::kSum, stream.get()))
          << "rank " << comm.rank() << ", " << count << " elements";
      EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice) << "the caller's error is still pending after the call";
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
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
