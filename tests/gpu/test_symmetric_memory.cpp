// Symmetric memory on 2 and 4 GPUs: peer writes through peer pointers and the contiguous view, teardown in
// any order, leak-free alloc/free cycles, refused bad input.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "peer_check.hpp"
#include "process_resources.hpp"
#include "spin_kernel.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

void cuda(cudaError_t result) { ASSERT_EQ(result, cudaSuccess) << cudaGetErrorString(result); }

char* bytes_at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }

void peers_write_and_owners_check(Communicator& comm, size_t region, check::Route route) {
  check::PeerWriteReport report = check::peers_write_owners_check(comm, region, route);
  ASSERT_EQ(static_cast<int>(report.received.size()), comm.size());
  EXPECT_EQ(report.wrong_bytes(), 0u) << report.describe_failures(comm.rank());
}

const size_t kRegionSizes[] = {1, 7, 4097, (1u << 20) + 3, (64u << 20) + 1};

TEST(SymmetricMemory, PeerPointerWritesArriveAtEveryOwner) {
  with_communicator([](Communicator& comm) {
    for (size_t region : kRegionSizes) peers_write_and_owners_check(comm, region, check::Route::kPeerPointer);
  });
}

TEST(SymmetricMemory, ContiguousViewWritesArriveAtEveryOwner) {
  with_communicator([](Communicator& comm) {
    for (size_t region : kRegionSizes) peers_write_and_owners_check(comm, region, check::Route::kContiguousView);
  });
}

TEST(SymmetricMemory, DevicePeerTableMatchesHostTableAndViewIsRankOrdered) {
  with_communicator([](Communicator& comm) {
    AllocOptions options;
    options.contiguous_view = true;
    SymmetricMemory memory = comm.alloc(12345, options);
    EXPECT_EQ(memory.bytes(), 12345u);
    EXPECT_GE(memory.view_stride(), memory.bytes());
    EXPECT_EQ(memory.world_size(), comm.size());
    EXPECT_EQ(memory.peer(comm.rank()), memory.local());
    std::vector<void*> from_device(comm.size());
    cuda(cudaMemcpy(from_device.data(), memory.device_peers(), sizeof(void*) * comm.size(), cudaMemcpyDeviceToHost));
    for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(from_device[r], memory.peers()[r]) << "rank " << r;
    // A byte written through the view at rank r's slot is read back through the peer pointer of rank r.
    for (int r = 0; r < comm.size(); ++r) {
      unsigned char value = static_cast<unsigned char>(17 * comm.rank() + r + 1);
      comm.barrier();
      if (comm.rank() == 0) {
        // Synchronised on its stream: a copy from pageable host memory may return before its DMA lands (CUDA's API
        // sync rules), and the byte must be in rank r's memory before the barrier lets rank r read it.
        cuda(cudaMemcpyAsync(bytes_at(memory.view(), memory.view_stride() * r + 100), &value, 1, cudaMemcpyDefault,
                             cudaStreamPerThread));
        cuda(cudaStreamSynchronize(cudaStreamPerThread));
      }
      comm.barrier();
      unsigned char seen = 0;
      cuda(cudaMemcpy(&seen, bytes_at(memory.peer(r), 100), 1, cudaMemcpyDefault));
      EXPECT_EQ(seen, static_cast<unsigned char>(r + 1)) << "rank " << comm.rank() << " reading rank " << r;
    }
    EXPECT_THROW(memory.peer(comm.size()), Error);
    EXPECT_THROW(memory.peer(-1), Error);
    comm.barrier();
  });
}

TEST(SymmetricMemory, NewMemoryIsZeroed) {
  with_communicator([](Communicator& comm) {
    SymmetricMemory memory = comm.alloc(3 << 20);
    std::vector<unsigned char> host(3 << 20, 0xFF);
    cuda(cudaMemcpy(host.data(), memory.local(), host.size(), cudaMemcpyDeviceToHost));
    size_t nonzero = 0;
    for (unsigned char byte : host) nonzero += byte != 0;
    EXPECT_EQ(nonzero, 0u);
    comm.barrier();
  });
}

TEST(SymmetricMemory, ThousandAllocFreeCyclesLeakNoMemoryOrFds) {
  with_communicator([](Communicator& comm) {
    const size_t sizes[] = {4096, (2u << 20) + 1, 3u << 20, 65536};
    auto cycle = [&](int i) {
      AllocOptions options;
      options.contiguous_view = i % 3 == 0;
      SymmetricMemory memory = comm.alloc(sizes[i % 4], options);
      EXPECT_NE(memory.peer((comm.rank() + 1) % comm.size()), nullptr);
    };
    // Warm-up: runtime and driver state made lazily on first use (fds included) is not a leak.
    for (int i = 0; i < 8; ++i) cycle(i);
    free_device_bytes();
    open_fds();
    device_synchronize();
    // Measure between barriers, when no rank is mid-cycle (ranks may be threads of this process).
    struct Reading {
      int fds;
      size_t free_bytes;
    };
    auto read_between_barriers = [&] {
      comm.barrier();
      Reading reading{static_cast<int>(open_fds()), free_device_bytes()};
      comm.barrier();
      return reading;
    };
    const Reading before = read_between_barriers();
    for (int i = 0; i < 500; ++i) cycle(i);
    device_synchronize();
    const Reading middle = read_between_barriers();
    for (int i = 500; i < 1000; ++i) cycle(i);
    device_synchronize();
    const Reading after = read_between_barriers();

    // A leak grows with the cycles: the last 500 must add nothing at all.
    EXPECT_EQ(after.fds, middle.fds) << "rank " << comm.rank() << ": open fds grew over 500 cycles";
    EXPECT_EQ(after.free_bytes, middle.free_bytes) << "rank " << comm.rank() << ": free device memory changed";
    EXPECT_EQ(after.fds, before.fds) << "rank " << comm.rank() << ": open fds " << before.fds << " -> " << after.fds;
    // The driver may keep a page of bookkeeping; a leak of 1000 allocations would be ≥ 4 MB.
    EXPECT_LE(before.free_bytes > after.free_bytes ? before.free_bytes - after.free_bytes : 0, size_t(2) << 20)
        << "rank " << comm.rank() << ": free device memory " << before.free_bytes << " before, " << after.free_bytes << " after";
    if (comm.rank() == 0) {
      std::printf("leak check: 1000 alloc/free cycles; open fds %d -> %d (after 500) -> %d; free device memory %zu -> %zu -> %zu bytes\n",
                  before.fds, middle.fds, after.fds, before.free_bytes, middle.free_bytes, after.free_bytes);
    }
  });
}

TEST(SymmetricMemory, TeardownInAnyOrder) {
  for_each_rank([](const RankContext& context) {
    Communicator keeper = Communicator::init(context.rendezvous, test_options());
    make_current(keeper);
    SymmetricMemory memory;
    {
      Communicator comm = Communicator::init(context.rendezvous, test_options());
      memory = comm.alloc(1 << 20);
    }  // communicator destroyed before its memory: the memory must stay usable
    const int me = keeper.rank(), world = keeper.size();
    const size_t region = (1 << 20) / world;
    keeper.barrier();
    for (int owner = 0; owner < world; ++owner) {
      check::write_pattern(bytes_at(memory.peer(owner), region * me), region, 42 + me, me, owner, nullptr);
    }
    device_synchronize();
    keeper.barrier();
    for (int writer = 0; writer < world; ++writer) {
      EXPECT_EQ(check::check_pattern(bytes_at(memory.local(), region * writer), region, 42 + writer, writer, me, nullptr).wrong, 0u);
    }
    keeper.barrier();
    memory.reset();
    EXPECT_FALSE(memory);
    EXPECT_THROW(memory.local(), Error);
    // And memory freed before its communicator.
    SymmetricMemory second = keeper.alloc(4096);
    second.reset();
    keeper.barrier();
  });
}

TEST(SymmetricMemory, DifferentSizesOnDifferentRanksAreRefused) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  with_communicator([](Communicator& comm) {
    size_t bytes = comm.rank() == 0 ? 4096 : 8192;
    try {
      comm.alloc(bytes);
      ADD_FAILURE() << "rank " << comm.rank() << ": mismatched alloc was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kMismatch);
      EXPECT_NE(std::string(error.what()).find("rank 1 asked for 8192"), std::string::npos) << error.what();
    }
    // The communicator is still usable afterwards.
    SymmetricMemory ok = comm.alloc(4096);
    EXPECT_NE(ok.local(), nullptr);
    comm.barrier();
  });
}

// 0 bytes on every rank: kInvalidArgument naming bytes. 0 bytes on the last rank alone: that rank raises
// kInvalidArgument naming bytes and the others kMismatch, all at once (well before the timeout).
TEST(SymmetricMemory, ZeroBytesIsRefusedNamingTheArgument) {
  with_communicator([](Communicator& comm) {
    try {
      comm.alloc(0);
      ADD_FAILURE() << "alloc(0) was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(error.what()).find("'bytes'"), std::string::npos) << error.what();
    }
    comm.barrier();
    if (comm.size() < 2) return;
    const bool zero = comm.rank() == comm.size() - 1;
    const auto start = std::chrono::steady_clock::now();
    try {
      comm.alloc(zero ? 0 : 4096);
      ADD_FAILURE() << "rank " << comm.rank() << ": an allocation with 0 bytes on one rank was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), zero ? ErrorCode::kInvalidArgument : ErrorCode::kMismatch) << error.what();
      if (zero) EXPECT_NE(std::string(error.what()).find("'bytes'"), std::string::npos) << error.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, comm.timeout_s() / 2) << "rank " << comm.rank() << " waited for the timeout";
    SymmetricMemory ok = comm.alloc(4096);  // the ranks are still in step
    EXPECT_NE(ok.local(), nullptr);
    comm.barrier();
  });
}

// A rank's set-up work makes no stream of its own (NOTE [streams made before the exchanges],
// src/core/private_copy.hpp), so a symmetric allocation ends while a kernel holds the GPU the ranks share as threads,
// whatever the count of the context's live streams (at some counts, making one more waits until the GPU is idle).
// Rank 0 holds the GPU with a kernel it releases only once every rank's allocation has returned, and keeps 0, 1, ...
// kMostExtraStreams more streams alive in turn, so that a stream made during the allocation would meet every count of a
// period.
TEST(SymmetricMemory, AllocationEndsWhileAKernelHoldsTheSharedGpu) {
  if (!ranks_share_a_context()) GTEST_SKIP() << "no ranks share a GPU as threads of this process in this run";
  constexpr int kMostExtraStreams = 48;  // more than one period (43) of the counts at which making a stream waited
  constexpr uint64_t kHoldNs = 4'000'000'000ull;
  constexpr double kMostSeconds = 2.0;  // an allocation takes milliseconds; one that waited for the hold takes 4 s
  with_communicator([&](Communicator& comm) {
    const int rank = comm.rank();
    int* host_flag = nullptr;
    cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&host_flag), sizeof(int), cudaHostAllocMapped), "cudaHostAlloc");
    const std::unique_ptr<int, cudaError_t (*)(void*)> flag_owner(host_flag, cudaFreeHost);
    volatile int* const released = host_flag;
    const StreamHandle holder;
    for (int extra = 0; extra <= kMostExtraStreams; ++extra) {
      std::vector<std::unique_ptr<StreamHandle>> extras;
      if (rank == 0) {
        for (int i = 0; i < extra; ++i) extras.push_back(std::make_unique<StreamHandle>());
      }
      *released = 0;
      host_barrier();  // every stream made before the GPU is held
      if (rank == 0) cuda_check(hold_until_released(holder.get(), released, kHoldNs), "hold");
      host_barrier();
      const auto start = std::chrono::steady_clock::now();
      SymmetricMemory memory = comm.alloc((size_t(1) << 20) + 3);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_LT(seconds, kMostSeconds) << "rank " << rank << ": comm.alloc took " << seconds
                                       << " s while rank 0's kernel held the GPU, with rank 0 keeping " << extra
                                       << " more streams";
      host_barrier();  // every allocation returned
      if (rank == 0) {
        *released = 1;
        cuda_check(cudaStreamSynchronize(holder.get()), "cudaStreamSynchronize");
      }
      host_barrier();  // the GPU is free before any rank frees its memory and streams
    }
  });
}

}  // namespace
}  // namespace braid::testing
