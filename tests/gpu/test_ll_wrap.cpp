// LL flags through their 32-bit wrap and through the periodic re-stamping, on every rank (threads or braid-run
// processes). An LL line's flag is its call's 64-bit sequence cut to 32 bits; a test hook (comm/test_hooks.hpp)
// starts a communicator's LL sequence just below the point of interest instead of making 2^32 calls:
//   - the wrap: the 6th call has sequence 2^32, flag 0 (what a never-written line shows);
//   - a re-stamping point past 2^32 (sequence 0 mod kLLRestampPeriod), with every line of the LL areas planted
//     with the flags of the calls 8 and 9 past it, as 2^32 calls without re-stamping would leave lines that no
//     call rewrote: the re-stamping must replace them before those calls poll them.
// For all-reduce (float32, bfloat16), reduce-scatter, all-gather, broadcast (roots 0 and 1) and all-to-all, forced
// onto LL: 16 calls each, every one larger than the one before (it polls lines no call wrote since the stamping),
// with fresh random inputs (never zero: planted lines hold zeros), poisoned outputs with a poisoned guard after
// each, and one rank late to every call (a device spin) so that the others poll lines before their data lands.
// Every output is compared with a host reference.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "kernels/ll_launch.hpp"
#include "spin_kernel.hpp"
#include "comm/test_hooks.hpp"
#include "test_helpers.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

constexpr uint64_t kTwoTo32 = uint64_t(1) << 32;
constexpr int kCalls = 16;
constexpr int kCallsBeforePoint = 5;         // the 6th call of a series has the sequence of interest
constexpr size_t kGuardBytes = 64;           // poisoned bytes after each output, which no call may write
constexpr uint32_t kLateRankSpinNs = 20000;  // how late one rank starts each call
constexpr size_t kMaxReportedLines = 4;      // per series and rank
const char* const kLLEverywhere = "allreduce=ll,reducescatter=ll,allgather=ll,broadcast=ll,alltoall=ll";

enum class Op { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kAllToAll };

struct Series {
  const char* name;
  Op op;
  DataType type;  // float32 or bfloat16 for the reductions (sum); uint8 for the others (any bytes)
  int root;       // broadcast only
};
constexpr Series kSeries[] = {
    {"all_reduce float32", Op::kAllReduce, DataType::kFloat32, 0},
    {"all_reduce bfloat16", Op::kAllReduce, DataType::kBFloat16, 0},
    {"reduce_scatter float32", Op::kReduceScatter, DataType::kFloat32, 0},
    {"all_gather", Op::kAllGather, DataType::kUint8, 0},
    {"broadcast from rank 0", Op::kBroadcast, DataType::kUint8, 0},
    {"broadcast from rank 1", Op::kBroadcast, DataType::kUint8, 1},
    {"all_to_all", Op::kAllToAll, DataType::kUint8, 0},
};

bool reduces(const Series& s) { return s.op == Op::kAllReduce || s.op == Op::kReduceScatter; }

// Elements of each rank block of call k: growing, 64 bytes to 16 KiB, odd byte counts for uint8.
size_t block_count(const Series& s, int k) {
  const size_t bytes = 64 * size_t(k + 1) * size_t(k + 1) + 4 * size_t(k);
  const size_t size = datatype_size(s.type);
  return bytes / size + (size == 1 ? 3 : 0);
}
size_t send_elements(const Series& s, size_t count, int world) {
  return s.op == Op::kReduceScatter || s.op == Op::kAllToAll ? count * world : count;
}
size_t recv_elements(const Series& s, size_t count, int world) {
  return s.op == Op::kAllGather || s.op == Op::kAllToAll ? count * world : count;
}

// A reduction input: magnitude in [1, 2), random sign, so that on up to 8 ranks every rank's term is at least
// 1/16 of the sum of magnitudes (a lost or stale term shows through the tolerance); never zero, never the poison.
void fill_reduction_inputs(DataType type, uint64_t key, size_t count, unsigned char* out) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t r = random_bits(key, i);
    if (type == DataType::kFloat32) {
      const uint32_t bits = static_cast<uint32_t>(r >> 63) << 31 | 127u << 23 | static_cast<uint32_t>(r & 0x7FFFFF);
      std::memcpy(out + i * 4, &bits, 4);
    } else {
      const uint16_t bits = static_cast<uint16_t>(static_cast<uint16_t>(r >> 63) << 15 | 127u << 7 | (r & 0x7F));
      std::memcpy(out + i * 2, &bits, 2);
    }
  }
}

double decode(DataType type, const unsigned char* element) {
  float value;
  if (type == DataType::kFloat32) {
    std::memcpy(&value, element, 4);
  } else {  // bfloat16: the high half of a float
    uint16_t half;
    std::memcpy(&half, element, 2);
    const uint32_t bits = static_cast<uint32_t>(half) << 16;
    std::memcpy(&value, &bits, 4);
  }
  return value;
}

// One call of a series: its rank block's count, its seed, and where its buffers lie in the arenas.
struct Call {
  size_t count = 0;
  uint64_t seed = 0;
  size_t send_offset = 0, send_bytes = 0;
  size_t recv_offset = 0, recv_bytes = 0;  // the output; kGuardBytes of poison follow it
};

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

void enqueue(Communicator& comm, const Series& s, const Call& call, const void* send, void* recv, cudaStream_t stream) {
  switch (s.op) {
    case Op::kAllReduce: comm.all_reduce(send, recv, call.count, s.type, ReduceOp::kSum, stream); return;
    case Op::kReduceScatter: comm.reduce_scatter(send, recv, call.count, s.type, ReduceOp::kSum, stream); return;
    case Op::kAllGather: comm.all_gather(send, recv, call.count, s.type, stream); return;
    case Op::kBroadcast: comm.broadcast(send, recv, call.count, s.type, s.root, stream); return;
    case Op::kAllToAll: comm.all_to_all(send, recv, call.count, s.type, stream); return;
  }
}

// What rank `rank`'s output of `call` must hold, from every rank's input, and checks `got` (output and guard).
// Returns a line describing the first wrong element and how many are wrong, or "" when all are right.
std::string check_call(const Series& s, const Call& call, int rank, int world,
                       const std::vector<std::vector<unsigned char>>& inputs, const unsigned char* got) {
  const size_t size = datatype_size(s.type), count = call.count;
  size_t wrong = 0;
  std::string first;
  auto note = [&](size_t index, const std::string& expected, const std::string& seen) {
    if (wrong++ == 0) first = "recv[" + std::to_string(index) + "] = " + seen + ", expected " + expected;
  };
  if (reduces(s)) {
    const double rtol = s.type == DataType::kFloat32 ? 1e-5 : 1e-2;  // bfloat16: one rounding of the float sum
    const size_t first_input = s.op == Op::kReduceScatter ? static_cast<size_t>(rank) * count : 0;
    for (size_t i = 0; i < count; ++i) {
      double sum = 0, magnitude = 0;
      for (int r = 0; r < world; ++r) {
        const double term = decode(s.type, inputs[r].data() + (first_input + i) * size);
        sum += term;
        magnitude += std::fabs(term);
      }
      const double value = decode(s.type, got + i * size);
      if (!(std::fabs(value - sum) <= rtol * magnitude)) note(i, std::to_string(sum), std::to_string(value));
    }
  } else {
    // Bytes: block r of the output (broadcast: the one block) comes from this byte range of rank r's input.
    const size_t blocks = s.op == Op::kBroadcast ? 1 : static_cast<size_t>(world);
    for (size_t block = 0; block < blocks; ++block) {
      const int from = s.op == Op::kBroadcast ? s.root : static_cast<int>(block);
      const size_t source = s.op == Op::kAllToAll ? static_cast<size_t>(rank) * count : 0;
      for (size_t i = 0; i < count; ++i) {
        const unsigned char expected = inputs[from][source + i], seen = got[block * count + i];
        if (seen != expected) note(block * count + i, std::to_string(expected), std::to_string(seen));
      }
    }
  }
  for (size_t i = 0; i < kGuardBytes; ++i) {
    if (got[call.recv_bytes + i] != kPoison) {
      note(call.recv_bytes / size + i / size, "the guard's poison", "written (guard byte " + std::to_string(i) + ")");
    }
  }
  if (wrong == 0) return "";
  return first + " (" + std::to_string(wrong) + " wrong)";
}

// Runs the 16 calls of series `s` from LL call count `calls_so_far`, the LL areas stamped as of `stamped_by`
// (set_ll_sequence), and checks every output. Returns false if a call raised (the communicator may be unusable).
bool run_series(Communicator& comm, const Series& s, uint64_t calls_so_far, uint64_t stamped_by, uint64_t seed,
                cudaStream_t stream) {
  const int world = comm.size(), rank = comm.rank();
  const size_t size = datatype_size(s.type);
  std::vector<Call> calls(kCalls);
  size_t send_total = 0, recv_total = 0;
  for (int k = 0; k < kCalls; ++k) {
    Call& call = calls[k];
    call.count = block_count(s, k);
    call.seed = mix64(seed + static_cast<uint64_t>(k));
    call.send_bytes = send_elements(s, call.count, world) * size;
    call.recv_bytes = recv_elements(s, call.count, world) * size;
    call.send_offset = send_total;
    call.recv_offset = recv_total;
    send_total += round_up_256(call.send_bytes);
    recv_total += round_up_256(call.recv_bytes + kGuardBytes);
  }
  // Every rank's inputs, call by call (each rank makes all of them: the reference needs them).
  std::vector<std::vector<std::vector<unsigned char>>> inputs(kCalls, std::vector<std::vector<unsigned char>>(world));
  std::vector<unsigned char> send_image(send_total, kPoison), recv_image(recv_total, kPoison);
  for (int k = 0; k < kCalls; ++k) {
    const Call& call = calls[k];
    for (int r = 0; r < world; ++r) {
      std::vector<unsigned char>& input = inputs[k][r];
      input.resize(call.send_bytes);
      const size_t elements = call.send_bytes / size;
      if (reduces(s)) {
        fill_reduction_inputs(s.type, input_key(call.seed, r), elements, input.data());
      } else {
        fill_inputs(s.type, input_key(call.seed, r), 0, elements, input.data());
      }
    }
    std::memcpy(send_image.data() + call.send_offset, inputs[k][rank].data(), call.send_bytes);
  }
  DeviceBuffer send(send_total), recv(recv_total);
  cuda_check(cudaMemcpy(send.get(), send_image.data(), send_total, cudaMemcpyHostToDevice), "cudaMemcpy inputs");
  cuda_check(cudaMemcpy(recv.get(), recv_image.data(), recv_total, cudaMemcpyHostToDevice), "cudaMemcpy poison");

  set_ll_sequence(comm, calls_so_far, stamped_by);
  try {
    for (int k = 0; k < kCalls; ++k) {
      const Call& call = calls[k];
      if (rank == k % world) cuda_check(spin_on_stream(stream, kLateRankSpinNs), "spin kernel launch");
      enqueue(comm, s, call, static_cast<const char*>(send.get()) + call.send_offset,
              static_cast<char*>(recv.get()) + call.recv_offset, stream);
    }
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the calls");
    comm.check();
  } catch (const Error& error) {
    ADD_FAILURE() << "rank " << rank << ": " << s.name << " threw (" << error_code_name(error.code())
                  << "): " << error.what();
    return false;
  }
  cuda_check(cudaMemcpy(recv_image.data(), recv.get(), recv_total, cudaMemcpyDeviceToHost), "cudaMemcpy outputs");

  size_t failed = 0;
  for (int k = 0; k < kCalls; ++k) {
    const Call& call = calls[k];
    const std::string line = check_call(s, call, rank, world, inputs[k], recv_image.data() + call.recv_offset);
    if (line.empty()) continue;
    if (failed++ < kMaxReportedLines) {
      const uint64_t sequence = calls_so_far + 1 + static_cast<uint64_t>(k);
      ADD_FAILURE() << "rank " << rank << ": " << s.name << ", call " << k << " (LL sequence " << sequence << ", flag "
                    << static_cast<uint32_t>(sequence) << ", " << call.count << " elements a block): " << line;
    }
  }
  if (failed > kMaxReportedLines) {
    ADD_FAILURE() << "rank " << rank << ": " << s.name << ": " << failed << " of " << kCalls << " calls wrong";
  }
  return true;
}

// Every series on one communicator (LL forced), each from LL call count `calls_so_far` with the areas stamped as
// of `stamped_by`. False where the communicator is not on the CUDA backend (LL runs there only): nothing ran.
bool run_every_series(const char* label, uint64_t calls_so_far, uint64_t stamped_by) {
  CommOptions options = test_options();
  options.algorithms = kLLEverywhere;
  std::atomic<bool> on_cuda{true};
  with_communicator(
      [&](Communicator& comm) {
        if (std::string(comm.backend()) != "cuda") {
          on_cuda = false;
          return;
        }
        const uint64_t seed = shared_seed(comm);
        StreamHandle stream;
        for (size_t i = 0; i < std::size(kSeries); ++i) {
          if (!run_series(comm, kSeries[i], calls_so_far, stamped_by, mix64(seed + i), stream.get())) break;
        }
        if (comm.rank() == 0) {
          std::printf("[ll_wrap] %s: %zu series of %d calls on %d ranks, LL sequences %llu to %llu\n", label,
                      std::size(kSeries), kCalls, comm.size(), static_cast<unsigned long long>(calls_so_far + 1),
                      static_cast<unsigned long long>(calls_so_far + kCalls));
        }
      },
      options);
  return on_cuda.load();
}

// The areas as calls leave them (stamped by the last two calls), through sequence 2^32: flag 0 on the 6th call,
// small flags after.
TEST(LLFlags, ThroughTheirWrap) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const uint64_t calls_so_far = kTwoTo32 - 1 - kCallsBeforePoint;
  if (!run_every_series("through the wrap", calls_so_far, calls_so_far - 1)) {
    GTEST_SKIP() << "the communicator is not on the CUDA backend, where LL runs";
  }
}

// Past 2^32, through a re-stamping point, with lines planted to pass for the data of the calls 8 and 9 past it
// (as written 2^32 calls earlier): the re-stamping on the point's two calls (one of each parity) must replace
// them first.
TEST(LLFlags, RestampingReplacesPlantedLines) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const uint64_t point = 5 * kernels::kLLRestampPeriod;
  static_assert(5 * kernels::kLLRestampPeriod > kTwoTo32, "the point lies past the wrap");
  const uint64_t calls_so_far = point - 1 - kCallsBeforePoint;
  if (!run_every_series("through a re-stamping point", calls_so_far, point + 8 - kTwoTo32)) {
    GTEST_SKIP() << "the communicator is not on the CUDA backend, where LL runs";
  }
}

}  // namespace
}  // namespace braid::testing
