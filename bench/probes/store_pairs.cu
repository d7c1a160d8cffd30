// Probe: how fast SM stores move data between two GPUs of one NVLink host when both directions are busy, as
// in an all-to-all, a MoE dispatch or combine on 2 ranks; measured outside braid.
//
// One process drives GPUs 0 and 1 (peer access on). Each variant copies `bytes` from a local buffer into the
// peer's buffer (16-byte vectors) with B blocks of N threads, each thread keeping U loads in flight, and
// reports GB/s per direction (bytes / kernel time, the max over the GPUs of each one's median):
//   - one-way:  only GPU 0 stores (GPU 1 idle);
//   - two-way:  both GPUs store into each other at once;
//   - two-way+local: both store into each other while a second kernel on another stream copies `bytes`
//                    locally on each GPU (HBM traffic beside the wire, as the pulls of a FIFO all-to-all);
//   - ce two-way: cudaMemcpyPeerAsync in both directions at once;
//   - pieces[+sc|+acqrel]: two-way, in pieces, each posted with a flag behind no fence, __threadfence_system
//                          or fence.acq_rel.sys (what posting a FIFO piece costs the sender).
// Usage: store_pairs [bytes] [sweep]   (sweep: block, thread and unroll sweep of the plain copies first)
// Blocks take contiguous parts of the buffer (as braid's pieces); threads stride within their block's part.
// Timing: host-synchronised start, CUDA events around one launch per GPU, medians of 11 after 3 warm-ups.
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/store_pairs.cu -o build/probes/store_pairs
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe_check.cuh"
#include "probe_copy.cuh"



template <int U>
__global__ void __launch_bounds__(1024) copy_parts(const uint4* __restrict__ from, uint4* __restrict__ to, size_t vectors) {
  const size_t per_block = (vectors + gridDim.x - 1) / gridDim.x;
  const size_t begin = min(vectors, blockIdx.x * per_block), end = min(vectors, begin + per_block);
  copy_range<U>(from, to, begin, end);
}

// As copy_parts, in pieces of `piece` vectors: after each piece the block meets at a barrier and thread 0 runs
// fence F (0: none, 1: __threadfence_system = fence.sc.sys, 2: fence.acq_rel.sys) and stores a flag into the
// peer, as a FIFO sender posts a piece. Nobody waits for the flags: this measures what posting costs the sender.
template <int U, int F>
__global__ void __launch_bounds__(1024) copy_pieces(const uint4* __restrict__ from, uint4* __restrict__ to, size_t vectors,
                                                   size_t piece, unsigned long long* flags) {
  const size_t per_block = (vectors + gridDim.x - 1) / gridDim.x;
  const size_t begin = min(vectors, blockIdx.x * per_block), end = min(vectors, begin + per_block);
  for (size_t p = begin; p < end; p += piece) {
    copy_range<U>(from, to, p, min(end, p + piece));
    __syncthreads();
    if (threadIdx.x == 0) {
      if constexpr (F == 1) __threadfence_system();
      if constexpr (F == 2) asm volatile("fence.acq_rel.sys;" ::: "memory");
      asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(flags + blockIdx.x), "l"(p) : "memory");
    }
  }
}

using Kernel = void (*)(const uint4*, uint4*, size_t);
Kernel kernel_for(int unroll) { return unroll == 8 ? copy_parts<8> : unroll == 2 ? copy_parts<2> : copy_parts<4>; }

struct Gpu {
  uint4* src;
  uint4* dst;    // the peer stores here
  uint4* local;  // local copy target
  unsigned long long* flags;  // the peer posts here
  cudaStream_t wire, side;
  cudaEvent_t start, stop;
};

enum Variant { kOneWay, kTwoWay, kTwoWayLocal, kCeTwoWay, kPiecesNoFence, kPiecesScFence, kPiecesRelFence };
const char* kNames[] = {"one-way", "two-way", "two-way+local", "ce two-way", "pieces", "pieces+sc", "pieces+acqrel"};

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t(256) << 20);
  const size_t vectors = bytes / 16;
  Gpu gpu[2];
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
    CHECK(cudaMalloc(&gpu[g].src, bytes));
    CHECK(cudaMalloc(&gpu[g].dst, bytes));
    CHECK(cudaMalloc(&gpu[g].local, bytes));
    CHECK(cudaMalloc(&gpu[g].flags, 4096 * sizeof(unsigned long long)));
    CHECK(cudaMemset(gpu[g].src, 1 + g, bytes));
    CHECK(cudaStreamCreateWithFlags(&gpu[g].wire, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&gpu[g].side, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&gpu[g].start));
    CHECK(cudaEventCreate(&gpu[g].stop));
  }
  std::printf("# store_pairs: %zu bytes per direction, GB/s per direction (median of 11, max over GPUs)\n", bytes);
  std::printf("%-14s %6s %7s %6s %10s %10s\n", "variant", "blocks", "threads", "unroll", "time_us", "GB/s");

  auto run = [&](Variant variant, int blocks, int threads, int unroll, size_t piece_bytes = 0) {
    const Kernel kernel = kernel_for(unroll);
    std::vector<float> times[2];
    for (int it = 0; it < 14; ++it) {
      for (int g = 0; g < 2; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaDeviceSynchronize());
      }
      for (int g = 0; g < 2; ++g) {
        if (variant == kOneWay && g == 1) continue;
        CHECK(cudaSetDevice(g));
        CHECK(cudaEventRecord(gpu[g].start, gpu[g].wire));
        if (variant >= kPiecesNoFence) {
          auto pieces = variant == kPiecesNoFence ? copy_pieces<4, 0> : variant == kPiecesScFence ? copy_pieces<4, 1> : copy_pieces<4, 2>;
          pieces<<<blocks, threads, 0, gpu[g].wire>>>(gpu[g].src, gpu[1 - g].dst, vectors, piece_bytes / 16, gpu[1 - g].flags);
        } else if (variant == kCeTwoWay) {
          CHECK(cudaMemcpyPeerAsync(gpu[1 - g].dst, 1 - g, gpu[g].src, g, bytes, gpu[g].wire));
        } else {
          kernel<<<blocks, threads, 0, gpu[g].wire>>>(gpu[g].src, gpu[1 - g].dst, vectors);
          if (variant == kTwoWayLocal) kernel<<<blocks, threads, 0, gpu[g].side>>>(gpu[g].src, gpu[g].local, vectors);
        }
        CHECK(cudaEventRecord(gpu[g].stop, gpu[g].wire));
      }
      for (int g = 0; g < 2; ++g) {
        if (variant == kOneWay && g == 1) continue;
        CHECK(cudaSetDevice(g));
        CHECK(cudaEventSynchronize(gpu[g].stop));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, gpu[g].start, gpu[g].stop));
        if (it >= 3) times[g].push_back(ms * 1000.f);
      }
    }
    float worst = 0;
    for (int g = 0; g < 2; ++g) {
      if (times[g].empty()) continue;
      std::sort(times[g].begin(), times[g].end());
      worst = std::max(worst, times[g][times[g].size() / 2]);
    }
    std::printf("%-14s %6d %7d %6d %10.1f %10.1f", kNames[variant], variant == kCeTwoWay ? 0 : blocks,
                variant == kCeTwoWay ? 0 : threads, variant == kCeTwoWay ? 0 : unroll, worst, bytes / (worst * 1e3));
    if (piece_bytes) std::printf("  piece %zu KiB", piece_bytes >> 10);
    std::printf("\n");
    std::fflush(stdout);
  };

  // Checked once: GPU 1's dst holds GPU 0's bytes after a two-way run.
  run(kTwoWay, 64, 512, 4);
  std::vector<unsigned char> check(4096);
  CHECK(cudaSetDevice(1));
  CHECK(cudaMemcpy(check.data(), reinterpret_cast<char*>(gpu[1].dst) + bytes - check.size(), check.size(), cudaMemcpyDeviceToHost));
  for (unsigned char c : check) {
    if (c != 1) {
      std::printf("check failed: %d\n", c);
      return 1;
    }
  }
  const bool sweep = argc > 2 && std::string(argv[2]) == "sweep";
  if (sweep) {
    for (int blocks : {32, 64, 128, 132, 264}) {
      for (int threads : {256, 512, 1024}) {
        for (int unroll : {4, 8}) {
          run(kTwoWay, blocks, threads, unroll);
        }
      }
    }
    for (int blocks : {64, 132}) {
      run(kOneWay, blocks, 512, 4);
      run(kTwoWayLocal, blocks, 512, 4);
    }
  }
  run(kCeTwoWay, 0, 0, 0);
  for (int threads : {256, 512}) {
    run(kTwoWay, 64, threads, 4);
    for (size_t piece : {size_t(32) << 10, size_t(64) << 10, size_t(256) << 10, size_t(1) << 20}) {
      for (Variant v : {kPiecesNoFence, kPiecesScFence, kPiecesRelFence}) run(v, 64, threads, 4, piece);
    }
  }
  return 0;
}
