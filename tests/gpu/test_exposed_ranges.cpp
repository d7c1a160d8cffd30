// Ranges exposed to the peers (memory/registered_exposures.hpp), on every rank (threads or braid-run processes):
// each rank exposes cudaMalloc and VMM ranges (a sub-range at an offset too); every peer's exposure table then
// holds each range's id, length and an address here through which the owner's bytes read back; withdrawal
// leaves nothing mapped on any peer. cudaMalloc memory of another process is refused (NOTE [no exposed cudaMalloc
// memory across processes]). Exposures and withdrawals made while the peers' collectives run never wait for them.
// Eager calls on exposed buffers (announced, exchanged, and buffers of several VMM allocations exposed at first use)
// equal the host's results whatever each rank exposed.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "comm/test_hooks.hpp"
#include "test_helpers.hpp"
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
  if (!eager_zero_copy_on()) GTEST_SKIP() << "runs with BRAID_EAGER_ZERO_COPY=1 (the eager_zero_copy entries)";
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

// After abort(), a registration's exposure and an exposed range's withdrawal end at once with kAborted, though the
// peers' helpers would still answer them; deregister lets the registration go all the same.
TEST(ExposedRanges, AbortEndsExposuresAndWithdrawals) {
  if (!eager_zero_copy_on()) GTEST_SKIP() << "runs with BRAID_EAGER_ZERO_COPY=1 (the eager_zero_copy entries)";
  with_communicator([](Communicator& comm) {
    if (comm.size() == 1) GTEST_SKIP() << "one rank exposes nothing";
    make_current(comm);
    const int rank = comm.rank();
    constexpr size_t kBytes = size_t(2) << 20;
    VmmBuffer exposed(kBytes, comm.device()), later(kBytes, comm.device());
    RegisteredBuffer registered = comm.register_buffer(exposed.pointer(), kBytes);
    EXPECT_EQ(comm.registration_stats().exposed, 1u) << "rank " << rank << ": the range is not exposed";
    comm.barrier();  // every rank exposed its range
    comm.abort();
    auto expect_aborted = [&](const char* what, const std::function<void()>& call) {
      const auto started = std::chrono::steady_clock::now();
      try {
        call();
        ADD_FAILURE() << "rank " << rank << ": " << what << " after abort() raised nothing";
      } catch (const Error& error) {
        EXPECT_EQ(error.code(), ErrorCode::kAborted) << "rank " << rank << ": " << what << ": " << error.what();
      }
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      EXPECT_LT(took, 1.0) << "rank " << rank << ": " << what << " waited for the peers";
    };
    expect_aborted("register_buffer", [&] { comm.register_buffer(later.pointer(), kBytes); });
    expect_aborted("deregister", [&] { comm.deregister(registered); });
    EXPECT_FALSE(registered) << "rank " << rank << ": deregister kept the registration";
    EXPECT_EQ(comm.registration_stats().buffers, 0u) << "rank " << rank;
    host_barrier();  // no rank's buffers go while a peer's helper may still map them
  });
}

// Every rank exposes and withdraws VMM memory right after enqueuing an all-reduce, so the peers' helpers map and
// unmap while their GPUs run (or wait in) it: no exposure or withdrawal may wait for a busy GPU.
TEST(ExposedRanges, ExposuresBesideCollectivesOfThePeers) {
  if (!eager_zero_copy_on()) GTEST_SKIP() << "runs with BRAID_EAGER_ZERO_COPY=1 (the eager_zero_copy entries)";
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


// Int32 element i of rank r's block in round `seed`: never zero, distinct per (seed, rank, i).
int32_t element(uint32_t seed, int rank, size_t i) {
  return static_cast<int32_t>((seed * 2654435761u ^ static_cast<uint32_t>(rank) * 40503u ^ static_cast<uint32_t>(i) * 7919u) %
                              2000003u) + 1;
}

// Elements i < count of `seen` that differ from the sum over every rank q of element(round, q, first + i) % modulus
// (small enough for int32 sums to be exact in any order).
size_t wrong_sums(const std::vector<int32_t>& seen, size_t count, uint32_t round, int world, size_t first,
                  int32_t modulus) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    int32_t expected = 0;
    for (int q = 0; q < world; ++q) expected += element(round, q, first + i) % modulus;
    wrong += seen[i] != expected;
  }
  return wrong;
}

// Who exposes the tested buffer: every rank, rank 0 alone or no rank by registering it (buffers nobody registered
// left unexposed), or every rank by its first use (NOTE [automatic exposures]: nobody registers it).
enum Exposing { kEveryRank, kRankZero, kNoRank, kAutomatic };

// Runs `body` for each Exposing with [pointer, pointer + bytes) registered on this rank as it says; after each,
// deregisters it (waiting for this rank's calls and the peers' release) and meets the peers.
void for_each_exposing(Communicator& comm, void* pointer, size_t bytes, const std::function<void(Exposing)>& body) {
  struct AutomaticExposuresBack {  // on again when the loop ends, even by an exception
    ~AutomaticExposuresBack() { expose_automatically(true); }
  } back;
  for (const Exposing exposing : {kEveryRank, kRankZero, kNoRank, kAutomatic}) {
    expose_automatically(exposing == kAutomatic);  // every rank's previous body ended at the barrier below
    std::optional<RegisteredBuffer> registered;
    if (exposing == kEveryRank || (exposing == kRankZero && comm.rank() == 0)) {
      registered = comm.register_buffer(pointer, bytes);
    }
    body(exposing);
    if (registered) comm.deregister(*registered);
    comm.barrier();
  }
}

// Waits for this thread's default stream, where the tests enqueue, then raises what the communicator recorded.
void finish_calls(Communicator& comm) {
  cuda(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
  comm.check();
}

// An int32 sum reduce-scatter of count elements a rank block from `input` (filled here with element(round, rank, i)
// % 100000) into `out` (poisoned first unless it is this rank's block of the input): the elements that differ from
// the host's sums.
size_t reduce_scatter_wrong_sums(Communicator& comm, int32_t* input, int32_t* out, size_t count, uint32_t round) {
  const int rank = comm.rank(), world = comm.size();
  std::vector<int32_t> values(count * world);
  for (size_t i = 0; i < values.size(); ++i) values[i] = element(round, rank, i) % 100000;
  cuda(cudaMemcpy(input, values.data(), values.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
  if (out != input + rank * count) cuda(cudaMemset(out, 0xA5, count * sizeof(int32_t)), "cudaMemset");
  comm.reduce_scatter(input, out, count, DataType::kInt32, ReduceOp::kSum, cudaStreamPerThread);
  finish_calls(comm);
  values.resize(count);
  cuda(cudaMemcpy(values.data(), out, count * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return wrong_sums(values, count, round, world, rank * count, 100000);
}

// BRAID_EAGER_ZERO_COPY=1 (its own ctest entries): eager all-gathers whose outputs every rank, one rank or no rank
// exposed (registered VMM memory; or every rank at first use, unregistered: for_each_exposing), out of place and in place, at an announced size (NOTE [announced sizes]) within
// a staging half, one larger than a staging half (the staged path's rounds) and a small one whose rank blocks are
// not whole 16-byte vectors (planned as staged):
// every block equal to its rank's input, outputs poisoned before each call; and an all-reduce on the output (staged
// under the switch, whatever each rank registered).
TEST(ExposedRanges, AnnouncedAllGathersMatchTheReferenceWhateverEachRankExposed) {
  if (!eager_zero_copy_on()) GTEST_SKIP() << "runs with BRAID_EAGER_ZERO_COPY=1 (the eager_zero_copy entries)";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    const size_t counts[] = {(size_t(1) << 21) + 4, (size_t(5) << 20) + 4, (size_t(1) << 18) + 3};
    const size_t most = (size_t(5) << 20) + 4;
    VmmBuffer output(most * sizeof(int32_t) * world, comm.device());
    int32_t* input = nullptr;
    cuda(cudaMalloc(reinterpret_cast<void**>(&input), most * sizeof(int32_t)), "cudaMalloc");
    int32_t* out = static_cast<int32_t*>(output.pointer());
    const uint32_t seed = static_cast<uint32_t>(shared_seed(comm));  // fresh each run, the same on every rank
    for_each_exposing(comm, out, most * sizeof(int32_t) * world, [&](Exposing exposing) {
      for (const size_t count : counts) {
        for (const bool in_place : {false, true}) {
          const uint32_t round = seed + static_cast<uint32_t>(count * 3 + in_place + exposing * 7);
          std::vector<int32_t> mine(count);
          for (size_t i = 0; i < count; ++i) mine[i] = element(round, rank, i);
          cuda(cudaMemset(out, 0xA5, count * sizeof(int32_t) * world), "cudaMemset");
          int32_t* source = in_place ? out + rank * count : input;
          cuda(cudaMemcpy(source, mine.data(), count * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
          comm.all_gather(source, out, count, DataType::kInt32, cudaStreamPerThread);
          finish_calls(comm);
          std::vector<int32_t> seen(count * world);
          cuda(cudaMemcpy(seen.data(), out, seen.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
          size_t wrong = 0;
          for (int q = 0; q < world; ++q) {
            for (size_t i = 0; i < count; ++i) wrong += seen[q * count + i] != element(round, q, i);
          }
          EXPECT_EQ(wrong, 0u) << "exposing " << exposing << ", " << count << " int32 a rank, "
                               << (in_place ? "in place" : "out of place");
        }
      }
      {  // An all-reduce on the output, registered on some ranks only: staged, never kMismatch, under the switch.
        const size_t count = (size_t(1) << 20) + 4;  // beyond LL
        std::vector<int32_t> mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = element(seed + 11, rank, i) % 1000;
        cuda(cudaMemcpy(out, mine.data(), count * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
        comm.all_reduce(out, out + count, count, DataType::kInt32, ReduceOp::kSum, cudaStreamPerThread);
        finish_calls(comm);
        std::vector<int32_t> sum(count);
        cuda(cudaMemcpy(sum.data(), out + count, count * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
        EXPECT_EQ(wrong_sums(sum, count, seed + 11, world, 0, 1000), 0u) << "all_reduce with exposing " << exposing;
      }
    });
    free_when_ranks_end(input);
    device_synchronize();  // the VMM output goes next
  });
}

// BRAID_EAGER_ZERO_COPY=1: eager reduce-scatters (input announced) and all-reduces (input and output announced)
// on VMM memory that every rank, one rank or no rank registered (or every rank exposed at first use), out of place
// and in place, at an announced size (NOTE [announced sizes]), one larger than a staging half (the staged rounds) and a small one
// (planned as staged; for reduce-scatter its rank blocks are not whole 16-byte vectors either): int32 sums (exact
// in any order) equal to the host's, outputs poisoned before each call.
TEST(ExposedRanges, AnnouncedReduceScattersAndAllReducesMatchTheReferenceWhateverEachRankExposed) {
  if (!eager_zero_copy_on()) GTEST_SKIP() << "runs with BRAID_EAGER_ZERO_COPY=1 (the eager_zero_copy entries)";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    const size_t counts[] = {(size_t(1) << 21) + 4, (size_t(5) << 20) + 4, (size_t(1) << 18) + 3};
    const size_t most = (size_t(5) << 20) + 4;
    VmmBuffer memory(2 * most * sizeof(int32_t) * world, comm.device());
    int32_t* const input = static_cast<int32_t*>(memory.pointer());
    int32_t* const output = input + most * world;
    const uint32_t seed = static_cast<uint32_t>(shared_seed(comm));
    for_each_exposing(comm, memory.pointer(), memory.bytes, [&](Exposing exposing) {
      for (const size_t count : counts) {
        for (const bool in_place : {false, true}) {
          const std::string what = std::string("exposing ") + std::to_string(exposing) + ", " + std::to_string(count) +
                                   " int32, " + (in_place ? "in place" : "out of place");
          const uint32_t round = seed + static_cast<uint32_t>(count * 5 + in_place + exposing * 13);
          // Reduce-scatter: count elements a rank block.
          EXPECT_EQ(reduce_scatter_wrong_sums(comm, input, in_place ? input + rank * count : output, count, round), 0u)
              << "reduce_scatter, " << what;
          // All-reduce: count elements.
          std::vector<int32_t> mine(count);
          std::vector<int32_t> seen(count);
          for (size_t i = 0; i < count; ++i) mine[i] = element(round + 1, rank, i) % 100000;
          cuda(cudaMemcpy(input, mine.data(), count * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
          int32_t* const out = in_place ? input : output;
          if (!in_place) cuda(cudaMemset(out, 0xA5, count * sizeof(int32_t)), "cudaMemset");
          comm.all_reduce(input, out, count, DataType::kInt32, ReduceOp::kSum, cudaStreamPerThread);
          finish_calls(comm);
          cuda(cudaMemcpy(seen.data(), out, count * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
          EXPECT_EQ(wrong_sums(seen, count, round + 1, world, 0, 100000), 0u) << "all_reduce, " << what;
        }
      }
    });
    device_synchronize();  // the VMM memory goes next
  });
}

// BRAID_EAGER_ZERO_COPY=1: eager all-gathers, reduce-scatters, all-reduces and all-to-alls at the sizes whose
// buffers the ranks exchange on the host (NOTE [exchanged sizes]; ranks as processes of their own: braid-run), on
// VMM memory that every rank, one rank or no rank registered (or every rank exposed at first use), out of place and
// in place: the copy engines where every rank's buffer is exposed and the call runs out of place (an all-reduce on
// 2 ranks in place too), the announced, zero-copy or staged paths elsewhere, the same results. The reduce-scatters' outputs reach the exchanged size once with every rank's input
// (pushes into the peers' outputs on 2 ranks) and once without. The all-reduces also run with rank 0 alone in place,
// which every rank must plan alike.
TEST(ExposedRanges, ExchangedCallsMatchTheReferenceWhateverEachRankExposed) {
  if (!eager_zero_copy_on()) GTEST_SKIP() << "runs with BRAID_EAGER_ZERO_COPY=1 (the eager_zero_copy entries)";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    const size_t least = (size_t(256) << 20) / sizeof(int32_t);  // elements of the least exchanged buffer
    const size_t gather_count = least / world + 4;               // a rank's block: the output just beyond it
    const size_t scatter_counts[] = {least / world + 4, least + 4};
    const size_t most = std::max(gather_count * world, (least + 4) * world);
    VmmBuffer memory(2 * most * sizeof(int32_t), comm.device());
    int32_t* const first = static_cast<int32_t*>(memory.pointer());
    int32_t* const second = first + most;
    const uint32_t seed = static_cast<uint32_t>(shared_seed(comm));
    for_each_exposing(comm, memory.pointer(), memory.bytes, [&](Exposing exposing) {
      for (const bool in_place : {false, true}) {
        const std::string how = std::string("exposing ") + std::to_string(exposing) + (in_place ? ", in place" : "");
        {  // All-gather into `second`.
          const uint32_t round = seed + static_cast<uint32_t>(in_place + exposing * 7);
          std::vector<int32_t> values(gather_count * world);
          for (size_t i = 0; i < gather_count; ++i) values[i] = element(round, rank, i);
          cuda(cudaMemset(second, 0xA5, values.size() * sizeof(int32_t)), "cudaMemset");
          int32_t* source = in_place ? second + rank * gather_count : first;
          cuda(cudaMemcpy(source, values.data(), gather_count * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
          comm.all_gather(source, second, gather_count, DataType::kInt32, cudaStreamPerThread);
          finish_calls(comm);
          cuda(cudaMemcpy(values.data(), second, values.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
               "cudaMemcpy");
          size_t wrong = 0;
          for (int q = 0; q < world; ++q) {
            for (size_t i = 0; i < gather_count; ++i) wrong += values[q * gather_count + i] != element(round, q, i);
          }
          EXPECT_EQ(wrong, 0u) << "all_gather, " << how;
        }
        for (const size_t count : scatter_counts) {  // Reduce-scatter of `first` (count elements a rank block).
          const uint32_t round = seed + static_cast<uint32_t>(count * 5 + in_place + exposing * 13);
          EXPECT_EQ(reduce_scatter_wrong_sums(comm, first, in_place ? first + rank * count : second, count, round), 0u)
              << "reduce_scatter of " << count << " int32 a rank, " << how;
        }
        for (const bool rank_zero_alone : {false, true}) {  // All-reduce of `first` into `second` or in place.
          const bool here_in_place = rank_zero_alone ? rank == 0 : in_place;
          if (rank_zero_alone && in_place) continue;
          const uint32_t round = seed + static_cast<uint32_t>(31 + in_place + rank_zero_alone * 2 + exposing * 17);
          std::vector<int32_t> values(least + 4);
          for (size_t i = 0; i < values.size(); ++i) values[i] = element(round, rank, i) % 100000;
          cuda(cudaMemcpy(first, values.data(), values.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
          int32_t* const out = here_in_place ? first : second;
          if (!here_in_place) cuda(cudaMemset(out, 0xA5, values.size() * sizeof(int32_t)), "cudaMemset");
          comm.all_reduce(first, out, values.size(), DataType::kInt32, ReduceOp::kSum, cudaStreamPerThread);
          finish_calls(comm);
          cuda(cudaMemcpy(values.data(), out, values.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
          EXPECT_EQ(wrong_sums(values, values.size(), round, world, 0, 100000), 0u)
              << "all_reduce, " << how << (rank_zero_alone ? ", rank 0 alone in place" : "");
        }
        {  // All-to-all from `first` into `second` (in place: in `second`), blocks of `block` elements.
          const size_t block = least / world + 4;
          const uint32_t round = seed + static_cast<uint32_t>(41 + in_place + exposing * 19);
          std::vector<int32_t> values(block * world);
          for (size_t i = 0; i < values.size(); ++i) values[i] = element(round, rank, i);  // block q goes to rank q
          int32_t* const source = in_place ? second : first;
          if (!in_place) cuda(cudaMemset(second, 0xA5, values.size() * sizeof(int32_t)), "cudaMemset");
          cuda(cudaMemcpy(source, values.data(), values.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
          comm.all_to_all(source, second, block, DataType::kInt32, cudaStreamPerThread);
          finish_calls(comm);
          cuda(cudaMemcpy(values.data(), second, values.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
          size_t wrong = 0;
          for (int q = 0; q < world; ++q) {  // block q here is what rank q sent to this rank
            for (size_t i = 0; i < block; ++i) wrong += values[q * block + i] != element(round, q, rank * block + i);
          }
          EXPECT_EQ(wrong, 0u) << "all_to_all, " << how;
        }
      }
    });
    device_synchronize();  // the VMM memory goes next
  });
}

// BRAID_EAGER_ZERO_COPY=1: unregistered buffers that several VMM allocations back side by side (PyTorch's expandable
// segments) are exposed at their first eager use (NOTE [automatic exposures]): an in-place all-reduce, an all-gather
// into and a reduce-scatter from such a buffer, spanning four allocations from the middle of one, equal the host's
// results with outputs poisoned first, and the calls leave one automatic exposure on every rank. Then every rank
// replaces one allocation under the buffer (unmaps it and maps a new one there, as an allocator that gives memory
// back does): the same calls on fresh data are right again, which they would not be if a peer still wrote into the
// allocation that went, and the buffer is exposed anew in place of the old exposure.
TEST(ExposedRanges, UnregisteredBuffersOfSeveralVmmAllocationsAreExposedAtFirstUseAndFollowTheirMemory) {
  if (!eager_zero_copy_on()) GTEST_SKIP() << "runs with BRAID_EAGER_ZERO_COPY=1 (the eager_zero_copy entries)";
  with_communicator([](Communicator& comm) {
    if (comm.size() == 1) GTEST_SKIP() << "one rank exposes nothing";
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    VmmBuffer memory(size_t(3) << 20, comm.device(), 6);  // six allocations of the granularity's multiple
    ASSERT_GE(memory.each * 3, size_t(4) << 20) << "the buffer must reach the size of automatic exposures";
    // The buffer: from the middle of allocation 0 to the middle of allocation 3.
    int32_t* const buffer = reinterpret_cast<int32_t*>(static_cast<char*>(memory.pointer()) + memory.each / 2);
    const size_t count = memory.each * 3 / sizeof(int32_t) / world * world;  // elements of the whole buffer
    const size_t block = count / world;
    int32_t* plain = nullptr;  // the all-gather's input and the reduce-scatter's output
    cuda(cudaMalloc(reinterpret_cast<void**>(&plain), count * sizeof(int32_t)), "cudaMalloc");
    const uint32_t seed = static_cast<uint32_t>(shared_seed(comm));
    auto run_calls = [&](uint32_t round, const std::string& when) {
      {  // All-reduce in place.
        std::vector<int32_t> values(count);
        for (size_t i = 0; i < count; ++i) values[i] = element(round, rank, i) % 100000;
        cuda(cudaMemcpy(buffer, values.data(), count * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
        comm.all_reduce(buffer, buffer, count, DataType::kInt32, ReduceOp::kSum, cudaStreamPerThread);
        finish_calls(comm);
        cuda(cudaMemcpy(values.data(), buffer, count * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
        EXPECT_EQ(wrong_sums(values, count, round, world, 0, 100000), 0u) << "all_reduce in place, " << when;
      }
      {  // All-gather into the buffer.
        std::vector<int32_t> values(count);
        for (size_t i = 0; i < block; ++i) values[i] = element(round + 1, rank, i);
        cuda(cudaMemcpy(plain, values.data(), block * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
        cuda(cudaMemset(buffer, 0xA5, count * sizeof(int32_t)), "cudaMemset");
        comm.all_gather(plain, buffer, block, DataType::kInt32, cudaStreamPerThread);
        finish_calls(comm);
        cuda(cudaMemcpy(values.data(), buffer, count * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
        size_t wrong = 0;
        for (int q = 0; q < world; ++q) {
          for (size_t i = 0; i < block; ++i) wrong += values[q * block + i] != element(round + 1, q, i);
        }
        EXPECT_EQ(wrong, 0u) << "all_gather, " << when;
      }
      EXPECT_EQ(reduce_scatter_wrong_sums(comm, buffer, plain, block, round + 2), 0u) << "reduce_scatter, " << when;
    };
    run_calls(seed, "first use");
    const RegistrationStats stats = comm.registration_stats();
    EXPECT_EQ(stats.exposed_at_first_use, 1u) << "the calls' buffer was not exposed automatically";
    EXPECT_EQ(stats.exposed, 1u) << "nothing else is exposed here";
    EXPECT_EQ(stats.peer_exposures, static_cast<uint64_t>(world - 1)) << "each peer's buffer, mapped here";
    device_synchronize();  // no work of any rank on the memory while it is replaced
    comm.barrier();
    memory.allocation.replace(1 + rank % 3);  // ranks replace different allocations under the buffer
    comm.barrier();
    run_calls(seed + 7, "after an allocation under the buffer was replaced");
    EXPECT_EQ(comm.registration_stats().exposed_at_first_use, 1u)
        << "the old exposure was not withdrawn, or the buffer not exposed anew";
    free_when_ranks_end(plain);
    device_synchronize();  // the VMM memory goes next
  });
}

// BRAID_EAGER_ZERO_COPY=1: eager all-to-alls (output and input announced) on VMM memory that every rank, one rank
// or no rank registered (or every rank exposed at first use), with no rank, rank 0 alone or every rank in place (every rank exposing: the
// stores, then the pair exchanges), at an announced size (NOTE [announced sizes]), one whose blocks are larger
// than a staging half's share (the staged rounds) and a small one (planned as staged): every block equal to what
// its sender sent, outputs poisoned first.
TEST(ExposedRanges, AnnouncedAllToAllsMatchTheReferenceWhateverEachRankExposed) {
  if (!eager_zero_copy_on()) GTEST_SKIP() << "runs with BRAID_EAGER_ZERO_COPY=1 (the eager_zero_copy entries)";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    const size_t counts[] = {(size_t(1) << 20) + 4, (size_t(5) << 20) + 4, (size_t(1) << 14) + 3};
    const size_t most = (size_t(5) << 20) + 4;
    VmmBuffer memory(2 * most * sizeof(int32_t) * world, comm.device());
    int32_t* const input = static_cast<int32_t*>(memory.pointer());
    int32_t* const output = input + most * world;
    const uint32_t seed = static_cast<uint32_t>(shared_seed(comm));
    for_each_exposing(comm, memory.pointer(), memory.bytes, [&](Exposing exposing) {
      for (const size_t count : counts) {
        for (const int ranks_in_place : {0, 1, world}) {
          const bool in_place = rank < ranks_in_place;
          const uint32_t round = seed + static_cast<uint32_t>(count * 7 + ranks_in_place * 3 + exposing * 17);
          std::vector<int32_t> mine(count * world);  // block q goes to rank q
          for (size_t i = 0; i < mine.size(); ++i) mine[i] = element(round, rank, i);
          cuda(cudaMemcpy(input, mine.data(), mine.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
          int32_t* out = in_place ? input : output;
          if (!in_place) cuda(cudaMemset(out, 0xA5, count * world * sizeof(int32_t)), "cudaMemset");
          comm.all_to_all(input, out, count, DataType::kInt32, cudaStreamPerThread);
          finish_calls(comm);
          std::vector<int32_t> seen(count * world);
          cuda(cudaMemcpy(seen.data(), out, seen.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
          size_t wrong = 0;
          for (int q = 0; q < world; ++q) {  // block q came from rank q, its block `rank`
            for (size_t i = 0; i < count; ++i) wrong += seen[q * count + i] != element(round, q, rank * count + i);
          }
          EXPECT_EQ(wrong, 0u) << "exposing " << exposing << ", " << count << " int32 a block, " << ranks_in_place
                               << " ranks in place, this one " << (in_place ? "in place" : "out of place");
        }
      }
    });
    device_synchronize();  // the VMM memory goes next
  });
}

// BRAID_EAGER_ZERO_COPY=1: every rank keeps a pool of registered VMM segments and, call after call, in an order of
// its own, frees one (deregistering it, sometimes right after a call that used it) and makes a new one of another
// size, and passes as the announced buffer (all-gather's output, reduce-scatter's input, all-reduce's buffer, in
// place) a segment, at an offset, or an unregistered buffer. Every call, zero copy or staged as the ranks'
// buffers fall, must equal the reference. Every size announces here (testing::announce_at_every_size): what is
// tested is the ranges' life, which the sizes where announcing pays would only make slower to reach.
TEST(ExposedRanges, AnnouncedCallsWhileRanksReplaceTheirSegmentsInOrdersOfTheirOwn) {
  if (!eager_zero_copy_on()) GTEST_SKIP() << "runs with BRAID_EAGER_ZERO_COPY=1 (the eager_zero_copy entries)";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    const size_t calls = ranks_share_gpus() ? 1000 : 10000;
    constexpr size_t kSegments = 4, kMaxCount = size_t(1) << 20;  // int32 a rank: 4 MiB
    const uint64_t seed = shared_seed(comm);
    std::mt19937_64 shared(seed);              // the same on every rank: the calls' counts
    std::mt19937_64 own(seed ^ (rank + 1) * 0x9E3779B97F4A7C15ull);  // this rank's choices
    struct Segment {
      std::unique_ptr<VmmBuffer> memory;
      RegisteredBuffer registration;
    };
    auto make_segment = [&] {
      const size_t bytes = (kMaxCount * world + (own() % kMaxCount) * world) * sizeof(int32_t) + 4096;  // offsets
      Segment segment{std::make_unique<VmmBuffer>(bytes, comm.device()), {}};
      segment.memory->synchronize_on_free = false;  // replaced after deregister, which waited for this rank's calls
      segment.registration = comm.register_buffer(segment.memory->pointer(), segment.memory->bytes);
      return segment;
    };
    // One rank a process sets the switch; it goes back when the body ends, even by an exception.
    struct EverySizeAnnounces {
      bool owner;
      explicit EverySizeAnnounces(bool setter) : owner(setter) {
        if (owner) announce_at_every_size(true);
      }
      ~EverySizeAnnounces() {
        if (owner) announce_at_every_size(false);
      }
    };
    comm.barrier();
    const EverySizeAnnounces every_size(rank == 0 || in_process_mode());
    comm.barrier();
    std::vector<Segment> pool;
    for (size_t i = 0; i < kSegments; ++i) pool.push_back(make_segment());
    auto replace = [&](size_t i) {
      comm.deregister(pool[i].registration);  // this rank's calls ended, every peer unmapped: free it
      pool[i] = make_segment();
    };
    int32_t* input = nullptr;
    int32_t* unexposed = nullptr;
    cuda(cudaMalloc(reinterpret_cast<void**>(&input), kMaxCount * sizeof(int32_t)), "cudaMalloc");
    cuda(cudaMalloc(reinterpret_cast<void**>(&unexposed), kMaxCount * world * sizeof(int32_t)), "cudaMalloc");
    std::vector<int32_t> mine(kMaxCount * world), seen(kMaxCount * world);
    size_t wrong = 0, calls_with_errors = 0;
    for (size_t call = 0; call < calls; ++call) {
      const size_t count = (kMaxCount / 4) + shared() % (kMaxCount - kMaxCount / 4);  // beyond LL at every world
      const uint64_t collective = shared() % 4;  // all-gather, reduce-scatter, all-reduce, all-to-all
      if (own() % 8 == 0) replace(own() % kSegments);
      // The buffer: a segment at a 16-byte offset, a segment at an odd offset (announced as staged), or unexposed.
      int32_t* buffer = unexposed;
      const uint64_t pick = own() % 10;
      const size_t i = own() % kSegments;
      if (pick < 7) buffer = static_cast<int32_t*>(pool[i].memory->pointer()) + (own() % 64) * 4;
      if (pick == 7) buffer = static_cast<int32_t*>(pool[i].memory->pointer()) + 1;
      const uint32_t round = static_cast<uint32_t>(seed + call);
      // All-to-all: blocks of count / world elements, its output the buffer (its input `unexposed`, unless the
      // buffer is: then in place).
      const size_t block = count / world;
      const size_t in_count = collective == 1 ? count * world : collective == 3 ? block * world : count;
      const size_t out_count = collective == 0 ? count * world : collective == 3 ? block * world : count;
      for (size_t k = 0; k < in_count; ++k) mine[k] = element(round, rank, k) % 100000;
      int32_t* in = collective == 0 ? input : collective == 3 ? unexposed : buffer;
      int32_t* out = collective == 0 ? buffer : collective == 1 ? input : buffer;
      cuda(cudaMemcpyAsync(in, mine.data(), in_count * sizeof(int32_t), cudaMemcpyHostToDevice, cudaStreamPerThread),
           "cudaMemcpyAsync");
      if (out != in) cuda(cudaMemsetAsync(out, 0xA5, out_count * sizeof(int32_t), cudaStreamPerThread), "cudaMemsetAsync");
      if (collective == 0) comm.all_gather(in, out, count, DataType::kInt32, cudaStreamPerThread);
      if (collective == 1) comm.reduce_scatter(in, out, count, DataType::kInt32, ReduceOp::kSum, cudaStreamPerThread);
      if (collective == 2) comm.all_reduce(in, out, count, DataType::kInt32, ReduceOp::kSum, cudaStreamPerThread);
      if (collective == 3) comm.all_to_all(in, out, block, DataType::kInt32, cudaStreamPerThread);
      finish_calls(comm);  // the call done before the copy to pageable memory (NOTE [shared-GPU waits], world.hpp)
      cuda(cudaMemcpy(seen.data(), out, out_count * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
      size_t here = 0;
      if (collective == 0 || collective == 3) {
        for (size_t k = 0; k < out_count; ++k) {
          const int32_t expected = collective == 0
                                       ? element(round, static_cast<int>(k / count), k % count) % 100000
                                       : element(round, static_cast<int>(k / block), rank * block + k % block) % 100000;
          here += seen[k] != expected;
        }
      } else {
        here = wrong_sums(seen, out_count, round, world, collective == 1 ? rank * count : 0, 100000);
      }
      wrong += here;
      calls_with_errors += here != 0;
      // Right after a peer used it: deregistering waits for this rank's calls and the peers' unmap.
      if (pick < 8 && own() % 16 == 0) replace(i);
    }
    EXPECT_EQ(wrong, 0u) << calls_with_errors << " of " << calls << " calls had wrong elements";
    for (size_t i = 0; i < kSegments; ++i) comm.deregister(pool[i].registration);
    comm.barrier();  // every rank's last call made before the switch goes back
    free_when_ranks_end(input);
    free_when_ranks_end(unexposed);
  });
}

}  // namespace
}  // namespace braid::testing
