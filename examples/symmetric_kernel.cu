// Symmetric memory written by the user's own kernel: every rank's buffer is mapped into one contiguous
// [world x stride] view, so rank r's copy is at view + r * stride and a kernel stores into peers directly.
//   braid-run -n 2 build/examples/example_symmetric_kernel
#include <braid/braid.hpp>

#include <cstdio>
#include <vector>

#include "common.hpp"

// Writes this rank's slot (slot `me`, n floats) of every rank's copy.
__global__ void write_my_slot(char* view, size_t stride, int world, int me, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    for (int r = 0; r < world; ++r) {
      float* slots = reinterpret_cast<float*>(view + r * stride);
      slots[me * n + i] = 1000.0f * static_cast<float>(me + 1) + static_cast<float>(i);
    }
  }
}

int main() {
  try {
    braid::Communicator comm = braid::Communicator::init(braid::Rendezvous::from_env());
    EXAMPLE_CUDA(cudaSetDevice(comm.device()));
    const int world = comm.size(), me = comm.rank();
    const size_t n = 4096;
    braid::SymmetricMemory memory = comm.alloc(world * n * sizeof(float), {.contiguous_view = true});

    write_my_slot<<<32, 256>>>(static_cast<char*>(memory.view()), memory.view_stride(), world, me, n);
    EXAMPLE_CUDA(cudaGetLastError());
    EXAMPLE_CUDA(cudaDeviceSynchronize());  // this rank's stores into the peers are done
    comm.barrier();                         // and so are every peer's into this rank

    std::vector<float> mine(world * n);
    EXAMPLE_CUDA(cudaMemcpy(mine.data(), memory.local(), mine.size() * sizeof(float), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (int s = 0; s < world; ++s) {
      for (size_t i = 0; i < n; ++i) wrong += mine[s * n + i] != 1000.0f * static_cast<float>(s + 1) + static_cast<float>(i);
    }
    std::printf("rank %d: every rank's slot arrived through the contiguous view: %s\n", me, wrong == 0 ? "OK" : "WRONG");
    comm.barrier();  // no rank frees its copy while a peer may still read it
    return wrong == 0 ? 0 : 1;
  } catch (const braid::Error& error) {
    std::fprintf(stderr, "braid: %s\n", error.what());
    return 1;
  }
}
