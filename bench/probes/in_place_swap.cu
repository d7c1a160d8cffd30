// Probe: how fast two GPUs swap the blocks of an in-place all-to-all on 2 ranks, outside braid. GPU g's buffer
// holds blocks 0 and 1 of `bytes / 2` each; block 1 - g of GPU g and block g of GPU 1 - g change places. Each GPU
// swaps one half of the pair (GPU 0 the first half, GPU 1 the second), so no GPU touches bytes the other swaps.
//   - push bound:     each GPU copies a whole block into the peer's other buffer (the out-of-place all-to-all);
//   - slots L:        braid's schedule: the half in tapered chunks (the largest L), each pulled into one of two
//                     slots (the pull of chunk c waits for the copy out of chunk c - 2's slot), pushed into the
//                     place it was pulled from (side stream), and copied out of the slot by SMs (second side
//                     stream) into the place the push read;
//   - area L:         the same, every chunk in its own place of a staging area as large as the half (no slot
//                     waits);
//   - area even N:    the same with N even chunks;
//   - sm swap B:      one kernel of B blocks: each thread loads U vectors of the peer's half and of its own, then
//                     stores each into the other's place (no staging, no copy engine);
//   - push area L:    pushes only: each GPU pushes its whole block, in tapered chunks (the largest L), into the
//                     peer's staging area, and copies chunk c of its area into its own block by SMs once its push
//                     of chunk c has read it and the peer's push of chunk c has landed (an event of the other
//                     GPU: what a flag per chunk would tell);
//   - push ce out L:  the same, each chunk copied out of the area by the copy engine instead of SMs.
// Each row: microseconds and bus bandwidth (a block / time: the all-to-all's on 2 ranks), the median of 11 after
// 3 warm-ups; host-synchronised start, events on each GPU's first stream, the max over the two GPUs. After the
// timed runs, one more swap is checked element by element on both GPUs.
// Usage: in_place_swap [bytes]   (the all-to-all's buffer a rank; default 256 MiB)
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/in_place_swap.cu -lcuda -o build/probes/in_place_swap
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe_check.cuh"
#include "probe_vmm.cuh"

constexpr int kThreads = 512;
constexpr int kUnroll = 4;
constexpr int kMaxChunks = 256;
constexpr size_t kMiB = size_t(1) << 20;

// Each thread swaps U vectors at a time of its block's contiguous part of [0, n).
__global__ void __launch_bounds__(kThreads) swap_vectors(uint4* __restrict__ mine, uint4* __restrict__ theirs, size_t n) {
  const size_t per_block = (n + gridDim.x - 1) / gridDim.x;
  const size_t begin = blockIdx.x * per_block, end = begin + per_block < n ? begin + per_block : n;
  for (size_t i = begin + threadIdx.x; i < end; i += kUnroll * size_t(kThreads)) {
    uint4 a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t at = i + u * size_t(kThreads);
      if (at < end) {
        a[u] = mine[at];
        b[u] = theirs[at];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t at = i + u * size_t(kThreads);
      if (at < end) {
        theirs[at] = a[u];
        mine[at] = b[u];
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) copy_vectors(uint4* __restrict__ to, const uint4* __restrict__ from, size_t n) {
  for (size_t i = blockIdx.x * size_t(kThreads) + threadIdx.x; i < n; i += size_t(gridDim.x) * kThreads) to[i] = from[i];
}

__global__ void fill(uint32_t* words, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    words[i] = seed * 0x9E3779B9u ^ static_cast<uint32_t>(i * 2654435761u);
  }
}

__global__ void count_wrong(const uint32_t* words, size_t n, uint32_t seed, unsigned long long* wrong) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    if (words[i] != (seed * 0x9E3779B9u ^ static_cast<uint32_t>(i * 2654435761u))) atomicAdd(wrong, 1ull);
  }
}

struct Gpu : ScheduleStreams {
  char* buffer;   // blocks 0 and 1
  char* other;    // the push bound's destination
  char* staging;  // as large as a half
  cudaEvent_t pulled[kMaxChunks], pushed[kMaxChunks], copied[kMaxChunks];
};
Gpu gpu[2];
int devices = 2;  // 1: both sides on GPU 0 (a dry run of the schedules and the check; its times mean nothing)
int device_of(int g) { return g % devices; }

enum class Kind { kPushBound, kSlots, kArea, kAreaEven, kSmSwap, kPushArea, kPushAreaEngineOut };
struct Variant {
  Kind kind;
  size_t param;  // the largest chunk (slots, area), the chunk count (area even), the blocks (sm swap)
};

std::string name(const Variant& v) {
  switch (v.kind) {
    case Kind::kPushBound: return "push bound";
    case Kind::kSlots: return "slots " + std::to_string(v.param / kMiB) + "M";
    case Kind::kArea: return "area " + std::to_string(v.param / kMiB) + "M";
    case Kind::kAreaEven: return "area even " + std::to_string(v.param);
    case Kind::kSmSwap: return "sm swap " + std::to_string(v.param);
    case Kind::kPushArea: return "push area " + std::to_string(v.param / kMiB) + "M";
    case Kind::kPushAreaEngineOut: return "push ce out " + std::to_string(v.param / kMiB) + "M";
  }
  return "";
}

// Chunk ends of `bytes`: from the end two of min(largest, 8 MiB), then each twice the next up to `largest`; a first
// chunk smaller than the last joins the next (braid's Chunks::tapered, every boundary on 256 bytes).
std::vector<size_t> tapered(size_t bytes, size_t largest) {
  std::vector<size_t> sizes;  // from the end
  const size_t last = std::min(largest, 8 * kMiB);
  size_t left = bytes, next = last;
  for (int k = 0; left > 0; ++k) {
    const size_t take = std::min(left, next);
    sizes.push_back(take);
    left -= take;
    if (k >= 1) next = std::min(largest, next * 2);
  }
  if (sizes.size() >= 2 && sizes.back() < last) {
    const size_t first = sizes.back();
    sizes.pop_back();
    sizes.back() += first;
  }
  std::vector<size_t> ends;
  size_t at = 0;
  for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) ends.push_back(at += *it);
  return ends;
}

std::vector<size_t> even(size_t bytes, size_t count) {
  std::vector<size_t> ends;
  for (size_t c = 1; c <= count; ++c) ends.push_back(c == count ? bytes : bytes * c / count / 256 * 256);
  return ends;
}

void local_copy(char* to, const char* from, size_t bytes, cudaStream_t stream) {
  const size_t n = bytes / 16;
  const int blocks = static_cast<int>(std::min<size_t>(132, (n + kThreads - 1) / kThreads));
  copy_vectors<<<std::max(blocks, 1), kThreads, 0, stream>>>(reinterpret_cast<uint4*>(to),
                                                            reinterpret_cast<const uint4*>(from), n);
  CHECK(cudaGetLastError());
}

// GPU g's part of one swap (or of the push bound), the way `v` says.
void issue(int g, const Variant& v, size_t bytes) {
  CHECK(cudaSetDevice(device_of(g)));
  Gpu& G = gpu[g];
  const int peer = 1 - g;
  const size_t block = bytes / 2, half = block / 2 / 256 * 256;
  const size_t own_offset = g == 0 ? 0 : half, own_bytes = g == 0 ? half : block - half;
  char* const mine = G.buffer + peer * block + own_offset;
  char* const theirs = gpu[peer].buffer + g * block + own_offset;
  CHECK(cudaEventRecord(G.start, G.s0));
  CHECK(cudaEventRecord(G.fork, G.s0));
  CHECK(cudaStreamWaitEvent(G.s1, G.fork, 0));
  CHECK(cudaStreamWaitEvent(G.s2, G.fork, 0));
  switch (v.kind) {
    case Kind::kPushBound:
      CHECK(cudaMemcpyAsync(gpu[peer].other + g * block, G.buffer + peer * block, block, cudaMemcpyDefault, G.s0));
      break;
    case Kind::kSmSwap:
      swap_vectors<<<static_cast<int>(v.param), kThreads, 0, G.s0>>>(reinterpret_cast<uint4*>(mine),
                                                                    reinterpret_cast<uint4*>(theirs), own_bytes / 16);
      CHECK(cudaGetLastError());
      break;
    default: {
      const std::vector<size_t> ends = v.kind == Kind::kAreaEven ? even(own_bytes, v.param) : tapered(own_bytes, v.param);
      const bool slots = v.kind == Kind::kSlots;
      size_t slot_bytes = 0;
      for (size_t c = 0; c < ends.size(); ++c) slot_bytes = std::max(slot_bytes, ends[c] - (c == 0 ? 0 : ends[c - 1]));
      for (size_t c = 0; c < ends.size(); ++c) {
        const size_t at = c == 0 ? 0 : ends[c - 1], n = ends[c] - at;
        char* const place = slots ? G.staging + (c % 2) * slot_bytes : G.staging + at;
        if (slots && c >= 2) CHECK(cudaStreamWaitEvent(G.s0, G.copied[c - 2], 0));
        CHECK(cudaMemcpyAsync(place, theirs + at, n, cudaMemcpyDefault, G.s0));
        CHECK(cudaEventRecord(G.pulled[c], G.s0));
        CHECK(cudaStreamWaitEvent(G.s1, G.pulled[c], 0));
        CHECK(cudaMemcpyAsync(theirs + at, mine + at, n, cudaMemcpyDefault, G.s1));
        CHECK(cudaEventRecord(G.pushed[c], G.s1));
        CHECK(cudaStreamWaitEvent(G.s2, G.pushed[c], 0));
        local_copy(mine + at, place, n, G.s2);
        CHECK(cudaEventRecord(G.copied[c], G.s2));
      }
    }
  }
  for (cudaStream_t s : {G.s1, G.s2}) {
    CHECK(cudaEventRecord(G.join, s));
    CHECK(cudaStreamWaitEvent(G.s0, G.join, 0));
  }
  CHECK(cudaEventRecord(G.stop, G.s0));
}

// Both GPUs' part of a push-area swap: every push first (so each GPU's copy out can wait for the peer's).
void issue_push_area(const Variant& v, size_t bytes) {
  const size_t block = bytes / 2;
  const std::vector<size_t> ends = tapered(block, v.param);
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(device_of(g)));
    Gpu& G = gpu[g];
    CHECK(cudaEventRecord(G.start, G.s0));
    CHECK(cudaEventRecord(G.fork, G.s0));
    CHECK(cudaStreamWaitEvent(G.s2, G.fork, 0));
  }
  for (size_t c = 0; c < ends.size(); ++c) {
    const size_t at = c == 0 ? 0 : ends[c - 1], n = ends[c] - at;
    for (int g = 0; g < 2; ++g) {
      CHECK(cudaSetDevice(device_of(g)));
      Gpu& G = gpu[g];
      CHECK(cudaMemcpyAsync(gpu[1 - g].staging + at, G.buffer + (1 - g) * block + at, n, cudaMemcpyDefault, G.s0));
      CHECK(cudaEventRecord(G.pushed[c], G.s0));
    }
  }
  for (size_t c = 0; c < ends.size(); ++c) {
    const size_t at = c == 0 ? 0 : ends[c - 1], n = ends[c] - at;
    for (int g = 0; g < 2; ++g) {
      CHECK(cudaSetDevice(device_of(g)));
      Gpu& G = gpu[g];
      CHECK(cudaStreamWaitEvent(G.s2, G.pushed[c], 0));
      CHECK(cudaStreamWaitEvent(G.s2, gpu[1 - g].pushed[c], 0));
      if (v.kind == Kind::kPushAreaEngineOut) {
        CHECK(cudaMemcpyAsync(G.buffer + (1 - g) * block + at, G.staging + at, n, cudaMemcpyDefault, G.s2));
      } else {
        local_copy(G.buffer + (1 - g) * block + at, G.staging + at, n, G.s2);
      }
    }
  }
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(device_of(g)));
    Gpu& G = gpu[g];
    CHECK(cudaEventRecord(G.join, G.s2));
    CHECK(cudaStreamWaitEvent(G.s0, G.join, 0));
    CHECK(cudaEventRecord(G.stop, G.s0));
  }
}

void issue_both(const Variant& v, size_t bytes) {
  if (v.kind == Kind::kPushArea || v.kind == Kind::kPushAreaEngineOut) return issue_push_area(v, bytes);
  for (int g = 0; g < 2; ++g) issue(g, v, bytes);
}

void synchronize_both() {
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(device_of(g)));
    CHECK(cudaDeviceSynchronize());
  }
}

// Wrong words on both GPUs after `swaps` swaps of buffers filled with seeds 2g and 2g + 1 (blocks 0 and 1).
unsigned long long wrong_words(size_t bytes, int swaps, unsigned long long* const wrong[2]) {
  const size_t block = bytes / 2;
  unsigned long long total = 0;
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(device_of(g)));
    CHECK(cudaMemset(wrong[g], 0, sizeof *wrong[g]));
    for (int b = 0; b < 2; ++b) {
      // Block b of GPU g holds, after an odd count of swaps, block g of GPU b (b != g).
      const bool moved = swaps % 2 == 1 && b != g;
      const uint32_t seed = moved ? 2 * b + g : 2 * g + b;
      count_wrong<<<264, 256>>>(reinterpret_cast<const uint32_t*>(gpu[g].buffer + b * block), block / 4, seed, wrong[g]);
    }
    unsigned long long host = 0;
    CHECK(cudaMemcpy(&host, wrong[g], sizeof host, cudaMemcpyDeviceToHost));
    total += host;
  }
  return total;
}

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : 256 * kMiB;
  if (bytes % 1024 != 0 || bytes < 2048) {
    std::fprintf(stderr, "bytes must be a multiple of 1024\n");
    return 2;
  }
  std::vector<Variant> variants = {{Kind::kPushBound, 0}};
  for (size_t largest : {16, 64}) variants.push_back({Kind::kSlots, largest * kMiB});
  for (size_t largest : {16, 32, 64}) variants.push_back({Kind::kArea, largest * kMiB});
  for (size_t count : {2, 4, 8}) variants.push_back({Kind::kAreaEven, count});
  for (size_t blocks : {132, 264, 528}) variants.push_back({Kind::kSmSwap, blocks});
  for (size_t largest : {16, 64, 128}) variants.push_back({Kind::kPushArea, largest * kMiB});
  variants.push_back({Kind::kPushAreaEngineOut, 64 * kMiB});
  CU_CHECK(cuInit(0));
  CHECK(cudaGetDeviceCount(&devices));
  devices = std::min(devices, 2);
  unsigned long long* wrong[2];
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(device_of(g)));
    Gpu& G = gpu[g];
    if (devices == 2) {
      CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
      G.buffer = static_cast<char*>(vmm_alloc(g, bytes));
      G.other = static_cast<char*>(vmm_alloc(g, bytes));
      G.staging = static_cast<char*>(vmm_alloc(g, bytes / 2));  // a whole block (push area), or a half's chunks
    } else {
      CHECK(cudaMalloc(&G.buffer, bytes));
      CHECK(cudaMalloc(&G.other, bytes));
      CHECK(cudaMalloc(&G.staging, bytes / 2));
    }
    CHECK(cudaMalloc(&wrong[g], sizeof(unsigned long long)));
    G.make();
    make_untimed_events(G.pulled, kMaxChunks);
    make_untimed_events(G.pushed, kMaxChunks);
    make_untimed_events(G.copied, kMaxChunks);
  }
  std::printf("# in_place_swap: %zu bytes a rank (blocks of %zu); bus GB/s = a block / time, median of 11%s\n", bytes,
              bytes / 2, devices == 2 ? "" : "; ONE GPU: a dry run, times mean nothing");
  std::printf("%-16s %10s %10s %8s\n", "variant", "us", "GB/s", "wrong");
  for (const Variant& v : variants) {
    for (int g = 0; g < 2; ++g) {
      CHECK(cudaSetDevice(device_of(g)));
      for (int b = 0; b < 2; ++b) {
        fill<<<264, 256>>>(reinterpret_cast<uint32_t*>(gpu[g].buffer + b * (bytes / 2)), bytes / 8, 2 * g + b);
      }
    }
    synchronize_both();
    std::vector<float> times;
    int swaps = 0;
    for (int rep = 0; rep < 14; ++rep) {
      synchronize_both();
      issue_both(v, bytes);
      float ms = 0;
      for (int g = 0; g < 2; ++g) ms = std::max(ms, elapsed_ms(device_of(g), gpu[g].start, gpu[g].stop));
      if (rep >= 3) times.push_back(ms);
      if (v.kind != Kind::kPushBound) ++swaps;
    }
    synchronize_both();
    std::sort(times.begin(), times.end());
    const double us = times[times.size() / 2] * 1e3;
    if (v.kind != Kind::kPushBound) {  // one more swap, checked
      issue_both(v, bytes);
      synchronize_both();
      ++swaps;
    }
    std::printf("%-16s %10.1f %10.1f %8llu\n", name(v).c_str(), us, bytes / 2 / us / 1e3,
                wrong_words(bytes, swaps, wrong));
  }
  return 0;
}
