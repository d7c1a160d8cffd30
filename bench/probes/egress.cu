// Probe: how many bytes per second one GPU of an NVLink/NVSwitch host can push out over its links (its egress),
// sending alone and while every GPU sends to every other one at once, as in an all-to-all or an all-gather at
// world N; measured outside braid, with SM stores and with copy engines. The two-GPU probes (store_pairs,
// copy_engines) give the rate of one link direction; they say nothing of whether one GPU can feed all its links
// at once, nor of what the switch gives when all GPUs send together.
//
// One process drives all N visible GPUs (N >= 2, peer access on for every pair, cudaMalloc buffers). `bytes`
// (default 512 MiB) is what one sending GPU sends, split evenly over its destinations (bytes / (N - 1) a peer in
// the to-all variants, rounded down to 16-byte vectors). Each row gives the GPUs sending and the GB/s egress of a
// sending GPU (the bytes it sent / its median time), the minimum and the mean over the senders:
//   - sm one-to-one: GPU 0 alone stores `bytes` into GPU 1;
//   - sm one-to-all: GPU 0 alone stores bytes / (N - 1) into each peer, all at once;
//   - sm all-to-all: every GPU stores bytes / (N - 1) into each peer, all at once;
//   - sm ring:       every GPU stores `bytes` into GPU (g + 1) % N at once;
//   - ce one-to-one, ce one-to-all, ce all-to-all, ce ring: the same with cudaMemcpyPeerAsync, each destination
//                    on its own stream, forked and joined with events so a GPU's time covers all its copies.
// SM kernels: one a sending GPU, SM-count blocks of 512 threads, 16-byte vectors, 4 loads in flight a thread.
// Each block copies its contiguous share of every destination's part in turn, starting at destination
// blockIdx mod (N - 1), so that at any time the blocks are spread over all the destinations.
// Timing: host-synchronised start, CUDA events around each sending GPU's work on its own stream, medians of 11
// after 3 warm-ups. Once per variant the destinations are poisoned, one pass runs, and 9 windows of 4 KiB of
// every part received are compared on the host with the source's pattern (a function of source GPU and offset).
// Usage: egress [bytes]
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 bench/probes/egress.cu -o build/probes/egress
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.cuh"
#include "probe_copy.cuh"

constexpr int kMaxGpus = 16;
constexpr int kThreads = 512;
constexpr size_t kWindow = 256;  // vectors in one checked window (4 KiB)
constexpr int kWindows = 9;      // checked windows a part, evenly spread from its first vector to its last

// The 32-bit word at word offset `word` of GPU `gpu`'s source.
__host__ __device__ inline uint32_t pattern(int gpu, size_t word) {
  return (static_cast<uint32_t>(word) * 2654435761u) ^ (static_cast<uint32_t>(gpu + 1) * 0x85EBCA6Bu);
}

__global__ void fill(uint32_t* to, size_t words, int gpu) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    to[i] = pattern(gpu, i);
  }
}

// What one SM kernel copies: `vectors` from each from[k] into to[k], k < count.
struct Parts {
  const uint4* from[kMaxGpus - 1];
  uint4* to[kMaxGpus - 1];
  int count;
  size_t vectors;
};

// Block b copies its share of every part, from part b mod count on.
__global__ void __launch_bounds__(kThreads) store_parts(Parts parts) {
  const size_t per_block = (parts.vectors + gridDim.x - 1) / gridDim.x;
  const size_t begin = min(parts.vectors, blockIdx.x * per_block), end = min(parts.vectors, begin + per_block);
  for (int k = 0; k < parts.count; ++k) {
    const int j = (blockIdx.x + k) % parts.count;
    copy_range<4>(parts.from[j], parts.to[j], begin, end);
  }
}

// One part of a variant: `vectors` from GPU `from`'s source at src_at into GPU `to`'s destination at dst_at.
struct Send {
  int from, to;
  size_t src_at, dst_at, vectors;
};

struct Gpu {
  uint4* src;  // pattern(gpu, word)
  uint4* dst;  // where the peers' parts land
  int sms;
  cudaStream_t main;                // the SM kernel, and the events that time the GPU
  cudaStream_t peer[kMaxGpus - 1];  // one a destination for the copy engines
  cudaEvent_t start, stop, done[kMaxGpus - 1];
};

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t(512) << 20;
  int n = 0;
  CHECK(cudaGetDeviceCount(&n));
  if (n < 2 || n > kMaxGpus) {
    std::fprintf(stderr, "egress: needs 2 to %d GPUs, found %d\n", kMaxGpus, n);
    return 1;
  }
  const size_t vectors = bytes / 16, per_peer = vectors / (n - 1);
  if (per_peer == 0) {
    std::fprintf(stderr, "egress: %zu bytes is less than 16 bytes for each of %d peers\n", bytes, n - 1);
    return 1;
  }
  std::vector<Gpu> gpu(n);
  for (int g = 0; g < n; ++g) {
    CHECK(cudaSetDevice(g));
    for (int p = 0; p < n; ++p) {
      if (p == g) continue;
      int can = 0;
      CHECK(cudaDeviceCanAccessPeer(&can, g, p));
      if (!can) {
        std::fprintf(stderr, "egress: GPU %d cannot access GPU %d (no peer access between them)\n", g, p);
        return 1;
      }
      CHECK(cudaDeviceEnablePeerAccess(p, 0));
    }
    CHECK(cudaDeviceGetAttribute(&gpu[g].sms, cudaDevAttrMultiProcessorCount, g));
    CHECK(cudaMalloc(&gpu[g].src, vectors * 16));
    CHECK(cudaMalloc(&gpu[g].dst, vectors * 16));
    fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(gpu[g].src), vectors * 4, g);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamCreateWithFlags(&gpu[g].main, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&gpu[g].start));
    CHECK(cudaEventCreate(&gpu[g].stop));
    for (int k = 0; k < n - 1; ++k) {
      CHECK(cudaStreamCreateWithFlags(&gpu[g].peer[k], cudaStreamNonBlocking));
      CHECK(cudaEventCreateWithFlags(&gpu[g].done[k], cudaEventDisableTiming));
    }
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# egress: %d GPUs (%s), %zu bytes sent per sending GPU; GB/s egress per sending GPU (median of 11)\n",
              n, prop.name, bytes);
  std::printf("%-16s %7s %10s %10s %10s\n", "variant", "senders", "time_us", "min_GB/s", "mean_GB/s");

  // Index of `peer` among `gpu`'s peers: where gpu's part for peer sits in gpu's source, and peer's part in gpu's
  // destination.
  auto slot = [](int gpu, int peer) { return size_t(peer < gpu ? peer : peer - 1); };
  // GPU 0 or every GPU sends, to the next GPU or to every peer.
  auto sends_of = [&](bool all_senders, bool all_peers) {
    std::vector<Send> sends;
    for (int g = 0; g < (all_senders ? n : 1); ++g) {
      if (!all_peers) sends.push_back({g, (g + 1) % n, 0, 0, vectors});
      for (int d = 0; all_peers && d < n; ++d) {
        if (d != g) sends.push_back({g, d, slot(g, d) * per_peer, slot(d, g) * per_peer, per_peer});
      }
    }
    return sends;
  };
  auto synchronize = [&] {
    for (int g = 0; g < n; ++g) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaDeviceSynchronize());
    }
  };
  // Each sending GPU in turn: start event, its parts (one kernel, or one copy a forked stream), stop event.
  auto issue = [&](const std::vector<Send>& sends, bool ce) {
    for (int g = 0; g < n; ++g) {
      Parts parts{};
      int k = 0;
      CHECK(cudaSetDevice(g));
      for (const Send& s : sends) {
        if (s.from != g) continue;
        if (k == 0) CHECK(cudaEventRecord(gpu[g].start, gpu[g].main));
        const uint4* from = gpu[g].src + s.src_at;
        uint4* to = gpu[s.to].dst + s.dst_at;
        if (ce) {
          CHECK(cudaStreamWaitEvent(gpu[g].peer[k], gpu[g].start, 0));
          CHECK(cudaMemcpyPeerAsync(to, s.to, from, g, s.vectors * 16, gpu[g].peer[k]));
          CHECK(cudaEventRecord(gpu[g].done[k], gpu[g].peer[k]));
          CHECK(cudaStreamWaitEvent(gpu[g].main, gpu[g].done[k], 0));
        } else {
          parts.from[k] = from;
          parts.to[k] = to;
          parts.vectors = s.vectors;
        }
        ++k;
      }
      if (k == 0) continue;
      if (!ce) {
        parts.count = k;
        store_parts<<<gpu[g].sms, kThreads, 0, gpu[g].main>>>(parts);
        CHECK(cudaGetLastError());
      }
      CHECK(cudaEventRecord(gpu[g].stop, gpu[g].main));
    }
  };
  // kWindows windows of every part, on the host, against the pattern of the part's source.
  auto check = [&](const std::vector<Send>& sends) {
    std::vector<uint32_t> got(kWindow * 4);
    for (const Send& s : sends) {
      CHECK(cudaSetDevice(s.to));
      const size_t window = std::min(kWindow, s.vectors);
      for (int i = 0; i < kWindows; ++i) {
        const size_t at = (s.vectors - window) * i / (kWindows - 1);
        CHECK(cudaMemcpy(got.data(), gpu[s.to].dst + s.dst_at + at, window * 16, cudaMemcpyDeviceToHost));
        for (size_t w = 0; w < window * 4; ++w) {
          const uint32_t want = pattern(s.from, (s.src_at + at) * 4 + w);
          if (got[w] != want) {
            std::fprintf(stderr, "egress: check failed: GPU %d byte %zu (from GPU %d) holds %08x, not %08x\n", s.to,
                         (s.dst_at + at) * 16 + w * 4, s.from, got[w], want);
            std::exit(1);
          }
        }
      }
    }
  };

  auto run = [&](const char* name, bool ce, bool all_senders, bool all_peers) {
    const std::vector<Send> sends = sends_of(all_senders, all_peers);
    const int senders = all_senders ? n : 1;
    const double sent = double(all_peers ? per_peer * (n - 1) : vectors) * 16;
    for (int g = 0; g < n; ++g) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaMemset(gpu[g].dst, 0xA5, vectors * 16));
    }
    synchronize();
    issue(sends, ce);
    synchronize();
    check(sends);

    std::vector<std::vector<float>> times(senders);
    for (int it = 0; it < 14; ++it) {
      synchronize();
      issue(sends, ce);
      for (int g = 0; g < senders; ++g) {
        const float ms = elapsed_ms(g, gpu[g].start, gpu[g].stop);
        if (it >= 3) times[g].push_back(ms);
      }
    }
    double slowest = 0, min_rate = 1e30, sum_rate = 0;
    for (int g = 0; g < senders; ++g) {
      std::sort(times[g].begin(), times[g].end());
      const double ms = times[g][times[g].size() / 2], rate = sent / (ms * 1e6);
      slowest = std::max(slowest, ms);
      min_rate = std::min(min_rate, rate);
      sum_rate += rate;
    }
    std::printf("%-16s %7d %10.1f %10.1f %10.1f\n", name, senders, slowest * 1000, min_rate, sum_rate / senders);
    std::fflush(stdout);
  };

  for (bool ce : {false, true}) {
    run(ce ? "ce one-to-one" : "sm one-to-one", ce, false, false);
    run(ce ? "ce one-to-all" : "sm one-to-all", ce, false, true);
    run(ce ? "ce all-to-all" : "sm all-to-all", ce, true, true);
    run(ce ? "ce ring" : "sm ring", ce, true, false);
  }

  for (int g = 0; g < n; ++g) {
    CHECK(cudaSetDevice(g));
    CHECK(cudaFree(gpu[g].src));
    CHECK(cudaFree(gpu[g].dst));
    CHECK(cudaStreamDestroy(gpu[g].main));
    CHECK(cudaEventDestroy(gpu[g].start));
    CHECK(cudaEventDestroy(gpu[g].stop));
    for (int k = 0; k < n - 1; ++k) {
      CHECK(cudaStreamDestroy(gpu[g].peer[k]));
      CHECK(cudaEventDestroy(gpu[g].done[k]));
    }
  }
  return 0;
}
