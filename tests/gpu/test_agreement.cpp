// Every rank runs the same plan for a call, or the call fails on every rank with kMismatch (braid.hpp),
// on every rank (threads or braid-run processes): buffers of different kinds across ranks (cudaMalloc,
// symmetric memory at equal or unequal offsets, registered buffers) for calls whose algorithm depends on the buffer kind. Where the
// kinds lead to the same kernels the result must be right; where they lead to different plans, every rank must
// raise kMismatch naming both plans, and nothing must hang. A communicator is unusable after a mismatch, so each
// case has its own, lined up by a keeper communicator.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"  // DeviceBuffer, StreamHandle, mix64, shared_seed, kPoison
#include "collectives/selection.hpp"
#include "spin_kernel.hpp"  // hold_until_released
#include "world.hpp"

namespace braid::testing {
namespace {

// cudaMalloc; comm.alloc at offset 0; at offset 256; cudaMalloc registered with the communicator
enum class Kind { kDevice, kSymmetric, kSymmetricShifted, kRegistered };
enum class Call { kAllReduce, kAllGather, kReduceScatter, kAllToAll };

const char* call_name(Call call) {
  switch (call) {
    case Call::kAllReduce: return "all_reduce";
    case Call::kAllGather: return "all_gather";
    case Call::kReduceScatter: return "reduce_scatter";
    case Call::kAllToAll: return "all_to_all";
  }
  return "?";
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kDevice: return "cudaMalloc";
    case Kind::kSymmetric: return "symmetric";
    case Kind::kSymmetricShifted: return "symmetric+256";
    case Kind::kRegistered: return "registered";
  }
  return "?";
}

struct Scenario {
  Call call;
  size_t bytes;           // all-reduce and reduce-scatter: the input; all-gather: the output; all-to-all: world x its input
  Kind even;              // the buffers of even ranks
  Kind odd;               // of odd ranks
  bool mismatch;          // the kinds lead to different plans
  bool odd_in_place = false;  // odd ranks call in place (recv = send; reduce-scatter: send + rank x count)
  bool two_ranks_only = false;  // the plans differ on 2 ranks alone (rows of the table for 2 ranks)
};

::braid::Collective collective_id(Call call) {
  switch (call) {
    case Call::kAllReduce: return ::braid::Collective::kAllReduce;
    case Call::kAllGather: return ::braid::Collective::kAllGather;
    case Call::kReduceScatter: return ::braid::Collective::kReduceScatter;
    case Call::kAllToAll: return ::braid::Collective::kAllToAll;
  }
  return ::braid::Collective::kAllReduce;
}

std::string describe(const Scenario& s) {
  return std::string(call_name(s.call)) + " of " + std::to_string(s.bytes) + " bytes, even ranks " +
         kind_name(s.even) + ", odd ranks " + kind_name(s.odd) + (s.odd_in_place ? " in place" : "");
}

// Sizes where the selection table gives symmetric buffers zero-copy kernels and other buffers different ones,
// on 2 ranks and on more: barrier kernels against barrier kernels (all-reduce of 2 MiB: the zero-copy two shot
// against the staged one shot on 2 ranks, the pipelined two shot on more; 8 MiB all-gather output and
// reduce-scatter input: staged) and against FIFO pushes (all-reduce of 64 MiB,
// reduce-scatter of 32 MiB, all-to-all of 8 MiB); symmetric buffers at unequal offsets; and kinds that lead to
// the same kernels (equal kinds, and LL sizes: all-reduce of 64 and 384 KiB, all-gather and all-to-all of
// 256 KiB, where any mix runs LL lines and looks up no buffer), which must work. A registered buffer's first use beyond LL's sizes exchanges mappings on the
// host: a peer that passes another kind fails with it instead of leaving it waiting.
constexpr size_t kKiB = size_t(1) << 10, kMiB = size_t(1) << 20;
const Scenario kScenarios[] = {
    {Call::kAllReduce, 2 * kMiB, Kind::kDevice, Kind::kSymmetric, true},
    {Call::kAllReduce, 2 * kMiB, Kind::kSymmetric, Kind::kSymmetricShifted, true},
    {Call::kAllReduce, kMiB, Kind::kSymmetric, Kind::kSymmetric, false},
    {Call::kAllReduce, kMiB, Kind::kDevice, Kind::kDevice, false},
    {Call::kAllReduce, 64 * kKiB, Kind::kDevice, Kind::kSymmetric, false},
    {Call::kAllReduce, 64 * kKiB, Kind::kSymmetric, Kind::kSymmetricShifted, false},
    {Call::kAllReduce, 384 * kKiB, Kind::kSymmetric, Kind::kDevice, false},
    {Call::kAllReduce, 64 * kMiB, Kind::kDevice, Kind::kSymmetric, true},
    {Call::kAllGather, 8 * kMiB, Kind::kDevice, Kind::kSymmetric, true},
    {Call::kReduceScatter, 8 * kMiB, Kind::kSymmetric, Kind::kDevice, true},
    {Call::kReduceScatter, 8 * kMiB, Kind::kSymmetric, Kind::kSymmetricShifted, true},
    {Call::kReduceScatter, 32 * kMiB, Kind::kDevice, Kind::kSymmetric, true},
    {Call::kAllToAll, 8 * kMiB, Kind::kSymmetric, Kind::kDevice, true},
    {Call::kAllToAll, 8 * kMiB, Kind::kSymmetric, Kind::kSymmetric, false},
    {Call::kAllReduce, kMiB, Kind::kRegistered, Kind::kRegistered, false},
    {Call::kAllReduce, 2 * kMiB, Kind::kRegistered, Kind::kDevice, true},
    {Call::kAllReduce, 2 * kMiB, Kind::kSymmetric, Kind::kRegistered, true},
    {Call::kAllReduce, 64 * kKiB, Kind::kDevice, Kind::kRegistered, false},
    {Call::kAllReduce, 384 * kKiB, Kind::kRegistered, Kind::kDevice, false},
    {Call::kAllReduce, 64 * kMiB, Kind::kDevice, Kind::kRegistered, true},
    {Call::kAllGather, 8 * kMiB, Kind::kRegistered, Kind::kRegistered, false},
    {Call::kAllGather, 8 * kMiB, Kind::kRegistered, Kind::kDevice, true},
    {Call::kAllToAll, 8 * kMiB, Kind::kRegistered, Kind::kRegistered, false},
    {Call::kAllToAll, 8 * kMiB, Kind::kDevice, Kind::kRegistered, true},
    {Call::kAllGather, 256 * kKiB, Kind::kSymmetric, Kind::kRegistered, false},
    {Call::kAllToAll, 256 * kKiB, Kind::kRegistered, Kind::kDevice, false},
    // An all-to-all in place at 8 MiB runs staged whatever its buffers (its zero-copy kernels would overwrite
    // blocks that peers still read): in place on some ranks only, symmetric buffers plan differently.
    {Call::kAllToAll, 8 * kMiB, Kind::kSymmetric, Kind::kSymmetric, true, true},
    {Call::kAllToAll, 8 * kMiB, Kind::kDevice, Kind::kDevice, false, true},
    // Copy-engine pairs through the pipeline areas (2 ranks, buffers no peer maps: an all-to-all input beyond
    // 64 MiB, an all-gather output beyond 128 MiB) have an entry barrier that announces the plan: against FIFO
    // pushes (an all-to-all in place on odd ranks) and against the copy engines into symmetric outputs, a
    // mismatch; pairs on both sides, right. (An all-to-all input is bytes / world here.)
    {Call::kAllToAll, 144 * kMiB, Kind::kDevice, Kind::kDevice, true, true, true},
    {Call::kAllToAll, 144 * kMiB, Kind::kDevice, Kind::kDevice, false, false, true},
    {Call::kAllGather, 144 * kMiB, Kind::kDevice, Kind::kSymmetric, true, false, true},
    {Call::kAllGather, 144 * kMiB, Kind::kDevice, Kind::kDevice, false, false, true},
    // Reduce-scatter's copy engines (2 ranks, an input beyond 64 MiB on buffers no peer maps, beyond 128 MiB on
    // symmetric ones): pairs through the pipeline area against pushes into symmetric outputs, against pushes into
    // outputs at unequal offsets, and pushes against the pairs of a rank in place, a mismatch; pairs or pushes on
    // both sides, right (registered buffers: processes push, threads take the pairs, the same on every rank).
    {Call::kReduceScatter, 144 * kMiB, Kind::kDevice, Kind::kSymmetric, true, false, true},
    {Call::kReduceScatter, 144 * kMiB, Kind::kSymmetric, Kind::kSymmetricShifted, true, false, true},
    {Call::kReduceScatter, 144 * kMiB, Kind::kSymmetric, Kind::kSymmetric, true, true, true},
    {Call::kReduceScatter, 144 * kMiB, Kind::kDevice, Kind::kDevice, false, false, true},
    {Call::kReduceScatter, 144 * kMiB, Kind::kSymmetric, Kind::kSymmetric, false, false, true},
    {Call::kReduceScatter, 144 * kMiB, Kind::kRegistered, Kind::kRegistered, false, false, true},
    // The copy-engine all-reduce (2 ranks, beyond 64 MiB, on buffers the peer maps) has barriers that announce the
    // plan: against the FIFO two shot of cudaMalloc buffers and against the engines of a rank in place (whose
    // first pushes go as pairs), a mismatch; on both sides, right (registered buffers too: processes take the
    // engines, threads the two shot, the same on every rank).
    {Call::kAllReduce, 144 * kMiB, Kind::kSymmetric, Kind::kDevice, true, false, true},
    {Call::kAllReduce, 144 * kMiB, Kind::kSymmetric, Kind::kSymmetric, true, true, true},
    {Call::kAllReduce, 144 * kMiB, Kind::kSymmetric, Kind::kSymmetric, false, false, true},
    {Call::kAllReduce, 144 * kMiB, Kind::kRegistered, Kind::kRegistered, false, false, true},
    // The all-to-all in place by the copy engines (2 ranks, buffers the peer maps, beyond 64 MiB) swaps blocks
    // between barriers that announce the plan: against the pushes into symmetric outputs out of place, and
    // against copy-engine pairs of cudaMalloc buffers, a mismatch.
    {Call::kAllToAll, 144 * kMiB, Kind::kSymmetric, Kind::kSymmetric, true, true, true},
    {Call::kAllToAll, 144 * kMiB, Kind::kDevice, Kind::kSymmetric, true, true, true},
};

int32_t input_value(uint64_t seed, int rank, size_t i) {
  return static_cast<int32_t>(mix64(seed ^ mix64(static_cast<uint64_t>(rank) * 7919 + i)) % 100001) - 50000;
}

// Runs body(context, keeper) on every rank, with `keeper`, a communicator that lines the ranks up around the
// communicators a case makes (each case needs its own: a communicator is unusable after a mismatch), current on
// this thread; the ranks meet once more at the end.
void for_each_rank_with_keeper(const std::function<void(const RankContext&, Communicator&)>& body) {
  for_each_rank([&](const RankContext& context) {
    Communicator keeper = Communicator::init(context.rendezvous, test_options());
    make_current(keeper);
    body(context, keeper);
    keeper.barrier();
  });
}

TEST(Agreement, MixedBufferKindsGiveTheRightAnswerOrMismatchEverywhere) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_rank_with_keeper([](const RankContext& context, Communicator& keeper) {
    const uint64_t seed = shared_seed(keeper);
    const int rank = keeper.rank(), world = keeper.size();
    for (const Scenario& s : kScenarios) {
      if (s.two_ranks_only && world != 2) continue;
      // Elements: the API's count, and this rank's input and output.
      const size_t elements = s.bytes / 4, blocks = static_cast<size_t>(world);
      // A rank's block is a multiple of 16 bytes at any world: zero-copy kernels need aligned blocks, and an
      // unaligned one would send every kind down the same staged path (no mismatch to find).
      auto aligned = [](size_t n) { return n / 4 * 4; };
      size_t count = elements, in_count = elements, out_count = elements;
      if (s.call == Call::kAllGather) count = in_count = aligned(elements / blocks), out_count = count * blocks;
      if (s.call == Call::kReduceScatter) count = out_count = aligned(elements / blocks), in_count = count * blocks;
      if (s.call == Call::kAllToAll) count = aligned(elements / blocks / blocks), in_count = out_count = count * blocks;
      keeper.barrier();
      Communicator comm = Communicator::init(context.rendezvous, test_options(10.0));
      const Kind kind = rank % 2 == 0 ? s.even : s.odd;
      const size_t bytes = (in_count + out_count) * 4 + 4096;
      // Collective on every rank, whatever this rank's kind.
      SymmetricMemory symmetric = comm.alloc(bytes);
      DeviceBuffer device(bytes);
      const bool device_memory = kind == Kind::kDevice || kind == Kind::kRegistered;
      char* base_pointer = device_memory ? static_cast<char*>(device.get()) : static_cast<char*>(symmetric.local());
      if (kind == Kind::kSymmetricShifted) base_pointer += 256;
      RegisteredBuffer registered;  // released before comm
      if (kind == Kind::kRegistered) registered = comm.register_buffer(device.get(), bytes);
      int32_t* send = reinterpret_cast<int32_t*>(base_pointer);
      int32_t* recv = send + in_count;
      if (s.odd_in_place && rank % 2 == 1) recv = s.call == Call::kReduceScatter ? send + rank * count : send;
      std::vector<int32_t> input(in_count);
      for (size_t i = 0; i < in_count; ++i) input[i] = input_value(seed, rank, i);
      StreamHandle stream;
      cuda_check(cudaMemcpyAsync(send, input.data(), in_count * 4, cudaMemcpyHostToDevice, stream.get()), "upload");
      if (recv != send) cuda_check(cudaMemsetAsync(recv, kPoison, out_count * 4, stream.get()), "poison");
      host_barrier();  // every rank made its buffers and stream before any rank calls (NOTE [shared-GPU waits])
      std::string outcome = "ok", message;
      try {
        switch (s.call) {
          case Call::kAllReduce:
            comm.all_reduce(send, recv, count, DataType::kInt32, ReduceOp::kSum, stream.get());
            break;
          case Call::kAllGather: comm.all_gather(send, recv, count, DataType::kInt32, stream.get()); break;
          case Call::kReduceScatter:
            comm.reduce_scatter(send, recv, count, DataType::kInt32, ReduceOp::kSum, stream.get());
            break;
          case Call::kAllToAll: comm.all_to_all(send, recv, count, DataType::kInt32, stream.get()); break;
        }
        cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
        comm.check();
      } catch (const Error& error) {
        outcome = error.code() == ErrorCode::kMismatch ? "mismatch" : std::string("error ") + error.what();
        message = error.what();
      }
      const std::vector<std::string> outcomes = keeper.host_allgather(outcome);
      const std::vector<std::string> messages = keeper.host_allgather(message);
      std::string every_message;  // each failure names every rank's error, the first failure's cause among them
      for (int r = 0; r < world; ++r) {
        if (!messages[r].empty()) every_message += "\n  rank " + std::to_string(r) + ": " + messages[r];
      }
      // The scenarios' outcomes follow the table of the worlds it was swept on. Where this world's table takes LL
      // lines (the same kernels for every buffer kind), every rank must get the right answer; where it takes none
      // for mixed kinds that rely on lines elsewhere, the kinds may plan alike or not: every rank must end alike,
      // right or kMismatch.
      const size_t selection_bytes = 4 * (s.call == Call::kAllGather ? out_count : in_count);
      const bool ll_here = runs_ll(collective_id(s.call), selection_bytes, world, DataType::kInt32, "");
      if (ll_here) {
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(outcomes[r], "ok") << "rank " << r << ", LL lines, " << describe(s) << every_message;
        }
        if (outcome != "ok") continue;
      } else if (!s.mismatch && s.even != s.odd) {
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(outcomes[r], outcomes[0]) << "rank " << r << ", " << describe(s) << every_message;
        }
        EXPECT_TRUE(outcomes[0] == "ok" || outcomes[0] == "mismatch") << outcomes[0] << ", " << describe(s);
        if (outcome != "ok") continue;
      } else if (s.mismatch) {
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(outcomes[r], "mismatch") << "rank " << r << ", " << describe(s) << every_message;
        }
        if (outcome == "mismatch") {
          EXPECT_NE(message.find("different plans"), std::string::npos) << message;
        }
        continue;
      } else {
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(outcomes[r], "ok") << "rank " << r << ", " << describe(s) << every_message;
        }
        if (outcome != "ok") continue;
      }
      std::vector<int32_t> got(out_count);
      cuda_check(cudaMemcpy(got.data(), recv, out_count * 4, cudaMemcpyDeviceToHost), "download");
      size_t wrong = 0;
      for (size_t i = 0; i < out_count; ++i) {
        int32_t expected = 0;
        if (s.call == Call::kAllGather) {
          expected = input_value(seed, static_cast<int>(i / count), i % count);
        } else if (s.call == Call::kAllToAll) {
          expected = input_value(seed, static_cast<int>(i / count), rank * count + i % count);  // block rank of sender
        } else {
          const size_t at = s.call == Call::kReduceScatter ? rank * count + i : i;
          for (int r = 0; r < world; ++r) expected += input_value(seed, r, at);
        }
        wrong += got[i] != expected;
      }
      EXPECT_EQ(wrong, 0u) << "rank " << rank << ", " << describe(s) << ": " << wrong << " of " << out_count << " wrong";
    }
  });
}

// All-gathers whose output is 2 MiB run a barrier kernel, which announces its plan, and one of 16 KiB runs LL
// lines: the calls these tests make disagree by giving odd ranks another count. Where the table gives 2 MiB
// all-gathers of cudaMalloc buffers the FIFO pushes instead (the cost model's rows for 5 to 8 ranks), which by
// design cannot tell another count (docs/dev/protocol.md), the barrier-kernel call gathers symmetric memory: the
// zero-copy kernel's entry barrier announces the plan.
constexpr size_t kStagedGatherBytes = 2 * kMiB, kLLGatherBytes = 16 * kKiB;

bool staged_gather_on_device_memory(int world) {
  return select_algorithm(::braid::Collective::kAllGather, kStagedGatherBytes, world, DataType::kInt32, "").algorithm ==
         Algorithm::kStaged;
}

// The 16 KiB gather runs LL at every world: the premise of the tests below.
void expect_ll_gather(int world) {
  ASSERT_TRUE(runs_ll(::braid::Collective::kAllGather, kLLGatherBytes, world, DataType::kInt32, ""))
      << "an all-gather of " << kLLGatherBytes << " output bytes at " << world << " ranks";
}

// Buffers for a barrier-kernel all-gather of up to `send_bytes` in and `recv_bytes` out on every rank: cudaMalloc
// where that runs the staged kernel, else symmetric memory (collective: every rank makes it, of the same size).
struct BarrierGatherBuffers {
  BarrierGatherBuffers(Communicator& comm, size_t send_bytes, size_t recv_bytes) {
    if (staged_gather_on_device_memory(comm.size())) {
      device_send.emplace(send_bytes);
      device_recv.emplace(recv_bytes);
      send = device_send->get();
      recv = device_recv->get();
    } else {
      symmetric_send = comm.alloc(send_bytes);
      symmetric_recv = comm.alloc(recv_bytes);
      send = symmetric_send.local();
      recv = symmetric_recv.local();
    }
  }
  std::optional<DeviceBuffer> device_send, device_recv;
  SymmetricMemory symmetric_send, symmetric_recv;
  void* send = nullptr;
  void* recv = nullptr;
};

// int32 elements of each rank's all-gather input for an output of about `output_bytes`, more on odd ranks when
// `odd_ranks_differ` (a plan mismatch: another count). Whole 16-byte blocks, so that symmetric buffers take the
// zero-copy kernel at every world (2 MiB over 5 ranks is not: its gather would take the FIFO pushes).
size_t gather_count(size_t output_bytes, int rank, int world, bool odd_ranks_differ) {
  return output_bytes / 4 / world / 4 * 4 + (odd_ranks_differ && rank % 2 == 1 ? 64 : 0);
}

// Runs `call` (which enqueues on `stream`), waits for the stream and checks the communicator: "ok", "mismatch"
// (kMismatch) or "error " and the message.
std::string outcome_of(Communicator& comm, cudaStream_t stream, const std::function<void()>& call) {
  try {
    call();
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    comm.check();
  } catch (const Error& error) {
    return error.code() == ErrorCode::kMismatch ? "mismatch" : std::string("error ") + error.what();
  }
  return "ok";
}

// Every rank's outcome (gathered through `keeper`) must be a mismatch; `what` names the case.
void expect_mismatch_on_every_rank(Communicator& keeper, const std::string& outcome, const std::string& what) {
  const std::vector<std::string> outcomes = keeper.host_allgather(outcome);
  for (int r = 0; r < keeper.size(); ++r) EXPECT_EQ(outcomes[r], "mismatch") << "rank " << r << ": " << what;
}

// A kernel that starts on a rank whose communicator has already failed (its host enqueued the call before the
// failure landed) touches nothing: no output written, nothing sent to a peer. Each rank holds its stream, enqueues
// a call whose plans differ between ranks (an all-gather of another count on the odd ranks: staged barrier
// kernels on every rank), then a call every rank plans alike, then lets the stream go. The first call fails with
// kMismatch on every rank; the second must leave its poisoned output as it was, on every rank: an LL all-reduce,
// a staged all-gather and a pipelined all-reduce.
TEST(Agreement, CallsEnqueuedBeforeAFailureLandedTouchNothing) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_rank_with_keeper([](const RankContext& context, Communicator& keeper) {
    const uint64_t seed = shared_seed(keeper);
    const int rank = keeper.rank(), world = keeper.size();
    int* host_flag = nullptr;
    cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&host_flag), sizeof(int), cudaHostAllocMapped), "cudaHostAlloc");
    const std::unique_ptr<int, cudaError_t (*)(void*)> flag_owner(host_flag, cudaFreeHost);
    volatile int* const released = host_flag;
    struct Second {
      const char* what;
      bool gather;
      size_t bytes;  // all-reduce: the buffer; all-gather: the output
    };
    for (const Second& second : {Second{"LL all-reduce", false, 16 * kKiB}, Second{"staged all-gather", true, kStagedGatherBytes},
                                 Second{"pipelined all-reduce", false, 64 * kMiB}}) {
      keeper.barrier();
      Communicator comm = Communicator::init(context.rendezvous, test_options(10.0));
      const size_t first_count = gather_count(kStagedGatherBytes, rank, world, true);
      const size_t in_count = second.gather ? gather_count(second.bytes, rank, world, false) : second.bytes / 4;
      const size_t out_count = second.gather ? in_count * world : in_count;
      const size_t most_first_count = gather_count(kStagedGatherBytes, 1, world, true);  // the odd ranks'
      BarrierGatherBuffers first(comm, most_first_count * 4, most_first_count * 4 * world);
      DeviceBuffer second_send(in_count * 4), second_recv(out_count * 4);
      std::vector<int32_t> input(in_count);
      for (size_t i = 0; i < in_count; ++i) input[i] = input_value(seed, rank, i);
      cuda_check(cudaMemcpy(second_send.get(), input.data(), in_count * 4, cudaMemcpyHostToDevice), "upload");
      cuda_check(cudaMemset(first.send, 1, first_count * 4), "first input");
      cuda_check(cudaMemset(second_recv.get(), kPoison, out_count * 4), "poison");
      StreamHandle stream;
      host_barrier();  // every rank made its buffers and stream before any rank calls (NOTE [shared-GPU waits])
      *released = 0;
      cuda_check(hold_until_released(stream.get(), released, 5'000'000'000ull), "hold");
      std::string outcome = "ok";
      try {
        comm.all_gather(first.send, first.recv, first_count, DataType::kInt32, stream.get());
        if (second.gather) {
          comm.all_gather(second_send.get(), second_recv.get(), in_count, DataType::kInt32, stream.get());
        } else {
          comm.all_reduce(second_send.get(), second_recv.get(), in_count, DataType::kInt32, ReduceOp::kSum, stream.get());
        }
      } catch (const Error& error) {
        outcome = std::string("enqueue failed: ") + error.what();
      }
      *released = 1;
      cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
      if (outcome == "ok") {
        try {
          comm.check();
          outcome = "no failure";
        } catch (const Error& error) {
          outcome = error.code() == ErrorCode::kMismatch ? "mismatch" : std::string("error ") + error.what();
        }
      }
      expect_mismatch_on_every_rank(keeper, outcome, std::string("then a ") + second.what);
      std::vector<int32_t> got(out_count);
      cuda_check(cudaMemcpy(got.data(), second_recv.get(), out_count * 4, cudaMemcpyDeviceToHost), "download");
      int32_t poison = 0;
      std::memset(&poison, kPoison, sizeof poison);
      size_t written = 0;
      for (const int32_t value : got) written += value != poison;
      EXPECT_EQ(written, 0u) << "rank " << rank << ": the " << second.what << " enqueued behind the failed call wrote "
                             << written << " of " << out_count << " elements";
    }
  });
}

// An LL call polls for its peers' lines and announces nothing; a peer that runs a barrier kernel for the same call
// (another count: the staged all-gather) announces its plan, and the LL poll must answer it, so every rank fails
// with kMismatch well within the communicator's timeout instead of timing out (kTimeout).
TEST(Agreement, AnLLCallAgainstABarrierKernelIsAMismatchEverywhere) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_rank_with_keeper([](const RankContext& context, Communicator& keeper) {
    const int rank = keeper.rank(), world = keeper.size();
    keeper.barrier();
    expect_ll_gather(world);
    Communicator comm = Communicator::init(context.rendezvous, test_options(10.0));
    const size_t ll_count = gather_count(kLLGatherBytes, rank, world, false);
    const size_t barrier_count = gather_count(kStagedGatherBytes, rank, world, false);
    DeviceBuffer ll_send(ll_count * 4), ll_recv(ll_count * 4 * world);
    BarrierGatherBuffers barrier(comm, barrier_count * 4, barrier_count * 4 * world);
    const bool ll = rank % 2 == 0;
    void* send = ll ? ll_send.get() : barrier.send;
    void* recv = ll ? ll_recv.get() : barrier.recv;
    const size_t count = ll ? ll_count : barrier_count;
    cuda_check(cudaMemset(send, 1, count * 4), "input");
    StreamHandle stream;
    host_barrier();  // every rank made its buffers and stream before any rank calls (NOTE [shared-GPU waits])
    const std::string outcome = outcome_of(comm, stream.get(), [&] {
      comm.all_gather(send, recv, count, DataType::kInt32, stream.get());
    });
    expect_mismatch_on_every_rank(keeper, outcome, "all-gather of " + std::to_string(kLLGatherBytes) +
                                                       " output bytes on even ranks, " +
                                                       std::to_string(kStagedGatherBytes) + " on odd ones");
  });
}

// LL calls that differ in their count (odd ranks pass more elements) fail with kMismatch on every rank, through
// the plan lines every LL call exchanges: no rank finishes on a prefix of a longer peer's lines. Sizes that run
// LL or LL128 lines (checked first): an all-reduce of 4 KiB, one of 256 KiB (LL128 up to 4 ranks; 48 KiB where the
// table takes no lines for 256 KiB), an all-gather of 16 KiB output, a broadcast of 8 KiB.
TEST(Agreement, LLCallsOfAnotherCountAreAMismatchEverywhere) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for_each_rank_with_keeper([](const RankContext& context, Communicator& keeper) {
    const int rank = keeper.rank(), world = keeper.size();
    enum class Call { kAllReduce, kAllGather, kBroadcast };
    struct Case {
      const char* what;
      Call call;
      size_t bytes;  // all-reduce and broadcast: the buffer; all-gather: the output
    };
    // 256 KiB where that all-reduce runs LL or LL128 lines at this world, else 48 KiB (LL at every world).
    const size_t wide = runs_ll(::braid::Collective::kAllReduce, 256 * kKiB, world, DataType::kInt32, "") ? 256 * kKiB
                                                                                                       : 48 * kKiB;
    const std::string wide_name = "all-reduce of " + std::to_string(wide / kKiB) + " KiB";
    for (const Case& c : {Case{"LL all-reduce", Call::kAllReduce, 4 * kKiB}, Case{wide_name.c_str(), Call::kAllReduce, wide},
                          Case{"LL all-gather", Call::kAllGather, kLLGatherBytes}, Case{"LL broadcast", Call::kBroadcast, 8 * kKiB}}) {
      const ::braid::Collective id = c.call == Call::kAllReduce   ? ::braid::Collective::kAllReduce
                                     : c.call == Call::kAllGather ? ::braid::Collective::kAllGather
                                                                  : ::braid::Collective::kBroadcast;
      ASSERT_TRUE(runs_ll(id, c.bytes, world, DataType::kInt32, "")) << c.what << " at " << world << " ranks";
      keeper.barrier();
      Communicator comm = Communicator::init(context.rendezvous, test_options(10.0));
      const size_t extra = rank % 2 == 1 ? 16 : 0;  // elements
      const size_t count = (c.call == Call::kAllGather ? c.bytes / 4 / world : c.bytes / 4) + extra;
      DeviceBuffer send(count * 4), recv(count * 4 * world);
      cuda_check(cudaMemset(send.get(), 1, count * 4), "input");
      StreamHandle stream;
      host_barrier();  // every rank made its buffers and stream before any rank calls (NOTE [shared-GPU waits])
      const std::string outcome = outcome_of(comm, stream.get(), [&] {
        switch (c.call) {
          case Call::kAllReduce:
            comm.all_reduce(send.get(), recv.get(), count, DataType::kInt32, ReduceOp::kSum, stream.get());
            break;
          case Call::kAllGather: comm.all_gather(send.get(), recv.get(), count, DataType::kInt32, stream.get()); break;
          case Call::kBroadcast: comm.broadcast(send.get(), recv.get(), count, DataType::kInt32, 0, stream.get()); break;
        }
      });
      expect_mismatch_on_every_rank(keeper, outcome, std::string(c.what) + ", 16 more elements on odd ranks");
    }
  });
}


}  // namespace
}  // namespace braid::testing
