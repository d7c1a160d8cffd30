// Probe: the floor under a small collective in a CUDA graph, measured outside braid.
//   - empty node:   a graph of 20 launches of an empty kernel (1 block of 32 threads) on GPU 0: the cost of one
//                   kernel node in a replayed graph;
//   - signal+wait:  GPUs 0 and 1 each replay a graph of 20 nodes of a kernel that stores a flag into the peer's
//                   memory (release, system scope) and waits for the peer's flag (acquire): the cost of one kernel
//                   node plus one NVLink round trip, which every 2-rank collective pays at least once.
// Each figure is per node: the time of 100 replays over 2000 nodes, the median of 11 runs after 3 warm-ups,
// timed with events on the replaying stream (the slower GPU's median for signal+wait).
// Usage: graph_floor
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/graph_floor.cu -o build/probes/graph_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_check.cuh"

constexpr int kNodes = 20, kReplays = 100, kRuns = 11, kWarmups = 3;

__global__ void empty_kernel() {}

// flags[0]: the peer's last epoch, written by the peer; flags[1]: this GPU's epoch counter.
__global__ void signal_wait_kernel(uint64_t* mine, uint64_t* peer_flag) {
  if (threadIdx.x != 0) return;
  const uint64_t epoch = ++mine[1];
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(peer_flag), "l"(epoch) : "memory");
  uint64_t seen = 0;
  do {
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(mine) : "memory");
  } while (seen < epoch);
}

struct Gpu {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  uint64_t* flags = nullptr;
};

template <typename Launch>
void capture(Gpu& gpu, Launch launch) {
  CHECK(cudaSetDevice(gpu.device));
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(gpu.stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kNodes; ++i) launch();
  CHECK(cudaStreamEndCapture(gpu.stream, &graph));
  CHECK(cudaGraphInstantiate(&gpu.exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
}

// Per-node microseconds: each GPU replays its graph kReplays times, all GPUs at once; the slowest GPU's time.
double run_once(std::vector<Gpu*> gpus) {
  for (Gpu* g : gpus) {
    CHECK(cudaSetDevice(g->device));
    CHECK(cudaEventRecord(g->start, g->stream));
    for (int r = 0; r < kReplays; ++r) CHECK(cudaGraphLaunch(g->exec, g->stream));
    CHECK(cudaEventRecord(g->stop, g->stream));
  }
  float slowest = 0;
  for (Gpu* g : gpus) {
    CHECK(cudaSetDevice(g->device));
    CHECK(cudaEventSynchronize(g->stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, g->start, g->stop));
    slowest = std::max(slowest, ms);
  }
  return slowest * 1000.0 / (kReplays * kNodes);
}

double median_per_node(std::vector<Gpu*> gpus) {
  for (int i = 0; i < kWarmups; ++i) run_once(gpus);
  std::vector<double> runs;
  for (int i = 0; i < kRuns; ++i) runs.push_back(run_once(gpus));
  std::sort(runs.begin(), runs.end());
  return runs[kRuns / 2];
}

int main() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("graph_floor needs 2 GPUs, found %d\n", count);
    return 1;
  }
  Gpu gpus[2];
  for (int d = 0; d < 2; ++d) {
    Gpu& g = gpus[d];
    g.device = d;
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&g.start));
    CHECK(cudaEventCreate(&g.stop));
    CHECK(cudaMalloc(&g.flags, 2 * sizeof(uint64_t)));
    CHECK(cudaMemset(g.flags, 0, 2 * sizeof(uint64_t)));
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));

  capture(gpus[0], [&] { empty_kernel<<<1, 32, 0, gpus[0].stream>>>(); });
  const double empty = median_per_node({&gpus[0]});
  CHECK(cudaGraphExecDestroy(gpus[0].exec));

  for (int d = 0; d < 2; ++d) {
    capture(gpus[d], [&] { signal_wait_kernel<<<1, 32, 0, gpus[d].stream>>>(gpus[d].flags, gpus[1 - d].flags); });
  }
  const double round_trip = median_per_node({&gpus[0], &gpus[1]});

  std::printf("# graph_floor: %s, graphs of %d nodes, %d replays, median of %d runs\n", prop.name, kNodes,
              kReplays, kRuns);
  std::printf("empty node        %6.2f us per node (GPU 0 alone)\n", empty);
  std::printf("signal+wait node  %6.2f us per node (GPUs 0 and 1, one flag each way per node)\n", round_trip);
  return 0;
}
