// Ranges exposed to the peers (memory/registered_exposures.hpp), on every rank (threads or braid-run processes):
// each rank exposes cudaMalloc and VMM ranges (a sub-range at an offset too); every peer's exposure table then
// holds each range's id, length and an address here through which the owner's bytes read back; withdrawal
// leaves nothing mapped on any peer. cudaMalloc memory of another process is refused (NOTE [no exposed cudaMalloc
// memory across processes]). Exposures and withdrawals made while the peers' collectives run never wait for them.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "comm/test_hooks.hpp"
#include "vmm_buffer.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

void cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
}

// Byte i of rank r's range k: distinct per (rank, range, i), never all zero.
std::vector<uint8_t> pattern(int rank, int range, size_t bytes) {
  std::vector<uint8_t> values(bytes);
  for (size_t i = 0; i < bytes; ++i) values[i] = static_cast<uint8_t>((i * 131 + rank * 29 + range * 7 + 1) % 251 + 1);
  return values;
}

// Every rank's `mine` in rank order (an all-gather on the GPU).
std::vector<uint64_t> gather(Communicator& comm, uint64_t mine) {
  uint64_t* words = nullptr;
  cuda(cudaMalloc(reinterpret_cast<void**>(&words), sizeof(uint64_t) * (comm.size() + 1)), "cudaMalloc");
  cuda(cudaMemcpy(words, &mine, sizeof(mine), cudaMemcpyHostToDevice), "cudaMemcpy");
  comm.all_gather(words, words + 1, 1, DataType::kUint64, cudaStreamPerThread);
  cuda(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
  std::vector<uint64_t> all(comm.size());
  cuda(cudaMemcpy(all.data(), words + 1, sizeof(uint64_t) * comm.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  free_when_ranks_end(words);
  return all;
}

TEST(ExposedRanges, EveryPeerMapsEachRangeAndReleasesItOnWithdrawal) {
  with_communicator([](Communicator& comm) {
    if (comm.size() == 1) GTEST_SKIP() << "one rank exposes nothing";
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    constexpr size_t kBytes = (size_t(1) << 20) + 4096, kOffset = 4096, kSubBytes = 12345;
    void* plain = nullptr;
    cuda(cudaMalloc(&plain, kBytes), "cudaMalloc");
    VmmBuffer vmm(kBytes, comm.device());
    struct Range {
      char* pointer;
      size_t bytes;
    };
    const std::vector<Range> ranges = {{static_cast<char*>(plain), kBytes},
                                       {static_cast<char*>(vmm.pointer()), kBytes},
                                       {static_cast<char*>(plain) + kOffset, kSubBytes}};
    for (size_t k = 0; k < 2; ++k) {
      const std::vector<uint8_t> bytes = pattern(rank, static_cast<int>(k), ranges[k].bytes);
      cuda(cudaMemcpy(ranges[k].pointer, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    // Ranges 0 and 2 are cudaMalloc memory: exposed where the ranks are threads of one process only.
    auto exposable = [](size_t k) { return k == 1 || !in_process_mode(); };
    std::vector<std::vector<uint64_t>> ids;  // [range][rank]
    for (size_t k = 0; k < ranges.size(); ++k) {
      const uint64_t id = expose(comm, k + 1, ranges[k].pointer, ranges[k].bytes);
      if (exposable(k)) {
        EXPECT_NE(id, 0u) << "range " << k << " was not mapped by every peer";
      } else {
        EXPECT_EQ(id, 0u) << "range " << k << ": cudaMalloc memory of another process was exposed";
      }
      ids.push_back(gather(comm, id));
    }
    size_t exposed = 0;
    for (size_t k = 0; k < ranges.size(); ++k) {
      if (!exposable(k)) continue;
      ++exposed;
      for (int owner = 0; owner < world; ++owner) {
        if (owner == rank) continue;
        const ExposedEntry entry = exposed_entry(comm, owner, ids[k][owner]);
        ASSERT_EQ(entry.id, ids[k][owner]) << "range " << k << " of rank " << owner << " is not in the table";
        ASSERT_EQ(entry.bytes, ranges[k].bytes) << "range " << k << " of rank " << owner;
        // The owner's bytes, read through this rank's mapping (range 2 lies at kOffset of range 0).
        const int written = k == 2 ? 0 : static_cast<int>(k);
        const size_t from = k == 2 ? kOffset : 0;
        const std::vector<uint8_t> expected = pattern(owner, written, from + ranges[k].bytes);
        std::vector<uint8_t> seen(ranges[k].bytes);
        cuda(cudaMemcpy(seen.data(), reinterpret_cast<void*>(entry.base), seen.size(), cudaMemcpyDeviceToHost),
             "cudaMemcpy from a peer's exposed range");
        EXPECT_EQ(0, std::memcmp(seen.data(), expected.data() + from, seen.size()))
            << "range " << k << " of rank " << owner << " reads other bytes here";
      }
    }
    EXPECT_EQ(imported_exposures(comm), exposed * (world - 1));
    comm.barrier();  // every rank has read the peers' ranges
    for (size_t k = 0; k < ranges.size(); ++k) withdraw(comm, k + 1);
    comm.barrier();  // every rank has withdrawn
    EXPECT_EQ(imported_exposures(comm), 0u) << "a withdrawn range stays mapped here";
    free_when_ranks_end(plain);
    device_synchronize();  // the VMM buffer goes next: no peer's work still on the GPU
  });
}

// Every rank exposes and withdraws VMM memory right after enqueuing an all-reduce, so the peers' helpers map and
// unmap while their GPUs run (or wait in) it: no exposure or withdrawal may wait for a busy GPU.
TEST(ExposedRanges, ExposuresBesideCollectivesOfThePeers) {
  with_communicator([](Communicator& comm) {
    if (comm.size() == 1) GTEST_SKIP() << "one rank exposes nothing";
    make_current(comm);
    constexpr size_t kCount = size_t(1) << 20;
    constexpr int kRounds = 20;
    VmmBuffer memory(kCount * sizeof(float) * 2, comm.device());  // exposable in both modes
    float* data = static_cast<float*>(memory.pointer());
    cuda(cudaMemset(data, 0, kCount * sizeof(float) * 2), "cudaMemset");
    for (int round = 0; round < kRounds; ++round) {
      comm.all_reduce(data, data + kCount, kCount, DataType::kFloat32, ReduceOp::kSum, cudaStreamPerThread);
      const uint64_t key = 100 + round;
      EXPECT_NE(expose(comm, key, data, kCount * sizeof(float)), 0u) << "round " << round;
      withdraw(comm, key);  // waits for this rank's all-reduce: every peer joins it
    }
    cuda(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
    comm.barrier();
    EXPECT_EQ(imported_exposures(comm), 0u);
    device_synchronize();  // the VMM buffer goes next: no peer's work still on the GPU
  });
}

}  // namespace
}  // namespace braid::testing
