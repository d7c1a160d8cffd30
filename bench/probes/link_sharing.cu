// Probe: whether a copy engine and SMs together move more over one NVLink direction than either alone; measured
// outside braid. The copy engine alone tops out near 390-398 GB/s a direction and SM stores or loads near 370
// (GPU-HOST-FACTS.md), both below the link's line rate, so a collective could split its bytes between them if
// the two add up.
//
// One process drives GPUs 0 and 1 (peer access on, cudaMalloc buffers). Each case moves `bytes` a direction:
// the first share (0-100 %) by one cudaMemcpyAsync on one stream, the rest by an SM kernel on a second stream
// started at the same time (16-byte vectors, B blocks of 512 threads, 4 loads in flight a thread):
//   - push: the kernel stores its part into the peer's buffer;
//   - pull: the kernel loads its part from the peer's buffer (the data flows toward the kernel's GPU);
//   - one-way: only data from GPU 0 to GPU 1 (the pull kernel runs on GPU 1); two-way: both directions at once.
// Each figure: the median of 11 after 3 warm-ups, timed on each GPU with events around both streams, the slower
// GPU's; bytes / time in GB/s a direction. The bytes that arrived are checked once per case.
// Usage: link_sharing [bytes]   (default 512 MiB)
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/link_sharing.cu -o build/probes/link_sharing
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.cuh"
#include "probe_copy.cuh"

// Blocks take contiguous parts of the vectors, 4 loads in flight a thread.
__global__ void __launch_bounds__(512) copy_vectors(const uint4* __restrict__ from, uint4* __restrict__ to, size_t vectors) {
  const size_t per_block = (vectors + gridDim.x - 1) / gridDim.x;
  const size_t begin = min(vectors, blockIdx.x * per_block), end = min(vectors, begin + per_block);
  copy_range<4>(from, to, begin, end);
}

struct Gpu {
  char* src;  // this GPU's data: bytes of the value 1 + gpu
  char* dst;  // where the other GPU's data lands
  cudaStream_t engine, sms;
  cudaEvent_t start, sms_done, stop;
};

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t(512) << 20;
  Gpu gpu[2];
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
    CHECK(cudaMalloc(&gpu[g].src, bytes));
    CHECK(cudaMalloc(&gpu[g].dst, bytes));
    CHECK(cudaMemset(gpu[g].src, 1 + g, bytes));
    CHECK(cudaStreamCreateWithFlags(&gpu[g].engine, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&gpu[g].sms, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&gpu[g].start));
    CHECK(cudaEventCreate(&gpu[g].sms_done));
    CHECK(cudaEventCreate(&gpu[g].stop));
  }
  std::printf("# link_sharing: %zu bytes a direction; GB/s a direction (median of 11, slower GPU)\n", bytes);
  std::printf("%-8s %-6s %8s %6s %10s %8s\n", "ways", "sms", "engine%", "blocks", "time_us", "GB/s");

  // Data from GPU `from` to GPU 1 - from: the engine part issued by `from`, the SM part by `from` (push) or by the
  // receiver (pull).
  auto run = [&](bool two_way, bool pull, int percent, int blocks) {
    const size_t engine_bytes = (bytes * percent / 100) & ~size_t(4095);
    const size_t sm_bytes = bytes - engine_bytes;
    const int directions = two_way ? 2 : 1;
    bool active[2] = {true, two_way || pull};
    auto issue = [&] {
      for (int from = 0; from < directions; ++from) {
        const int to = 1 - from, sm_gpu = pull ? to : from;
        if (engine_bytes != 0) {
          CHECK(cudaSetDevice(from));
          CHECK(cudaMemcpyAsync(gpu[to].dst, gpu[from].src, engine_bytes, cudaMemcpyDefault, gpu[from].engine));
        }
        if (sm_bytes != 0) {
          CHECK(cudaSetDevice(sm_gpu));
          copy_vectors<<<blocks, 512, 0, gpu[sm_gpu].sms>>>(reinterpret_cast<const uint4*>(gpu[from].src + engine_bytes),
                                                            reinterpret_cast<uint4*>(gpu[to].dst + engine_bytes), sm_bytes / 16);
          CHECK(cudaGetLastError());
        }
      }
    };
    auto synchronize = [&] {
      for (int g = 0; g < 2; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaDeviceSynchronize());
      }
    };

    // One checked pass into cleared outputs: the first byte, the first of the SM part and the last.
    for (int g = 0; g < 2; ++g) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaMemset(gpu[g].dst, 0, bytes));
    }
    synchronize();
    issue();
    synchronize();
    for (int from = 0; from < directions; ++from) {
      std::vector<unsigned char> probe(4096);
      const int to = 1 - from;
      CHECK(cudaSetDevice(to));
      for (size_t at : {size_t(0), engine_bytes, bytes - probe.size()}) {
        if (at + probe.size() > bytes) continue;
        CHECK(cudaMemcpy(probe.data(), gpu[to].dst + at, probe.size(), cudaMemcpyDeviceToHost));
        for (unsigned char c : probe) {
          if (c != 1 + from) {
            std::printf("check failed: GPU %d byte %zu holds %d\n", to, at, c);
            std::exit(1);
          }
        }
      }
    }

    // Timed passes: on each GPU that works, a start event forks its second stream and a stop event joins it.
    std::vector<float> times[2];
    for (int it = 0; it < 14; ++it) {
      synchronize();
      for (int g = 0; g < 2; ++g) {
        if (!active[g]) continue;
        CHECK(cudaSetDevice(g));
        CHECK(cudaEventRecord(gpu[g].start, gpu[g].engine));
        CHECK(cudaStreamWaitEvent(gpu[g].sms, gpu[g].start, 0));
      }
      issue();
      for (int g = 0; g < 2; ++g) {
        if (!active[g]) continue;
        CHECK(cudaSetDevice(g));
        CHECK(cudaEventRecord(gpu[g].sms_done, gpu[g].sms));
        CHECK(cudaStreamWaitEvent(gpu[g].engine, gpu[g].sms_done, 0));
        CHECK(cudaEventRecord(gpu[g].stop, gpu[g].engine));
      }
      for (int g = 0; g < 2; ++g) {
        if (active[g] && it >= 3) times[g].push_back(elapsed_ms(g, gpu[g].start, gpu[g].stop) * 1000.f);
      }
    }
    float worst = 0;
    for (int g = 0; g < 2; ++g) {
      if (times[g].empty()) continue;
      std::sort(times[g].begin(), times[g].end());
      worst = std::max(worst, times[g][times[g].size() / 2]);
    }
    std::printf("%-8s %-6s %8d %6d %10.1f %8.1f\n", two_way ? "two-way" : "one-way", pull ? "pull" : "push", percent,
                percent == 100 ? 0 : blocks, worst, bytes / (worst * 1e3));
    std::fflush(stdout);
  };

  for (bool two_way : {false, true}) {
    run(two_way, false, 100, 0);
    for (bool pull : {false, true}) {
      for (int blocks : {32, 132}) {
        for (int percent : {0, 50, 60, 70, 80, 90}) run(two_way, pull, percent, blocks);
      }
    }
  }
  return 0;
}
