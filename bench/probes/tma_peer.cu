// Probe: whether the Hopper bulk-copy unit (TMA, cp.async.bulk) moves data between two GPUs of one NVLink host
// faster than SM loads and stores of 16-byte vectors, and as fast as the copy engines, and with how few blocks.
// The SM paths of braid's eager calls stop near 361 GB/s on 2×H200 where a copy engine moves 393-397; the copy
// engines need every peer's address on the host, TMA only on the GPU. Measured outside braid.
//
// One process drives GPUs 0 and 1 (peer access on, cudaMalloc buffers). Each row copies `bytes` per direction,
// one-way (GPU 0 only) or two-way (both GPUs at once), and gives GB/s per direction (bytes / kernel time, the
// max over the GPUs of each one's median):
//   - sm push:  SM loads of the local source, 16-byte stores into the peer (512 threads, 4 loads in flight);
//   - sm pull:  16-byte loads from the peer's source, stores into the local destination;
//   - tma push: one thread a block streams its part through `stages` shared-memory buffers of `chunk` bytes:
//               cp.async.bulk global→shared from the local source (mbarrier complete_tx), then
//               cp.async.bulk shared→global into the peer (bulk groups, a buffer refilled once its store read it);
//   - tma pull: the same, loading from the peer's source and storing into the local destination;
//   - ce:       cudaMemcpyPeerAsync.
// Blocks take contiguous parts of the buffer. Every variant's destination is poisoned once, one pass runs and
// 9 windows of 4 KiB of it are compared on the host with the source's pattern.
// Timing: host-synchronised start, CUDA events around one launch per GPU, medians of 11 after 3 warm-ups.
// Usage: tma_peer [bytes]
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/tma_peer.cu -o build/probes/tma_peer
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.cuh"
#include "probe_copy.cuh"

__global__ void __launch_bounds__(512) sm_copy(const uint4* __restrict__ from, uint4* __restrict__ to, size_t vectors) {
  const size_t per_block = (vectors + gridDim.x - 1) / gridDim.x;
  const size_t begin = min(vectors, blockIdx.x * per_block), end = min(vectors, begin + per_block);
  copy_range<4>(from, to, begin, end);
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void wait_parity(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// The block's part of [0, bytes) in chunks of `chunk` bytes (the last one shorter), through `stages` buffers.
// Thread 0 alone issues every bulk copy; the others only hold the block's shared memory.
__global__ void __launch_bounds__(32) tma_copy(const char* __restrict__ from, char* __restrict__ to, size_t bytes,
                                               uint32_t chunk, int stages) {
  extern __shared__ __align__(128) char buffers[];
  __shared__ __align__(8) uint64_t bars[8];
  if (threadIdx.x != 0) return;
  const size_t per_block = (bytes / gridDim.x + 15) / 16 * 16;
  const size_t begin = min(bytes, blockIdx.x * per_block), end = min(bytes, begin + per_block);
  const size_t chunks = (end - begin + chunk - 1) / chunk;
  for (int s = 0; s < stages; ++s) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&bars[s])) : "memory");
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  auto load = [&](size_t c) {
    const int s = static_cast<int>(c % stages);
    const size_t at = begin + c * chunk;
    const uint32_t size = static_cast<uint32_t>((chunk < end - at ? size_t(chunk) : end - at));
    const uint32_t bar = shared_address(&bars[s]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(size) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     shared_address(buffers + size_t(s) * chunk)),
                 "l"(from + at), "r"(size), "r"(bar)
                 : "memory");
  };
  for (size_t c = 0; c < (chunks < size_t(stages) ? chunks : size_t(stages)); ++c) load(c);
  for (size_t c = 0; c < chunks; ++c) {
    const int s = static_cast<int>(c % stages);
    wait_parity(shared_address(&bars[s]), static_cast<uint32_t>((c / stages) & 1));
    const size_t at = begin + c * chunk;
    const uint32_t size = static_cast<uint32_t>((chunk < end - at ? size_t(chunk) : end - at));
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(to + at),
                 "r"(shared_address(buffers + size_t(s) * chunk)), "r"(size)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    // The previous chunk's buffer is free once its store has read it: refill it with the chunk `stages` ahead.
    if (c >= 1 && c - 1 + stages < chunks) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      load(c - 1 + stages);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

enum Method { kSmPush, kSmPull, kTmaPush, kTmaPull, kCe };
const char* kMethodNames[] = {"sm push", "sm pull", "tma push", "tma pull", "ce"};

struct Gpu {
  char* src;
  char* dst;  // the peer's push lands here; a pull lands in the own dst
  cudaStream_t stream;
  cudaEvent_t start, stop;
};

unsigned char pattern(int gpu, size_t offset) { return static_cast<unsigned char>((offset * 7 + gpu * 101 + 3) & 0xff); }

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t(256) << 20) / 16 * 16;
  Gpu gpu[2];
  std::vector<unsigned char> host(bytes);
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
    CHECK(cudaMalloc(&gpu[g].src, bytes));
    CHECK(cudaMalloc(&gpu[g].dst, bytes));
    for (size_t i = 0; i < bytes; ++i) host[i] = pattern(g, i);
    CHECK(cudaMemcpy(gpu[g].src, host.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaStreamCreateWithFlags(&gpu[g].stream, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&gpu[g].start));
    CHECK(cudaEventCreate(&gpu[g].stop));
    CHECK(cudaFuncSetAttribute(tma_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("# tma_peer: %zu bytes per direction, GB/s per direction (median of 11, max over GPUs), %d SMs\n", bytes, sms);
  std::printf("%-9s %-8s %6s %9s %6s %10s %8s\n", "method", "way", "blocks", "chunk_KiB", "stages", "time_us", "GB/s");

  // GPU g's launch: a push moves g's source into the peer's dst, a pull moves the peer's source into g's dst.
  auto launch = [&](Method m, int g, int blocks, uint32_t chunk, int stages) {
    const int p = 1 - g;
    const bool push = m == kSmPush || m == kTmaPush;
    const char* from = push ? gpu[g].src : gpu[p].src;
    char* to = push ? gpu[p].dst : gpu[g].dst;
    if (m == kCe) {
      CHECK(cudaMemcpyPeerAsync(gpu[p].dst, p, gpu[g].src, g, bytes, gpu[g].stream));
    } else if (m == kSmPush || m == kSmPull) {
      sm_copy<<<blocks, 512, 0, gpu[g].stream>>>(reinterpret_cast<const uint4*>(from), reinterpret_cast<uint4*>(to), bytes / 16);
    } else {
      tma_copy<<<blocks, 32, size_t(chunk) * stages, gpu[g].stream>>>(from, to, bytes, chunk, stages);
    }
    CHECK(cudaGetLastError());
  };
  // Where GPU `g`'s launch of `m` wrote, and whose pattern it must hold.
  auto landed = [&](Method m, int g, int* owner) {
    const bool pull = m == kSmPull || m == kTmaPull;
    *owner = pull ? 1 - g : g;
    return pull ? g : 1 - g;
  };
  auto check = [&](Method m, bool two_way, int blocks, uint32_t chunk, int stages) {
    for (int g = 0; g < 2; ++g) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaMemset(gpu[g].dst, 0xA5, bytes));
      CHECK(cudaDeviceSynchronize());
    }
    for (int g = 0; g < (two_way ? 2 : 1); ++g) {
      CHECK(cudaSetDevice(g));
      launch(m, g, blocks, chunk, stages);
    }
    for (int g = 0; g < 2; ++g) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaDeviceSynchronize());
    }
    for (int g = 0; g < (two_way ? 2 : 1); ++g) {
      int owner = 0;
      const int where = landed(m, g, &owner);
      std::vector<unsigned char> window(4096);
      for (int w = 0; w < 9; ++w) {
        const size_t at = std::min(bytes - window.size(), (bytes - window.size()) / 8 * w) / 16 * 16;
        CHECK(cudaMemcpy(window.data(), gpu[where].dst + at, window.size(), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < window.size(); ++i) {
          if (window[i] != pattern(owner, at + i)) {
            std::printf("WRONG: %s from GPU %d, byte %zu holds %d, expected %d\n", kMethodNames[m], g, at + i,
                        window[i], pattern(owner, at + i));
            std::exit(1);
          }
        }
      }
    }
  };
  auto run = [&](Method m, bool two_way, int blocks, uint32_t chunk, int stages) {
    check(m, two_way, blocks, chunk, stages);
    std::vector<float> times[2];
    for (int it = 0; it < 14; ++it) {
      for (int g = 0; g < 2; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaDeviceSynchronize());
      }
      for (int g = 0; g < (two_way ? 2 : 1); ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaEventRecord(gpu[g].start, gpu[g].stream));
        launch(m, g, blocks, chunk, stages);
        CHECK(cudaEventRecord(gpu[g].stop, gpu[g].stream));
      }
      for (int g = 0; g < (two_way ? 2 : 1); ++g) {
        const float ms = elapsed_ms(g, gpu[g].start, gpu[g].stop);
        if (it >= 3) times[g].push_back(ms * 1000.f);
      }
    }
    float worst = 0;
    for (auto& t : times) {
      if (t.empty()) continue;
      std::sort(t.begin(), t.end());
      worst = std::max(worst, t[t.size() / 2]);
    }
    const bool tma = m == kTmaPush || m == kTmaPull;
    std::printf("%-9s %-8s %6d %9u %6d %10.1f %8.1f\n", kMethodNames[m], two_way ? "two-way" : "one-way",
                m == kCe ? 0 : blocks, tma ? chunk >> 10 : 0, tma ? stages : 0, worst, bytes / (worst * 1e3));
    std::fflush(stdout);
  };

  for (bool two_way : {false, true}) {
    run(kCe, two_way, 0, 0, 0);
    for (int blocks : {32, sms, 2 * sms}) {
      run(kSmPush, two_way, blocks, 0, 0);
      run(kSmPull, two_way, blocks, 0, 0);
    }
    for (Method m : {kTmaPush, kTmaPull}) {
      for (int blocks : {8, 16, 32, 66, sms}) {
        for (uint32_t chunk : {8u << 10, 16u << 10, 32u << 10}) {
          for (int stages : {2, 4}) {
            if (size_t(chunk) * stages > (200u << 10)) continue;
            run(m, two_way, blocks, chunk, stages);
          }
        }
      }
    }
  }
  return 0;
}
