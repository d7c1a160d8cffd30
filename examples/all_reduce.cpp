// All-reduce on an ordinary cudaMalloc buffer, in place, as NCCL takes it.
//   braid-run -n 2 build/examples/example_all_reduce
#include <braid/braid.hpp>

#include <cstdio>
#include <vector>

#include "common.hpp"

int main() {
  try {
    braid::Communicator comm = braid::Communicator::init(braid::Rendezvous::from_env());
    EXAMPLE_CUDA(cudaSetDevice(comm.device()));  // braid leaves the current device as it found it
    cudaStream_t stream;
    EXAMPLE_CUDA(cudaStreamCreate(&stream));

    const size_t count = 1 << 20;
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(comm.rank() + 1) + static_cast<float>(i % 7);
    float* data = nullptr;
    EXAMPLE_CUDA(cudaMalloc(&data, count * sizeof(float)));
    EXAMPLE_CUDA(cudaMemcpy(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));

    comm.all_reduce(data, data, count, braid::DataType::kFloat32, braid::ReduceOp::kSum, stream);
    EXAMPLE_CUDA(cudaStreamSynchronize(stream));
    comm.check();  // a failure a kernel recorded (a peer that never came) is raised here

    EXAMPLE_CUDA(cudaMemcpy(host.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost));
    const int n = comm.size();
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(n * (n + 1) / 2) + static_cast<float>(n * static_cast<int>(i % 7));
      wrong += host[i] != want;
    }
    std::printf("rank %d: all_reduce of %zu floats on %d ranks: %s\n", comm.rank(), count, n, wrong == 0 ? "OK" : "WRONG");
    EXAMPLE_CUDA(cudaFree(data));
    EXAMPLE_CUDA(cudaStreamDestroy(stream));
    return wrong == 0 ? 0 : 1;
  } catch (const braid::Error& error) {
    std::fprintf(stderr, "braid: %s\n", error.what());
    return 1;
  }
}
