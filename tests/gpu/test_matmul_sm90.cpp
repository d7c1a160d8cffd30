// braid's Hopper GEMM (kernels/matmul_sm90.hpp) against a host reference, on rank 0's GPU where it is a Hopper.
// Inputs are multiples of 1/8 in [-1/2, 1/2] (never 0), alpha and beta powers of two, so every float32 sum the
// kernel forms is exact whatever order it adds in: D must equal the reference rounded once, bit for bit. D is
// poisoned (NaN) first; shapes cover one row, one 8-column group, K not a multiple of the 64-column steps, rows and
// columns past one tile, and grids of one cluster (so each block loops over many tiles) up to every multiprocessor.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "collective_reference.hpp"  // cuda_check
#include "half_bits.hpp"
#include "kernels/matmul_sm90.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

// The copies and memsets that made the inputs ran on this thread's default stream, which the GEMM's non-blocking
// stream does not wait for.
void inputs_ready() { cuda_check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize(inputs)"); }

struct DeviceMatrix {
  std::vector<float> host;
  void* device = nullptr;
  DeviceMatrix(DataType type, size_t elements, std::mt19937_64& random) : host(elements) {
    for (float& x : host) {
      int v = static_cast<int>(random() % 9) - 4;
      if (v == 0) v = 3;
      x = static_cast<float>(v) / 8.0f;
    }
    std::vector<uint16_t> bits(elements);
    for (size_t i = 0; i < elements; ++i) bits[i] = bits_of(type, host[i]);
    cuda_check(cudaMalloc(&device, elements * 2), "cudaMalloc");
    cuda_check(cudaMemcpy(device, bits.data(), elements * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~DeviceMatrix() { cudaFree(device); }
  DeviceMatrix(const DeviceMatrix&) = delete;
  DeviceMatrix& operator=(const DeviceMatrix&) = delete;
};

struct Case {
  size_t rows, k, n;
  int multiprocessors;
  bool with_c;
  bool c_is_d;  // C read from D's own memory (in place)
  float alpha, beta;
};

std::string describe(DataType type, const Case& c) {
  return std::string(type == DataType::kBFloat16 ? "bf16" : "fp16") + " rows " + std::to_string(c.rows) + " k " +
         std::to_string(c.k) + " n " + std::to_string(c.n) + " blocks " + std::to_string(c.multiprocessors) +
         (c.with_c ? (c.c_is_d ? " C in place" : " C") : "") + " alpha " + std::to_string(c.alpha) + " beta " +
         std::to_string(c.beta);
}

// Runs one case; returns the number of elements of D that differ from the reference.
size_t run_case(DataType type, const Case& c, uint64_t seed) {
  std::mt19937_64 random(seed);
  // D has a guard of kGuard elements past its end, which the kernel must leave as they are.
  constexpr size_t kGuard = 256;
  DeviceMatrix a(type, c.rows * c.k, random), b(type, c.n * c.k, random), d(type, c.rows * c.n + kGuard, random);
  cuda_check(cudaMemset(static_cast<uint16_t*>(d.device) + c.rows * c.n, 0x5A, kGuard * 2), "guard");
  std::vector<float> c_host = d.host;  // D's random contents are C where C is D itself
  std::unique_ptr<DeviceMatrix> separate_c;
  if (c.with_c && !c.c_is_d) {
    separate_c = std::make_unique<DeviceMatrix>(type, c.rows * c.n, random);
    c_host = separate_c->host;
  }
  if (!c.c_is_d) cuda_check(cudaMemset(d.device, 0xFF, c.rows * c.n * 2), "poison D");
  if (separate_c != nullptr && c.beta == 0.0f) {
    cuda_check(cudaMemset(separate_c->device, 0xFF, c.rows * c.n * 2), "C of NaN, never read where beta is 0");
  }
  kernels::Sm90Matmul m;
  m.type = type;
  m.rows = c.rows;
  m.k = c.k;
  m.n = c.n;
  m.a = a.device;
  m.b = b.device;
  m.c = c.with_c ? (c.c_is_d ? d.device : separate_c->device) : nullptr;
  m.d = d.device;
  m.alpha = c.alpha;
  m.beta = c.beta;
  m.multiprocessors = c.multiprocessors;
  EXPECT_TRUE(kernels::sm90_matmul_supports(m)) << describe(type, c);
  inputs_ready();
  cudaStream_t stream;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(kernels::launch_sm90_matmul(m, stream), "launch_sm90_matmul");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaStreamDestroy(stream);
  std::vector<uint16_t> got(c.rows * c.n + kGuard);
  cuda_check(cudaMemcpy(got.data(), d.device, got.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  size_t wrong = 0;
  for (size_t i = c.rows * c.n; i < got.size(); ++i) {
    if (got[i] != 0x5A5A && wrong++ < 5) ADD_FAILURE() << describe(type, c) << ": written past D at element " << i;
  }
  for (size_t r = 0; r < c.rows; ++r) {
    for (size_t j = 0; j < c.n; ++j) {
      double sum = 0;
      for (size_t x = 0; x < c.k; ++x) sum += double(a.host[r * c.k + x]) * double(b.host[j * c.k + x]);
      double expected = double(c.alpha) * sum;
      if (c.with_c && c.beta != 0.0f) expected += double(c.beta) * double(c_host[r * c.n + j]);
      const uint16_t want = bits_of(type, static_cast<float>(expected));
      if (got[r * c.n + j] != want && wrong++ < 5) {
        ADD_FAILURE() << describe(type, c) << ": D[" << r << ", " << j << "] bits " << got[r * c.n + j]
                      << ", expected " << want << " (" << expected << ")";
      }
    }
  }
  return wrong;
}

bool on_hopper() {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  return kernels::sm90_matmul_available(device);
}

TEST(Sm90Matmul, MatchesTheHostReferenceBitForBit) {
  for_each_rank([](const RankContext& context) {
    if (context.rank != 0) return;
    if (!on_hopper()) GTEST_SKIP() << "braid's Hopper GEMM runs on GPUs of compute capability 9.0 only";
    const Case cases[] = {
        {1, 8, 8, 0, false, false, 1.0f, 0.0f},
        {7, 72, 264, 0, false, false, 1.0f, 0.0f},
        {129, 136, 520, 2, false, false, 1.0f, 0.0f},
        {300, 1000, 1032, 6, true, false, 1.0f, 1.0f},
        {513, 264, 256, 0, true, true, 0.5f, -2.0f},
        {256, 64, 512, 2, true, false, 2.0f, 0.0f},  // beta 0: C not read (it is NaN)
        {1024, 520, 768, 4, false, false, 1.0f, 0.0f},
        {2048, 256, 2048, 0, true, false, 1.0f, 1.0f},
    };
    uint64_t seed = 0x5EED0000u;
    for (DataType type : {DataType::kBFloat16, DataType::kFloat16}) {
      for (const Case& c : cases) {
        EXPECT_EQ(run_case(type, c, ++seed), 0u) << describe(type, c);
      }
    }
  });
}

TEST(Sm90Matmul, RandomShapes) {
  for_each_rank([](const RankContext& context) {
    if (context.rank != 0) return;
    if (!on_hopper()) GTEST_SKIP() << "braid's Hopper GEMM runs on GPUs of compute capability 9.0 only";
    std::random_device device;
    const uint64_t seed = (uint64_t(device()) << 32) | device();
    std::mt19937_64 random(seed);
    for (int i = 0; i < 12; ++i) {
      Case c;
      c.rows = 1 + random() % 700;
      c.k = 8 * (1 + random() % 100);
      c.n = 8 * (1 + random() % 90);
      c.multiprocessors = static_cast<int>(random() % 3) * 2;  // 0 (all), 2 or 4 blocks
      c.with_c = random() % 2 == 0;
      c.c_is_d = c.with_c && random() % 2 == 0;
      c.alpha = random() % 2 == 0 ? 1.0f : 0.25f;
      c.beta = c.with_c ? (random() % 2 == 0 ? 1.0f : -0.5f) : 0.0f;
      const DataType type = random() % 2 == 0 ? DataType::kBFloat16 : DataType::kFloat16;
      EXPECT_EQ(run_case(type, c, random()), 0u) << describe(type, c) << " (seed " << seed << ")";
    }
  });
}

// Captured into a CUDA graph and replayed on new inputs (copied into the same buffers): every replay equals the
// reference for its inputs.
TEST(Sm90Matmul, GraphReplaysMatchTheReference) {
  for_each_rank([](const RankContext& context) {
    if (context.rank != 0) return;
    if (!on_hopper()) GTEST_SKIP() << "braid's Hopper GEMM runs on GPUs of compute capability 9.0 only";
    const DataType type = DataType::kBFloat16;
    const size_t rows = 300, k = 200, n = 264;
    std::mt19937_64 random(0x6A4F);
    DeviceMatrix a(type, rows * k, random), b(type, n * k, random), d(type, rows * n, random);
    kernels::Sm90Matmul m;
    m.type = type;
    m.rows = rows;
    m.k = k;
    m.n = n;
    m.a = a.device;
    m.b = b.device;
    m.c = nullptr;
    m.d = d.device;
    cudaStream_t stream;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaGraph_t graph = nullptr;
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    const cudaError_t launched = kernels::launch_sm90_matmul(m, stream);
    cuda_check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cuda_check(launched, "launch_sm90_matmul (captured)");
    cudaGraphExec_t exec = nullptr;
    cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int replay = 0; replay < 3; ++replay) {
      DeviceMatrix fresh_a(type, rows * k, random), fresh_b(type, n * k, random);
      cuda_check(cudaMemcpy(a.device, fresh_a.device, rows * k * 2, cudaMemcpyDeviceToDevice), "copy A");
      cuda_check(cudaMemcpy(b.device, fresh_b.device, n * k * 2, cudaMemcpyDeviceToDevice), "copy B");
      cuda_check(cudaMemset(d.device, 0xFF, rows * n * 2), "poison D");
      inputs_ready();
      cuda_check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      std::vector<uint16_t> got(rows * n);
      cuda_check(cudaMemcpy(got.data(), d.device, got.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
      size_t wrong = 0;
      for (size_t r = 0; r < rows; ++r) {
        for (size_t j = 0; j < n; ++j) {
          double sum = 0;
          for (size_t x = 0; x < k; ++x) sum += double(fresh_a.host[r * k + x]) * double(fresh_b.host[j * k + x]);
          if (got[r * n + j] != bits_of(type, static_cast<float>(sum))) ++wrong;
        }
      }
      EXPECT_EQ(wrong, 0u) << "replay " << replay;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  });
}

}  // namespace
}  // namespace braid::testing
