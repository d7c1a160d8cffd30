// Probe: what a copy-engine reduce-scatter or reduce loses against bare copy-engine pulls. Such a collective
// pulls each peer's block into a staging half in chunks and reduces every chunk with this rank's own block by an
// SM kernel while the next chunk is pulled. This probe takes that pipeline apart, outside braid, on GPUs 0 and 1
// of one process (peer access on, VMM memory as braid's symmetric allocator makes):
//   - one copy:          the whole block pulled by one cudaMemcpyAsync (the bound);
//   - serial C:          the block pulled in chunks of C bytes, back to back on one stream, nothing else;
//   - serial+reduce C:   each chunk pulled, then reduced, on one stream (no overlap at all);
//   - lanes C:           the pipeline above: chunk c on stream c % 2, pulled into half c % 2 and reduced there;
//   - decoupled C /N:    every pull on one stream, every reduction (N blocks) on another; pull c + 2 waits
//                        for reduction c (the half it overwrites), reduction c for pull c;
//   - pairs C:           chunks pulled on two streams in turn, nothing between them (two pulls in flight);
//   - overlapped C xK /N: pulls on two streams in turn, reductions on a third; K staging slots, pull c waits
//                        for reduction c - K, reduction c for pull c;
//   - halving C:         the block pulled straight into a destination as big as itself, in pieces that halve
//                        from half the block down to C (then the rest), back to back on one stream;
//   - halving+reduce C /N: the same, and each piece reduced in place with the own block on another stream
//                        after its pull (a copy-engine reduce with one peer).
// One-way: GPU 1 pulls from GPU 0 (reduce to a root). Two-way: both pull at once (reduce-scatter on 2 ranks).
// Each row: microseconds and GB/s per direction, the median of 11 after 3 warm-ups, timed with events on the
// pulling GPU's first stream (the max over GPUs for two-way).
// Usage: chunked_pulls [bytes]
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/chunked_pulls.cu -lcuda -o build/probes/chunked_pulls
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
constexpr int kMaxChunks = 256;

// out = a + b over n float4 vectors, grid-stride (braid's local reduction does the same work per element).
__global__ void __launch_bounds__(kThreads) add(float4* out, const float4* a, const float4* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(kThreads) + threadIdx.x; i < n; i += size_t(gridDim.x) * kThreads) {
    const float4 x = a[i], y = b[i];
    out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

struct Gpu : ScheduleStreams {
  char* src;      // what the peer pulls
  char* own;      // this rank's block
  char* out;      // the reduction's output
  char* dst;      // one copy's destination
  char* staging;  // two halves of the largest chunk
  cudaEvent_t pulled[kMaxChunks], reduced[kMaxChunks];
};
Gpu gpu[2];

enum class Kind { kOneCopy, kSerial, kSerialReduce, kLanes, kDecoupled, kPairs, kOverlapped, kHalving, kHalvingReduce };
struct Variant {
  Kind kind;
  size_t chunk;
  int blocks;     // of each reduction
  int slots = 2;  // of staging, each a chunk
};

std::string name(const Variant& v) {
  const char* kinds[] = {"one copy", "serial", "serial+reduce", "lanes", "decoupled", "pairs", "overlapped", "halving", "halving+reduce"};
  std::string s = kinds[static_cast<int>(v.kind)];
  if (v.kind != Kind::kOneCopy) s += " " + std::to_string(v.chunk >> 20) + "M";
  if (v.kind == Kind::kOverlapped) s += " x" + std::to_string(v.slots);
  if (v.blocks != 0) s += " /" + std::to_string(v.blocks);
  return s;
}

void reduce(Gpu& G, size_t c, size_t chunk, int blocks, int slots, cudaStream_t s) {
  char* half = G.staging + (c % slots) * chunk;
  add<<<blocks, kThreads, 0, s>>>(reinterpret_cast<float4*>(G.out + c * chunk),
                                  reinterpret_cast<const float4*>(half),
                                  reinterpret_cast<const float4*>(G.own + c * chunk), chunk / 16);
  CHECK(cudaGetLastError());
}

// GPU g pulls `bytes` of GPU 1 - g's src the way `v` says.
void issue(int g, const Variant& v, size_t bytes) {
  CHECK(cudaSetDevice(g));
  Gpu& G = gpu[g];
  const char* peer = gpu[1 - g].src;
  CHECK(cudaEventRecord(G.start, G.s0));
  CHECK(cudaEventRecord(G.fork, G.s0));
  CHECK(cudaStreamWaitEvent(G.s1, G.fork, 0));
  CHECK(cudaStreamWaitEvent(G.s2, G.fork, 0));
  if (v.kind == Kind::kHalving || v.kind == Kind::kHalvingReduce) {
    for (size_t first = 0; first < bytes;) {
      const size_t rest = bytes - first, piece = rest <= 2 * v.chunk ? rest : rest / 2 / 256 * 256;
      CHECK(cudaMemcpyAsync(G.dst + first, peer + first, piece, cudaMemcpyDefault, G.s0));
      if (v.kind == Kind::kHalvingReduce) {
        CHECK(cudaEventRecord(G.fork, G.s0));
        CHECK(cudaStreamWaitEvent(G.s1, G.fork, 0));
        add<<<v.blocks, kThreads, 0, G.s1>>>(reinterpret_cast<float4*>(G.dst + first),
                                              reinterpret_cast<const float4*>(G.dst + first),
                                              reinterpret_cast<const float4*>(G.own + first), piece / 16);
        CHECK(cudaGetLastError());
      }
      first += piece;
    }
  }
  const size_t chunks = v.kind == Kind::kOneCopy ? 1 : v.kind == Kind::kHalving || v.kind == Kind::kHalvingReduce ? 0 : bytes / v.chunk;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t at = c * v.chunk;
    char* half = G.staging + (c % v.slots) * v.chunk;
    switch (v.kind) {
      case Kind::kOneCopy:
        CHECK(cudaMemcpyAsync(G.dst, peer, bytes, cudaMemcpyDefault, G.s0));
        break;
      case Kind::kSerial:
        CHECK(cudaMemcpyAsync(half, peer + at, v.chunk, cudaMemcpyDefault, G.s0));
        break;
      case Kind::kSerialReduce:
        CHECK(cudaMemcpyAsync(half, peer + at, v.chunk, cudaMemcpyDefault, G.s0));
        reduce(G, c, v.chunk, v.blocks, v.slots, G.s0);
        break;
      case Kind::kLanes: {
        cudaStream_t lane = c % 2 == 0 ? G.s0 : G.s1;
        CHECK(cudaMemcpyAsync(half, peer + at, v.chunk, cudaMemcpyDefault, lane));
        reduce(G, c, v.chunk, v.blocks, v.slots, lane);
        break;
      }
      case Kind::kDecoupled:
        if (c >= 2) CHECK(cudaStreamWaitEvent(G.s0, G.reduced[c - 2], 0));
        CHECK(cudaMemcpyAsync(half, peer + at, v.chunk, cudaMemcpyDefault, G.s0));
        CHECK(cudaEventRecord(G.pulled[c], G.s0));
        CHECK(cudaStreamWaitEvent(G.s1, G.pulled[c], 0));
        reduce(G, c, v.chunk, v.blocks, v.slots, G.s1);
        CHECK(cudaEventRecord(G.reduced[c], G.s1));
        break;
      case Kind::kPairs:
        CHECK(cudaMemcpyAsync(half, peer + at, v.chunk, cudaMemcpyDefault, c % 2 == 0 ? G.s0 : G.s1));
        break;
      case Kind::kOverlapped: {
        cudaStream_t lane = c % 2 == 0 ? G.s0 : G.s1;
        if (c >= size_t(v.slots)) CHECK(cudaStreamWaitEvent(lane, G.reduced[c - v.slots], 0));
        CHECK(cudaMemcpyAsync(half, peer + at, v.chunk, cudaMemcpyDefault, lane));
        CHECK(cudaEventRecord(G.pulled[c], lane));
        CHECK(cudaStreamWaitEvent(G.s2, G.pulled[c], 0));
        reduce(G, c, v.chunk, v.blocks, v.slots, G.s2);
        CHECK(cudaEventRecord(G.reduced[c], G.s2));
        break;
      }
    }
  }
  for (cudaStream_t s : {G.s1, G.s2}) {
    CHECK(cudaEventRecord(G.join, s));
    CHECK(cudaStreamWaitEvent(G.s0, G.join, 0));
  }
  CHECK(cudaEventRecord(G.stop, G.s0));
}

float elapsed(int g) { return elapsed_ms(g, gpu[g].start, gpu[g].stop); }

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t(256) << 20);
  const size_t MiB = size_t(1) << 20;
  std::vector<Variant> variants = {{Kind::kOneCopy, 0, 0}};
  for (size_t c : {4, 16, 64}) variants.push_back({Kind::kSerial, c * MiB, 0});
  variants.push_back({Kind::kSerialReduce, 16 * MiB, 128});
  for (size_t c : {4, 16, 64}) variants.push_back({Kind::kLanes, c * MiB, 128});
  for (int blocks : {16, 32, 128}) variants.push_back({Kind::kDecoupled, 16 * MiB, blocks});
  for (size_t c : {4, 8, 16}) variants.push_back({Kind::kPairs, c * MiB, 0});
  for (size_t c : {4, 8, 16}) variants.push_back({Kind::kOverlapped, c * MiB, 128, int(32 / c)});
  variants.push_back({Kind::kOverlapped, 8 * MiB, 64, 4});
  variants.push_back({Kind::kOverlapped, 16 * MiB, 128, 4});
  variants.push_back({Kind::kHalving, 1 * MiB, 0, 0});
  for (int blocks : {32, 64, 128, 264}) variants.push_back({Kind::kHalvingReduce, 1 * MiB, blocks, 0});
  size_t staging = 0;
  for (const Variant& v : variants) {
    staging = std::max(staging, v.chunk * v.slots);
    if (v.kind != Kind::kOneCopy && v.slots != 0 && (bytes % v.chunk != 0 || bytes / v.chunk > kMaxChunks)) {
      std::fprintf(stderr, "bytes must be a multiple of every chunk, at most %d chunks\n", kMaxChunks);
      return 2;
    }
  }
  CU_CHECK(cuInit(0));
  for (int g = 0; g < 2; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaDeviceEnablePeerAccess(1 - g, 0));
    Gpu& G = gpu[g];
    G.src = static_cast<char*>(vmm_alloc(g, bytes));
    G.own = static_cast<char*>(vmm_alloc(g, bytes));
    G.out = static_cast<char*>(vmm_alloc(g, bytes));
    G.dst = static_cast<char*>(vmm_alloc(g, bytes));
    G.staging = static_cast<char*>(vmm_alloc(g, staging));
    CHECK(cudaMemset(G.src, 1 + g, bytes));
    CHECK(cudaMemset(G.own, 3 + g, bytes));
    G.make();
    make_untimed_events(G.pulled, kMaxChunks);
    make_untimed_events(G.reduced, kMaxChunks);
    CHECK(cudaDeviceSynchronize());
  }
  std::printf("# chunked_pulls: %zu bytes a direction; GB/s per direction, median of 11; /N = blocks of a reduction\n",
              bytes);
  std::printf("%-24s %10s %10s %10s %10s\n", "variant", "1-way us", "GB/s", "2-way us", "GB/s");
  for (const Variant& v : variants) {
    double us[2];
    for (int ways = 1; ways <= 2; ++ways) {
      std::vector<float> times;
      for (int rep = 0; rep < 14; ++rep) {
        for (int g = 0; g < 2; ++g) {
          CHECK(cudaSetDevice(g));
          CHECK(cudaDeviceSynchronize());
        }
        for (int g = 2 - ways; g < 2; ++g) issue(g, v, bytes);
        float ms = 0;
        for (int g = 2 - ways; g < 2; ++g) ms = std::max(ms, elapsed(g));
        if (rep >= 3) times.push_back(ms);
      }
      std::sort(times.begin(), times.end());
      us[ways - 1] = times[times.size() / 2] * 1e3;
    }
    std::printf("%-24s %10.1f %10.1f %10.1f %10.1f\n", name(v).c_str(), us[0], bytes / us[0] / 1e3, us[1],
                bytes / us[1] / 1e3);
  }
  return 0;
}
