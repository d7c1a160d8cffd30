// All-to-all with the counts decided on the GPU, captured once in a CUDA graph and replayed: every replay a
// kernel picks new counts (from a round counter in device memory), and all_to_allv_device moves that many
// elements to each rank and writes what arrived (counts and offsets) to device arrays. No host round trip.
//   braid-run -n 2 build/examples/example_all_to_all_graph
#include <braid/braid.hpp>

#include <cstdio>
#include <vector>

#include "common.hpp"

constexpr int kMaxPerPeer = 5;  // elements one rank sends another: 1 .. kMaxPerPeer

// What source s sends rank q in round `round`, and the value of element j of it.
__host__ __device__ inline int64_t count_for(int round, int s, int q) { return 1 + (round + s + q) % kMaxPerPeer; }
__host__ __device__ inline float value_of(int s, int q, int64_t j) { return 100000.0f * s + 1000.0f * q + static_cast<float>(j); }

// One block: this round's counts and packed send buffer; then the round moves on.
__global__ void make_sends(int* round, int64_t* counts, float* send, int world, int me) {
  const int r = *round;
  if (threadIdx.x < world) counts[threadIdx.x] = count_for(r, me, threadIdx.x);
  for (int q = 0, offset = 0; q < world; offset += static_cast<int>(count_for(r, me, q)), ++q) {
    for (int64_t j = threadIdx.x; j < count_for(r, me, q); j += blockDim.x) send[offset + j] = value_of(me, q, j);
  }
  __syncthreads();
  if (threadIdx.x == 0) *round = r + 1;
}

int main() {
  try {
    braid::Communicator comm = braid::Communicator::init(braid::Rendezvous::from_env());
    EXAMPLE_CUDA(cudaSetDevice(comm.device()));
    const int world = comm.size(), me = comm.rank();
    const size_t capacity = size_t(world) * kMaxPerPeer;
    int* round = nullptr;
    int64_t *send_counts = nullptr, *recv_counts = nullptr, *recv_displs = nullptr;
    float *send = nullptr, *recv = nullptr;
    EXAMPLE_CUDA(cudaMalloc(&round, sizeof(int)));
    EXAMPLE_CUDA(cudaMemset(round, 0, sizeof(int)));
    EXAMPLE_CUDA(cudaMalloc(&send_counts, world * sizeof(int64_t)));
    EXAMPLE_CUDA(cudaMalloc(&recv_counts, world * sizeof(int64_t)));
    EXAMPLE_CUDA(cudaMalloc(&recv_displs, world * sizeof(int64_t)));
    EXAMPLE_CUDA(cudaMalloc(&send, capacity * sizeof(float)));
    EXAMPLE_CUDA(cudaMalloc(&recv, capacity * sizeof(float)));

    cudaStream_t stream;
    EXAMPLE_CUDA(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    EXAMPLE_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    make_sends<<<1, 128, 0, stream>>>(round, send_counts, send, world, me);
    comm.all_to_allv_device(send, send_counts, nullptr, recv, capacity, recv_counts, recv_displs,
                            braid::DataType::kFloat32, stream);
    EXAMPLE_CUDA(cudaStreamEndCapture(stream, &graph));
    EXAMPLE_CUDA(cudaGraphInstantiate(&exec, graph, 0));

    size_t wrong = 0;
    const int replays = 10;
    std::vector<int64_t> counts(world);
    std::vector<float> got(capacity);
    for (int r = 0; r < replays; ++r) {
      EXAMPLE_CUDA(cudaGraphLaunch(exec, stream));
      EXAMPLE_CUDA(cudaStreamSynchronize(stream));
      comm.check();
      EXAMPLE_CUDA(cudaMemcpy(counts.data(), recv_counts, world * sizeof(int64_t), cudaMemcpyDeviceToHost));
      EXAMPLE_CUDA(cudaMemcpy(got.data(), recv, capacity * sizeof(float), cudaMemcpyDeviceToHost));
      size_t at = 0;
      for (int s = 0; s < world; ++s) {
        wrong += counts[s] != count_for(r, s, me);
        for (int64_t j = 0; j < count_for(r, s, me); ++j) wrong += got[at++] != value_of(s, me, j);
      }
    }
    std::printf("rank %d: %d replays of a graph with device-count all-to-all: %s\n", me, replays, wrong == 0 ? "OK" : "WRONG");
    comm.barrier();  // every rank is done with the call before any frees its buffers
    EXAMPLE_CUDA(cudaGraphExecDestroy(exec));
    EXAMPLE_CUDA(cudaGraphDestroy(graph));
    free_all(round, send_counts, recv_counts, recv_displs, send, recv);
    EXAMPLE_CUDA(cudaStreamDestroy(stream));
    return wrong == 0 ? 0 : 1;
  } catch (const braid::Error& error) {
    std::fprintf(stderr, "braid: %s\n", error.what());
    return 1;
  }
}
