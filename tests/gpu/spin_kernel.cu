#include "spin_kernel.hpp"

namespace braid::testing {
namespace {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__global__ void spin_kernel(uint32_t nanoseconds) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
  }
}

__global__ void hold_kernel(const volatile int* released, uint64_t max_nanoseconds) {
  const uint64_t start = global_timer_ns();
  while (*released == 0 && global_timer_ns() - start < max_nanoseconds) {
  }
}

}  // namespace

cudaError_t spin_on_stream(cudaStream_t stream, uint32_t nanoseconds) {
  spin_kernel<<<1, 1, 0, stream>>>(nanoseconds);
  return cudaGetLastError();
}

cudaError_t hold_until_released(cudaStream_t stream, const volatile int* released, uint64_t max_nanoseconds) {
  hold_kernel<<<1, 1, 0, stream>>>(released, max_nanoseconds);
  return cudaGetLastError();
}

}  // namespace braid::testing
