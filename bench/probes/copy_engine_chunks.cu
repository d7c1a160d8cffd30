// Probe: what cutting a copy-engine transfer into chunks costs, measured outside braid. Braid's copy-engine pairs
// (send_recv_bulk_launch.hpp) move a buffer no peer maps as 32 MiB chunks into two slots of the receiver's
// pipeline area: one copy per chunk, and before each copy but the first two a wait for the step that handed
// its slot back. This probe moves 512 MiB from GPU 0 to GPU 1 (one-way) or both ways at once (two-way), between
// cudaMalloc buffers with peer access on, as:
//   - one copy;
//   - chunks of 64, 32 or 16 MiB, back to back on one stream;
//   - 32 MiB chunks as 2D copies (rows of 1 MiB at a 2 MiB pitch on the destination, as a slot's rows lie);
//   - 32 MiB chunks alternating between two streams;
//   - chunks each after a handover: chunk c waits (cudaStreamWaitEvent, or cuStreamWaitValue32 on a flag) for
//     a 10 us kernel on another stream that started once chunk c - 2 was done, as a receiver frees a slot.
// Each figure: the median of 7 after 2 warm-ups, timed with events on the issuing GPU's stream (two-way: the
// slower GPU), in us and GB/s per direction.
// Usage: copy_engine_chunks
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/copy_engine_chunks.cu -lcuda -o build/probes/copy_engine_chunks
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "probe_check.cuh"

constexpr size_t kTotal = size_t(512) << 20;
constexpr size_t kMiB = size_t(1) << 20;
constexpr int kMaxChunks = 64;

// Spins for `ns` nanoseconds, then (with a flag) stores `value` into it.
__global__ void handover(long long ns, unsigned int* flag, unsigned int value) {
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  if (flag != nullptr) {
    __threadfence_system();
    atomicExch(flag, value);
  }
}

enum class Wait { kNone, kEvent, kFlag };
struct Variant {
  const char* name;
  size_t chunk;
  int streams;
  bool rows;  // 2D copies of 1 MiB rows
  Wait wait;
};

struct Gpu {
  char* src;
  char* dst;  // twice kTotal: the 2D copies' rows lie at twice their width
  unsigned int* flag;
  unsigned int flag_base = 0;
  cudaStream_t streams[3];  // two for copies, one for the handovers
  cudaEvent_t start, stop, done[kMaxChunks], freed[kMaxChunks];
};
Gpu gpu[2];

void issue(int d, const Variant& v) {
  CHECK(cudaSetDevice(d));
  Gpu& G = gpu[d];
  char* const dst = gpu[1 - d].dst;
  const size_t chunks = kTotal / v.chunk;
  CHECK(cudaEventRecord(G.start, G.streams[0]));
  if (v.streams > 1) CHECK(cudaStreamWaitEvent(G.streams[1], G.start, 0));
  for (size_t c = 0; c < chunks; ++c) {
    cudaStream_t s = G.streams[c % v.streams];
    if (c >= 2 && v.wait == Wait::kEvent) CHECK(cudaStreamWaitEvent(s, G.freed[c - 2], 0));
    if (c >= 2 && v.wait == Wait::kFlag) {
      CU_CHECK(cuStreamWaitValue32(s, reinterpret_cast<CUdeviceptr>(G.flag), G.flag_base + unsigned(c) - 1,
                                   CU_STREAM_WAIT_VALUE_GEQ));
    }
    const char* from = G.src + c * v.chunk;
    if (v.rows) {
      CHECK(cudaMemcpy2DAsync(dst + 2 * c * v.chunk, 2 * kMiB, from, kMiB, kMiB, v.chunk / kMiB, cudaMemcpyDefault, s));
    } else {
      CHECK(cudaMemcpyAsync(dst + c * v.chunk, from, v.chunk, cudaMemcpyDefault, s));
    }
    if (v.wait != Wait::kNone) {
      CHECK(cudaEventRecord(G.done[c], s));
      CHECK(cudaStreamWaitEvent(G.streams[2], G.done[c], 0));
      handover<<<1, 1, 0, G.streams[2]>>>(10000, v.wait == Wait::kFlag ? G.flag : nullptr, G.flag_base + unsigned(c) + 1);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(G.freed[c], G.streams[2]));
    }
  }
  if (v.wait == Wait::kFlag) G.flag_base += unsigned(chunks);
  for (int k = 1; k < 3; ++k) {  // join the other streams
    CHECK(cudaEventRecord(G.done[kMaxChunks - k], G.streams[k]));
    CHECK(cudaStreamWaitEvent(G.streams[0], G.done[kMaxChunks - k], 0));
  }
  CHECK(cudaEventRecord(G.stop, G.streams[0]));
}

int main() {
  CU_CHECK(cuInit(0));
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
    Gpu& G = gpu[g];
    CHECK(cudaMalloc(&G.src, kTotal));
    CHECK(cudaMalloc(&G.dst, 2 * kTotal));
    CHECK(cudaMalloc(&G.flag, sizeof(unsigned int)));
    CHECK(cudaMemset(G.flag, 0, sizeof(unsigned int)));
    CHECK(cudaMemset(G.src, 1 + g, kTotal));
    for (cudaStream_t& s : G.streams) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int c = 0; c < kMaxChunks; ++c) {
      CHECK(cudaEventCreateWithFlags(&G.done[c], cudaEventDisableTiming));
      CHECK(cudaEventCreateWithFlags(&G.freed[c], cudaEventDisableTiming));
    }
    CHECK(cudaEventCreate(&G.start));
    CHECK(cudaEventCreate(&G.stop));
    CHECK(cudaDeviceSynchronize());
  }
  const Variant variants[] = {
      {"one copy", kTotal, 1, false, Wait::kNone},
      {"64 MiB chunks", 64 * kMiB, 1, false, Wait::kNone},
      {"32 MiB chunks", 32 * kMiB, 1, false, Wait::kNone},
      {"16 MiB chunks", 16 * kMiB, 1, false, Wait::kNone},
      {"32 MiB chunks, 2D rows", 32 * kMiB, 1, true, Wait::kNone},
      {"32 MiB chunks, two streams", 32 * kMiB, 2, false, Wait::kNone},
      {"64 MiB chunks, event handover", 64 * kMiB, 1, false, Wait::kEvent},
      {"32 MiB chunks, event handover", 32 * kMiB, 1, false, Wait::kEvent},
      {"32 MiB chunks, flag handover", 32 * kMiB, 1, false, Wait::kFlag},
  };
  std::printf("# copy_engine_chunks: 512 MiB a direction; us and GB/s per direction, median of 7\n");
  for (const bool two_way : {false, true}) {
    for (const Variant& v : variants) {
      std::vector<float> times;
      for (int rep = 0; rep < 9; ++rep) {
        for (int g = 0; g < 2; ++g) {
          CHECK(cudaSetDevice(g));
          CHECK(cudaDeviceSynchronize());
        }
        for (int d = 0; d < (two_way ? 2 : 1); ++d) issue(d, v);
        float ms = 0;
        for (int d = 0; d < (two_way ? 2 : 1); ++d) ms = std::max(ms, elapsed_ms(d, gpu[d].start, gpu[d].stop));
        if (rep >= 2) times.push_back(ms);
      }
      std::sort(times.begin(), times.end());
      const double us = times[times.size() / 2] * 1e3;
      std::printf("%-8s %-32s %9.1f %7.1f\n", two_way ? "two-way" : "one-way", v.name, us, kTotal / us / 1e3);
    }
  }
  return 0;
}
