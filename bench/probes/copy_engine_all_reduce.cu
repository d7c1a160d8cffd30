// Probe: how fast an all-reduce of two GPUs can go when copy engines carry every byte over NVLink and SMs only
// reduce locally; measured outside braid, as an upper bound (events stand in for braid's flags and barriers).
// Braid's two shot moves the data with SM loads and stores, which top out below the copy engines
// (docs/dev/collectives.md, "What the links move").
//
// One process drives GPUs 0 and 1 (peer access on, cudaMalloc buffers), float32 sum, `bytes` of input a GPU.
// GPU g owns half g of the buffer. Per chunk k of C bytes of a half:
//   1. reduce-scatter: a copy engine pushes chunk k of the peer's half of g's input into a slot of the peer's
//      scratch (stream 1);
//   2. once the peer's chunk k landed in g's scratch (an event of the peer's stream 1), SMs add it to g's own
//      input into g's output (stream 2);
//   3. a copy engine pushes that reduced chunk into the peer's output (stream 3).
// With S slots of scratch, the push of chunk k first waits for the peer to have reduced chunk k - S (a freed
// slot); "all" slots: the scratch holds the whole half, no waits. Each figure: the median of 7 after 2 warm-ups,
// timed on each GPU from an event before its first copy to one after its last, the slower GPU's; busbw = bytes /
// time (nccl-tests' all-reduce busbw on 2 ranks). The output is checked once per case.
// Usage: copy_engine_all_reduce
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/copy_engine_all_reduce.cu -o build/probes/copy_engine_all_reduce
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "probe_check.cuh"
#include "probe_reduce.cuh"

constexpr size_t kMiB = size_t(1) << 20;
constexpr int kMaxChunks = 64;

struct Gpu {
  char* in;
  char* out;
  char* scratch;  // slots of one chunk each, or the whole half
  cudaStream_t push, reduce, gather;
  cudaEvent_t start, stop, reduce_done, landed[kMaxChunks], reduced[kMaxChunks];
};
Gpu gpu[2];

int main() {
  const size_t max_bytes = size_t(512) << 20;
  for (int g = 0; g < 2; ++g) {
    gpu[g].in = filled_input(g, max_bytes);
    CHECK(cudaMalloc(&gpu[g].out, max_bytes));
    CHECK(cudaMalloc(&gpu[g].scratch, max_bytes / 2));
    for (cudaStream_t* s : {&gpu[g].push, &gpu[g].reduce, &gpu[g].gather}) {
      CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    }
    CHECK(cudaEventCreate(&gpu[g].start));
    CHECK(cudaEventCreate(&gpu[g].stop));
    CHECK(cudaEventCreate(&gpu[g].reduce_done));
    for (int k = 0; k < kMaxChunks; ++k) {
      CHECK(cudaEventCreateWithFlags(&gpu[g].landed[k], cudaEventDisableTiming));
      CHECK(cudaEventCreateWithFlags(&gpu[g].reduced[k], cudaEventDisableTiming));
    }
    CHECK(cudaDeviceSynchronize());
  }
  std::printf("# copy_engine_all_reduce: float32 sum on 2 GPUs, busbw GB/s (median of 7, slower GPU)\n");
  std::printf("%10s %10s %6s %10s %8s\n", "bytes", "chunk", "slots", "time_us", "busbw");

  // slots == 0: the scratch holds the whole half.
  auto run = [&](size_t bytes, size_t chunk, int slots) {
    const size_t half = bytes / 2, chunks = half / chunk;
    const auto slot_of = [&](size_t k) { return slots == 0 ? k * chunk : (k % slots) * chunk; };
    const auto issue = [&] {
      for (int g = 0; g < 2; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaEventRecord(gpu[g].start, gpu[g].push));
        CHECK(cudaStreamWaitEvent(gpu[g].reduce, gpu[g].start, 0));
        CHECK(cudaStreamWaitEvent(gpu[g].gather, gpu[g].start, 0));
      }
      for (size_t k = 0; k < chunks; ++k) {
        for (int g = 0; g < 2; ++g) {  // 1. the peer's half of g's input, chunk k, into the peer's scratch
          const int p = 1 - g;
          CHECK(cudaSetDevice(g));
          if (slots != 0 && k >= size_t(slots)) CHECK(cudaStreamWaitEvent(gpu[g].push, gpu[p].reduced[k - slots], 0));
          CHECK(cudaMemcpyAsync(gpu[p].scratch + slot_of(k), gpu[g].in + p * half + k * chunk, chunk, cudaMemcpyDefault,
                                gpu[g].push));
          CHECK(cudaEventRecord(gpu[g].landed[k], gpu[g].push));
        }
        for (int g = 0; g < 2; ++g) {  // 2. reduce chunk k of g's half; 3. push it into the peer's output
          const int p = 1 - g;
          CHECK(cudaSetDevice(g));
          CHECK(cudaStreamWaitEvent(gpu[g].reduce, gpu[p].landed[k], 0));
          const size_t at = g * half + k * chunk;
          add_into<<<264, 512, 0, gpu[g].reduce>>>(reinterpret_cast<const float4*>(gpu[g].in + at),
                                                   reinterpret_cast<const float4*>(gpu[g].scratch + slot_of(k)),
                                                   reinterpret_cast<float4*>(gpu[g].out + at), chunk / 16);
          CHECK(cudaGetLastError());
          CHECK(cudaEventRecord(gpu[g].reduced[k], gpu[g].reduce));
          CHECK(cudaStreamWaitEvent(gpu[g].gather, gpu[g].reduced[k], 0));
          CHECK(cudaMemcpyAsync(gpu[p].out + at, gpu[g].out + at, chunk, cudaMemcpyDefault, gpu[g].gather));
        }
      }
      for (int g = 0; g < 2; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaEventRecord(gpu[g].reduce_done, gpu[g].reduce));
        CHECK(cudaStreamWaitEvent(gpu[g].gather, gpu[g].reduce_done, 0));
        CHECK(cudaEventRecord(gpu[g].stop, gpu[g].gather));
      }
    };
    const auto poison = [&](int g) { CHECK(cudaMemsetAsync(gpu[g].out, 0xff, bytes, gpu[g].push)); };
    const float worst = slower_gpu_median_us(poison, issue, {gpu[0].start, gpu[1].start}, {gpu[0].stop, gpu[1].stop});
    for (int g = 0; g < 2; ++g) {  // both outputs hold the sum everywhere (sampled)
      CHECK(cudaSetDevice(g));
      CHECK(cudaDeviceSynchronize());
      std::vector<float> host(bytes / 4);
      CHECK(cudaMemcpy(host.data(), gpu[g].out, bytes, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < host.size(); i += 997) {
        if (host[i] != two_gpu_sum(i)) {
          std::printf("check failed: GPU %d element %zu holds %g\n", g, i, host[i]);
          std::exit(1);
        }
      }
    }
    std::printf("%10zu %10zu %6s %10.1f %8.1f\n", bytes, chunk, slots == 0 ? "all" : std::to_string(slots).c_str(),
                worst, bytes / (worst * 1e3));
    std::fflush(stdout);
  };

  for (size_t bytes : {size_t(256) << 20, size_t(512) << 20}) {
    run(bytes, bytes / 2, 0);
    for (size_t chunk : {64 * kMiB, 32 * kMiB, 16 * kMiB, 8 * kMiB}) {
      if (bytes / 2 / chunk > kMaxChunks) continue;
      run(bytes, chunk, 0);
      run(bytes, chunk, 2);
    }
  }
  return 0;
}
