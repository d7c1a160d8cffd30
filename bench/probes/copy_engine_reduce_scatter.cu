// Probe: how fast a reduce-scatter of two GPUs can go when a copy engine pushes the peer's block of the input
// straight into the peer's output and the peer's SMs reduce it there in place; measured outside braid, as an upper
// bound (events stand in for braid's flags and barriers).
//
// One process drives GPUs 0 and 1 (peer access on, cudaMalloc buffers), float32 sum, `bytes` of input a GPU (two
// blocks of bytes / 2; GPU g's output is block g). Per chunk k of the peer's block:
//   1. a copy engine pushes chunk k of block p of g's input into the same place of p's output (stream 1);
//   2. once the peer's chunk k landed in g's output (an event of the peer's stream 1), SMs add g's own block of
//      its input to it, in place (stream 2).
// The chunks of a block follow a schedule:
//   - uniform: chunks of C bytes;
//   - taper M/F: from the end of the block, chunks of F, F, 2F, 4F, ... up to M, the rest of the block in chunks
//     of M at its start: the last reduction, which nothing overlaps, covers F bytes;
//   - taper M/F + pull P/B: the last P bytes of the block are not pushed: B blocks of SMs on a third stream load
//     them from the peer's input from the start of the call and reduce them into the output (they may fill the
//     link while the engine is between chunks).
// Each figure: the median of 7 after 2 warm-ups, timed on each GPU from an event before its first copy to one after
// its last reduction, the slower GPU's; busbw = bytes / 2 / time (nccl-tests' reduce-scatter busbw on 2 ranks).
// "one copy" is the push of a whole block with no reduction, the engine's bound. The output is checked once per
// case.
// With `blocks`, only 256 and 512 MiB: one copy, and tapers 128/8 and 128/4 with each chunk's reduction on 16, 32,
// 64, 132 or 264 blocks of 512 threads (264 elsewhere).
// Usage: copy_engine_reduce_scatter [blocks]
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/copy_engine_reduce_scatter.cu -o build/probes/copy_engine_reduce_scatter
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
  cudaStream_t push, reduce, pull;
  cudaEvent_t start, stop, reduce_done, pull_done, landed[kMaxChunks];
};
Gpu gpu[2];

struct Schedule {
  std::string name;
  std::vector<size_t> chunks;  // bytes of each pushed chunk, in order
  size_t pulled = 0;           // bytes at the end of the block that SMs load instead
  int pull_blocks = 0;
  bool reduce = true;
  int reduce_blocks = 264;  // blocks of 512 threads of each chunk's reduction
};

Schedule uniform(size_t block, size_t chunk) {
  Schedule s{"uniform " + std::to_string(chunk / kMiB) + "M", {}};
  for (size_t at = 0; at < block; at += chunk) s.chunks.push_back(std::min(chunk, block - at));
  return s;
}

Schedule taper(size_t block, size_t max_chunk, size_t floor, size_t pulled = 0, int pull_blocks = 0) {
  Schedule s{"taper " + std::to_string(max_chunk / kMiB) + "/" + std::to_string(floor / kMiB), {}, pulled, pull_blocks};
  if (pulled != 0) s.name += " + pull " + std::to_string(pulled / kMiB) + "M/" + std::to_string(pull_blocks);
  std::vector<size_t> tail;
  size_t left = block - pulled, next = floor;
  bool second_floor = true;
  while (left > 0) {
    const size_t c = std::min(next, left);
    tail.push_back(c);
    left -= c;
    if (second_floor) {
      second_floor = false;
    } else {
      next = std::min(next * 2, max_chunk);
    }
  }
  s.chunks.assign(tail.rbegin(), tail.rend());
  return s;
}

int main(int argc, char** argv) {
  const bool sweep_blocks = argc > 1 && std::string(argv[1]) == "blocks";
  const size_t max_bytes = size_t(512) << 20;
  for (int g = 0; g < 2; ++g) {
    gpu[g].in = filled_input(g, max_bytes);
    CHECK(cudaMalloc(&gpu[g].out, max_bytes / 2));
    for (cudaStream_t* s : {&gpu[g].push, &gpu[g].reduce, &gpu[g].pull}) {
      CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    }
    for (cudaEvent_t* e : {&gpu[g].start, &gpu[g].stop, &gpu[g].reduce_done, &gpu[g].pull_done}) {
      CHECK(cudaEventCreate(e));
    }
    for (int k = 0; k < kMaxChunks; ++k) CHECK(cudaEventCreateWithFlags(&gpu[g].landed[k], cudaEventDisableTiming));
    CHECK(cudaDeviceSynchronize());
  }
  std::printf("# copy_engine_reduce_scatter: float32 sum on 2 GPUs (median of 7, slower GPU)\n");
  std::printf("%10s %-28s %7s %10s %8s\n", "bytes", "schedule", "chunks", "time_us", "busbw");

  auto run = [&](size_t bytes, const Schedule& s) {
    const size_t block = bytes / 2;
    const auto issue = [&] {
      for (int g = 0; g < 2; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaEventRecord(gpu[g].start, gpu[g].push));
        CHECK(cudaStreamWaitEvent(gpu[g].reduce, gpu[g].start, 0));
        CHECK(cudaStreamWaitEvent(gpu[g].pull, gpu[g].start, 0));
        if (s.pulled != 0) {  // the end of block g: g's own input plus the peer's, loaded over NVLink
          const size_t at = block - s.pulled;
          add_into<<<s.pull_blocks, 512, 0, gpu[g].pull>>>(
              reinterpret_cast<const float4*>(gpu[g].in + g * block + at),
              reinterpret_cast<const float4*>(gpu[1 - g].in + g * block + at),
              reinterpret_cast<float4*>(gpu[g].out + at), s.pulled / 16);
          CHECK(cudaGetLastError());
        }
        CHECK(cudaEventRecord(gpu[g].pull_done, gpu[g].pull));
      }
      size_t at = 0;
      for (size_t k = 0; k < s.chunks.size(); ++k) {
        const size_t chunk = s.chunks[k];
        for (int g = 0; g < 2; ++g) {  // 1. chunk k of block p of g's input into p's output
          const int p = 1 - g;
          CHECK(cudaSetDevice(g));
          CHECK(cudaMemcpyAsync(gpu[p].out + at, gpu[g].in + p * block + at, chunk, cudaMemcpyDefault, gpu[g].push));
          CHECK(cudaEventRecord(gpu[g].landed[k], gpu[g].push));
        }
        for (int g = 0; g < 2; ++g) {  // 2. g's own block added to the chunk that landed in its output
          if (!s.reduce) continue;
          const int p = 1 - g;
          CHECK(cudaSetDevice(g));
          CHECK(cudaStreamWaitEvent(gpu[g].reduce, gpu[p].landed[k], 0));
          add_into<<<s.reduce_blocks, 512, 0, gpu[g].reduce>>>(reinterpret_cast<const float4*>(gpu[g].in + g * block + at),
                                                   reinterpret_cast<const float4*>(gpu[g].out + at),
                                                   reinterpret_cast<float4*>(gpu[g].out + at), chunk / 16);
          CHECK(cudaGetLastError());
        }
        at += chunk;
      }
      for (int g = 0; g < 2; ++g) {
        const int p = 1 - g;
        CHECK(cudaSetDevice(g));
        if (!s.reduce) CHECK(cudaStreamWaitEvent(gpu[g].reduce, gpu[p].landed[s.chunks.size() - 1], 0));
        CHECK(cudaStreamWaitEvent(gpu[g].reduce, gpu[g].pull_done, 0));
        CHECK(cudaEventRecord(gpu[g].stop, gpu[g].reduce));
      }
    };
    const auto poison = [&](int g) { CHECK(cudaMemsetAsync(gpu[g].out, 0xff, block, gpu[g].push)); };
    const float worst = slower_gpu_median_us(poison, issue, {gpu[0].start, gpu[1].start}, {gpu[0].stop, gpu[1].stop});
    for (int g = 0; g < 2 && s.reduce; ++g) {  // each output holds the sum (sampled)
      CHECK(cudaSetDevice(g));
      CHECK(cudaDeviceSynchronize());
      std::vector<float> host(block / 4);
      CHECK(cudaMemcpy(host.data(), gpu[g].out, block, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < host.size(); i += 997) {
        const size_t index = g * host.size() + i;
        if (host[i] != two_gpu_sum(index)) {
          std::printf("check failed (%s): GPU %d element %zu holds %g\n", s.name.c_str(), g, i, host[i]);
          std::exit(1);
        }
      }
    }
    std::printf("%10zu %-28s %7zu %10.1f %8.1f\n", bytes, s.name.c_str(), s.chunks.size(), worst,
                bytes / 2 / (worst * 1e3));
    std::fflush(stdout);
  };

  for (size_t bytes : {size_t(128) << 20, size_t(256) << 20, size_t(512) << 20}) {
    const size_t block = bytes / 2;
    Schedule one = uniform(block, block);
    one.name = "one copy";
    one.reduce = false;
    if (sweep_blocks && bytes < (size_t(256) << 20)) continue;
    run(bytes, one);
    if (sweep_blocks) {
      for (size_t floor : {8 * kMiB, 4 * kMiB}) {
        for (int blocks : {16, 32, 64, 132, 264}) {
          Schedule s = taper(block, 128 * kMiB, floor);
          s.reduce_blocks = blocks;
          s.name += " reduce " + std::to_string(blocks);
          run(bytes, s);
        }
      }
      continue;
    }
    run(bytes, uniform(block, 64 * kMiB));
    run(bytes, uniform(block, 32 * kMiB));
    run(bytes, taper(block, 64 * kMiB, 16 * kMiB));
    run(bytes, taper(block, 64 * kMiB, 8 * kMiB));
    run(bytes, taper(block, 64 * kMiB, 4 * kMiB));
    run(bytes, taper(block, 128 * kMiB, 8 * kMiB));
    run(bytes, taper(block, 128 * kMiB, 4 * kMiB));
    for (size_t pulled : {4 * kMiB, 8 * kMiB, 16 * kMiB}) {
      for (int blocks : {4, 8, 16}) run(bytes, taper(block, 64 * kMiB, 8 * kMiB, pulled, blocks));
    }
  }
  return 0;
}
