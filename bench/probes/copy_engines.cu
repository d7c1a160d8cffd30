// Probe: how fast copy engines move data between two GPUs of one NVLink host, by the kind of memory and how the
// copy is issued; measured outside braid. Braid's copy-engine collectives copy between VMM mappings
// (symmetric memory) with cudaMemcpyAsync on the caller's GPU; cudaMemcpyPeerAsync between cudaMalloc buffers
// (the first variant) is the reference they are compared with.
//
// One process drives GPUs 0 and 1 (peer access on). Each variant moves `bytes` from GPU 0 to GPU 1 (and, for
// the two-way ones, GPU 1 to GPU 0 at the same time) and reports GB/s per direction: bytes / time, the median
// of 11 after 3 warm-ups, timed with events on a stream of the issuing GPU (the max over GPUs for two-way).
//   - peer cudaMalloc:   cudaMemcpyPeerAsync on GPU 0's stream;
//   - push cudaMalloc:   cudaMemcpyAsync (default kind) on GPU 0's stream;
//   - pull cudaMalloc:   the same on GPU 1's stream;
//   - push vmm / pull vmm: the same between VMM allocations (cuMemCreate, mapped once, both GPUs granted access);
//   - push vmm xK:       K pieces, each on its own stream of GPU 0 (forked and joined with events);
//   - two-way ...:       both directions at once.
//   - one GPU both ways: GPU 0 issues both directions at once, a push to GPU 1 and a pull from it, each on its own
//                        streams (xK: each direction in K pieces), as a rank that knows both ranks' buffers would.
// Usage: copy_engines [bytes]
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/copy_engines.cu -lcuda -o build/probes/copy_engines
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.cuh"
#include "probe_vmm.cuh"

constexpr int kStreams = 4;
struct Gpu {
  void* malloc_src;
  void* malloc_dst;  // the peer copies here
  void* vmm_src;
  void* vmm_dst;
  cudaStream_t streams[kStreams];
  cudaEvent_t start, stop, fork, join[kStreams];
};
Gpu gpu[2];

struct Copy {
  void* dst;
  const void* src;
};

// Copies `bytes` for each of `copies` at once, each in `pieces` pieces on streams of GPU g's own (copy c's piece p on
// stream c * pieces + p), between g's start and stop events.
void issue(int g, const std::vector<Copy>& copies, size_t bytes, int pieces, bool peer_api) {
  CHECK(cudaSetDevice(g));
  Gpu& G = gpu[g];
  CHECK(cudaEventRecord(G.start, G.streams[0]));
  CHECK(cudaEventRecord(G.fork, G.streams[0]));
  const size_t piece = (bytes / pieces + 255) / 256 * 256;
  for (size_t c = 0; c < copies.size(); ++c) {
    for (int p = 0; p < pieces; ++p) {
      const int index = static_cast<int>(c) * pieces + p;
      cudaStream_t s = G.streams[index];
      if (index > 0) CHECK(cudaStreamWaitEvent(s, G.fork, 0));
      const size_t begin = std::min(bytes, p * piece), n = std::min(bytes, begin + piece) - begin;
      char* d = static_cast<char*>(copies[c].dst) + begin;
      const char* from = static_cast<const char*>(copies[c].src) + begin;
      if (peer_api) {
        CHECK(cudaMemcpyPeerAsync(d, 1 - g, from, g, n, s));
      } else {
        CHECK(cudaMemcpyAsync(d, from, n, cudaMemcpyDefault, s));
      }
      if (index > 0) {
        CHECK(cudaEventRecord(G.join[index], s));
        CHECK(cudaStreamWaitEvent(G.streams[0], G.join[index], 0));
      }
    }
  }
  CHECK(cudaEventRecord(G.stop, G.streams[0]));
}

float elapsed(int g) { return elapsed_ms(g, gpu[g].start, gpu[g].stop); }

struct Variant {
  const char* name;
  bool vmm, pull, two_way, peer_api;
  int pieces;
  bool one_gpu_both_ways = false;
};

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t(256) << 20);
  CU_CHECK(cuInit(0));
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
    Gpu& G = gpu[g];
    CHECK(cudaMalloc(&G.malloc_src, bytes));
    CHECK(cudaMalloc(&G.malloc_dst, bytes));
    G.vmm_src = vmm_alloc(g, bytes);
    G.vmm_dst = vmm_alloc(g, bytes);
    CHECK(cudaMemset(G.malloc_src, 1 + g, bytes));
    CHECK(cudaMemset(G.vmm_src, 1 + g, bytes));
    for (int s = 0; s < kStreams; ++s) {
      CHECK(cudaStreamCreateWithFlags(&G.streams[s], cudaStreamNonBlocking));
      CHECK(cudaEventCreateWithFlags(&G.join[s], cudaEventDisableTiming));
    }
    CHECK(cudaEventCreate(&G.start));
    CHECK(cudaEventCreate(&G.stop));
    CHECK(cudaEventCreateWithFlags(&G.fork, cudaEventDisableTiming));
    CHECK(cudaDeviceSynchronize());
  }
  const Variant variants[] = {
      {"peer cudaMalloc", false, false, false, true, 1},   {"push cudaMalloc", false, false, false, false, 1},
      {"pull cudaMalloc", false, true, false, false, 1},   {"push vmm", true, false, false, false, 1},
      {"pull vmm", true, true, false, false, 1},           {"push vmm x2", true, false, false, false, 2},
      {"push vmm x4", true, false, false, false, 4},       {"pull vmm x2", true, true, false, false, 2},
      {"peer cudaMalloc x2", false, false, false, true, 2}, {"two-way peer cudaMalloc", false, false, true, true, 1},
      {"two-way push vmm", true, false, true, false, 1},   {"two-way pull vmm", true, true, true, false, 1},
      {"two-way push vmm x2", true, false, true, false, 2}, {"two-way push vmm x4", true, false, true, false, 4},
      {"one GPU both ways vmm", true, false, true, false, 1, true},
      {"one GPU both ways vmm x2", true, false, true, false, 2, true},
  };
  std::printf("# copy_engines: %zu bytes a direction; GB/s per direction, median of 11\n", bytes);
  std::printf("%-26s %10s %10s\n", "variant", "us", "GB/s");
  for (const Variant& v : variants) {
    std::vector<float> times;
    for (int rep = 0; rep < 14; ++rep) {
      for (int g = 0; g < 2; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaDeviceSynchronize());
      }
      float ms = 0;
      if (v.one_gpu_both_ways) {  // GPU 0 pushes its source to GPU 1 and pulls GPU 1's into its own
        issue(0, {{gpu[1].vmm_dst, gpu[0].vmm_src}, {gpu[0].vmm_dst, gpu[1].vmm_src}}, bytes, v.pieces, false);
        if (rep >= 3) times.push_back(elapsed(0));
        continue;
      }
      // Direction d: GPU d's data to GPU 1 - d. A push is issued by the source GPU, a pull by the destination.
      for (int d = 0; d < (v.two_way ? 2 : 1); ++d) {
        const int issuer = v.pull ? 1 - d : d;
        void* dst = v.vmm ? gpu[1 - d].vmm_dst : gpu[1 - d].malloc_dst;
        const void* src = v.vmm ? gpu[d].vmm_src : gpu[d].malloc_src;
        issue(issuer, {{dst, src}}, bytes, v.pieces, v.peer_api);
      }
      for (int d = 0; d < (v.two_way ? 2 : 1); ++d) ms = std::max(ms, elapsed(v.pull ? 1 - d : d));
      if (rep >= 3) times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    const double us = times[times.size() / 2] * 1e3;
    std::printf("%-26s %10.1f %10.1f\n", v.name, us, bytes / us / 1e3);
  }
  return 0;
}
