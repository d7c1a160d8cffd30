// Collectives against a host reference, on every rank (threads or braid-run processes):
//   - a matrix per collective: every datatype × every valid op × sizes {0, 1, 7, 4097, 1 MiB + 3 bytes, and
//     for float32 and int8 one larger than the default staging buffer} × in place and out of place × aligned
//     and unaligned × roots {0, n-1} (every root at 7 elements), from cudaMalloc'd buffers;
//   - all_reduce and all_gather from symmetric memory (comm.alloc(): the zero-copy path);
//   - argument errors raised before anything is enqueued; integer avg refused; count 0 a no-op;
//   - a captured CUDA graph of mixed collectives replayed 1000 times, bit-identical to the eager run.
// Every case gets fresh random inputs (a seed from rank 0's std::random_device, shared), poisoned outputs
// (0xA5) and guard bytes around every buffer; afterwards the outputs must match the reference and every
// other byte (inputs, guards, a non-root's recv, other ranks' blocks) must be as it was. See
// collective_reference.hpp for the inputs and tolerances.
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "core/config.hpp"
#include "core/cuda_driver.hpp"
#include "memory/multicast.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

constexpr size_t kMaxReportedCases = 8;              // detailed failure lines per rank and test
constexpr size_t kOneMiBPlus3 = (size_t(1) << 20) + 3;  // bytes
// A rank block of whole 16-byte vectors whose reduce-scatter / all-gather exceeds the table's 4 MiB zero-copy
// cut-off on 2 ranks and more (bytes).
constexpr size_t kZeroCopyBlock = (size_t(2) << 20) + 16;
constexpr size_t kLargerThanStaging = size_t(48) << 20;  // bytes; the default staging buffer is 32 MiB per rank
// Every collective that has a copy-engine algorithm, forced onto it (CommOptions::algorithms).
const char* const kCopyEngineEverywhere =
    "allgather=copyengine,broadcast=copyengine,alltoall=copyengine,reducescatter=copyengine,reduce=copyengine,"
    "allreduce=copyengine";

// Runs body on a fresh communicator whose selection table is overridden by `algorithms` (CommOptions::algorithms).
void with_algorithms(const std::string& algorithms, const std::function<void(Communicator&)>& body) {
  CommOptions options = test_options();
  options.algorithms = algorithms;
  with_communicator(body, options);
}

// ---- The matrix ----

// Element counts for type: empty, one, odd, just over a 4 KiB page of floats, 1 MiB + 3 bytes' worth.
std::vector<size_t> matrix_sizes(DataType type) {
  const size_t element = datatype_size(type);
  return {0, 1, 7, 4097, (kOneMiBPlus3 + element - 1) / element};
}

// float32 and int8 (only, to keep time down) also run one size past the staging buffer, odd.
bool has_larger_than_staging(DataType type) { return type == DataType::kFloat32 || type == DataType::kInt8; }
size_t larger_than_staging_count(DataType type) { return kLargerThanStaging / datatype_size(type) + 1; }

struct Variant {
  bool in_place;
  bool aligned;
};
constexpr Variant kAllVariants[] = {{false, true}, {false, false}, {true, true}, {true, false}};
constexpr Variant kLargeVariants[] = {{false, true}, {true, false}};  // the large size: two of the four

// Roots for a case of `count` elements: none (0) for rootless collectives; 0 and n-1; every root at 7.
std::vector<int> roots_for(Collective collective, size_t count, int world) {
  if (!has_root(collective)) return {0};
  std::vector<int> roots;
  if (count == 7) {
    for (int root = 0; root < world; ++root) roots.push_back(root);
  } else {
    roots.push_back(0);
    if (world > 1) roots.push_back(world - 1);
  }
  return roots;
}

std::vector<Case> matrix(Collective collective, int world) {
  std::vector<Case> cases;
  auto add = [&](DataType type, ReduceOp op, size_t count, const Variant& variant) {
    for (int root : roots_for(collective, count, world)) {
      cases.push_back(Case{collective, type, op, count, root, variant.in_place, variant.aligned, 0});
    }
  };
  for (DataType type : kAllDataTypes) {
    const std::vector<ReduceOp> ops = is_reducing(collective) ? supported_ops(type) : std::vector<ReduceOp>{ReduceOp::kSum};
    for (ReduceOp op : ops) {
      for (size_t count : matrix_sizes(type)) {
        for (const Variant& variant : kAllVariants) add(type, op, count, variant);
      }
      if (has_larger_than_staging(type) && op == ReduceOp::kSum) {
        for (const Variant& variant : kLargeVariants) add(type, op, larger_than_staging_count(type), variant);
      }
    }
  }
  return cases;
}

// ---- Running cases one at a time ----

// NOTE [sampled matrices where ranks share GPUs]: ranks that share a GPU run each case several times slower, so
// there a matrix runs a sample of its cases, drawn with the seed every rank shares (a different sample each run):
// each collective's largest case (past the staging area where the matrix has one), then, in the matrix's order, up
// to shared_gpu_cases(world) of the rest (fewer at larger worlds, where each case costs more on the host and the
// GPU). Every collective, protocol and buffer kind of the test still runs; the datatype, op, size, root and placement
// of each case come from the draw.
size_t shared_gpu_cases(int world) { return std::min<size_t>(32, 128 / static_cast<size_t>(std::max(world, 1))); }

std::vector<Case> sampled_where_ranks_share_gpus(std::vector<Case> cases, uint64_t seed, int world) {
  const size_t sample = shared_gpu_cases(world);
  if (!ranks_share_gpus() || cases.size() <= sample) return cases;
  std::vector<bool> keep(cases.size(), false);
  for (size_t i = 0; i < cases.size(); ++i) {  // each collective's largest
    size_t largest = i;
    for (size_t j = 0; j < cases.size(); ++j) {
      if (cases[j].collective == cases[i].collective && cases[j].count > cases[largest].count) largest = j;
    }
    keep[largest] = true;
  }
  std::vector<size_t> rest;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (!keep[i]) rest.push_back(i);
  }
  std::mt19937_64 draw(seed ^ 0x5ca1ab1e5eedULL);
  std::shuffle(rest.begin(), rest.end(), draw);
  for (size_t i = 0; i < std::min(rest.size(), sample); ++i) keep[rest[i]] = true;
  std::vector<Case> sampled;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (keep[i]) sampled.push_back(cases[i]);
  }
  return sampled;
}

// Runs cases on one rank, one at a time: poison and inputs uploaded, the call, cudaStreamSynchronize,
// comm.check(), everything read back and checked. Reports failures with the rank (at most
// kMaxReportedCases in detail) and a count at the end.
class CaseRunner {
 public:
  CaseRunner(Communicator& comm, const Arenas& arenas, cudaStream_t stream)
      : comm_(comm), arenas_(arenas), stream_(stream) {}
  ~CaseRunner() {
    if (failed_ > 0) {
      ADD_FAILURE() << "rank " << comm_.rank() << ": " << failed_ << " of " << ran_ << " case(s) failed"
                    << (failed_ > kMaxReportedCases ? " (the first ones are reported above)" : "");
    }
  }
  CaseRunner(const CaseRunner&) = delete;
  CaseRunner& operator=(const CaseRunner&) = delete;

  // False when the call raised a device-side failure (kTimeout, kRemoteError): the communicator is then
  // unusable and the caller should stop.
  bool run(const Case& c) {
    Batch batch(comm_.rank(), comm_.size());
    if (!batch.add(c, arenas_.send_capacity, arenas_.recv_capacity)) {
      throw std::logic_error("case does not fit the arenas: " + describe(c));
    }
    batch.initial_images(initial_send_, initial_recv_);
    upload(arenas_, initial_send_, initial_recv_, stream_);
    ++ran_;
    try {
      launch(comm_, c, batch.send_pointer(0, arenas_.send, arenas_.recv), batch.recv_pointer(0, arenas_.send, arenas_.recv),
             stream_);
      cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after the collective");
      comm_.check();
    } catch (const Error& error) {
      fail("rank " + std::to_string(comm_.rank()) + ": " + describe(c) + " threw (" + error_code_name(error.code()) +
           "): " + error.what());
      return error.code() != ErrorCode::kTimeout && error.code() != ErrorCode::kRemoteError;
    }
    send_.resize(initial_send_.size());
    recv_.resize(initial_recv_.size());
    download(arenas_, send_, recv_, stream_);
    size_t failed = 0;
    std::vector<std::string> lines = batch.check(initial_send_, initial_recv_, send_.data(), recv_.data(), 1, &failed);
    if (failed > 0) fail(lines.at(0));
    return true;
  }

  size_t ran() const { return ran_; }

 private:
  void fail(const std::string& line) {
    if (failed_++ < kMaxReportedCases) ADD_FAILURE() << line;
  }

  Communicator& comm_;
  Arenas arenas_;
  cudaStream_t stream_;
  size_t ran_ = 0;
  size_t failed_ = 0;
  std::vector<unsigned char> initial_send_, initial_recv_, send_, recv_;
};

// Runs `cases` (seeded here) from cudaMalloc'd buffers on every rank.
void run_cases(Communicator& comm, std::vector<Case> cases, const char* label) {
  const uint64_t seed = shared_seed(comm);
  cases = sampled_where_ranks_share_gpus(std::move(cases), seed, comm.size());
  seed_cases(cases, seed);
  size_t send_capacity = 0, recv_capacity = 0;
  capacities(cases, comm.size(), send_capacity, recv_capacity);
  DeviceBuffer send(send_capacity), recv(recv_capacity);
  StreamHandle stream;
  CaseRunner runner(comm, Arenas{send.get(), recv.get(), send_capacity, recv_capacity}, stream.get());
  for (const Case& c : cases) {
    if (!runner.run(c)) break;
  }
  if (comm.rank() == 0) std::printf("[collectives] %s: %zu case(s) on %d rank(s)\n", label, runner.ran(), comm.size());
}

void run_matrix(Collective collective) {
  with_communicator([&](Communicator& comm) { run_cases(comm, matrix(collective, comm.size()), collective_name(collective)); });
}

// ---- The reference itself (host only) ----

TEST(CollectiveReference, EncodingsWrapAroundAndInputRangesAreRight) {
  EXPECT_EQ(encode_exact(DataType::kFloat16, 1.0), 0x3C00u);
  EXPECT_EQ(encode_exact(DataType::kFloat16, -2.0), 0xC000u);
  EXPECT_EQ(encode_exact(DataType::kFloat16, 1.5), 0x3E00u);
  EXPECT_EQ(encode_exact(DataType::kFloat16, std::ldexp(1.0, -10)), 0x1400u);
  EXPECT_EQ(encode_exact(DataType::kFloat16, 0.0), 0x0000u);
  EXPECT_EQ(encode_exact(DataType::kBFloat16, 1.0), 0x3F80u);
  EXPECT_EQ(encode_exact(DataType::kBFloat16, -0.5), 0xBF00u);
  EXPECT_EQ(encode_exact(DataType::kFloat32, 0.75), 0x3F400000u);
  EXPECT_THROW(encode_exact(DataType::kFloat16, 1.0 + 1.0 / 4096), std::logic_error);
  EXPECT_THROW(encode_exact(DataType::kBFloat16, 1.0 + 1.0 / 1024), std::logic_error);
  EXPECT_EQ(decode_float(DataType::kFloat16, 0x3C00), 1.0);
  EXPECT_EQ(decode_float(DataType::kFloat16, 0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(decode_float(DataType::kFloat16, 0x7BFF), 65504.0);
  EXPECT_EQ(decode_float(DataType::kFloat16, 0xA5A5), -1445.0 / 65536.0);  // the poison
  EXPECT_TRUE(std::isinf(decode_float(DataType::kFloat16, 0x7C00)));
  EXPECT_TRUE(std::isnan(decode_float(DataType::kFloat16, 0x7E00)));
  EXPECT_EQ(decode_float(DataType::kBFloat16, 0x3F80), 1.0);
  EXPECT_EQ(encode_exact(DataType::kFloat8E4M3, 1.0), 0x38u);
  EXPECT_EQ(encode_exact(DataType::kFloat8E4M3, -0.125), 0xA0u);
  EXPECT_EQ(encode_exact(DataType::kFloat8E5M2, 1.0), 0x3Cu);
  EXPECT_EQ(encode_exact(DataType::kFloat8E5M2, 0.75), 0x3Au);
  EXPECT_THROW(encode_exact(DataType::kFloat8E4M3, 1.0 + 1.0 / 16), std::logic_error);
  EXPECT_THROW(encode_exact(DataType::kFloat8E5M2, 1.0 + 1.0 / 8), std::logic_error);
  EXPECT_EQ(decode_float(DataType::kFloat8E4M3, 0x7E), 448.0);  // e4m3's largest: no infinity
  EXPECT_TRUE(std::isnan(decode_float(DataType::kFloat8E4M3, 0x7F)));
  EXPECT_EQ(decode_float(DataType::kFloat8E4M3, 0xA5), -13.0 / 64.0);  // the poison
  EXPECT_TRUE(std::isinf(decode_float(DataType::kFloat8E5M2, 0x7C)));
  EXPECT_EQ(decode_float(DataType::kFloat8E5M2, 0x01), std::ldexp(1.0, -16));  // subnormal

  EXPECT_EQ(reduce_integer(DataType::kInt8, ReduceOp::kSum, {100, 100}), 0xC8u);  // -56
  EXPECT_EQ(reduce_integer(DataType::kUint8, ReduceOp::kSum, {200, 100}), 44u);
  EXPECT_EQ(reduce_integer(DataType::kInt8, ReduceOp::kMax, {0x80, 0x01}), 0x01u);   // -128 < 1
  EXPECT_EQ(reduce_integer(DataType::kUint8, ReduceOp::kMax, {0x80, 0x01}), 0x80u);  // 128 > 1
  EXPECT_EQ(reduce_integer(DataType::kInt8, ReduceOp::kMin, {0x80, 0x01}), 0x80u);
  EXPECT_EQ(reduce_integer(DataType::kInt32, ReduceOp::kProd, {0x10001, 0x10001}), 0x20001u);
  EXPECT_EQ(reduce_integer(DataType::kInt64, ReduceOp::kMin, {UINT64_MAX, 5}), UINT64_MAX);  // -1 < 5
  EXPECT_EQ(reduce_integer(DataType::kUint64, ReduceOp::kMin, {UINT64_MAX, 5}), 5u);
  EXPECT_EQ(reduce_integer(DataType::kUint64, ReduceOp::kSum, {UINT64_MAX, 2}), 1u);
  const unsigned char minus_56 = 0xC8;
  EXPECT_NE(format_element(DataType::kInt8, &minus_56).find("-56"), std::string::npos);

  // Every floating input is exactly representable (fill_input throws otherwise) and in range.
  for (DataType type : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                        DataType::kFloat8E4M3, DataType::kFloat8E5M2}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd}) {
      Case c{Collective::kAllReduce, type, op, 0, 0, false, true, 12345};
      const size_t n = 100000, element = datatype_size(type);
      std::vector<unsigned char> bytes(n * element);
      fill_input(c, 3, 0, n, bytes.data());
      for (size_t i = 0; i < n; ++i) {
        uint64_t bits = 0;
        std::memcpy(&bits, bytes.data() + i * element, element);
        const double magnitude = std::fabs(decode_float(type, bits));
        const bool in_range = op == ReduceOp::kProd ? magnitude >= 0.5 && magnitude <= 1.5 : magnitude <= 1.0;
        ASSERT_TRUE(in_range) << datatype_name(type) << " " << reduce_op_name(op) << " input " << i << " is " << magnitude;
      }
    }
  }
}

// An output of zeros passes fp8 e5m2 sums at 8 ranks element by element (their tolerance reaches the inputs'
// summed magnitude), but not the check of the summed errors; one rounded after every step, as a chain does, passes.
TEST(CollectiveReference, SummedErrorsRefuseZerosThatEachElementsToleranceAccepts) {
  constexpr int kWorld = 8;
  constexpr DataType kType = DataType::kFloat8E5M2;
  const Case c{Collective::kAllReduce, kType, ReduceOp::kSum, 1000, 0, false, true, 0x5E77ull};
  auto nearest_e5m2 = [](double value) {  // round to nearest, ties to the even code, finite
    return static_cast<uint64_t>(__nv_cvt_double_to_fp8(value, __NV_SATFINITE, __NV_E5M2));
  };
  std::vector<std::vector<unsigned char>> inputs(kWorld, std::vector<unsigned char>(c.count));
  for (int r = 0; r < kWorld; ++r) fill_input(c, r, 0, c.count, inputs[r].data());
  std::vector<unsigned char> chained(c.count);
  for (size_t i = 0; i < c.count; ++i) {
    double partial = decode_float(kType, inputs[0][i]);
    for (int r = 1; r < kWorld; ++r) partial = decode_float(kType, nearest_e5m2(partial + decode_float(kType, inputs[r][i])));
    chained[i] = static_cast<unsigned char>(nearest_e5m2(partial));
  }

  Batch batch(0, kWorld);
  ASSERT_TRUE(batch.add(c, SIZE_MAX, SIZE_MAX));
  std::vector<unsigned char> initial_send, initial_recv;
  batch.initial_images(initial_send, initial_recv);
  auto check_output = [&](const std::vector<unsigned char>& output) {
    std::vector<unsigned char> recv = initial_recv;
    std::memcpy(batch.recv_pointer(0, initial_send.data(), recv.data()), output.data(), output.size());
    return batch.check(initial_send, initial_recv, initial_send.data(), recv.data(), 1);
  };
  const std::vector<std::string> chained_lines = check_output(chained);
  EXPECT_TRUE(chained_lines.empty()) << chained_lines.front();
  const std::vector<std::string> zero_lines = check_output(std::vector<unsigned char>(c.count, 0));
  ASSERT_EQ(zero_lines.size(), 1u) << "an output of zeros passed";
  EXPECT_EQ(zero_lines[0].find("wrong output element"), std::string::npos) << "each element's tolerance refused a zero: "
                                                                           << zero_lines[0];
  EXPECT_NE(zero_lines[0].find("errors sum to"), std::string::npos) << zero_lines[0];
}

// ---- The matrix, per collective ----

TEST(Collectives, AllReduceMatrix) { run_matrix(Collective::kAllReduce); }

// The selection table picks one all-reduce algorithm per size; each must be right at every size, so the
// matrix runs again with each one forced (datatypes of every width, to keep time down).
// Runs body(comm, label) on a fresh communicator once per all-reduce algorithm, forced through
// CommOptions::algorithms; label names the forcing.
void with_each_all_reduce_algorithm(const std::function<void(Communicator&, const char*)>& body) {
  for (const char* algorithm : {"ll", "ll128", "oneshot", "twoshot"}) {
    const std::string algorithms = std::string("allreduce=") + algorithm;
    with_algorithms(algorithms, [&](Communicator& comm) { body(comm, algorithms.c_str()); });
  }
}

TEST(Collectives, AllReduceMatrixEveryAlgorithm) {
  with_each_all_reduce_algorithm([](Communicator& comm, const char* label) {
    std::vector<Case> cases;
    for (const Case& c : matrix(Collective::kAllReduce, comm.size())) {
      if (c.type == DataType::kInt8 || c.type == DataType::kBFloat16 || c.type == DataType::kFloat16 ||
          c.type == DataType::kFloat32 || c.type == DataType::kUint64 || c.type == DataType::kFloat64 ||
          c.type == DataType::kFloat8E4M3) {
        cases.push_back(c);
      }
    }
    run_cases(comm, cases, label);
  });
}
TEST(Collectives, ReduceMatrix) { run_matrix(Collective::kReduce); }
TEST(Collectives, ReduceScatterMatrix) { run_matrix(Collective::kReduceScatter); }
TEST(Collectives, AllGatherMatrix) { run_matrix(Collective::kAllGather); }

// The matrices of `collectives`, each on a communicator with `algorithms` forced (CommOptions::algorithms).
void run_forced_matrices(const std::string& algorithms, const std::string& label,
                         std::initializer_list<Collective> collectives) {
  with_algorithms(algorithms, [&](Communicator& comm) {
    for (Collective c : collectives) run_cases(comm, matrix(c, comm.size()), (label + " " + collective_name(c)).c_str());
  });
}

// Reduce-scatter and all-gather pushed through the pipeline FIFOs (not the table's choice yet): the same
// matrices with the algorithm forced.
TEST(Collectives, PipelinedReduceScatterAllGatherReduceAndBroadcastMatrices) {
  run_forced_matrices("reducescatter=pipelined,allgather=pipelined,reduce=pipelined,broadcast=pipelined", "pipelined",
                      {Collective::kReduceScatter, Collective::kAllGather, Collective::kReduce, Collective::kBroadcast});
}
// Staged reduce-scatter and all-gather, forced at every size: the table takes them between LL and the FIFOs, up to
// 32 MiB on some worlds, so every size must be right, including calls the staging area holds only in chunks.
TEST(Collectives, StagedReduceScatterAndAllGatherMatrices) {
  run_forced_matrices("reducescatter=staged,allgather=staged", "staged",
                      {Collective::kReduceScatter, Collective::kAllGather});
}
// Staged reduce, forced: the table takes LL below it and the pipelined reduce (pushes or the chain) above it.
TEST(Collectives, StagedReduceMatrix) { run_forced_matrices("reduce=staged", "staged", {Collective::kReduce}); }
// The two shot gathered by the root (BRAID_ALGO only: the chain rounds per step, this one once), forced at every
// size: every root, unaligned inputs read through a slot of the rank's own.
TEST(Collectives, TwoShotReduceMatrix) { run_forced_matrices("reduce=twoshot", "two shot", {Collective::kReduce}); }
// The same with LL forced: the table takes LL only for small calls; forced, every size must still be right,
// including blocks larger than an LL slot (several LL launches, each its own flag).
TEST(Collectives, LLReduceScatterAllGatherReduceAndBroadcastMatrices) {
  run_forced_matrices("reducescatter=ll,allgather=ll,reduce=ll,broadcast=ll", "LL",
                      {Collective::kReduceScatter, Collective::kAllGather, Collective::kReduce, Collective::kBroadcast});
}
TEST(Collectives, BroadcastMatrix) { run_matrix(Collective::kBroadcast); }
// The pipelined broadcast forced at every size: on two ranks the root pushes into its peer's FIFOs, on more the
// pieces go down a chain of every rank from the root (every root, so every position in the chain).
TEST(Collectives, PipelinedBroadcastMatrix) {
  run_forced_matrices("broadcast=pipelined", "pipelined", {Collective::kBroadcast});
}
// Copy engines forced on cudaMalloc'd buffers: all-gather, broadcast and reduce move as send/recv's copy-engine
// pairs through the peers' pipeline areas (copy_engine_pairs.hpp), at every size, in place and out, aligned or
// not, every root, every datatype and op (reduce: on 2 ranks, on more the planner takes its other algorithms).
TEST(Collectives, CopyEnginePairsMatrices) {
  run_forced_matrices(kCopyEngineEverywhere, "copy-engine pairs",
                      {Collective::kAllGather, Collective::kBroadcast, Collective::kReduce});
}
// Reduce-scatter's pairs at every world: beyond 2 ranks each receive reduces into the output so far, a rounding
// per peer that the reference's tolerance holds (NOTE [reduction pairs on more than 2 ranks] in send_recv.cpp).
TEST(Collectives, ReduceScatterCopyEnginePairsMatrix) {
  run_forced_matrices(kCopyEngineEverywhere, "copy-engine pairs", {Collective::kReduceScatter});
}
// All-reduce's pairs beyond 2 ranks (a reduce-scatter's pairs, then an all-gather's, in the output; BRAID_ALGO
// only): every datatype and op, in place and out, unaligned, counts that do not divide by the world.
TEST(Collectives, AllReduceCopyEnginePairsMatrix) {
  if (world_size() <= 2) GTEST_SKIP() << "all-reduce's copy-engine pairs serve more than 2 ranks";
  with_algorithms(kCopyEngineEverywhere, [&](Communicator& comm) {
    run_cases(comm, matrix(Collective::kAllReduce, comm.size()), "copy-engine pairs all_reduce");
  });
}
// The table takes LL for small broadcasts: the staged one forced, at every size.
TEST(Collectives, StagedBroadcastMatrix) { run_forced_matrices("broadcast=staged", "staged", {Collective::kBroadcast}); }
// Reduce and broadcast in two phases (BRAID_ALGO only), forced at every size and on every world: parts of one
// vector or none, tails, every root.
TEST(Collectives, SplitReduceAndBroadcastMatrices) {
  run_forced_matrices("reduce=split,broadcast=split", "split", {Collective::kReduce, Collective::kBroadcast});
}

// Every datatype of `types` × op × size (bytes, rounded up to whole elements) × variant of `collectives`.
const std::vector<DataType> kEveryType(std::begin(kAllDataTypes), std::end(kAllDataTypes));

std::vector<Case> cases_of(const std::vector<Collective>& collectives, const std::vector<DataType>& types,
                           const std::vector<size_t>& sizes) {
  std::vector<Case> cases;
  for (Collective collective : collectives) {
    for (DataType type : types) {
      const size_t element = datatype_size(type);
      const std::vector<ReduceOp> ops = is_reducing(collective) ? supported_ops(type) : std::vector<ReduceOp>{ReduceOp::kSum};
      for (ReduceOp op : ops) {
        for (size_t bytes : sizes) {
          const size_t count = std::max<size_t>(1, (bytes + element - 1) / element);
          for (const Variant& v : kAllVariants) cases.push_back(Case{collective, type, op, count, 0, v.in_place, v.aligned, 0});
        }
      }
    }
  }
  return cases;
}

// Runs seeded `cases` on arenas the caller made (symmetric or registered), then a barrier: no rank frees or
// deregisters its buffers while a peer may still map them in a case.
void run_cases_on(Communicator& comm, const std::vector<Case>& cases, const Arenas& arenas, const char* label) {
  {
    StreamHandle stream;
    CaseRunner runner(comm, arenas, stream.get());
    for (const Case& c : cases) {
      if (!runner.run(c)) {
        ADD_FAILURE() << label << ": stopped at the first failing case";
        break;
      }
    }
  }
  comm.barrier();
}

// Cases on buffers in symmetric memory (comm.alloc), at the same offsets on every rank: aligned all-reduces
// take the zero-copy two shot where the table picks it (unaligned ones, offset by one element, and the one shot
// stage);
// reduce-scatters and all-gathers whose rank blocks are whole 16-byte vectors take theirs where the table
// picks "pipelined".
void run_symmetric_cases(Communicator& comm, std::vector<Case> cases, const char* label) {
  const uint64_t seed = shared_seed(comm);
  cases = sampled_where_ranks_share_gpus(std::move(cases), seed, comm.size());
  seed_cases(cases, seed);
  size_t send_capacity = 0, recv_capacity = 0;
  capacities(cases, comm.size(), send_capacity, recv_capacity);
  SymmetricMemory send = comm.alloc(send_capacity);  // collective: the same size on every rank
  SymmetricMemory recv = comm.alloc(recv_capacity);
  run_cases_on(comm, cases, Arenas{send.local(), recv.local(), send_capacity, recv_capacity}, label);
}

TEST(Collectives, SymmetricMemoryBuffers) {
  with_communicator([](Communicator& comm) {
    run_symmetric_cases(comm,
                        cases_of({Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}, kEveryType,
                                 {1, 4097, kOneMiBPlus3, kZeroCopyBlock}),
                        "table");
  });
}

// Reduce-scatter and all-gather cases on cudaMalloc buffers registered with the communicator (legacy CUDA IPC
// mappings instead of a symmetric allocation).
void run_registered_reduce_scatter_and_all_gather(Communicator& comm, const std::vector<Collective>& collectives,
                                                  const char* label) {
  std::vector<Case> cases = cases_of(collectives, {DataType::kFloat32, DataType::kBFloat16, DataType::kInt8},
                                     {4097, kZeroCopyBlock});
  const uint64_t seed = shared_seed(comm);
  cases = sampled_where_ranks_share_gpus(std::move(cases), seed, comm.size());
  seed_cases(cases, seed);
  size_t send_capacity = 0, recv_capacity = 0;
  capacities(cases, comm.size(), send_capacity, recv_capacity);
  DeviceBuffer send(send_capacity), recv(recv_capacity);
  RegisteredBuffer send_registration = comm.register_buffer(send.get(), send_capacity);
  RegisteredBuffer recv_registration = comm.register_buffer(recv.get(), recv_capacity);
  run_cases_on(comm, cases, Arenas{send.get(), recv.get(), send_capacity, recv_capacity}, label);
  comm.deregister(send_registration);
  comm.deregister(recv_registration);
}

// The zero-copy kernels, by the selection table: kZeroCopyBlock takes them, 4097 bytes staging.
TEST(Collectives, RegisteredBuffersReduceScatterAndAllGather) {
  with_communicator([](Communicator& comm) {
    run_registered_reduce_scatter_and_all_gather(comm, {Collective::kReduceScatter, Collective::kAllGather},
                                                 "registered reduce_scatter/all_gather");
  });
}

// Copy engines forced: ranks as processes copy to and from the peers' IPC mappings; ranks as threads (another
// GPU's cudaMalloc memory of the same process) fall back to the zero-copy kernels.
TEST(Collectives, RegisteredBuffersCopyEngines) {
  with_algorithms(kCopyEngineEverywhere, [](Communicator& comm) {
    run_registered_reduce_scatter_and_all_gather(comm, {Collective::kAllGather, Collective::kBroadcast},
                                                 "registered buffers, copy engines");
  });
}

// Reduce-scatter and all-gather forced onto their zero-copy kernels ("pipelined" on buffers peers map) at every
// size: rank blocks of whole 16-byte vectors take them (16 B, 4 KiB + 16, kZeroCopyBlock: one vector, a tail
// after the blocks' split, many blocks), other sizes and the unaligned variants the FIFOs.
TEST(Collectives, SymmetricMemoryZeroCopyReduceScatterAndAllGather) {
  with_algorithms("reducescatter=pipelined,allgather=pipelined", [](Communicator& comm) {
    run_symmetric_cases(comm,
                        cases_of({Collective::kReduceScatter, Collective::kAllGather}, kEveryType,
                                 {16, 4096 + 16, kOneMiBPlus3, kZeroCopyBlock}),
                        "zero-copy reduce_scatter/all_gather");
  });
}

// Copy engines forced for all-gather, broadcast, all-reduce and reduce-scatter on symmetric buffers: they push
// into the peers' outputs (larger than a staging half too; all-reduce and reduce-scatter on 2 ranks out of place,
// in chunks; the unaligned variants reduce element by element). Sizes that are not whole 16-byte rank blocks, and
// the in-place variants, check the fallbacks (zero-copy kernels or FIFOs; reduce-scatter's pairs through the
// pipeline area; all-reduce on 2 ranks: the pairs, then pushes into the peer's buffer).
TEST(Collectives, SymmetricMemoryCopyEngineMatrices) {
  with_algorithms(kCopyEngineEverywhere, [](Communicator& comm) {
    const std::vector<Collective> collectives = {Collective::kAllGather, Collective::kBroadcast,
                                                 Collective::kAllReduce, Collective::kReduceScatter};
    std::vector<Case> cases = cases_of(collectives, kEveryType, {16, 4096 + 16, kOneMiBPlus3, kZeroCopyBlock});
    for (const Case& c : cases_of(collectives, {DataType::kFloat32, DataType::kInt8}, {kLargerThanStaging + 16})) {
      if (c.op == ReduceOp::kSum && (c.in_place != c.aligned)) cases.push_back(c);  // two variants, as the matrix
    }
    for (Case& c : cases) {
      if (has_root(c.collective) && c.count % 2 == 1) c.root = comm.size() - 1;  // roots other than 0 too
    }
    run_symmetric_cases(comm, cases, "copy engines");
  });
}

// An all-reduce in place on symmetric buffers of 2 ranks by the copy engines (NOTE [all-reduce in place by the copy
// engines]): forced at small sizes (one element, odd counts, halves that are not whole 256-byte pieces, unaligned),
// and where the table picks them beyond 64 MiB, up to a half of five pipeline slots and an odd tail, so every slot
// is used more than once; sum and avg, float32 and bfloat16, each against the host reference.
TEST(Collectives, AllReduceInPlaceByCopyEnginesOnTwoRanks) {
  if (world_size() != 2) GTEST_SKIP() << "the copy engines serve an all-reduce in place on 2 ranks";
  with_algorithms(kCopyEngineEverywhere, [](Communicator& comm) {
    constexpr size_t kMiB = size_t(1) << 20;
    std::vector<Case> cases;
    auto add = [&](DataType type, ReduceOp op, size_t bytes, bool aligned) {
      const size_t count = std::max<size_t>(1, bytes / datatype_size(type));
      cases.push_back(Case{Collective::kAllReduce, type, op, count, 0, true, aligned, 0});
    };
    for (const size_t bytes : {size_t(4), size_t(28), size_t(4097 * 4), kOneMiBPlus3 + 1}) {
      add(DataType::kFloat32, ReduceOp::kSum, bytes, true);
    }
    add(DataType::kFloat32, ReduceOp::kSum, 4097 * 4, false);
    add(DataType::kBFloat16, ReduceOp::kAvg, 6, true);
    add(DataType::kBFloat16, ReduceOp::kAvg, 64 * kMiB + 6, true);
    add(DataType::kBFloat16, ReduceOp::kSum, 96 * kMiB + 2, false);
    add(DataType::kFloat32, ReduceOp::kSum, 320 * kMiB + 12, true);  // a half of 5 slots of 32 MiB, and a tail
    run_symmetric_cases(comm, cases, "copy engines, all-reduce in place");
  });
}

// The multicast gate on real GPUs (off unless BRAID_ENABLE_MULTICAST=1): with BRAID_ENABLE_MULTICAST unset, making the
// communicators and running what multicast would serve (all-reduce, reduce and all-gather of float32 and
// bfloat16 in whole 16-byte vectors, beyond LL's sizes; the unaligned variants too) never reaches the driver's
// multicast entry points. The real driver table serves, its multicast entries replaced by counters that refuse
// without calling the driver, and the support query counted where it asks for multicast.
std::atomic<int> g_multicast_calls{0};

TEST(Collectives, MulticastGateHoldsWithTheVariableUnset) {
  ASSERT_FALSE(detail::multicast_enabled(Config::get()))
      << "BRAID_ENABLE_MULTICAST=1 in this run: never set it on a shared GPU host";
  static const DriverApi real = driver();
  DriverApi counted = real;
  counted.cuMulticastGetGranularity = [](size_t*, const CUmulticastObjectProp*, CUmulticastGranularity_flags) {
    ++g_multicast_calls;
    return CUDA_ERROR_NOT_PERMITTED;
  };
  counted.cuMulticastCreate = [](CUmemGenericAllocationHandle*, const CUmulticastObjectProp*) {
    ++g_multicast_calls;
    return CUDA_ERROR_NOT_PERMITTED;
  };
  counted.cuMulticastAddDevice = [](CUmemGenericAllocationHandle, CUdevice) {
    ++g_multicast_calls;
    return CUDA_ERROR_NOT_PERMITTED;
  };
  counted.cuMulticastBindAddr = [](CUmemGenericAllocationHandle, size_t, CUdeviceptr, size_t, unsigned long long) {
    ++g_multicast_calls;
    return CUDA_ERROR_NOT_PERMITTED;
  };
  counted.cuMulticastUnbind = [](CUmemGenericAllocationHandle, CUdevice, size_t, size_t) {
    ++g_multicast_calls;
    return CUDA_ERROR_NOT_PERMITTED;
  };
  counted.cuDeviceGetAttribute = [](int* value, CUdevice_attribute attribute, CUdevice device) {
    if (attribute == CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED) ++g_multicast_calls;
    return real.cuDeviceGetAttribute(value, attribute, device);
  };
  struct Restore {
    ~Restore() { set_driver_for_testing(nullptr); }
  } restore;
  set_driver_for_testing(&counted);
  with_communicator([](Communicator& comm) {
    EXPECT_FALSE(comm.uses_multicast()) << "rank " << comm.rank();
    run_cases(comm,
              cases_of({Collective::kAllReduce, Collective::kReduce, Collective::kAllGather},
                       {DataType::kFloat32, DataType::kBFloat16}, {size_t(1) << 20, (size_t(4) << 20) + 16}),
              "multicast gate closed");
  });
  EXPECT_EQ(g_multicast_calls.load(), 0) << "a closed gate reached a multicast entry point of the driver";
}

// Each all-reduce algorithm forced on symmetric buffers, with sizes that fill every block and leave tails; the
// largest (many blocks, 9 MiB + 5) for one type of each width only, since it is the slowest case by far.
TEST(Collectives, SymmetricMemoryAllReduceEveryAlgorithm) {
  with_each_all_reduce_algorithm([](Communicator& comm, const char* label) {
    std::vector<Case> cases = cases_of({Collective::kAllReduce}, kEveryType, {1, 33, 4097, kOneMiBPlus3});
    for (const Case& c : cases_of({Collective::kAllReduce}, {DataType::kInt8, DataType::kBFloat16, DataType::kFloat32,
                                                             DataType::kFloat64}, {(size_t(9) << 20) + 5})) {
      cases.push_back(c);
    }
    run_symmetric_cases(comm, cases, label);
  });
}

// ---- Argument errors ----

// `call` must throw braid::Error kInvalidArgument whose message contains `argument` (e.g. "'send'").
void expect_invalid_argument(int rank, const std::string& what, const char* argument, const std::function<void()>& call) {
  try {
    call();
    ADD_FAILURE() << "rank " << rank << ": " << what << " was accepted; expected kInvalidArgument naming " << argument;
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << "rank " << rank << ": " << what << ": " << error.what();
    EXPECT_NE(std::string(error.what()).find(argument), std::string::npos)
        << "rank " << rank << ": " << what << ": the message does not name " << argument << ": " << error.what();
  }
}

// After refused calls: nothing was enqueued (recv, poisoned before, is still poisoned) and the communicator
// still works (a valid all_reduce is right).
void expect_nothing_enqueued_and_still_usable(Communicator& comm, const DeviceBuffer& recv, cudaStream_t stream) {
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<unsigned char> bytes(recv.bytes());
  cuda_check(cudaMemcpy(bytes.data(), recv.get(), bytes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  const size_t written = bytes.size() - std::count(bytes.begin(), bytes.end(), kPoison);
  EXPECT_EQ(written, 0u) << "rank " << comm.rank() << ": a refused call wrote " << written << " byte(s) of recv";
  comm.check();
  run_cases(comm, {Case{Collective::kAllReduce, DataType::kFloat32, ReduceOp::kSum, 4097, 0, false, true, 0}},
            "after refused calls");
}

TEST(Collectives, ArgumentErrorsRaiseBeforeEnqueue) {
  with_communicator([](Communicator& comm) {
    const int rank = comm.rank(), world = comm.size();
    constexpr size_t n = 1024;
    StreamHandle stream;
    const cudaStream_t st = stream.get();
    DeviceBuffer send_buffer(n * 8 * world), recv_buffer(n * 8 * world);  // any type, any collective
    cuda_check(cudaMemset(recv_buffer.get(), kPoison, recv_buffer.bytes()), "cudaMemset");
    cuda_check(cudaMemset(send_buffer.get(), 0, send_buffer.bytes()), "cudaMemset");
    const void* s = send_buffer.get();
    void* r = recv_buffer.get();
    const DataType f32 = DataType::kFloat32;
    const ReduceOp sum = ReduceOp::kSum;

    // Null buffers with count > 0. reduce's recv and broadcast's send matter on the root: root = this rank.
    expect_invalid_argument(rank, "all_reduce(send = null)", "'send'", [&] { comm.all_reduce(nullptr, r, n, f32, sum, st); });
    expect_invalid_argument(rank, "all_reduce(recv = null)", "'recv'", [&] { comm.all_reduce(s, nullptr, n, f32, sum, st); });
    expect_invalid_argument(rank, "reduce(send = null)", "'send'", [&] { comm.reduce(nullptr, r, n, f32, sum, rank, st); });
    expect_invalid_argument(rank, "reduce(recv = null) on the root", "'recv'", [&] { comm.reduce(s, nullptr, n, f32, sum, rank, st); });
    expect_invalid_argument(rank, "reduce_scatter(send = null)", "'send'", [&] { comm.reduce_scatter(nullptr, r, n, f32, sum, st); });
    expect_invalid_argument(rank, "reduce_scatter(recv = null)", "'recv'", [&] { comm.reduce_scatter(s, nullptr, n, f32, sum, st); });
    expect_invalid_argument(rank, "all_gather(send = null)", "'send'", [&] { comm.all_gather(nullptr, r, n, f32, st); });
    expect_invalid_argument(rank, "all_gather(recv = null)", "'recv'", [&] { comm.all_gather(s, nullptr, n, f32, st); });
    expect_invalid_argument(rank, "broadcast(send = null) on the root", "'send'", [&] { comm.broadcast(nullptr, r, n, f32, rank, st); });
    expect_invalid_argument(rank, "broadcast(recv = null)", "'recv'", [&] { comm.broadcast(s, nullptr, n, f32, 0, st); });

    // Roots out of range.
    for (int root : {-1, world, world + 7}) {
      const std::string at = "(root = " + std::to_string(root) + ")";
      expect_invalid_argument(rank, "reduce" + at, "'root'", [&] { comm.reduce(s, r, n, f32, sum, root, st); });
      expect_invalid_argument(rank, "broadcast" + at, "'root'", [&] { comm.broadcast(s, r, n, f32, root, st); });
    }

    // Datatypes and ops outside their enums.
    for (int value : {-1, kDataTypeCount, 1000}) {
      const DataType bad = static_cast<DataType>(value);
      const std::string at = "(type = " + std::to_string(value) + ")";
      expect_invalid_argument(rank, "all_reduce" + at, "'type'", [&] { comm.all_reduce(s, r, n, bad, sum, st); });
      expect_invalid_argument(rank, "reduce" + at, "'type'", [&] { comm.reduce(s, r, n, bad, sum, 0, st); });
      expect_invalid_argument(rank, "reduce_scatter" + at, "'type'", [&] { comm.reduce_scatter(s, r, n, bad, sum, st); });
      expect_invalid_argument(rank, "all_gather" + at, "'type'", [&] { comm.all_gather(s, r, n, bad, st); });
      expect_invalid_argument(rank, "broadcast" + at, "'type'", [&] { comm.broadcast(s, r, n, bad, 0, st); });
    }
    for (int value : {-1, kReduceOpCount}) {
      const ReduceOp bad = static_cast<ReduceOp>(value);
      const std::string at = "(op = " + std::to_string(value) + ")";
      expect_invalid_argument(rank, "all_reduce" + at, "'op'", [&] { comm.all_reduce(s, r, n, f32, bad, st); });
      expect_invalid_argument(rank, "reduce" + at, "'op'", [&] { comm.reduce(s, r, n, f32, bad, 0, st); });
      expect_invalid_argument(rank, "reduce_scatter" + at, "'op'", [&] { comm.reduce_scatter(s, r, n, f32, bad, st); });
    }

    // Counts whose byte size overflows size_t (the message names 'count', 'recv_count' or 'send_count').
    const size_t overflowing = SIZE_MAX / 4 + 1;                         // × 4 bytes overflows
    const size_t overflowing_times_world = SIZE_MAX / (4 * size_t(world)) + 1;  // × world × 4 bytes overflows
    for (size_t count : {overflowing, SIZE_MAX}) {
      const std::string at = "(count = " + std::to_string(count) + ", float32)";
      expect_invalid_argument(rank, "all_reduce" + at, "count'", [&] { comm.all_reduce(s, r, count, f32, sum, st); });
      expect_invalid_argument(rank, "reduce" + at, "count'", [&] { comm.reduce(s, r, count, f32, sum, 0, st); });
      expect_invalid_argument(rank, "broadcast" + at, "count'", [&] { comm.broadcast(s, r, count, f32, 0, st); });
      expect_invalid_argument(rank, "reduce_scatter" + at, "count'", [&] { comm.reduce_scatter(s, r, count, f32, sum, st); });
      expect_invalid_argument(rank, "all_gather" + at, "count'", [&] { comm.all_gather(s, r, count, f32, st); });
    }
    const std::string at = "(count = " + std::to_string(overflowing_times_world) + ": world × count × 4 bytes overflows)";
    expect_invalid_argument(rank, "reduce_scatter" + at, "count'",
                            [&] { comm.reduce_scatter(s, r, overflowing_times_world, f32, sum, st); });
    expect_invalid_argument(rank, "all_gather" + at, "count'", [&] { comm.all_gather(s, r, overflowing_times_world, f32, st); });

    expect_nothing_enqueued_and_still_usable(comm, recv_buffer, st);
  });
}

// Average on an integer type is NCCL's: the sum, wrapped in the type's width, divided by the ranks and truncated
// toward zero. Inputs chosen so that sums are negative, not multiples of the world size, and (int8, uint8) wrap.
template <typename T>
void check_integer_average(Communicator& comm, DataType type, cudaStream_t stream) {
  using U = std::make_unsigned_t<T>;
  constexpr size_t n = 4099;
  const int world = comm.size();
  const auto input = [](int rank, size_t i) -> T {
    if constexpr (std::is_signed_v<T>) {
      if (i % 11 == 0) return static_cast<T>(100 + rank);  // int8: the sum of every rank wraps past 127
      return static_cast<T>(rank == 0 ? -static_cast<int>(i % 7) - 1 : static_cast<int>(i % 3));
    } else {
      if (i % 11 == 0) return static_cast<T>(200 + rank);  // uint8: wraps past 255
      return static_cast<T>(rank + i % 5);
    }
  };
  std::vector<T> mine(n), expected(n), got(n);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = input(comm.rank(), i);
    U sum = 0;
    for (int r = 0; r < world; ++r) sum = static_cast<U>(sum + static_cast<U>(input(r, i)));
    expected[i] = static_cast<T>(static_cast<T>(sum) / static_cast<T>(world));
  }
  DeviceBuffer send(n * sizeof(T)), recv(n * sizeof(T));
  cuda_check(cudaMemcpy(send.get(), mine.data(), n * sizeof(T), cudaMemcpyHostToDevice), "input");
  cuda_check(cudaMemset(recv.get(), kPoison, recv.bytes()), "poison");
  comm.all_reduce(send.get(), recv.get(), n, type, ReduceOp::kAvg, stream);
  cuda_check(cudaStreamSynchronize(stream), "all_reduce avg");
  cuda_check(cudaMemcpy(got.data(), recv.get(), n * sizeof(T), cudaMemcpyDeviceToHost), "output");
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != expected[i] && wrong++ == 0) {
      ADD_FAILURE() << "rank " << comm.rank() << ": all_reduce avg " << datatype_name(type) << " element " << i << ": got "
                    << static_cast<long long>(got[i]) << ", expected " << static_cast<long long>(expected[i]);
    }
  }
  EXPECT_EQ(wrong, 0u) << datatype_name(type);
}

TEST(Collectives, IntegerAverageIsTheWrappedSumDividedTowardZero) {
  with_communicator([](Communicator& comm) {
    StreamHandle stream;
    check_integer_average<int8_t>(comm, DataType::kInt8, stream.get());
    check_integer_average<uint8_t>(comm, DataType::kUint8, stream.get());
    check_integer_average<int32_t>(comm, DataType::kInt32, stream.get());
    check_integer_average<uint32_t>(comm, DataType::kUint32, stream.get());
    check_integer_average<int64_t>(comm, DataType::kInt64, stream.get());
    check_integer_average<uint64_t>(comm, DataType::kUint64, stream.get());
    comm.check();
  });
}

TEST(Collectives, ZeroCountIsANoOp) {
  with_communicator([](Communicator& comm) {
    StreamHandle stream;
    // With null buffers: valid, nothing to read or write.
    for (Collective collective : kAllCollectives) {
      for (DataType type : {DataType::kFloat32, DataType::kInt8}) {
        const Case c{collective, type, ReduceOp::kSum, 0, comm.size() - 1, false, true, 0};
        try {
          launch(comm, c, nullptr, nullptr, stream.get());
        } catch (const Error& error) {
          ADD_FAILURE() << "rank " << comm.rank() << ": " << describe(c) << " with null buffers threw: " << error.what();
        }
      }
    }
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    comm.check();
    // With real buffers (guards and poison must survive), in and out of place, then a real call: still in step.
    std::vector<Case> cases;
    for (Collective collective : kAllCollectives) {
      for (const Variant& v : kAllVariants) {
        cases.push_back(Case{collective, DataType::kFloat32, ReduceOp::kSum, 0, 0, v.in_place, v.aligned, 0});
      }
    }
    cases.push_back(Case{Collective::kAllReduce, DataType::kFloat32, ReduceOp::kSum, 4097, 0, false, true, 0});
    run_cases(comm, cases, "count 0");
  });
}

// ---- CUDA graphs ----

struct GraphHandles {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~GraphHandles() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

// Where two images first differ, in words (the batch names the case and buffer); "" when equal.
std::string first_difference(const Batch& batch, bool in_send_arena, const std::vector<unsigned char>& a,
                             const std::vector<unsigned char>& b) {
  const auto [at_a, at_b] = std::mismatch(a.begin(), a.end(), b.begin());
  if (at_a == a.end()) return "";
  const size_t offset = static_cast<size_t>(at_a - a.begin());
  const size_t differing = std::inner_product(a.begin(), a.end(), b.begin(), size_t(0), std::plus<>(),
                                              [](unsigned char x, unsigned char y) { return size_t(x != y); });
  return std::to_string(differing) + " byte(s) differ, first at " + batch.locate(in_send_arena, offset);
}

// Runs `sequence` eagerly (checked against the reference), then captures it once and replays the graph 1000
// times after poisoning the outputs once: the replays must leave the same bytes as the eager run. Buffers are
// cudaMalloc memory, or symmetric memory (comm.alloc) when `symmetric`.
void check_graph_replays_match_eager(Communicator& comm, std::vector<Case> sequence, bool symmetric) {
  const int rank = comm.rank(), world = comm.size();
  seed_cases(sequence, shared_seed(comm));
  Batch batch(rank, world);
  for (const Case& c : sequence) batch.add(c, SIZE_MAX, SIZE_MAX);
  std::optional<DeviceBuffer> send_memory, recv_memory;
  SymmetricMemory send_symmetric, recv_symmetric;
  void* send = nullptr;
  void* recv = nullptr;
  if (symmetric) {
    send_symmetric = comm.alloc(batch.send_span());  // the same spans on every rank
    recv_symmetric = comm.alloc(batch.recv_span());
    send = send_symmetric.local();
    recv = recv_symmetric.local();
  } else {
    send = send_memory.emplace(batch.send_span()).get();
    recv = recv_memory.emplace(batch.recv_span()).get();
  }
  const Arenas arenas{send, recv, batch.send_span(), batch.recv_span()};
  {
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    auto enqueue_sequence = [&] {
      for (size_t i = 0; i < batch.size(); ++i) {
        launch(comm, batch.at(i), batch.send_pointer(i, send, recv), batch.recv_pointer(i, send, recv), stream);
      }
    };

    // Eager: the results, checked against the reference and kept.
    std::vector<unsigned char> initial_send, initial_recv;
    batch.initial_images(initial_send, initial_recv);
    upload(arenas, initial_send, initial_recv, stream);
    enqueue_sequence();
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (eager)");
    comm.check();
    std::vector<unsigned char> eager_send(initial_send.size()), eager_recv(initial_recv.size());
    download(arenas, eager_send, eager_recv, stream);
    for (const std::string& line : batch.check(initial_send, initial_recv, eager_send.data(), eager_recv.data(), 10)) {
      ADD_FAILURE() << "eager run: " << line;
    }

    // Captured once, replayed 1000 times after the outputs are poisoned once.
    GraphHandles graph;
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    enqueue_sequence();
    cuda_check(cudaStreamEndCapture(stream, &graph.graph), "cudaStreamEndCapture");
    graph.exec = instantiate_on_every_rank(graph.graph, stream);
    upload(arenas, initial_send, initial_recv, stream);  // inputs as they were, outputs poisoned
    constexpr int kReplays = 1000;
    replay_graph(graph.exec, stream, kReplays);
    comm.check();
    std::vector<unsigned char> replay_send(initial_send.size()), replay_recv(initial_recv.size());
    download(arenas, replay_send, replay_recv, stream);

    // Same algorithm, same order, same inputs: bit-identical to the eager run.
    const std::string send_difference = first_difference(batch, true, eager_send, replay_send);
    const std::string recv_difference = first_difference(batch, false, eager_recv, replay_recv);
    EXPECT_TRUE(send_difference.empty()) << "rank " << rank << ": after " << kReplays << " replays, send: " << send_difference;
    EXPECT_TRUE(recv_difference.empty()) << "rank " << rank << ": after " << kReplays << " replays, recv: " << recv_difference;
  }
  comm.barrier();  // no rank frees symmetric buffers while a peer's copies may still reach them
}

// Short names for the graph tests' case lists.
using C = Collective;
using D = DataType;
using O = ReduceOp;

TEST(Collectives, GraphCaptureReplaysMatchEager) {
  with_communicator([](Communicator& comm) {
    const int bcast_root = 1 % comm.size();
    // Mixed collectives, 1 KiB .. 4 MiB per rank, out of place (inputs stay as they are across replays).
    check_graph_replays_match_eager(comm,
                                    {
                                        {C::kAllReduce, D::kFloat32, O::kSum, (4u << 20) / 4, 0, false, true, 0},
                                        {C::kAllGather, D::kBFloat16, O::kSum, (1u << 10) / 2, 0, false, true, 0},
                                        {C::kReduceScatter, D::kInt32, O::kMax, (256u << 10) / 4, 0, false, true, 0},
                                        {C::kBroadcast, D::kFloat32, O::kSum, (64u << 10) / 4, bcast_root, false, true, 0},
                                        {C::kReduce, D::kFloat16, O::kSum, (1u << 20) / 2, 0, false, true, 0},
                                        {C::kAllReduce, D::kFloat32, O::kSum, (1u << 10) / 4, 0, false, false, 0},
                                        {C::kAllGather, D::kBFloat16, O::kSum, (4u << 20) / 2, 0, false, true, 0},
                                        {C::kReduceScatter, D::kInt32, O::kMax, (1u << 10) / 4, 0, false, true, 0},
                                        {C::kBroadcast, D::kInt8, O::kSum, 4u << 20, bcast_root, false, true, 0},
                                        {C::kReduce, D::kFloat16, O::kSum, (4u << 10) / 2, 0, false, true, 0},
                                    },
                                    false);
  });
}

// The copy-engine collectives captured: the side stream's fork and join of the own block's copy, and the
// reductions' side streams (reduce-scatter's 20 MiB blocks: tapered chunks of 12 and 8 MiB; an all-reduce of
// 72 MiB in place: halves of a whole pipeline slot and a part of one, each chunk's push back on the third). An
// all-reduce in place replays as its eager call ran only where a second call leaves the first's result: avg.
TEST(Collectives, CopyEngineGraphCaptureReplaysMatchEager) {
  with_algorithms(kCopyEngineEverywhere, [](Communicator& comm) {
    const int last = comm.size() - 1;
    check_graph_replays_match_eager(comm,
                                    {
                                        {C::kAllGather, D::kBFloat16, O::kSum, (1u << 20) / 2, 0, false, true, 0},
                                        {C::kAllReduce, D::kBFloat16, O::kSum, (6u << 20) / 2 + 5, 0, false, true, 0},
                                        {C::kAllReduce, D::kFloat32, O::kAvg, (72u << 20) / 4 + 3, 0, true, true, 0},
                                        {C::kBroadcast, D::kFloat32, O::kSum, (4u << 20) / 4, last, false, true, 0},
                                        {C::kAllGather, D::kInt32, O::kSum, (16u << 10) / 4, 0, false, true, 0},
                                        {C::kReduceScatter, D::kBFloat16, O::kSum, (20u << 20) / 2 + 8, 0, false, true, 0},
                                        {C::kReduceScatter, D::kFloat32, O::kMax, (1u << 20) / 4, 0, false, false, 0},
                                    },
                                    true);
  });
}

// The same on cudaMalloc'd buffers. With automatic registration the captured calls take the engines into the
// registered outputs (ranks as processes; an all-reduce in place its pairs, then pushes into the peer's buffer)
// or the zero-copy kernels (threads); with BRAID_AUTO_REGISTER=0, the pairs through the peers' pipeline areas,
// whose forks and joins of the communicator's side streams the capture must follow (the all-reduces, which have
// no pairs on 2 ranks there, then take the table's choice).
TEST(Collectives, CopyEngineGraphCaptureReplaysMatchEagerOnCudaMallocBuffers) {
  with_algorithms(kCopyEngineEverywhere, [](Communicator& comm) {
    const int last = comm.size() - 1;
    check_graph_replays_match_eager(comm,
                                    {
                                        {C::kAllGather, D::kBFloat16, O::kSum, (1u << 20) / 2, 0, false, true, 0},
                                        {C::kBroadcast, D::kFloat32, O::kSum, (4u << 20) / 4 + 3, last, false, true, 0},
                                        {C::kAllGather, D::kInt32, O::kSum, (16u << 10) / 4 + 1, 0, true, true, 0},
                                        {C::kAllReduce, D::kFloat32, O::kAvg, (6u << 20) / 4 + 3, 0, false, true, 0},
                                        {C::kAllReduce, D::kBFloat16, O::kAvg, (72u << 20) / 2 + 1, 0, true, true, 0},
                                        {C::kReduceScatter, D::kBFloat16, O::kSum, (20u << 20) / 2 + 8, 0, false, true, 0},
                                        {C::kReduceScatter, D::kFloat32, O::kAvg, (1u << 20) / 4 + 4, 0, false, false, 0},
                                    },
                                    false);
  });
}

}  // namespace
}  // namespace braid::testing
