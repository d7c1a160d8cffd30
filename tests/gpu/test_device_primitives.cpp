// The public device primitives (include/braid/device/copy_device.hpp, ll_device.hpp), called from kernels of the
// test's own, as a user's kernel calls them: group copies at every alignment and length, into this GPU's memory
// and into a peer's symmetric allocation, and LL lines from one rank to the next through symmetric memory.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "braid/device/ll_device.hpp"
#include "collective_reference.hpp"
#include "device_primitives_kernel.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

constexpr unsigned char kPoison = 0xA5;

std::vector<unsigned char> random_bytes(uint64_t key, size_t count) {
  std::vector<unsigned char> bytes(count);
  for (size_t i = 0; i < count; ++i) {
    bytes[i] = static_cast<unsigned char>(mix64(key + i) >> 7);
    if (bytes[i] == kPoison) bytes[i] ^= 1;
  }
  return bytes;
}

std::string where(CopyGroup group, size_t source_offset, size_t destination_offset, size_t bytes) {
  const char* name = group == CopyGroup::kBlock ? "block_copy" : group == CopyGroup::kWarp ? "warp_copy" : "block_copy_to";
  return std::string(name) + ": source offset " + std::to_string(source_offset) + ", destination offset " +
         std::to_string(destination_offset) + ", " + std::to_string(bytes) + " bytes";
}

// Every group, source and destination offsets 0..17 (16-byte vectors, 4-byte words, single bytes), lengths from 0
// past several vectors per thread; the second destination of block_copy_to is the next rank's symmetric
// allocation. The bytes around each copy keep their poison.
TEST(DevicePrimitives, GroupCopiesAnyAlignmentAndLength) {
  with_communicator([](Communicator& comm) {
    constexpr size_t kGuard = 32, kMaxBytes = 70001;
    const size_t capacity = kMaxBytes + 2 * kGuard + 64;
    SymmetricMemory peers = comm.alloc(capacity);
    DeviceBuffer source(capacity), destination(capacity);
    const StreamHandle stream;
    char* const next = static_cast<char*>(peers.peer((comm.rank() + 1) % comm.size()));
    const uint64_t seed = shared_seed(comm) ^ static_cast<uint64_t>(comm.rank());
    const size_t lengths[] = {0, 1, 3, 7, 15, 16, 17, 255, 4096 + 5, kMaxBytes};
    const size_t offsets[] = {0, 1, 2, 4, 8, 15, 16, 17};
    size_t checked = 0;
    for (CopyGroup group : {CopyGroup::kBlock, CopyGroup::kWarp, CopyGroup::kBlockToTwo}) {
      for (size_t from : offsets) {
        for (size_t to : offsets) {
          for (size_t bytes : lengths) {
            if (group == CopyGroup::kBlockToTwo && comm.size() < 2) continue;
            const std::vector<unsigned char> input = random_bytes(seed + checked * 1000003, bytes);
            std::vector<unsigned char> poisoned(capacity, kPoison);
            cuda_check(cudaMemcpy(destination.get(), poisoned.data(), capacity, cudaMemcpyHostToDevice), "poison");
            cuda_check(cudaMemcpy(next, poisoned.data(), capacity, cudaMemcpyHostToDevice), "poison peer");
            char* const in = static_cast<char*>(source.get()) + kGuard + from;
            cuda_check(cudaMemcpy(in, input.data(), bytes, cudaMemcpyHostToDevice), "input");
            char* const out = static_cast<char*>(destination.get()) + kGuard + to;
            cuda_check(launch_group_copy(group, out, next + kGuard + to, in, bytes, stream.get()), "launch");
            cuda_check(cudaStreamSynchronize(stream.get()), "copy");
            std::vector<unsigned char> outputs[2] = {std::vector<unsigned char>(capacity), {}};
            cuda_check(cudaMemcpy(outputs[0].data(), destination.get(), capacity, cudaMemcpyDeviceToHost), "output");
            if (group == CopyGroup::kBlockToTwo) {
              outputs[1].resize(capacity);
              cuda_check(cudaMemcpy(outputs[1].data(), next, capacity, cudaMemcpyDeviceToHost), "peer output");
            }
            for (const std::vector<unsigned char>& output : outputs) {
              if (output.empty()) continue;
              const unsigned char* copy = output.data() + kGuard + to;
              ASSERT_EQ(std::memcmp(copy, input.data(), bytes), 0) << where(group, from, to, bytes);
              for (size_t i = 0; i < kGuard + to; ++i) ASSERT_EQ(output[i], kPoison) << where(group, from, to, bytes);
              for (size_t i = kGuard + to + bytes; i < capacity; ++i) {
                ASSERT_EQ(output[i], kPoison) << where(group, from, to, bytes) << ", byte " << i;
              }
            }
            ++checked;
          }
        }
      }
    }
    EXPECT_GT(checked, 500u);
    comm.barrier();  // no peer still copies into this rank's allocation
  });
}

// Rank r sends LL lines into rank r+1's symmetric allocation; rank r+1 polls them. Odd sizes end in a partial
// line; the bytes past the payload keep their poison. A flag no line carries arrives nowhere, within the bound.
TEST(DevicePrimitives, LLLinesCarryPayloadAndFlagBetweenRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  with_communicator([](Communicator& comm) {
    constexpr size_t kBytes = 100003;
    constexpr size_t kLines = (kBytes + device::kLLLineBytes - 1) / device::kLLLineBytes;
    SymmetricMemory wire = comm.alloc(kLines * device::kLLWireBytes);  // zeroed
    DeviceBuffer source(kBytes), destination(kBytes + 64);
    unsigned long long* arrived = nullptr;
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&arrived), sizeof(*arrived)), "counter");
    const StreamHandle stream;
    const int rank = comm.rank(), next = (rank + 1) % comm.size(), previous = (rank + comm.size() - 1) % comm.size();
    const uint64_t seed = shared_seed(comm);
    const std::vector<unsigned char> mine = random_bytes(seed + static_cast<uint64_t>(rank) * 7919, kBytes);
    const std::vector<unsigned char> expected = random_bytes(seed + static_cast<uint64_t>(previous) * 7919, kBytes);
    cuda_check(cudaMemcpy(source.get(), mine.data(), kBytes, cudaMemcpyHostToDevice), "input");
    const std::vector<unsigned char> poisoned(kBytes + 64, kPoison);

    for (uint32_t flag : {1u, 2u, 0x80000001u}) {
      cuda_check(cudaMemcpy(destination.get(), poisoned.data(), poisoned.size(), cudaMemcpyHostToDevice), "poison");
      cuda_check(cudaMemset(arrived, 0, sizeof(*arrived)), "counter");
      cuda_check(launch_ll_send(static_cast<char*>(wire.peer(next)), static_cast<const char*>(source.get()), kBytes, flag,
                                stream.get()),
                 "send");
      cuda_check(launch_ll_receive(static_cast<const char*>(wire.local()), static_cast<char*>(destination.get()), kBytes,
                                   flag, uint64_t(10) * 1000000000, arrived, stream.get()),
                 "receive");
      cuda_check(cudaStreamSynchronize(stream.get()), "lines");
      unsigned long long lines = 0;
      cuda_check(cudaMemcpy(&lines, arrived, sizeof(lines), cudaMemcpyDeviceToHost), "counter");
      EXPECT_EQ(lines, kLines) << "flag " << flag;
      std::vector<unsigned char> output(kBytes + 64);
      cuda_check(cudaMemcpy(output.data(), destination.get(), output.size(), cudaMemcpyDeviceToHost), "output");
      EXPECT_EQ(std::memcmp(output.data(), expected.data(), kBytes), 0) << "flag " << flag;
      for (size_t i = kBytes; i < output.size(); ++i) ASSERT_EQ(output[i], kPoison) << "flag " << flag << ", byte " << i;
      comm.barrier();  // the previous rank's lines of this flag were read before it writes the next
    }

    // A flag the lines do not carry: nothing arrives, nothing is written, and the poll ends at its bound.
    cuda_check(cudaMemcpy(destination.get(), poisoned.data(), poisoned.size(), cudaMemcpyHostToDevice), "poison");
    cuda_check(cudaMemset(arrived, 0, sizeof(*arrived)), "counter");
    cuda_check(launch_ll_receive(static_cast<const char*>(wire.local()), static_cast<char*>(destination.get()), kBytes, 3u,
                                 uint64_t(20) * 1000000, arrived, stream.get()),
               "receive");
    cuda_check(cudaStreamSynchronize(stream.get()), "no lines");
    unsigned long long lines = 1;
    cuda_check(cudaMemcpy(&lines, arrived, sizeof(lines), cudaMemcpyDeviceToHost), "counter");
    EXPECT_EQ(lines, 0u);
    std::vector<unsigned char> output(kBytes + 64);
    cuda_check(cudaMemcpy(output.data(), destination.get(), output.size(), cudaMemcpyDeviceToHost), "output");
    EXPECT_EQ(output, poisoned);
    cuda_check(cudaFree(arrived), "counter");
    comm.barrier();
  });
}

}  // namespace
}  // namespace braid::testing
