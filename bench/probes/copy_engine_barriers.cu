// Probe: what the barriers around a copy-engine all-gather cost, measured outside braid. Braid's copy-engine
// all-gather on 2 ranks (copy_engine.cpp) runs, on each rank's stream: a one-block barrier kernel (store a flag
// into the peer's memory, wait for the peer's), one cudaMemcpyAsync of this rank's block into the peer's
// output, and a second barrier kernel; this rank's own block is copied by 16 SM blocks on a side stream forked
// before the first barrier and joined before the second. This probe runs that call back to back on VMM memory
// mapped by both GPUs, with the barriers as:
//   - none (the copies alone: the bound);
//   - kernels (braid's);
//   - stream memory operations (cuStreamWriteValue32 into the peer's flag, cuStreamWaitValue32 on this GPU's),
//     which no SM runs;
//   - a kernel before the copy and stream memory operations after it;
//   - a stream write of the flag, then a one-block kernel that only waits for the peer's.
// Each figure: 10 calls timed with events on each GPU's stream, the slower GPU's median of 7 after 2 warm-ups
// (slower_gpu_median_us), in us a call and busbw (the block over the time).
// Usage: copy_engine_barriers [block MiB ...]   (default 128 256: all-gathers of 256 and 512 MiB)
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/copy_engine_barriers.cu -lcuda -o build/probes/copy_engine_barriers
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.cuh"
#include "probe_copy.cuh"
#include "probe_reduce.cuh"
#include "probe_vmm.cuh"

constexpr size_t kMiB = size_t(1) << 20;
constexpr int kCalls = 10;

// Stores `epoch` into the peer's flag (unless `signal` is off), then waits until this GPU's flag reaches it.
__global__ void barrier_kernel(unsigned int* mine, unsigned int* peer, unsigned int epoch, bool signal) {
  if (threadIdx.x != 0) return;
  if (signal) asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(peer), "r"(epoch) : "memory");
  unsigned int seen = 0;
  do {
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(mine) : "memory");
  } while (seen < epoch);
}

__global__ void copy_kernel(const uint4* from, uint4* to, size_t vectors) {
  const size_t per_block = (vectors + gridDim.x - 1) / gridDim.x;
  const size_t begin = min(vectors, blockIdx.x * per_block), end = min(vectors, begin + per_block);
  copy_range<4>(from, to, begin, end);
}

enum class Barrier { kNone, kKernel, kMemop, kKernelThenMemop, kWriteThenKernelWait };
struct Variant {
  const char* name;
  Barrier entry, exit;
};

struct Gpu {
  char* src;
  char* dst;
  unsigned int* flag;  // this GPU's flag, written by the peer
  unsigned int epoch = 0;
  cudaStream_t stream, side;
  cudaEvent_t start, stop, fork, join;
};
Gpu gpu[2];

void barrier(int d, Barrier how) {
  Gpu& G = gpu[d];
  unsigned int* const peer = gpu[1 - d].flag;
  const unsigned int epoch = ++G.epoch;
  switch (how) {
    case Barrier::kNone:
      --G.epoch;
      return;
    case Barrier::kKernel:
      barrier_kernel<<<1, 32, 0, G.stream>>>(G.flag, peer, epoch, true);
      CHECK(cudaGetLastError());
      return;
    case Barrier::kMemop:
    case Barrier::kKernelThenMemop:
      CU_CHECK(cuStreamWriteValue32(G.stream, reinterpret_cast<CUdeviceptr>(peer), epoch, CU_STREAM_WRITE_VALUE_DEFAULT));
      CU_CHECK(cuStreamWaitValue32(G.stream, reinterpret_cast<CUdeviceptr>(G.flag), epoch, CU_STREAM_WAIT_VALUE_GEQ));
      return;
    case Barrier::kWriteThenKernelWait:
      CU_CHECK(cuStreamWriteValue32(G.stream, reinterpret_cast<CUdeviceptr>(peer), epoch, CU_STREAM_WRITE_VALUE_DEFAULT));
      barrier_kernel<<<1, 32, 0, G.stream>>>(G.flag, peer, epoch, false);
      CHECK(cudaGetLastError());
      return;
  }
}

void call(int d, const Variant& v, size_t block) {
  Gpu& G = gpu[d];
  CHECK(cudaEventRecord(G.fork, G.stream));
  CHECK(cudaStreamWaitEvent(G.side, G.fork, 0));
  copy_kernel<<<16, 512, 0, G.side>>>(reinterpret_cast<const uint4*>(G.src),
                                      reinterpret_cast<uint4*>(G.dst + d * block), block / sizeof(uint4));
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(G.join, G.side));
  barrier(d, v.entry);
  CHECK(cudaMemcpyAsync(gpu[1 - d].dst + d * block, G.src, block, cudaMemcpyDefault, G.stream));
  CHECK(cudaStreamWaitEvent(G.stream, G.join, 0));
  barrier(d, v.exit);
}

int main(int argc, char** argv) {
  std::vector<size_t> blocks;
  for (int i = 1; i < argc; ++i) blocks.push_back(std::strtoull(argv[i], nullptr, 10) * kMiB);
  if (blocks.empty()) blocks = {128 * kMiB, 256 * kMiB};
  const size_t largest = *std::max_element(blocks.begin(), blocks.end());
  CU_CHECK(cuInit(0));
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
    Gpu& G = gpu[g];
    G.src = static_cast<char*>(vmm_alloc(g, largest));
    G.dst = static_cast<char*>(vmm_alloc(g, 2 * largest));
    G.flag = static_cast<unsigned int*>(vmm_alloc(g, sizeof(unsigned int)));
    CHECK(cudaMemset(G.flag, 0, sizeof(unsigned int)));
    CHECK(cudaMemset(G.src, 1 + g, largest));
    CHECK(cudaStreamCreateWithFlags(&G.stream, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&G.side, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&G.start));
    CHECK(cudaEventCreate(&G.stop));
    CHECK(cudaEventCreateWithFlags(&G.fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&G.join, cudaEventDisableTiming));
    CHECK(cudaDeviceSynchronize());
  }
  const Variant variants[] = {
      {"no barriers", Barrier::kNone, Barrier::kNone},
      {"kernel barriers", Barrier::kKernel, Barrier::kKernel},
      {"memop barriers", Barrier::kMemop, Barrier::kMemop},
      {"kernel entry, memop exit", Barrier::kKernel, Barrier::kKernelThenMemop},
      {"write + kernel wait", Barrier::kWriteThenKernelWait, Barrier::kWriteThenKernelWait},
      {"kernel barriers (again)", Barrier::kKernel, Barrier::kKernel},
  };
  std::printf("# copy_engine_barriers: us a call and busbw GB/s, %d calls, the slower GPU's median of 7\n", kCalls);
  for (const size_t block : blocks) {
    for (const Variant& v : variants) {
      const auto issue = [&] {
        for (int g = 0; g < 2; ++g) {
          CHECK(cudaSetDevice(g));
          CHECK(cudaEventRecord(gpu[g].start, gpu[g].stream));
        }
        for (int c = 0; c < kCalls; ++c) {
          for (int g = 0; g < 2; ++g) {
            CHECK(cudaSetDevice(g));
            call(g, v, block);
          }
        }
        for (int g = 0; g < 2; ++g) {
          CHECK(cudaSetDevice(g));
          CHECK(cudaEventRecord(gpu[g].stop, gpu[g].stream));
        }
      };
      const float total_us = slower_gpu_median_us([](int) {}, issue, {gpu[0].start, gpu[1].start},
                                                  {gpu[0].stop, gpu[1].stop});
      const double us = double(total_us) / kCalls;
      std::printf("block %4zu MiB  %-28s %9.1f us %7.1f GB/s\n", block / kMiB, v.name, us, block / us / 1e3);
    }
  }
  return 0;
}
