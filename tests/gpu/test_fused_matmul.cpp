// FusedMatmul (braid/fused_matmul.hpp) against a host reference. Inputs are multiples of 1/8 in [-1/2, 1/2], exact in
// bfloat16 and float16, so every float32 sum of products is exact whatever order cuBLASLt adds in: the reference
// rounds exactly what the GEMM rounds, and the checks allow one rounding step of slack (kAvg's scalars by 1/3 are
// not exact).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "braid/fused_matmul.hpp"
#include "half_bits.hpp"
#include "test_helpers.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

using Clock = std::chrono::steady_clock;

float round_to(DataType type, double value) {
  return type == DataType::kBFloat16 ? __bfloat162float(__float2bfloat16_rn(static_cast<float>(value)))
                                     : __half2float(__float2half_rn(static_cast<float>(value)));
}

float value_of(DataType type, uint16_t bits) {
  if (type == DataType::kBFloat16) {
    __nv_bfloat16 v;
    std::memcpy(&v, &bits, 2);
    return __bfloat162float(v);
  }
  __half v;
  std::memcpy(&v, &bits, 2);
  return __half2float(v);
}

// A host matrix of exact values and its device copy.
struct Matrix {
  size_t rows = 0, cols = 0;
  std::vector<float> host;
  void* device = nullptr;
  Matrix() = default;
  Matrix(const Matrix&) = delete;
  Matrix& operator=(const Matrix&) = delete;
  ~Matrix() {
    if (device != nullptr) free_when_ranks_end(device);
  }
};

void make_random(Matrix& m, size_t rows, size_t cols, DataType type, uint64_t seed) {
  m.rows = rows;
  m.cols = cols;
  m.host.resize(rows * cols);
  std::mt19937_64 random(seed);
  for (float& x : m.host) {
    int v = static_cast<int>(random() % 9) - 4;  // [-4, 4] / 8, never 0
    if (v == 0) v = 3;
    x = static_cast<float>(v) / 8.0f;
  }
  std::vector<uint16_t> bits(m.host.size());
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = bits_of(type, m.host[i]);
  if (m.device == nullptr) ASSERT_EQ(cudaMalloc(&m.device, std::max<size_t>(bits.size() * 2, 16)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(m.device, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  // From pageable memory the copy may return before its data lands; the calls' streams do not wait for it.
  ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
}

// `bytes` of device memory, every byte `value`.
void* filled(size_t bytes, int value) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 16)), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, value, bytes), cudaSuccess);
  // The memset runs on this thread's default stream, which the calls' non-blocking streams do not wait for.
  EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  return p;
}

void* poisoned(size_t bytes) { return filled(bytes, kPoison); }

std::vector<float> download(DataType type, const void* device, size_t count) {
  std::vector<uint16_t> bits(count);
  EXPECT_EQ(cudaMemcpy(bits.data(), device, count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = value_of(type, bits[i]);
  return values;
}

// Row r of A (rows x k) times B (k x n, row-major, or stored [n, k] when transposed), exactly.
double product(const float* a_row, const Matrix& b, bool transposed, size_t k, size_t n, size_t column) {
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += double(a_row[i]) * (transposed ? b.host[column * k + i] : b.host[i * n + column]);
  return sum;
}

// One rounding step of the type at `value`, the slack of each check.
bool close(DataType type, float got, double expected) {
  const double step = std::ldexp(std::max(std::fabs(expected), 1e-3), type == DataType::kBFloat16 ? -7 : -10);
  return std::fabs(got - expected) <= step;
}

struct Case {
  DataType type;
  Layout layout;
  size_t rows, k, n;  // rows: each rank's rows of A (all-gather) or of the output (reduce-scatter)
};

std::string describe(const Case& c) {
  return std::string(datatype_name(c.type)) + (c.layout == Layout::kTransposed ? " B^T" : " B") + " rows " +
         std::to_string(c.rows) + " k " + std::to_string(c.k) + " n " + std::to_string(c.n);
}

uint64_t seed_of(uint64_t base, int rank) { return base * 1000003ull + static_cast<uint64_t>(rank) * 7919ull; }

// all_gather_matmul of every rank's random shard, checked against the host product, a_gathered bit-exact.
// NOTE [shared-GPU waits] (world.hpp): every rank allocates before the barrier, so none allocates while a peer's call
// waits for it. `delayed_rank` sleeps `delay` after the barrier.
constexpr std::chrono::milliseconds kDelay(20);
void after_barrier(int rank, int delayed_rank, std::chrono::milliseconds delay) {
  host_barrier();
  if (rank == delayed_rank) std::this_thread::sleep_for(delay);
}

// Elements of an all_gather_matmul output `got` [M, N] that differ from the host product of the gathered shards and
// b; the first 3 are reported, labelled `what`.
size_t wrong_gathered_products(const std::vector<Matrix>& shards, const Matrix& b, const Case& c,
                               const std::vector<float>& got, const std::string& what) {
  size_t wrong = 0;
  for (size_t row = 0; row < shards.size() * c.rows; ++row) {
    const float* a_row = shards[row / c.rows].host.data() + (row % c.rows) * c.k;
    for (size_t j = 0; j < c.n; ++j) {
      const double expected = round_to(c.type, product(a_row, b, c.layout == Layout::kTransposed, c.k, c.n, j));
      if (!close(c.type, got[row * c.n + j], expected) && wrong++ < 3) {
        ADD_FAILURE() << what << ": out[" << row << ", " << j << "] = " << got[row * c.n + j] << ", expected "
                      << expected;
      }
    }
  }
  return wrong;
}

// Elements of a gathered A `got` [M, K] that differ from the shards.
size_t differing_gathered_a(const std::vector<Matrix>& shards, const Case& c, const std::vector<float>& got) {
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != shards[i / (c.rows * c.k)].host[i % (c.rows * c.k)];
  return differ;
}

void check_all_gather_matmul(FusedMatmul& fused, int rank, int world, const Case& c, uint64_t seed, cudaStream_t stream,
                             bool gather_a, int delayed_rank = -1, std::chrono::milliseconds delay = kDelay) {
  std::vector<Matrix> shards(world);
  for (int q = 0; q < world; ++q) make_random(shards[q], c.rows, c.k, c.type, seed_of(seed, q));
  Matrix b;
  make_random(b, c.layout == Layout::kTransposed ? c.n : c.k, c.layout == Layout::kTransposed ? c.k : c.n, c.type,
              seed_of(seed, 1000));
  const size_t m = c.rows * world;
  void* out = poisoned(m * c.n * 2);
  void* gathered = gather_a ? poisoned(m * c.k * 2) : nullptr;
  after_barrier(rank, delayed_rank, delay);
  fused.all_gather_matmul(shards[rank].device, c.rows, c.k, b.device, c.layout, c.n, out, gathered, c.type, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::string what = "rank " + std::to_string(rank) + " " + describe(c);
  EXPECT_EQ(wrong_gathered_products(shards, b, c, download(c.type, out, m * c.n), what), 0u) << what;
  if (gather_a) {
    EXPECT_EQ(differing_gathered_a(shards, c, download(c.type, gathered, m * c.k)), 0u) << what << ": a_gathered";
  }
  device_free(out);
  if (gathered != nullptr) device_free(gathered);
}

// How a reduce-scatter adds the peers' products beyond 2 ranks: the pieces round their sum once, the epilogue
// (BRAID_MATMUL_REDUCE_SCATTER=epilogue) keeps it in float32.
enum class PeersSum { kRounded, kFloat32 };

// The expected block `rank` of the reduce-scatter of every rank's a x B, rounded as the fused call rounds it.
std::vector<double> expected_reduce_scatter(const std::vector<Matrix>& as, const Matrix& b, const Case& c, int rank,
                                            int world, ReduceOp op, PeersSum peers_sum = PeersSum::kRounded) {
  std::vector<double> expected(c.rows * c.n);
  const bool transposed = c.layout == Layout::kTransposed;
  for (size_t i = 0; i < c.rows; ++i) {
    const size_t row = rank * c.rows + i;
    for (size_t j = 0; j < c.n; ++j) {
      double peers = 0, own = 0;
      for (int q = 0; q < world; ++q) {
        const double partial = product(as[q].host.data() + row * c.k, b, transposed, c.k, c.n, j);
        if (q == rank) own = partial;
        else peers += round_to(c.type, partial);  // each peer's product arrives in the datatype
      }
      if (world > 2 && peers_sum == PeersSum::kRounded) peers = round_to(c.type, peers);
      const double scale = op == ReduceOp::kAvg ? 1.0 / world : 1.0;
      expected[i * c.n + j] = round_to(c.type, scale * own + scale * peers);
    }
  }
  return expected;
}

void check_matmul_reduce_scatter(FusedMatmul& fused, int rank, int world, const Case& c, ReduceOp op, uint64_t seed,
                                 cudaStream_t stream, int delayed_rank = -1, PeersSum peers_sum = PeersSum::kRounded,
                                 std::chrono::milliseconds delay = kDelay) {
  const size_t m = c.rows * world;
  std::vector<Matrix> as(world);
  for (int q = 0; q < world; ++q) make_random(as[q], m, c.k, c.type, seed_of(seed, q));
  Matrix b;
  make_random(b, c.layout == Layout::kTransposed ? c.n : c.k, c.layout == Layout::kTransposed ? c.k : c.n, c.type,
              seed_of(seed, 1000));
  void* out = poisoned(c.rows * c.n * 2);
  after_barrier(rank, delayed_rank, delay);
  fused.matmul_reduce_scatter(as[rank].device, m, c.k, b.device, c.layout, c.n, out, c.type, op, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::vector<float> got = download(c.type, out, c.rows * c.n);
  const std::vector<double> expected = expected_reduce_scatter(as, b, c, rank, world, op, peers_sum);
  size_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!close(c.type, got[i], expected[i]) && wrong++ < 3) {
      ADD_FAILURE() << "rank " << rank << " " << describe(c) << " " << reduce_op_name(op) << ": out[" << i / c.n
                    << ", " << i % c.n << "] = " << got[i] << ", expected " << expected[i];
    }
  }
  EXPECT_EQ(wrong, 0u) << "rank " << rank << " " << describe(c) << " " << reduce_op_name(op);
  device_free(out);
}

// Shapes: small, odd (unaligned chunk rows and columns), one row a rank, and one past the first call's workspace.
const std::vector<Case> kCases = {
    {DataType::kBFloat16, Layout::kRowMajor, 64, 128, 96},  {DataType::kBFloat16, Layout::kTransposed, 64, 128, 96},
    {DataType::kFloat16, Layout::kRowMajor, 48, 64, 40},    {DataType::kFloat16, Layout::kTransposed, 37, 30, 18},
    {DataType::kBFloat16, Layout::kRowMajor, 1, 16, 8},     {DataType::kBFloat16, Layout::kTransposed, 37, 24, 56},
    {DataType::kBFloat16, Layout::kRowMajor, 256, 256, 136},
};

// This rank's FusedMatmul with `reserve` bytes of workspace, made by every rank before any calls (NOTE [shared-GPU
// waits]: the workspace is allocated collectively).
FusedMatmul reserved_fused(Communicator& comm, size_t reserve) {
  make_current(comm);
  FusedMatmul fused = FusedMatmul::create(comm);
  fused.reserve(reserve);
  host_barrier();
  return fused;
}

TEST(FusedMatmul, AllGatherMatmulMatchesTheHostReference) {
  with_communicator([](Communicator& comm) {
    FusedMatmul fused = reserved_fused(comm, size_t(8) << 20);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    uint64_t seed = 11;
    for (const Case& c : kCases) {
      check_all_gather_matmul(fused, comm.rank(), comm.size(), c, ++seed, stream, /*gather_a=*/seed % 2 == 0);
    }
    check_all_gather_matmul(fused, comm.rank(), comm.size(), kCases[0], ++seed, stream, /*gather_a=*/true);
  });
}

TEST(FusedMatmul, MatmulReduceScatterMatchesTheHostReference) {
  with_communicator([](Communicator& comm) {
    FusedMatmul fused = reserved_fused(comm, size_t(8) << 20);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    uint64_t seed = 101;
    for (const Case& c : kCases) {
      check_matmul_reduce_scatter(fused, comm.rank(), comm.size(), c, ++seed % 3 == 0 ? ReduceOp::kAvg : ReduceOp::kSum,
                                  seed, stream);
    }
    check_matmul_reduce_scatter(fused, comm.rank(), comm.size(), kCases[1], ReduceOp::kAvg, ++seed, stream);
  });
}

// One shape called through its algorithm trials and after it settles (NOTE [GEMM algorithm choice]: its first eager
// runs try cuBLASLt's first 4 candidates and, on a Hopper, braid's GEMM): every call equals the reference.
TEST(FusedMatmul, EveryCallIsRightThroughTheAlgorithmTrialsAndAfter) {
  with_communicator([](Communicator& comm) {
    FusedMatmul fused = reserved_fused(comm, size_t(8) << 20);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    const Case c{DataType::kBFloat16, Layout::kTransposed, 128, 256, 192};
    for (int call = 0; call < 20; ++call) {
      check_all_gather_matmul(fused, comm.rank(), comm.size(), c, 700 + call, stream, /*gather_a=*/false);
      check_matmul_reduce_scatter(fused, comm.rank(), comm.size(), c, ReduceOp::kSum, 800 + call, stream);
    }
  });
}

// Calls on two streams, a delayed rank, and a collective of the communicator between them: each result right.
TEST(FusedMatmul, CallsOnTwoStreamsWithADelayedRankStayOrdered) {
  with_communicator([](Communicator& comm) {
    FusedMatmul fused = reserved_fused(comm, size_t(8) << 20);
    StreamHandle first, second;
    const cudaStream_t streams[2] = {first.get(), second.get()};
    const Case c{DataType::kBFloat16, Layout::kTransposed, 96, 64, 80};
    for (int i = 0; i < 6; ++i) {
      const int delayed = i % comm.size();
      if (i % 2 == 0) {
        check_all_gather_matmul(fused, comm.rank(), comm.size(), c, 500 + i, streams[i % 2], true, delayed);
      } else {
        check_matmul_reduce_scatter(fused, comm.rank(), comm.size(), c, ReduceOp::kSum, 500 + i, streams[i % 2], delayed);
      }
    }
  });
}

// Both calls captured into one graph, replayed on new inputs: every replay equals the reference, also after
// reserve() grew the workspace (the graph keeps the one it captured).
TEST(FusedMatmul, GraphReplaysMatchTheReference) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    FusedMatmul fused = FusedMatmul::create(comm);
    const Case c{DataType::kBFloat16, Layout::kRowMajor, 40, 64, 48};
    const size_t m = c.rows * world;
    fused.reserve(size_t(4) << 20);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    std::vector<Matrix> shards(world), as(world);
    Matrix b;
    auto fill = [&](uint64_t seed) {
      for (int q = 0; q < world; ++q) {
        make_random(shards[q], c.rows, c.k, c.type, seed_of(seed, q));
        make_random(as[q], m, c.k, c.type, seed_of(seed + 1, q));
      }
      make_random(b, c.k, c.n, c.type, seed_of(seed, 1000));
    };
    fill(1);
    void* ag_out = poisoned(m * c.n * 2);
    void* rs_out = poisoned(c.rows * c.n * 2);
    host_barrier();
    GraphHandles graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    fused.all_gather_matmul(shards[rank].device, c.rows, c.k, b.device, c.layout, c.n, ag_out, nullptr, c.type, stream);
    fused.matmul_reduce_scatter(as[rank].device, m, c.k, b.device, c.layout, c.n, rs_out, c.type, ReduceOp::kSum, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph.graph), cudaSuccess);
    graph.exec = instantiate_on_every_rank(graph.graph, stream);
    for (uint64_t replay = 0; replay < 3; ++replay) {
      if (replay == 1) {  // a growth after the capture keeps the workspace the graph uses
        fused.reserve(fused.workspace_bytes() + (size_t(8) << 20));
        host_barrier();
      }
      fill(100 + 10 * replay);  // same device buffers, new values
      // On the graph's stream: a memset on the thread's default stream could land after the graph's first GEMM.
      ASSERT_EQ(cudaMemsetAsync(ag_out, kPoison, m * c.n * 2, stream), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(rs_out, kPoison, c.rows * c.n * 2, stream), cudaSuccess);
      host_barrier();
      ASSERT_EQ(cudaGraphLaunch(graph.exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      comm.check();  // a meeting that timed out inside the graph names itself before the data is judged
      const std::string what = "rank " + std::to_string(rank) + " replay " + std::to_string(replay);
      EXPECT_EQ(wrong_gathered_products(shards, b, c, download(c.type, ag_out, m * c.n), what), 0u)
          << what << ": all_gather_matmul";
      const std::vector<float> rs = download(c.type, rs_out, c.rows * c.n);
      const std::vector<double> expected = expected_reduce_scatter(as, b, c, rank, world, ReduceOp::kSum);
      size_t wrong = 0;
      for (size_t i = 0; i < rs.size(); ++i) wrong += !close(c.type, rs[i], expected[i]);
      EXPECT_EQ(wrong, 0u) << "rank " << rank << " replay " << replay << ": matmul_reduce_scatter";
      host_barrier();
    }
    device_free(ag_out);
    device_free(rs_out);
  });
}

// Products over k = 0 columns are zeros, eager on two streams (ordered as every call: the zeros land after the
// previous call's GEMMs on the other stream) and captured in a graph, whose capture ends joined.
TEST(FusedMatmul, ProductsOverNoColumnsAreZerosOrderedAndCapturable) {
  with_communicator([](Communicator& comm) {
    FusedMatmul fused = reserved_fused(comm, size_t(4) << 20);
    const int world = comm.size();
    StreamHandle first, second;
    const Case c{DataType::kBFloat16, Layout::kTransposed, 64, 96, 80};
    const size_t rows = c.rows, n = c.n, m = rows * world;
    void* ag_out = poisoned(m * n * 2);
    void* rs_out = poisoned(rows * n * 2);
    auto zeros = [&](const char* what) {
      size_t wrong = 0;
      for (float v : download(c.type, ag_out, m * n)) wrong += v != 0.0f;
      for (float v : download(c.type, rs_out, rows * n)) wrong += v != 0.0f;
      EXPECT_EQ(wrong, 0u) << "rank " << comm.rank() << ": " << what;
    };
    check_all_gather_matmul(fused, comm.rank(), world, c, 900, first.get(), /*gather_a=*/false);
    // Real calls into the outputs on the first stream, left running, then k = 0 into the same outputs on the
    // second: a call waits for the previous one where it names another stream, so the zeros come last.
    void* a = filled(m * c.k * 2, 0x3F);  // bfloat16 0x3F3F, about 0.75: products far from 0
    void* b = filled(n * c.k * 2, 0x3F);
    fused.all_gather_matmul(a, rows, c.k, b, c.layout, n, ag_out, nullptr, c.type, first.get());
    fused.matmul_reduce_scatter(a, m, c.k, b, c.layout, n, rs_out, c.type, ReduceOp::kSum, first.get());
    fused.all_gather_matmul(nullptr, rows, 0, nullptr, c.layout, n, ag_out, nullptr, c.type, second.get());
    fused.matmul_reduce_scatter(nullptr, m, 0, nullptr, c.layout, n, rs_out, c.type, ReduceOp::kSum, second.get());
    ASSERT_EQ(cudaStreamSynchronize(second.get()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(first.get()), cudaSuccess);
    zeros("eager");
    cudaFree(a);
    cudaFree(b);
    ASSERT_EQ(cudaMemsetAsync(ag_out, kPoison, m * n * 2, first.get()), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(rs_out, kPoison, rows * n * 2, first.get()), cudaSuccess);
    GraphHandles graph;
    ASSERT_EQ(cudaStreamBeginCapture(first.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    fused.all_gather_matmul(nullptr, rows, 0, nullptr, c.layout, n, ag_out, nullptr, c.type, first.get());
    fused.matmul_reduce_scatter(nullptr, m, 0, nullptr, c.layout, n, rs_out, c.type, ReduceOp::kAvg, first.get());
    ASSERT_EQ(cudaStreamEndCapture(first.get(), &graph.graph), cudaSuccess);
    graph.exec = instantiate_on_every_rank(graph.graph, first.get());
    ASSERT_EQ(cudaGraphLaunch(graph.exec, first.get()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(first.get()), cudaSuccess);
    zeros("graph");
    device_free(ag_out);
    device_free(rs_out);
  });
}

// A fused call in one launch of braid's Hopper GEMM (NOTE [one-launch choice]): the setting that asks for it.
struct OneLaunch {
  const char* variable;
  const char* value;
  const char* needs;  // why a test of it skips
};
constexpr OneLaunch kEpilogue{"BRAID_MATMUL_REDUCE_SCATTER", "epilogue",
                                  "needs BRAID_MATMUL_REDUCE_SCATTER=epilogue or engines, BRAID_GEMM_TUNING on and a "
                                  "GPU of compute capability 9.0"};
constexpr OneLaunch kEngines{"BRAID_MATMUL_REDUCE_SCATTER", "engines", kEpilogue.needs};
// The reduce-scatter in one launch of braid's Hopper GEMM that this process asks for: its epilogue's exchange, or
// the copy engines' (both counted by epilogue_reduce_scatters; the tests take either).
const OneLaunch& reduce_scatter_launch() {
  const char* choice = std::getenv("BRAID_MATMUL_REDUCE_SCATTER");
  return choice != nullptr && std::string(choice) == kEngines.value ? kEngines : kEpilogue;
}
constexpr OneLaunch kLoads{"BRAID_ALL_GATHER_MATMUL", "loads",
                           "needs BRAID_ALL_GATHER_MATMUL=loads, BRAID_GEMM_TUNING on and a GPU of compute capability "
                           "9.0"};

// Whether this process runs the call in one launch where the shape allows: asked for, on a GPU of compute
// capability 9.0, with braid's GEMM among the candidates.
bool one_launch_expected(const OneLaunch& launch, int device) {
  const char* choice = std::getenv(launch.variable);
  const char* tuning = std::getenv("BRAID_GEMM_TUNING");
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return choice != nullptr && std::string(choice) == launch.value &&
         (tuning == nullptr || std::string(tuning) == "on") && major == 9 && minor == 0;
}

// A call in one launch that its peer never joins, ended by the peer's revocation (within a second, not at the
// timeout) and, on a communicator with a 2 s timeout, by the timeout: the kernel ends, and the next call raises
// kRevoked or kTimeout naming the call (NOTE [stopped ranks]). Rank 1 waits; rank 0 made the first call with it
// (`first`: the agreement and the exchange area), then stays out. `call` enqueues the call on zeroed a, b and out of
// `bytes` each, `count` reads the FusedMatmul's count of calls in one launch, `name` is the call's name, and
// `timeout_names` what a timeout may name: the call, and where the call also meets its peers on the GPU (the copy
// engines' reduce-scatter) the meeting's all_reduce, whichever wait gives up first.
using FirstCall = std::function<void(FusedMatmul&, int rank, cudaStream_t)>;
using ZerosCall = std::function<void(FusedMatmul&, void* a, void* b, void* out, cudaStream_t)>;
using LaunchCount = std::function<unsigned long long(const FusedMatmul&)>;
void check_one_launch_ends_on_a_revocation_and_on_the_timeout(const OneLaunch& launch, const char* name,
                                                             const std::vector<std::string>& timeout_names,
                                                             const size_t (&bytes)[3], const FirstCall& first,
                                                             const ZerosCall& call, const LaunchCount& count) {
  if (in_process_mode()) GTEST_SKIP() << "ranks as threads only: rank 0 acts on rank 1's thread's progress";
  if (world_size() != 2) GTEST_SKIP() << "2 ranks";
  for (const bool revoke : {true, false}) {
    std::atomic<bool> waiting{false}, done{false};
    for_each_rank([&](const RankContext& context) {
      Communicator comm = Communicator::init(context.rendezvous, test_options(revoke ? 30.0 : 2.0));
      make_current(comm);
      if (!one_launch_expected(launch, comm.device())) {
        GTEST_SKIP() << launch.needs;
      }
      FusedMatmul fused = FusedMatmul::create(comm);
      StreamHandle stream_handle;
      const cudaStream_t stream = stream_handle.get();
      first(fused, context.rank, stream);
      const unsigned long long before = count(fused);
      DeviceBuffer a(bytes[0]), b(bytes[1]), out(bytes[2]);
      cuda_check(cudaMemset(a.get(), 0, bytes[0]), "cudaMemset");
      cuda_check(cudaMemset(b.get(), 0, bytes[1]), "cudaMemset");
      comm.barrier();
      const std::string what = std::string(name) + (revoke ? " revoked" : " timed out") + ", rank " +
                               std::to_string(context.rank);
      if (context.rank == 1) {
        call(fused, a.get(), b.get(), out.get(), stream);
        EXPECT_EQ(count(fused), before + 1) << what;
        const Clock::time_point started = Clock::now();
        waiting = true;
        EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << what;
        const double waited = std::chrono::duration<double>(Clock::now() - started).count();
        std::printf("[fused] %s: the waiting kernel ended after %.2f s\n", what.c_str(), waited);
        EXPECT_LT(waited, revoke ? 1.5 : comm.timeout_s() + 2.0) << what;
        done = true;
      } else {
        while (!waiting.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 1's kernel waits by now
        if (revoke) comm.revoke();
        while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!revoke) return;  // never raises: only rank 1 waited
      }
      try {
        call(fused, a.get(), b.get(), out.get(), stream);
        ADD_FAILURE() << what << ": the next call raised nothing";
      } catch (const Error& error) {
        EXPECT_EQ(error.code(), revoke ? ErrorCode::kRevoked : ErrorCode::kTimeout) << what << ": " << error.what();
        if (!revoke) {
          const std::string message = error.what();
          EXPECT_TRUE(std::any_of(timeout_names.begin(), timeout_names.end(),
                                  [&](const std::string& n) { return message.find(n) != std::string::npos; }))
              << message;
        }
      }
    });
  }
}

// The reduce-scatter in braid's Hopper GEMM's epilogue (NOTE [reduce-scatter in the epilogue]): shapes with several
// tiles a rank, columns that end inside a tile, one tile, a growing exchange area, both ops and datatypes, on two
// streams with a delayed rank, and a shape the epilogue does not take (rows not a multiple of 128) between them,
// which runs the pieces; each call counted where it ran.
TEST(FusedMatmul, EpilogueReduceScatterMatchesTheHostReference) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    if (!one_launch_expected(reduce_scatter_launch(), comm.device())) {
      GTEST_SKIP() << reduce_scatter_launch().needs;
    }
    FusedMatmul fused = reserved_fused(comm, size_t(8) << 20);
    StreamHandle first, second;
    const cudaStream_t streams[2] = {first.get(), second.get()};
    const std::vector<Case> cases = {
        {DataType::kBFloat16, Layout::kTransposed, 128, 64, 256},  {DataType::kFloat16, Layout::kTransposed, 256, 136, 136},
        {DataType::kBFloat16, Layout::kTransposed, 384, 520, 520}, {DataType::kBFloat16, Layout::kTransposed, 128, 8, 8},
        {DataType::kBFloat16, Layout::kTransposed, 37, 64, 64},    {DataType::kFloat16, Layout::kTransposed, 1024, 512, 768},
        {DataType::kBFloat16, Layout::kTransposed, 128, 64, 256},
    };
    const int world = comm.size();
    unsigned long long epilogue_calls = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const ReduceOp op = i % 3 == 1 ? ReduceOp::kAvg : ReduceOp::kSum;
      const bool in_epilogue = c.rows % 128 == 0;
      check_matmul_reduce_scatter(fused, comm.rank(), world, c, op, 1200 + i, streams[i % 2],
                                  static_cast<int>(i % world), in_epilogue ? PeersSum::kFloat32 : PeersSum::kRounded);
      epilogue_calls += in_epilogue;
      EXPECT_EQ(fused.epilogue_reduce_scatters(), epilogue_calls) << "rank " << comm.rank() << " " << describe(c);
    }
    for (int call = 0; call < 8; ++call) {  // back to back, each rank's stream running ahead of the checks' waits
      check_matmul_reduce_scatter(fused, comm.rank(), world, cases[0], ReduceOp::kSum, 1300 + call, streams[0], -1,
                                  PeersSum::kFloat32);
    }
    EXPECT_EQ(fused.epilogue_reduce_scatters(), epilogue_calls + 8);
  });
}

// Epilogue reduce-scatters of two shapes captured into one graph, after eager calls that made the exchange area,
// replayed on new inputs: every replay equals the reference (the stamps advance on the GPU), also after an eager
// call of a larger shape grew the exchange area.
TEST(FusedMatmul, EpilogueReduceScatterGraphReplaysMatchTheReference) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    if (!one_launch_expected(reduce_scatter_launch(), comm.device())) {
      GTEST_SKIP() << reduce_scatter_launch().needs;
    }
    const int rank = comm.rank(), world = comm.size();
    FusedMatmul fused = reserved_fused(comm, size_t(4) << 20);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    const Case shapes[2] = {{DataType::kBFloat16, Layout::kTransposed, 256, 192, 264},
                            {DataType::kBFloat16, Layout::kTransposed, 128, 64, 512}};
    check_matmul_reduce_scatter(fused, rank, world, shapes[0], ReduceOp::kSum, 1400, stream, -1, PeersSum::kFloat32);
    check_matmul_reduce_scatter(fused, rank, world, shapes[1], ReduceOp::kAvg, 1401, stream, -1, PeersSum::kFloat32);
    std::vector<Matrix> as[2] = {std::vector<Matrix>(world), std::vector<Matrix>(world)};
    Matrix bs[2];
    void* outs[2];
    auto fill = [&](uint64_t seed) {
      for (int s = 0; s < 2; ++s) {
        for (int q = 0; q < world; ++q) make_random(as[s][q], shapes[s].rows * world, shapes[s].k, shapes[s].type, seed_of(seed + s, q));
        make_random(bs[s], shapes[s].n, shapes[s].k, shapes[s].type, seed_of(seed + s, 1000));
      }
    };
    fill(1500);
    for (int s = 0; s < 2; ++s) outs[s] = poisoned(shapes[s].rows * shapes[s].n * 2);
    host_barrier();
    const unsigned long long before = fused.epilogue_reduce_scatters();
    GraphHandles graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const ReduceOp ops[2] = {ReduceOp::kSum, ReduceOp::kAvg};
    for (int s = 0; s < 2; ++s) {
      fused.matmul_reduce_scatter(as[s][rank].device, shapes[s].rows * world, shapes[s].k, bs[s].device,
                                  shapes[s].layout, shapes[s].n, outs[s], shapes[s].type, ops[s], stream);
    }
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph.graph), cudaSuccess);
    EXPECT_EQ(fused.epilogue_reduce_scatters(), before + 2);
    graph.exec = instantiate_on_every_rank(graph.graph, stream);
    for (uint64_t replay = 0; replay < 4; ++replay) {
      if (replay == 2) {  // an eager call that grows the exchange area: the graph keeps the one it captured
        const Case larger{DataType::kBFloat16, Layout::kTransposed, 512, 64, 1024};
        check_matmul_reduce_scatter(fused, rank, world, larger, ReduceOp::kSum, 1700, stream, -1, PeersSum::kFloat32);
        host_barrier();
      }
      fill(1600 + 10 * replay);
      for (int s = 0; s < 2; ++s) {
        ASSERT_EQ(cudaMemsetAsync(outs[s], kPoison, shapes[s].rows * shapes[s].n * 2, stream), cudaSuccess);
      }
      host_barrier();
      ASSERT_EQ(cudaGraphLaunch(graph.exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (int s = 0; s < 2; ++s) {
        const Case& c = shapes[s];
        const std::vector<float> got = download(c.type, outs[s], c.rows * c.n);
        const std::vector<double> expected =
            expected_reduce_scatter(as[s], bs[s], c, rank, world, ops[s], PeersSum::kFloat32);
        size_t wrong = 0;
        for (size_t i = 0; i < got.size(); ++i) wrong += !close(c.type, got[i], expected[i]);
        EXPECT_EQ(wrong, 0u) << "rank " << rank << " replay " << replay << " " << describe(c);
      }
      host_barrier();
    }
    for (void* out : outs) device_free(out);
  });
}

// A reduce-scatter in the epilogue that its peer never joins
// (check_one_launch_ends_on_a_revocation_and_on_the_timeout).
TEST(FusedMatmul, EpilogueReduceScatterEndsOnARevocationAndOnTheTimeout) {
  const Case c{DataType::kBFloat16, Layout::kTransposed, 128, 64, 256};
  check_one_launch_ends_on_a_revocation_and_on_the_timeout(
      reduce_scatter_launch(), "matmul_reduce_scatter",
      &reduce_scatter_launch() == &kEngines ? std::vector<std::string>{"matmul_reduce_scatter", "all_reduce"}
                                            : std::vector<std::string>{"matmul_reduce_scatter"},
      {c.rows * 2 * c.k * 2, c.n * c.k * 2, c.rows * c.n * 2},
      [&](FusedMatmul& fused, int rank, cudaStream_t stream) {
        check_matmul_reduce_scatter(fused, rank, 2, c, ReduceOp::kSum, 1700, stream, -1, PeersSum::kFloat32);
      },
      [&](FusedMatmul& fused, void* a, void* b, void* out, cudaStream_t stream) {
        fused.matmul_reduce_scatter(a, c.rows * 2, c.k, b, c.layout, c.n, out, c.type, ReduceOp::kSum, stream);
      },
      [](const FusedMatmul& fused) { return fused.epilogue_reduce_scatters(); });
}

// A peer that starts its call in one launch 11 s after this rank: longer than the kernel's barrier waits last by
// themselves (kWaitLimitNs, 10 s), but within the communicator's timeout (30 s), which bounds every wait of such a
// launch, those behind the wait for the peer too. Each call ends right: a reduce-scatter in the epilogue, then an
// all-gather under the loads, each after an undelayed call of its shape (the agreement and the exchange area).
TEST(FusedMatmul, OneLaunchCallsWaitForAPeerLaterThanTheKernelsOwnWaitLimit) {
  if (world_size() != 2) GTEST_SKIP() << "2 ranks";
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const bool epilogue = one_launch_expected(reduce_scatter_launch(), comm.device());
    const bool loads = one_launch_expected(kLoads, comm.device());
    if (!epilogue && !loads) GTEST_SKIP() << reduce_scatter_launch().needs << "; or " << kLoads.needs;
    ASSERT_GT(comm.timeout_s(), 20.0);
    constexpr std::chrono::milliseconds kLate(11000);
    FusedMatmul fused = reserved_fused(comm, size_t(8) << 20);
    StreamHandle stream;
    const Case c{DataType::kBFloat16, Layout::kTransposed, 128, 64, 256};
    const int rank = comm.rank();
    if (epilogue) {
      check_matmul_reduce_scatter(fused, rank, 2, c, ReduceOp::kSum, 1950, stream.get(), -1, PeersSum::kFloat32);
      check_matmul_reduce_scatter(fused, rank, 2, c, ReduceOp::kSum, 1951, stream.get(), 1, PeersSum::kFloat32, kLate);
      EXPECT_EQ(fused.epilogue_reduce_scatters(), 2u) << "rank " << rank;
    }
    if (loads) {
      check_all_gather_matmul(fused, rank, 2, c, 1960, stream.get(), true);
      check_all_gather_matmul(fused, rank, 2, c, 1961, stream.get(), true, 1, kLate);
      EXPECT_EQ(fused.all_gathers_under_loads(), 2u) << "rank " << rank;
    }
    comm.check();
  });
}

// The all-gather under braid's Hopper GEMM's loads (NOTE [all-gather under the loads]): shapes with several row
// tiles and pieces of K a rank, K and N that end inside a step and a tile, one tile, a growing exchange area, both
// datatypes, with and without the gathered A, on two streams with a delayed rank; a shape the kernel does not take
// (rows not a multiple of 128) between them runs the pieces, and a reduce-scatter between them shares the exchange
// area where it runs in the epilogue; each call counted where it ran.
TEST(FusedMatmul, AllGatherUnderLoadsMatchesTheHostReference) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    if (!one_launch_expected(kLoads, comm.device())) {
      GTEST_SKIP() << kLoads.needs;
    }
    FusedMatmul fused = reserved_fused(comm, size_t(8) << 20);
    StreamHandle first, second;
    const cudaStream_t streams[2] = {first.get(), second.get()};
    const std::vector<Case> cases = {
        {DataType::kBFloat16, Layout::kTransposed, 128, 64, 256},
        {DataType::kFloat16, Layout::kTransposed, 256, 520, 136},
        {DataType::kBFloat16, Layout::kTransposed, 384, 1096, 264},
        {DataType::kBFloat16, Layout::kTransposed, 128, 8, 8},
        {DataType::kBFloat16, Layout::kTransposed, 37, 64, 64},
        {DataType::kFloat16, Layout::kTransposed, 1024, 512, 768},
        {DataType::kBFloat16, Layout::kTransposed, 128, 64, 256},
    };
    const int world = comm.size();
    const bool epilogue = one_launch_expected(reduce_scatter_launch(), comm.device());
    unsigned long long loads_calls = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const bool under_loads = c.rows % 128 == 0;
      check_all_gather_matmul(fused, comm.rank(), world, c, 1800 + i, streams[i % 2], /*gather_a=*/i % 2 == 0,
                              static_cast<int>(i % world));
      loads_calls += under_loads;
      EXPECT_EQ(fused.all_gathers_under_loads(), loads_calls) << "rank " << comm.rank() << " " << describe(c);
      if (i % 3 == 2) {  // a reduce-scatter between, in the same exchange area where it runs in the epilogue
        const Case between{DataType::kBFloat16, Layout::kTransposed, 256, 192, 264};
        check_matmul_reduce_scatter(fused, comm.rank(), world, between, ReduceOp::kSum, 1850 + i, streams[i % 2], -1,
                                    epilogue ? PeersSum::kFloat32 : PeersSum::kRounded);
      }
    }
    for (int call = 0; call < 8; ++call) {  // back to back, each rank's stream running ahead of the checks' waits
      check_all_gather_matmul(fused, comm.rank(), world, cases[0], 1900 + call, streams[0], /*gather_a=*/call % 2 == 1);
    }
    EXPECT_EQ(fused.all_gathers_under_loads(), loads_calls + 8);
  });
}

// All-gathers under the loads of two shapes captured into one graph, after eager calls that made the exchange area,
// replayed on new inputs: every replay equals the reference, the gathered A included (the stamps advance on the
// GPU).
TEST(FusedMatmul, AllGatherUnderLoadsGraphReplaysMatchTheReference) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    if (!one_launch_expected(kLoads, comm.device())) {
      GTEST_SKIP() << kLoads.needs;
    }
    const int rank = comm.rank(), world = comm.size();
    FusedMatmul fused = reserved_fused(comm, size_t(4) << 20);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    const Case shapes[2] = {{DataType::kBFloat16, Layout::kTransposed, 256, 584, 264},
                            {DataType::kFloat16, Layout::kTransposed, 128, 64, 512}};
    check_all_gather_matmul(fused, rank, world, shapes[0], 2000, stream, /*gather_a=*/true);
    check_all_gather_matmul(fused, rank, world, shapes[1], 2001, stream, /*gather_a=*/false);
    std::vector<Matrix> shards[2] = {std::vector<Matrix>(world), std::vector<Matrix>(world)};
    Matrix bs[2];
    void* outs[2];
    const size_t m[2] = {shapes[0].rows * world, shapes[1].rows * world};
    void* gathered = poisoned(m[0] * shapes[0].k * 2);  // shape 0's gathered A; shape 1 asks for none
    auto fill = [&](uint64_t seed) {
      for (int s = 0; s < 2; ++s) {
        for (int q = 0; q < world; ++q) {
          make_random(shards[s][q], shapes[s].rows, shapes[s].k, shapes[s].type, seed_of(seed + s, q));
        }
        make_random(bs[s], shapes[s].n, shapes[s].k, shapes[s].type, seed_of(seed + s, 1000));
      }
    };
    fill(2100);
    for (int s = 0; s < 2; ++s) outs[s] = poisoned(m[s] * shapes[s].n * 2);
    host_barrier();
    const unsigned long long before = fused.all_gathers_under_loads();
    GraphHandles graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    for (int s = 0; s < 2; ++s) {
      fused.all_gather_matmul(shards[s][rank].device, shapes[s].rows, shapes[s].k, bs[s].device, shapes[s].layout,
                              shapes[s].n, outs[s], s == 0 ? gathered : nullptr, shapes[s].type, stream);
    }
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph.graph), cudaSuccess);
    EXPECT_EQ(fused.all_gathers_under_loads(), before + 2);
    graph.exec = instantiate_on_every_rank(graph.graph, stream);
    for (uint64_t replay = 0; replay < 4; ++replay) {
      fill(2200 + 10 * replay);
      for (int s = 0; s < 2; ++s) {
        ASSERT_EQ(cudaMemsetAsync(outs[s], kPoison, m[s] * shapes[s].n * 2, stream), cudaSuccess);
      }
      ASSERT_EQ(cudaMemsetAsync(gathered, kPoison, m[0] * shapes[0].k * 2, stream), cudaSuccess);
      host_barrier();
      ASSERT_EQ(cudaGraphLaunch(graph.exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (int s = 0; s < 2; ++s) {
        const std::string what = "rank " + std::to_string(rank) + " replay " + std::to_string(replay) + " " +
                                 describe(shapes[s]);
        const std::vector<float> got = download(shapes[s].type, outs[s], m[s] * shapes[s].n);
        EXPECT_EQ(wrong_gathered_products(shards[s], bs[s], shapes[s], got, what), 0u) << what;
      }
      EXPECT_EQ(differing_gathered_a(shards[0], shapes[0], download(shapes[0].type, gathered, m[0] * shapes[0].k)), 0u)
          << "rank " << rank << " replay " << replay << ": a_gathered";
      host_barrier();
    }
    for (void* out : outs) device_free(out);
    device_free(gathered);
  });
}

// An all-gather under the loads that its peer never joins
// (check_one_launch_ends_on_a_revocation_and_on_the_timeout).
TEST(FusedMatmul, AllGatherUnderLoadsEndsOnARevocationAndOnTheTimeout) {
  const Case c{DataType::kBFloat16, Layout::kTransposed, 128, 64, 256};
  check_one_launch_ends_on_a_revocation_and_on_the_timeout(
      kLoads, "all_gather_matmul", {"all_gather_matmul"}, {c.rows * c.k * 2, c.n * c.k * 2, c.rows * 2 * c.n * 2},
      [&](FusedMatmul& fused, int rank, cudaStream_t stream) {
        check_all_gather_matmul(fused, rank, 2, c, 2300, stream, /*gather_a=*/true);
      },
      [&](FusedMatmul& fused, void* a, void* b, void* out, cudaStream_t stream) {
        fused.all_gather_matmul(a, c.rows, c.k, b, c.layout, c.n, out, nullptr, c.type, stream);
      },
      [](const FusedMatmul& fused) { return fused.all_gathers_under_loads(); });
}

// The C API's fused calls (braid.h) against the host reference, on a C communicator; its argument checks name the
// argument; the FusedMatmul is freed after the communicator, as braid.h allows.
TEST(FusedMatmul, CApiMatchesTheHostReference) {
  for_each_rank([](const RankContext& context) {
    braidComm_t comm = nullptr;
    ASSERT_NO_FATAL_FAILURE(init_c_communicator(context, &comm));
    const int rank = context.rank, world = context.world;
    braidFusedMatmul_t fused = nullptr;
    ASSERT_EQ(braidFusedMatmulCreate(comm, &fused), braidSuccess) << braidGetLastError();
    ASSERT_EQ(braidFusedMatmulReserve(fused, size_t(4) << 20), braidSuccess) << braidGetLastError();
    size_t workspace = 0;
    EXPECT_EQ(braidFusedMatmulWorkspaceBytes(fused, &workspace), braidSuccess);
    EXPECT_GE(workspace, size_t(4) << 20);
    const Case c{DataType::kFloat16, Layout::kTransposed, 24, 72, 40};
    const size_t m = c.rows * world;
    std::vector<Matrix> shards(world), as(world);
    Matrix b;
    for (int q = 0; q < world; ++q) {
      make_random(shards[q], c.rows, c.k, c.type, seed_of(31, q));
      make_random(as[q], m, c.k, c.type, seed_of(32, q));
    }
    make_random(b, c.n, c.k, c.type, seed_of(33, 1000));
    void* ag_out = poisoned(m * c.n * 2);
    void* gathered = poisoned(m * c.k * 2);
    void* rs_out = poisoned(c.rows * c.n * 2);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    host_barrier();  // every rank's buffers made before any call (NOTE [shared-GPU waits])
    ASSERT_EQ(braidAllGatherMatmul(fused, shards[rank].device, c.rows, c.k, b.device, braidLayoutTransposed, c.n,
                                   ag_out, gathered, braidFloat16, stream), braidSuccess) << braidGetLastError();
    ASSERT_EQ(braidMatmulReduceScatter(fused, as[rank].device, m, c.k, b.device, braidLayoutTransposed, c.n, rs_out,
                                       braidFloat16, braidAvg, stream), braidSuccess) << braidGetLastError();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::string what = "rank " + std::to_string(rank) + ": braidAllGatherMatmul";
    EXPECT_EQ(wrong_gathered_products(shards, b, c, download(c.type, ag_out, m * c.n), what), 0u) << what;
    EXPECT_EQ(differing_gathered_a(shards, c, download(c.type, gathered, m * c.k)), 0u) << what << "'s a_gathered";
    const std::vector<float> rs = download(c.type, rs_out, c.rows * c.n);
    const std::vector<double> expected = expected_reduce_scatter(as, b, c, rank, world, ReduceOp::kAvg);
    size_t wrong = 0;
    for (size_t i = 0; i < rs.size(); ++i) wrong += !close(c.type, rs[i], expected[i]);
    EXPECT_EQ(wrong, 0u) << "rank " << rank << ": braidMatmulReduceScatter";

    // Refused before anything is enqueued, the same on every rank: the argument named.
    EXPECT_EQ(braidAllGatherMatmul(fused, shards[rank].device, c.rows, c.k, b.device, static_cast<braidLayout_t>(7),
                                   c.n, ag_out, nullptr, braidFloat16, stream), braidInvalidArgument);
    EXPECT_NE(std::string(braidGetLastError()).find("'b_layout'"), std::string::npos) << braidGetLastError();
    EXPECT_EQ(braidMatmulReduceScatter(fused, as[rank].device, m, c.k, b.device, braidLayoutTransposed, c.n, rs_out,
                                       braidFloat32, braidSum, stream), braidInvalidArgument);
    EXPECT_NE(std::string(braidGetLastError()).find("'type'"), std::string::npos) << braidGetLastError();
    EXPECT_EQ(braidMatmulReduceScatter(fused, as[rank].device, m, c.k, b.device, braidLayoutTransposed, c.n, rs_out,
                                       braidFloat16, braidMax, stream), braidInvalidArgument);
    EXPECT_NE(std::string(braidGetLastError()).find("'op'"), std::string::npos) << braidGetLastError();
    host_barrier();
    EXPECT_EQ(braidCommDestroy(comm), braidSuccess) << braidGetLastError();
    EXPECT_EQ(braidFusedMatmulFree(fused), braidSuccess) << braidGetLastError();
    device_free(ag_out);
    device_free(gathered);
    device_free(rs_out);
  });
}

// After abort(), every call of a FusedMatmul raises kAborted at its entry, whatever its sizes (rows, m, n or k of 0
// too) and before its arguments are looked at (the null matrices below would be refused otherwise), and the
// legacy stream comes after the failure too; nothing is enqueued: out keeps its poison.
TEST(FusedMatmul, CallsOfEveryShapeRaiseAFailureRecordedBefore) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    FusedMatmul fused = FusedMatmul::create(comm);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    const DataType bf16 = DataType::kBFloat16;
    const size_t rows = 128, k = 64, n = 64, m = rows * comm.size();
    void* out = poisoned(m * n * 2);
    comm.abort();  // local: this rank's calls raise from now on
    const std::vector<std::pair<const char*, std::function<void(cudaStream_t)>>> calls = {
        {"all_gather_matmul, rows 0",
         [&](cudaStream_t s) { fused.all_gather_matmul(nullptr, 0, k, nullptr, Layout::kTransposed, n, out, nullptr, bf16, s); }},
        {"all_gather_matmul, k 0",
         [&](cudaStream_t s) { fused.all_gather_matmul(nullptr, rows, 0, nullptr, Layout::kTransposed, n, out, nullptr, bf16, s); }},
        {"all_gather_matmul, null operands",
         [&](cudaStream_t s) { fused.all_gather_matmul(nullptr, rows, k, nullptr, Layout::kTransposed, n, out, nullptr, bf16, s); }},
        {"matmul_reduce_scatter, m 0",
         [&](cudaStream_t s) {
           fused.matmul_reduce_scatter(nullptr, 0, k, nullptr, Layout::kTransposed, n, out, bf16, ReduceOp::kSum, s);
         }},
        {"matmul_reduce_scatter, n 0",
         [&](cudaStream_t s) {
           fused.matmul_reduce_scatter(nullptr, m, k, nullptr, Layout::kTransposed, 0, out, bf16, ReduceOp::kSum, s);
         }},
        {"matmul_reduce_scatter, k 0",
         [&](cudaStream_t s) {
           fused.matmul_reduce_scatter(nullptr, m, 0, nullptr, Layout::kTransposed, n, out, bf16, ReduceOp::kSum, s);
         }},
    };
    for (const auto& [what, call] : calls) {
      for (cudaStream_t s : {stream, cudaStreamLegacy}) {
        try {
          call(s);
          ADD_FAILURE() << "rank " << comm.rank() << ": " << what << " after abort() was accepted";
        } catch (const Error& error) {
          EXPECT_EQ(error.code(), ErrorCode::kAborted) << what << ": " << error.what();
        }
      }
    }
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    size_t touched = 0;
    std::vector<uint8_t> bytes(m * n * 2);
    cuda_check(cudaMemcpy(bytes.data(), out, bytes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (uint8_t byte : bytes) touched += byte != kPoison;
    EXPECT_EQ(touched, 0u) << "rank " << comm.rank() << ": a refused call wrote into out";
    cudaFree(out);
  });
}

// A call whose workspace (or, in one launch, exchange area) must grow is refused inside a capture, naming `stream`,
// and adds nothing to the capture, not even its wait for the capture's previous call on another stream; the graph
// of the call before it replays as that call ran eagerly.
TEST(FusedMatmul, ACallThatMustGrowIsRefusedInACaptureAndAddsNothing) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    FusedMatmul fused = FusedMatmul::create(comm);
    StreamHandle first_handle, second_handle;
    const cudaStream_t first = first_handle.get(), second = second_handle.get();
    // small fits in the 2 MiB its eager call makes (workspace or exchange area); large needs more. Both shapes are
    // ones the one-launch reduce-scatter takes, where it is asked for.
    const Case small{DataType::kBFloat16, Layout::kTransposed, 128, 64, 256};
    const Case large{DataType::kBFloat16, Layout::kTransposed, 512, 64, 2048};
    void* a = filled(large.rows * world * large.k * 2, 0x3F);
    void* b = filled(large.n * large.k * 2, 0x3E);
    void* eager_out = poisoned(small.rows * small.n * 2);
    void* graph_out = poisoned(large.rows * large.n * 2);
    cudaEvent_t fork = nullptr, join = nullptr;
    ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
    auto reduce_scatter = [&](const Case& c, void* out, cudaStream_t stream) {
      fused.matmul_reduce_scatter(a, c.rows * world, c.k, b, c.layout, c.n, out, c.type, ReduceOp::kSum, stream);
    };
    auto waited_on = [&](cudaStream_t stream) {  // the capture's nodes that `stream`'s next work would wait for
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      const cudaGraphNode_t* nodes = nullptr;
      size_t count = 0;
      EXPECT_EQ(cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &nodes, nullptr, &count), cudaSuccess);
      EXPECT_EQ(status, cudaStreamCaptureStatusActive);
      return std::vector<cudaGraphNode_t>(nodes, nodes + count);
    };
    host_barrier();
    reduce_scatter(small, eager_out, first);
    ASSERT_EQ(cudaStreamSynchronize(first), cudaSuccess);
    const size_t workspace = fused.workspace_bytes();
    const unsigned long long one_launch = fused.epilogue_reduce_scatters();  // 1 where the call ran in one launch
    host_barrier();
    GraphHandles graph;
    ASSERT_EQ(cudaStreamBeginCapture(first, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(fork, first), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(second, fork, 0), cudaSuccess);  // second joins the capture before the call
    reduce_scatter(small, graph_out, first);
    const std::vector<cudaGraphNode_t> before = waited_on(second);
    expect_invalid_argument(rank, "a captured call that needs more memory", {"'stream'"},
                            [&] { reduce_scatter(large, graph_out, second); });
    EXPECT_EQ(waited_on(second), before) << "rank " << rank << ": the refused call added a wait to the capture";
    ASSERT_EQ(cudaEventRecord(join, second), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(first, join, 0), cudaSuccess);
    ASSERT_EQ(cudaStreamEndCapture(first, &graph.graph), cudaSuccess);
    EXPECT_EQ(fused.workspace_bytes(), workspace) << "rank " << rank << ": a refused call grew the workspace";
    EXPECT_EQ(fused.epilogue_reduce_scatters(), one_launch * 2) << "rank " << rank;
    graph.exec = instantiate_on_every_rank(graph.graph, first);
    replay_graph(graph.exec, first, 1);
    std::vector<uint16_t> eager(small.rows * small.n), replayed(small.rows * small.n);
    ASSERT_EQ(cudaMemcpy(eager.data(), eager_out, eager.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(replayed.data(), graph_out, replayed.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(replayed, eager) << "rank " << rank << ": the replay differs from the eager call";
    EXPECT_NE(eager[0], uint16_t(kPoison * 0x101)) << "rank " << rank << ": the eager call wrote nothing";
    host_barrier();
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    for (void* p : {a, b, eager_out, graph_out}) device_free(p);
  });
}

TEST(FusedMatmul, BadArgumentsNameTheArgument) {
  with_communicator([](Communicator& comm) {
    make_current(comm);
    const int rank = comm.rank(), world = comm.size();
    FusedMatmul fused = FusedMatmul::create(comm);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    void* a = poisoned(size_t(1) << 20);
    void* b = poisoned(size_t(1) << 20);
    void* out = poisoned(size_t(1) << 20);
    std::vector<char> host(1 << 20);
    const DataType bf16 = DataType::kBFloat16;
    expect_invalid_argument(rank, "float32", {"'type'"}, [&] {
      fused.all_gather_matmul(a, 8, 16, b, Layout::kRowMajor, 16, out, nullptr, DataType::kFloat32, stream);
    });
    if (world > 1) {  // one rank divides every m
      expect_invalid_argument(rank, "m not divisible", {"'m'"}, [&] {
        fused.matmul_reduce_scatter(a, world * 8 + 1, 16, b, Layout::kRowMajor, 16, out, bf16, ReduceOp::kSum, stream);
      });
    }
    expect_invalid_argument(rank, "max", {"'op'"}, [&] {
      fused.matmul_reduce_scatter(a, world * 8, 16, b, Layout::kRowMajor, 16, out, bf16, ReduceOp::kMax, stream);
    });
    expect_invalid_argument(rank, "B in host memory", {"'b'"}, [&] {
      fused.all_gather_matmul(a, 8, 16, host.data(), Layout::kRowMajor, 16, out, nullptr, bf16, stream);
    });
    expect_invalid_argument(rank, "null out", {"'out'"}, [&] {
      fused.all_gather_matmul(a, 8, 16, b, Layout::kRowMajor, 16, nullptr, nullptr, bf16, stream);
    });
    expect_invalid_argument(rank, "unaligned a", {"'a_shard'"}, [&] {
      fused.all_gather_matmul(static_cast<char*>(a) + 2, 8, 16, b, Layout::kRowMajor, 16, out, nullptr, bf16, stream);
    });
    expect_invalid_argument(rank, "layout", {"'b_layout'"}, [&] {
      fused.all_gather_matmul(a, 8, 16, b, static_cast<Layout>(7), 16, out, nullptr, bf16, stream);
    });
    expect_invalid_argument(rank, "out over a", {"'out'"}, [&] {
      fused.all_gather_matmul(a, 8, 16, b, Layout::kRowMajor, 16, a, nullptr, bf16, stream);
    });
    // Nothing was enqueued: the output keeps its poison.
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    unsigned char first = 0;
    ASSERT_EQ(cudaMemcpy(&first, out, 1, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(first, kPoison);
    EXPECT_EQ(fused.workspace_bytes(), 0u) << "a refused call grew the workspace";
    host_barrier();
    device_free(a);
    device_free(b);
    device_free(out);
  });
}

}  // namespace
}  // namespace braid::testing
