// Probe: what the fused GEMM calls' cut into pieces costs on one GPU, with no communication at all. The fused
// all_gather_matmul and matmul_reduce_scatter (src/overlap/fused_matmul.cpp) run their GEMM as pieces of rows,
// some on fewer multiprocessors than the GPU has; this times those pieces against the whole GEMM, to tell the
// cost of the cut from the cost of the communication beside it.
//
// For each shape (M rows of the whole A, K, N; bf16; B stored as a Linear weight [N, K]; world 2), rows are
// multiplied through cuBLASLt as the fused calls do (row-major, float32 accumulation, the heuristic's first
// algorithm unless a row names another), and each row gives the median of 21 timed runs after 5 warm-ups (CUDA
// events around the whole schedule, the GPU busy with a spin kernel while the schedule is enqueued):
//   whole            the GEMM of all M rows, all multiprocessors
//   whole algo=i     the same with the heuristic's i-th algorithm
//   ag serial        all_gather_matmul's pieces: this rank's M/2 rows on SMs-4, then the other M/2 on all
//   ag serial all    the same, both on all multiprocessors
//   ag two streams   the second piece on a second stream, started with the first, so it fills the
//                    multiprocessors the first leaves as it ends
//   rs serial        matmul_reduce_scatter's pieces: the peer's M/2 rows in two chunks on SMs-4, then this rank's
//                    two chunks adding C, the first on SMs-4, the second on all
//   rs serial all    the same, all on all multiprocessors
//   rs two streams   this rank's chunks on a second stream that waits for the peer chunks' first piece only
//   rs chunks=c      the rs serial schedule with c chunks
//   rs tail add      the peer's M/2 rows as one GEMM, then this rank's M/2 rows as one GEMM without C, then an SM
//                    pass adding C to them (what a two-piece schedule costs when the peer's rows arrive under the
//                    second GEMM instead of before it), all on all multiprocessors
//   rs tail add only that last pass alone
//   rs half+quarters the peer's M/2 rows as one GEMM, then this rank's rows in two chunks adding C
// Usage: gemm_pieces [OP M [pieces]]   (OP M: that shape alone, e.g. rs 4096; pieces: also each piece shape alone
// on each algorithm, which the full run always times)
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/gemm_pieces.cu -lcublasLt -o build/probes/gemm_pieces
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "probe_check.cuh"

#define LT_CHECK(call)                                                                       \
  do {                                                                                       \
    cublasStatus_t status_ = (call);                                                         \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      std::fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #call, (int)status_); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

__global__ void fill_random(__nv_bfloat16* to, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    to[i] = __float2bfloat16((static_cast<float>(x & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}

// to[i] += from[i], 8 bf16 a thread per step.
__global__ void add_into(__nv_bfloat16* to, const __nv_bfloat16* from, size_t count) {
  const size_t vectors = count / 8;
  for (size_t v = blockIdx.x * size_t(blockDim.x) + threadIdx.x; v < vectors; v += size_t(gridDim.x) * blockDim.x) {
    uint4 a = reinterpret_cast<const uint4*>(to)[v];
    const uint4 b = reinterpret_cast<const uint4*>(from)[v];
    __nv_bfloat162* x = reinterpret_cast<__nv_bfloat162*>(&a);
    const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&b);
    for (int i = 0; i < 4; ++i) x[i] = __hadd2(x[i], y[i]);
    reinterpret_cast<uint4*>(to)[v] = a;
  }
}

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

struct Plan {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t b, a, cd;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
};

struct Lt {
  cublasLtHandle_t handle;
  void* workspace[2];
  std::map<std::tuple<size_t, size_t, size_t, int>, Plan> plans;

  Lt() {
    LT_CHECK(cublasLtCreate(&handle));
    CHECK(cudaMalloc(&workspace[0], kWorkspaceBytes));
    CHECK(cudaMalloc(&workspace[1], kWorkspaceBytes));
  }

  // Row-major D[rows, n] = A[rows, k] x W^T (+ C), W [n, k]: column-major D^T = W x A^T (braid's mapping).
  Plan& plan(size_t rows, size_t k, size_t n, int sms) {
    auto key = std::make_tuple(rows, k, n, sms);
    auto found = plans.find(key);
    if (found != plans.end()) return found->second;
    Plan p{};
    LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op = CUBLAS_OP_T;
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof(op)));
    if (sms > 0) {
      const int32_t target = sms;
      LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof(target)));
    }
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, n, k));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, rows, k));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.cd, CUDA_R_16BF, n, rows, n));
    cublasLtMatmulPreference_t preference;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t bytes = kWorkspaceBytes;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                                  sizeof(bytes)));
    p.algos.resize(8);
    int found_count = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.b, p.a, p.cd, p.cd, preference, 8, p.algos.data(),
                                            &found_count));
    p.algos.resize(found_count);
    cublasLtMatmulPreferenceDestroy(preference);
    return plans.emplace(key, p).first->second;
  }

  void run(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, __nv_bfloat16* d, size_t rows,
           size_t k, size_t n, int sms, int algo, int slot, cudaStream_t stream) {
    Plan& p = plan(rows, k, n, sms);
    const int index = std::min<int>(algo, static_cast<int>(p.algos.size()) - 1);
    const float alpha = 1.0f, beta = c != nullptr ? 1.0f : 0.0f;
    LT_CHECK(cublasLtMatmul(handle, p.desc, &alpha, w, p.b, a, p.a, &beta, c != nullptr ? c : d, p.cd, d, p.cd,
                            &p.algos[index].algo, workspace[slot], kWorkspaceBytes, stream));
  }
};

int main(int argc, char** argv) {
  const std::string only_op = argc > 2 ? argv[1] : "";
  const size_t only_m = argc > 2 ? std::stoul(argv[2]) : 0;
  const bool piece_tables = argc <= 2 || (argc > 3 && std::string(argv[3]) == "pieces");
  CHECK(cudaSetDevice(0));
  int sm_count = 0;
  CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const int reduced = sm_count - 4;
  Lt lt;
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t start, stop, fork, joined, piece;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&piece, cudaEventDisableTiming));

  struct Shape {
    const char* op;
    size_t m, k, n;
  };
  const Shape shapes[] = {{"ag", 4096, 4096, 4096},  {"ag", 8192, 8192, 3584}, {"ag", 16384, 4096, 7168},
                          {"rs", 4096, 4096, 4096},  {"rs", 8192, 3584, 8192}, {"rs", 16384, 7168, 4096}};
  std::printf("GPU 0: %d multiprocessors; times in us, median of 21\n", sm_count);
  for (const Shape& s : shapes) {
    if (!only_op.empty() && (only_op != s.op || only_m != s.m)) continue;
    __nv_bfloat16 *a, *w, *d, *c;
    CHECK(cudaMalloc(&a, s.m * s.k * 2));
    CHECK(cudaMalloc(&w, s.n * s.k * 2));
    CHECK(cudaMalloc(&d, s.m * s.n * 2));
    CHECK(cudaMalloc(&c, s.m * s.n * 2));
    fill_random<<<1024, 256>>>(a, s.m * s.k, 1);
    fill_random<<<1024, 256>>>(w, s.n * s.k, 2);
    fill_random<<<1024, 256>>>(c, s.m * s.n, 3);
    CHECK(cudaDeviceSynchronize());
    auto A = [&](size_t row) { return a + row * s.k; };
    auto D = [&](size_t row) { return d + row * s.n; };
    auto C = [&](size_t row) { return c + row * s.n; };
    const size_t half = s.m / 2;

    auto time = [&](const std::string& name, const std::function<void()>& schedule) {
      std::vector<float> ms;
      for (int r = 0; r < 26; ++r) {
        spin<<<1, 1, 0, s1>>>(2000000);  // ~1 ms: the schedule is enqueued while the GPU waits
        CHECK(cudaEventRecord(start, s1));
        schedule();
        CHECK(cudaEventRecord(stop, s1));
        CHECK(cudaEventSynchronize(stop));
        float t = 0;
        CHECK(cudaEventElapsedTime(&t, start, stop));
        if (r >= 5) ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      std::printf("%s %5zu x %5zu x %5zu  %-16s %8.1f  (min %.1f max %.1f)\n", s.op, s.m, s.k, s.n, name.c_str(),
                  ms[ms.size() / 2] * 1000, ms.front() * 1000, ms.back() * 1000);
    };
    auto fork_to_s2 = [&]() {
      CHECK(cudaEventRecord(fork, s1));
      CHECK(cudaStreamWaitEvent(s2, fork, 0));
    };
    auto join_s2 = [&]() {
      CHECK(cudaEventRecord(joined, s2));
      CHECK(cudaStreamWaitEvent(s1, joined, 0));
    };

    time("whole", [&] { lt.run(A(0), w, nullptr, D(0), s.m, s.k, s.n, 0, 0, 0, s1); });
    for (int algo = 1; algo < 4; ++algo) {
      time("whole algo=" + std::to_string(algo), [&] { lt.run(A(0), w, nullptr, D(0), s.m, s.k, s.n, 0, algo, 0, s1); });
    }
    if (s.op[0] == 'a') {
      for (int algo = 0; algo < 4; ++algo) {
        const std::string suffix = algo == 0 ? "" : " algo=" + std::to_string(algo);
        time("ag serial" + suffix, [&] {
          lt.run(A(0), w, nullptr, D(0), half, s.k, s.n, reduced, algo, 0, s1);
          lt.run(A(half), w, nullptr, D(half), half, s.k, s.n, 0, algo, 0, s1);
        });
      }
      time("ag serial all", [&] {
        lt.run(A(0), w, nullptr, D(0), half, s.k, s.n, 0, 0, 0, s1);
        lt.run(A(half), w, nullptr, D(half), half, s.k, s.n, 0, 0, 0, s1);
      });
      time("ag two streams", [&] {
        fork_to_s2();
        lt.run(A(0), w, nullptr, D(0), half, s.k, s.n, reduced, 0, 0, s1);
        lt.run(A(half), w, nullptr, D(half), half, s.k, s.n, 0, 0, 1, s2);
        join_s2();
      });
    } else {
      auto rs = [&](size_t chunks, bool all_sms, bool two_streams) {
        auto first = [&](size_t h) { return h * half / chunks; };
        const int overlapped = all_sms ? 0 : reduced;
        if (two_streams) fork_to_s2();
        for (size_t h = 0; h < chunks; ++h) {  // the peer's rows: rows [half, m)
          lt.run(A(half + first(h)), w, nullptr, D(half + first(h)), first(h + 1) - first(h), s.k, s.n, overlapped, 0,
                 0, s1);
          if (two_streams && h == 0) {
            CHECK(cudaEventRecord(piece, s1));
            CHECK(cudaStreamWaitEvent(s2, piece, 0));
          }
        }
        cudaStream_t own = two_streams ? s2 : s1;
        for (size_t h = 0; h < chunks; ++h) {  // this rank's rows, adding C
          lt.run(A(first(h)), w, C(first(h)), D(first(h)), first(h + 1) - first(h), s.k, s.n,
                 h + 1 < chunks ? overlapped : 0, 0, two_streams ? 1 : 0, own);
        }
        if (two_streams) join_s2();
      };
      time("rs serial", [&] { rs(2, false, false); });
      time("rs serial all", [&] { rs(2, true, false); });
      time("rs two streams", [&] { rs(2, false, true); });
      for (size_t chunks : {1, 3, 4}) {
        time("rs chunks=" + std::to_string(chunks), [&] { rs(chunks, false, false); });
      }
      auto tail_add = [&] { add_into<<<sm_count * 4, 512, 0, s1>>>(D(0), C(0), half * s.n); };
      time("rs tail add", [&] {
        lt.run(A(half), w, nullptr, D(half), half, s.k, s.n, 0, 0, 0, s1);
        lt.run(A(0), w, nullptr, D(0), half, s.k, s.n, 0, 0, 0, s1);
        tail_add();
      });
      time("rs tail add only", tail_add);
      time("rs half+quarters", [&] {
        lt.run(A(half), w, nullptr, D(half), half, s.k, s.n, 0, 0, 0, s1);
        lt.run(A(0), w, C(0), D(0), half / 2, s.k, s.n, 0, 0, 0, s1);
        lt.run(A(half / 2), w, C(half / 2), D(half / 2), half - half / 2, s.k, s.n, 0, 0, 0, s1);
      });
    }
    // Each piece shape alone, on each of the heuristic's first 8 algorithms: alone, and beside a device-to-device
    // copy on a third stream (the copy engines' traffic of the fused call, heavier: both ends local).
    struct Piece {
      const char* name;
      size_t rows;
      bool with_c;
      int sms;
    };
    std::vector<Piece> pieces;
    if (s.op[0] == 'a') {
      pieces = {{"ag half sms-4", half, false, reduced}, {"ag half all", half, false, 0}};
    } else {
      pieces = {{"rs quarter sms-4", half / 2, false, reduced}, {"rs quarter +C", half / 2, true, reduced},
                {"rs half +C all", half, true, 0}};
    }
    if (!piece_tables) pieces.clear();
    for (const Piece& pc : pieces) {
      Plan& p = lt.plan(pc.rows, s.k, s.n, pc.sms);
      for (int algo = 0; algo < static_cast<int>(p.algos.size()); ++algo) {
        int tile = 0, stages = 0, split = 0, swizzle = 0, scheme = 0;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&p.algos[algo].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
        cublasLtMatmulAlgoConfigGetAttribute(&p.algos[algo].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &written);
        cublasLtMatmulAlgoConfigGetAttribute(&p.algos[algo].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split), &written);
        cublasLtMatmulAlgoConfigGetAttribute(&p.algos[algo].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle), &written);
        cublasLtMatmulAlgoConfigGetAttribute(&p.algos[algo].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &written);
        const std::string tag = std::string(pc.name) + " a" + std::to_string(algo) + " t" + std::to_string(tile) + " s" +
                                std::to_string(stages) + " k" + std::to_string(split) + " w" + std::to_string(swizzle) +
                                " r" + std::to_string(scheme) + " ws" + std::to_string(p.algos[algo].workspaceSize >> 10);
        auto one = [&] { lt.run(A(0), w, pc.with_c ? C(0) : nullptr, D(0), pc.rows, s.k, s.n, pc.sms, algo, 0, s1); };
        time(tag, one);
        time(tag + " +copy", [&] {
          fork_to_s2();
          for (int copy = 0; copy < 4; ++copy) {
            CHECK(cudaMemcpyAsync(C(half), A(0), std::min(s.m * s.n, 2 * s.m * s.k), cudaMemcpyDeviceToDevice, s2));
          }
          one();
          join_s2();
        });
      }
    }
    CHECK(cudaFree(a));
    CHECK(cudaFree(w));
    CHECK(cudaFree(d));
    CHECK(cudaFree(c));
  }
  return 0;
}
