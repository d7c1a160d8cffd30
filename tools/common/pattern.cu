#include "pattern.hpp"

#include <stdexcept>
#include <string>

namespace braid::check {
namespace {

void check_cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(result));
}

// splitmix64 of the coordinates: neighbouring bytes, writers and owners all differ.
__host__ __device__ inline uint8_t pattern_byte(uint64_t seed, int writer, int owner, uint64_t index) {
  uint64_t x = seed ^ (static_cast<uint64_t>(writer) << 48) ^ (static_cast<uint64_t>(owner) << 32) ^ (index * 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  // 0xA5 is the poison byte: keep patterns off it so a never-written byte cannot pass.
  uint8_t value = static_cast<uint8_t>(x);
  return value == 0xA5 ? 0x5A : value;
}

__global__ void write_kernel(uint8_t* destination, uint64_t bytes, uint64_t seed, int writer, int owner) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < bytes; i += uint64_t(gridDim.x) * blockDim.x) {
    destination[i] = pattern_byte(seed, writer, owner, i);
  }
}

__global__ void check_kernel(const uint8_t* source, uint64_t bytes, uint64_t seed, int writer, int owner,
                             unsigned long long* wrong, unsigned long long* first_bad) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < bytes; i += uint64_t(gridDim.x) * blockDim.x) {
    if (source[i] != pattern_byte(seed, writer, owner, i)) {
      atomicAdd(wrong, 1ull);
      atomicMin(first_bad, static_cast<unsigned long long>(i));
    }
  }
}

unsigned grid_for(size_t bytes) {
  size_t blocks = (bytes + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks));
}

}  // namespace

void write_pattern(void* destination, size_t bytes, uint64_t seed, int writer, int owner, cudaStream_t stream) {
  if (bytes == 0) return;
  write_kernel<<<grid_for(bytes), 256, 0, stream>>>(static_cast<uint8_t*>(destination), bytes, seed, writer, owner);
  check_cuda(cudaGetLastError(), "write_pattern launch");
}

void poison(void* destination, size_t bytes, cudaStream_t stream) {
  check_cuda(cudaMemsetAsync(destination, 0xA5, bytes, stream), "poison");
}

PatternCheck check_pattern(const void* source, size_t bytes, uint64_t seed, int writer, int owner, cudaStream_t stream) {
  PatternCheck result;
  if (bytes == 0) return result;
  unsigned long long* counters = nullptr;  // [wrong, first_bad]
  check_cuda(cudaMalloc(&counters, 2 * sizeof(unsigned long long)), "cudaMalloc");
  unsigned long long initial[2] = {0, ~0ull};
  check_cuda(cudaMemcpyAsync(counters, initial, sizeof(initial), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  check_kernel<<<grid_for(bytes), 256, 0, stream>>>(static_cast<const uint8_t*>(source), bytes, seed, writer, owner,
                                                    counters, counters + 1);
  check_cuda(cudaGetLastError(), "check_pattern launch");
  unsigned long long host[2] = {};
  check_cuda(cudaMemcpyAsync(host, counters, sizeof(host), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check_cuda(cudaFree(counters), "cudaFree");
  result.wrong = host[0];
  if (result.wrong > 0) {
    result.first_bad = host[1];
    result.expected = pattern_byte(seed, writer, owner, host[1]);
    uint8_t got = 0;
    check_cuda(cudaMemcpy(&got, static_cast<const uint8_t*>(source) + host[1], 1, cudaMemcpyDeviceToHost), "cudaMemcpy");
    result.got = got;
  }
  return result;
}

}  // namespace braid::check
