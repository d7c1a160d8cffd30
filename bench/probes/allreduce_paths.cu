// Probe: where the time of a large all-reduce goes on one NVLink host, measured outside braid.
//
// One process drives every GPU (peer access on); each variant runs the same float32 sum all-reduce shape on
// every GPU at once and reports busbw (nccl-tests' definition, 2(n-1)/n × size / time) as the max over GPUs of
// each GPU's median kernel time. Variants:
//   - rs-loads:    reduce-scatter only, by loads from every peer (the first half of a zero-copy two shot);
//   - ag-stores:   all-gather only, by stores into every peer;
//   - ag-ce-pull:  all-gather only, by copy engines pulling every peer's shard (one stream per peer);
//   - two-shot:    both fused, as braid's zero-copy two shot (block-contiguous parts, unrolled loads):
//       seq        loads of source s issued after source s-1 arrived (braid's block_reduce with Batch 1);
//       batched    every source's loads issued before any is combined;
//       rotated    batched, and each rank starts with its next peer (loads and stores), so no GPU serves
//                  every reader at once;
//   at several block counts, threads per block and unroll depths.
// The busbw of the rs/ag halves counts only their own bytes ((n-1)/n × size); "fused" rows count both.
// Timing: host-synchronised start, CUDA events around one launch per GPU, medians of 15 after 3 warm-ups.
// Results are checked once per variant, at the first size (inputs rank+1+i%7: the sum is known).
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/allreduce_paths.cu -o build/probes/allreduce_paths
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "probe_check.cuh"


constexpr int kMaxW = 8;
struct Ptrs {
  float* p[kMaxW];
};

enum Mode { kSeq = 0, kBatched = 1, kRotated = 2, kPhased = 3, kStepped = 4 };
enum Part { kFused = 0, kReduceScatter = 1, kAllGather = 2 };

__device__ __forceinline__ float4 add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

// Block b takes a contiguous part [begin, end) of this rank's shard (in float4 vectors); thread t its vectors
// t, t + blockDim, ... (as braid).
struct VectorRange {
  size_t begin, end;
};
template <int W>
__device__ __forceinline__ VectorRange block_part(int rank, size_t vectors) {
  const size_t shard = vectors / W, shard_begin = rank * shard;
  const size_t per_block = (shard + gridDim.x - 1) / gridDim.x;
  return {shard_begin + min(shard, blockIdx.x * per_block), shard_begin + min(shard, (blockIdx.x + 1) * per_block)};
}

template <int W, int U, int M, int P>
__global__ void __launch_bounds__(512) two_shot(Ptrs in, Ptrs out, int rank, size_t vectors) {
  const VectorRange part = block_part<W>(rank, vectors);
  const size_t begin = part.begin, end = part.end;
  const float4* src[W];
  float4* dst[W];
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const int r = M == kRotated ? (rank + 1 + i) % W : i;
    src[i] = reinterpret_cast<const float4*>(in.p[r]);
    dst[i] = reinterpret_cast<float4*>(out.p[r]);
  }
  const size_t stride = blockDim.x;
  size_t e = begin + threadIdx.x;
  for (; e + (U - 1) * stride < end; e += U * stride) {
    float4 acc[U];
    if constexpr (P == kAllGather) {
#pragma unroll
      for (int u = 0; u < U; ++u) acc[u] = reinterpret_cast<const float4*>(in.p[rank])[e + u * stride];
    } else if constexpr (M == kSeq) {
#pragma unroll
      for (int u = 0; u < U; ++u) acc[u] = src[0][e + u * stride];
#pragma unroll 1
      for (int s = 1; s < W; ++s) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = src[s][e + u * stride];
#pragma unroll
        for (int u = 0; u < U; ++u) acc[u] = add4(acc[u], v[u]);
      }
    } else {
      float4 v[W][U];
#pragma unroll
      for (int s = 0; s < W; ++s)
#pragma unroll
        for (int u = 0; u < U; ++u) v[s][u] = src[s][e + u * stride];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        acc[u] = v[0][u];
#pragma unroll
        for (int s = 1; s < W; ++s) acc[u] = add4(acc[u], v[s][u]);
      }
    }
    if constexpr (P == kReduceScatter) {
#pragma unroll
      for (int u = 0; u < U; ++u) reinterpret_cast<float4*>(out.p[rank])[e + u * stride] = acc[u];
    } else {
#pragma unroll
      for (int s = 0; s < W; ++s)
#pragma unroll
        for (int u = 0; u < U; ++u) dst[s][e + u * stride] = acc[u];
    }
  }
  for (; e < end; e += stride) {
    float4 acc = src[0][e];
    for (int s = 1; s < W; ++s) acc = add4(acc, src[s][e]);
    if (P == kAllGather) acc = reinterpret_cast<const float4*>(in.p[rank])[e];
    if (P == kReduceScatter) {
      reinterpret_cast<float4*>(out.p[rank])[e] = acc;
    } else {
      for (int s = 0; s < W; ++s) dst[s][e] = acc;
    }
  }
}

// Calls f(e, stride, N) for this thread's vectors of [begin, end): N = U vectors stride apart, then singles.
template <int U, typename F>
__device__ __forceinline__ void walk(size_t begin, size_t end, F&& f) {
  const size_t stride = blockDim.x;
  size_t e = begin + threadIdx.x;
  for (; e + (U - 1) * stride < end; e += U * stride) f(e, stride, std::integral_constant<int, U>{});
  for (; e < end; e += stride) f(e, stride, std::integral_constant<int, 1>{});
}

// The two halves one after the other in each block (its part: reduce it, then store it to every peer):
//   phased   the reduce loads every peer at once (rotated), the all-gather stores to every peer at once;
//   stepped  one peer at a time in both halves (rank + 1, rank + 2, ...): the reduce accumulates in the
//            output (local HBM), so every GPU talks to one peer at a time, as in a ring.
template <int W, int U, int M, int P>
__global__ void __launch_bounds__(512) two_shot_split(Ptrs in, Ptrs out, int rank, size_t vectors) {
  const VectorRange part = block_part<W>(rank, vectors);
  const size_t begin = part.begin, end = part.end;
  float4* mine = reinterpret_cast<float4*>(out.p[rank]);
  if constexpr (P != kAllGather) {
    if constexpr (M == kPhased) {
      walk<U>(begin, end, [&](size_t e, size_t stride, auto n) {
        constexpr int N = decltype(n)::value;
        float4 v[W][N];
#pragma unroll
        for (int i = 0; i < W; ++i)
#pragma unroll
          for (int u = 0; u < N; ++u) v[i][u] = reinterpret_cast<const float4*>(in.p[(rank + i) % W])[e + u * stride];
#pragma unroll
        for (int u = 0; u < N; ++u) {
#pragma unroll
          for (int i = 1; i < W; ++i) v[0][u] = add4(v[0][u], v[i][u]);
          mine[e + u * stride] = v[0][u];
        }
      });
    } else {
#pragma unroll 1
      for (int k = 0; k < W; ++k) {
        const float4* from = reinterpret_cast<const float4*>(in.p[(rank + k) % W]);
        walk<U>(begin, end, [&](size_t e, size_t stride, auto n) {
          constexpr int N = decltype(n)::value;
          float4 v[N], a[N];
#pragma unroll
          for (int u = 0; u < N; ++u) v[u] = from[e + u * stride];
          if (k > 0) {
#pragma unroll
            for (int u = 0; u < N; ++u) a[u] = mine[e + u * stride];
#pragma unroll
            for (int u = 0; u < N; ++u) v[u] = add4(a[u], v[u]);
          }
#pragma unroll
          for (int u = 0; u < N; ++u) mine[e + u * stride] = v[u];
        });
      }
    }
  }
  if constexpr (P != kReduceScatter) {
    const float4* from = reinterpret_cast<const float4*>(P == kAllGather ? in.p[rank] : out.p[rank]);
    if constexpr (M == kPhased) {
      walk<U>(begin, end, [&](size_t e, size_t stride, auto n) {
        constexpr int N = decltype(n)::value;
        float4 v[N];
#pragma unroll
        for (int u = 0; u < N; ++u) v[u] = from[e + u * stride];
#pragma unroll
        for (int i = (P == kAllGather ? 0 : 1); i < W; ++i)
#pragma unroll
          for (int u = 0; u < N; ++u) reinterpret_cast<float4*>(out.p[(rank + i) % W])[e + u * stride] = v[u];
      });
    } else {
#pragma unroll 1
      for (int k = (P == kAllGather ? 0 : 1); k < W; ++k) {
        float4* to = reinterpret_cast<float4*>(out.p[(rank + k) % W]);
        walk<U>(begin, end, [&](size_t e, size_t stride, auto n) {
          constexpr int N = decltype(n)::value;
          float4 v[N];
#pragma unroll
          for (int u = 0; u < N; ++u) v[u] = from[e + u * stride];
#pragma unroll
          for (int u = 0; u < N; ++u) to[e + u * stride] = v[u];
        });
      }
    }
  }
}

__global__ void fill(float* data, size_t count, int rank) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    data[i] = float(rank + 1 + int(i % 7));
}

__global__ void poison(float* data, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    data[i] = -1.0f;
}

using Launch = void (*)(dim3, dim3, cudaStream_t, Ptrs, Ptrs, int, size_t);

template <int W, int U, int M, int P>
void launch(dim3 grid, dim3 block, cudaStream_t stream, Ptrs in, Ptrs out, int rank, size_t vectors) {
  if constexpr (M == kPhased || M == kStepped) two_shot_split<W, U, M, P><<<grid, block, 0, stream>>>(in, out, rank, vectors);
  else two_shot<W, U, M, P><<<grid, block, 0, stream>>>(in, out, rank, vectors);
}

struct Host {
  int world;
  size_t max_bytes;
  Ptrs in{}, out{};
  std::vector<cudaStream_t> stream;            // [rank]
  std::vector<std::vector<cudaStream_t>> ce;   // [rank][peer]
  std::vector<cudaEvent_t> start, stop;
  std::vector<std::vector<cudaEvent_t>> ce_done;
};

void sync_all(Host& h) {
  for (int r = 0; r < h.world; ++r) {
    CHECK(cudaSetDevice(r));
    CHECK(cudaDeviceSynchronize());
  }
}

// Runs `body(rank)` on every GPU between events; returns the max over ranks of the median time (µs).
template <typename Body>
double time_all(Host& h, Body body) {
  const int warm = 3, reps = 15;
  std::vector<std::vector<float>> times(h.world);
  for (int it = 0; it < warm + reps; ++it) {
    sync_all(h);
    for (int r = 0; r < h.world; ++r) {
      CHECK(cudaSetDevice(r));
      CHECK(cudaEventRecord(h.start[r], h.stream[r]));
      body(r);
      CHECK(cudaEventRecord(h.stop[r], h.stream[r]));
    }
    sync_all(h);
    if (it < warm) continue;
    for (int r = 0; r < h.world; ++r) {
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, h.start[r], h.stop[r]));
      times[r].push_back(ms);
    }
  }
  double worst = 0;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    worst = std::max(worst, double(t[t.size() / 2]) * 1000.0);
  }
  return worst;
}

// Checks every rank's out: the sum (fused), the sum in its own shard and poison elsewhere (rs), the owners'
// inputs (ag).
bool check(Host& h, size_t count, Part part) {
  const size_t shard = count / h.world;
  std::vector<float> host(count);
  for (int r = 0; r < h.world; ++r) {
    CHECK(cudaSetDevice(r));
    CHECK(cudaMemcpy(host.data(), h.out.p[r], count * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < shard * h.world; ++i) {
      const int owner = int(i / shard);
      float want = 0;
      for (int q = 0; q < h.world; ++q) want += float(q + 1 + int(i % 7));
      if (part == kAllGather) want = float(owner + 1 + int(i % 7));
      if (part == kReduceScatter && owner != r) want = -1.0f;
      if (host[i] != want) {
        std::printf("  WRONG rank %d element %zu: %g, want %g\n", r, i, host[i], want);
        return false;
      }
    }
  }
  return true;
}

void poison_all(Host& h, size_t count) {
  for (int r = 0; r < h.world; ++r) {
    CHECK(cudaSetDevice(r));
    poison<<<264, 512, 0, h.stream[r]>>>(h.out.p[r], count);
  }
  sync_all(h);
}

template <int W>
Launch pick(int unroll, int mode, int part) {
#define BRAID_PICK(U)                                                                              \
  if (unroll == U) {                                                                               \
    if (mode == kPhased) return part == kReduceScatter ? launch<W, U, kPhased, kReduceScatter> : part == kAllGather ? launch<W, U, kPhased, kAllGather> : launch<W, U, kPhased, kFused>; \
    if (mode == kStepped) return part == kReduceScatter ? launch<W, U, kStepped, kReduceScatter> : part == kAllGather ? launch<W, U, kStepped, kAllGather> : launch<W, U, kStepped, kFused>; \
    if (part == kReduceScatter) return mode == kSeq ? launch<W, U, kSeq, kReduceScatter> : mode == kBatched ? launch<W, U, kBatched, kReduceScatter> : launch<W, U, kRotated, kReduceScatter>; \
    if (part == kAllGather) return mode == kRotated ? launch<W, U, kRotated, kAllGather> : launch<W, U, kSeq, kAllGather>; \
    return mode == kSeq ? launch<W, U, kSeq, kFused> : mode == kBatched ? launch<W, U, kBatched, kFused> : launch<W, U, kRotated, kFused>; \
  }
  BRAID_PICK(1)
  BRAID_PICK(2)
  BRAID_PICK(4)
  BRAID_PICK(8)
#undef BRAID_PICK
  return nullptr;
}

const char* kModeName[] = {"seq", "batched", "rotated", "phased", "stepped"};
const char* kPartName[] = {"fused", "rs-loads", "ag-stores"};

int main(int argc, char** argv) {
  Host h;
  CHECK(cudaGetDeviceCount(&h.world));
  if (h.world != 2 && h.world != 4) {
    std::printf("needs 2 or 4 GPUs, found %d\n", h.world);
    return 2;
  }
  const std::string only = argc > 1 ? argv[1] : "all";          // a part (rs-loads, ag-stores, fused, ce) or all
  const std::string modes = argc > 2 ? argv[2] : "0,1,2,3,4";   // mode numbers to run; argv[3]: sizes (MiB)
  std::vector<size_t> sizes = {size_t(32) << 20, size_t(128) << 20, size_t(512) << 20};
  if (argc > 3) {  // sizes in MiB, comma-separated (the first one is checked)
    sizes.clear();
    for (const char* p = argv[3]; *p != '\0';) {
      char* end = nullptr;
      sizes.push_back(size_t(std::strtoul(p, &end, 10)) << 20);
      p = *end == ',' ? end + 1 : end;
    }
    std::sort(sizes.begin(), sizes.end());
  }
  h.max_bytes = *std::max_element(sizes.begin(), sizes.end());
  h.stream.resize(h.world);
  h.ce.assign(h.world, std::vector<cudaStream_t>(h.world));
  h.ce_done.assign(h.world, std::vector<cudaEvent_t>(h.world));
  h.start.resize(h.world);
  h.stop.resize(h.world);
  for (int r = 0; r < h.world; ++r) {
    CHECK(cudaSetDevice(r));
    for (int q = 0; q < h.world; ++q)
      if (q != r) CHECK(cudaDeviceEnablePeerAccess(q, 0));
    CHECK(cudaMalloc(&h.in.p[r], h.max_bytes));
    CHECK(cudaMalloc(&h.out.p[r], h.max_bytes));
    CHECK(cudaStreamCreateWithFlags(&h.stream[r], cudaStreamNonBlocking));
    for (int q = 0; q < h.world; ++q) {
      CHECK(cudaStreamCreateWithFlags(&h.ce[r][q], cudaStreamNonBlocking));
      CHECK(cudaEventCreateWithFlags(&h.ce_done[r][q], cudaEventDisableTiming));
    }
    CHECK(cudaEventCreate(&h.start[r]));
    CHECK(cudaEventCreate(&h.stop[r]));
    fill<<<264, 512, 0, h.stream[r]>>>(h.in.p[r], h.max_bytes / sizeof(float), r);
  }
  sync_all(h);
  const double factor = 2.0 * (h.world - 1) / h.world, half = (h.world - 1.0) / h.world;
  std::printf("# allreduce_paths: %d GPUs, float32 sum; busbw GB/s = bytes moved per direction / time "
              "(fused: 2(n-1)/n x size; rs/ag halves: (n-1)/n x size); max over GPUs of median of 15\n", h.world);
  std::printf("%-12s %-8s %6s %7s %6s %10s %10s %8s %s\n", "part", "mode", "blocks", "threads", "unroll", "bytes",
              "time_us", "busbw", "check");

  for (size_t bytes : sizes) {
    const size_t count = bytes / sizeof(float), vectors = count / 4;
    // Copy-engine all-gather: each rank pulls every peer's shard into its own out.
    if (only == "all" || only == "ce") {
      const size_t shard_bytes = bytes / h.world;
      poison_all(h, count);
      auto body = [&](int r) {
        for (int k = 1; k < h.world; ++k) {
          const int from = (r + k) % h.world;  // rotated, so the peers are not pulled from in the same order
          CHECK(cudaStreamWaitEvent(h.ce[r][from], h.start[r]));
          CHECK(cudaMemcpyPeerAsync(reinterpret_cast<char*>(h.out.p[r]) + from * shard_bytes, r,
                                    reinterpret_cast<char*>(h.in.p[from]) + from * shard_bytes, from, shard_bytes,
                                    h.ce[r][from]));
          CHECK(cudaEventRecord(h.ce_done[r][from], h.ce[r][from]));
          CHECK(cudaStreamWaitEvent(h.stream[r], h.ce_done[r][from]));
        }
      };
      const double us = time_all(h, body);
      std::printf("%-12s %-8s %6s %7s %6s %10zu %10.1f %8.1f %s\n", "ag-ce-pull", "-", "-", "-", "-", bytes, us,
                  half * bytes / us / 1e3, "-");
    }
    for (int part : {kReduceScatter, kAllGather, kFused}) {
      if (only != "all" && only != kPartName[part]) continue;
      for (int mode : {kSeq, kBatched, kRotated, kPhased, kStepped}) {
        if (modes.find(char('0' + mode)) == std::string::npos) continue;
        if (part == kAllGather && mode == kBatched) continue;
        for (int blocks : {64, 132, 264}) {
          for (int threads : {256, 512}) {
            for (int unroll : {1, 2, 4, 8}) {
              if (part != kFused && (unroll == 1 || unroll == 8)) continue;
              Launch fn = h.world == 4 ? pick<4>(unroll, mode, part) : pick<2>(unroll, mode, part);
              poison_all(h, count);
              const double us = time_all(h, [&](int r) { fn(blocks, threads, h.stream[r], h.in, h.out, r, vectors); });
              CHECK(cudaGetLastError());
              // Checked at the first size only (the kernels do not depend on the size; checking 512 MB a
              // variant on the host would take longer than the timing).
              const char* verdict = bytes == sizes.front() ? (check(h, count, Part(part)) ? "ok" : "WRONG") : "-";
              std::printf("%-12s %-8s %6d %7d %6d %10zu %10.1f %8.1f %s\n", kPartName[part], kModeName[mode], blocks,
                          threads, unroll, bytes, us, (part == kFused ? factor : half) * bytes / us / 1e3,
                          verdict);
              std::fflush(stdout);
            }
          }
        }
      }
    }
  }
  return 0;
}
