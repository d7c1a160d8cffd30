#include "memory/exposure_table.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>

#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/private_copy.hpp"

namespace braid::detail {

ExposureTable::ExposureTable(int world, int device, cudaStream_t setup) : world_(world) {
  const size_t bytes = static_cast<size_t>(world) * kExposureSlots * sizeof(ExposedRange);
  DeviceGuard guard(device);
  void* host = nullptr;
  BRAID_CUDA(cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(host, 0, bytes);
  void* device_pointer = nullptr;
  if (cudaError_t error = cudaHostGetDevicePointer(&device_pointer, host, 0); error != cudaSuccess) {
    cudaFreeHost(host);
    BRAID_CUDA(error);
  }
  void* cache = nullptr;
  if (cudaError_t error = cudaMalloc(&cache, bytes); error != cudaSuccess) {
    cudaFreeHost(host);
    BRAID_CUDA(error);
  }
  try {
    fill_zeros_now(cache, bytes, setup);  // NOTE [no device-wide waits]
  } catch (...) {
    cudaFree(cache);
    cudaFreeHost(host);
    throw;
  }
  entries_ = static_cast<ExposedRange*>(host);
  device_entries_ = static_cast<const ExposedRange*>(device_pointer);
  device_cache_ = static_cast<ExposedRange*>(cache);
}

ExposureTable::~ExposureTable() {
  if (device_cache_ != nullptr) cudaFree(device_cache_);
  if (entries_ != nullptr) cudaFreeHost(entries_);
}

bool ExposureTable::put(int owner, uint64_t id, uintptr_t base, uint64_t bytes) {
  if (owner < 0 || owner >= world_ || id == 0) return false;
  const size_t slot = exposure_slot(owner, id);
  std::lock_guard<std::mutex> lock(mutex_);
  auto held = live_.find(slot);
  if (held != live_.end() && held->second != id) return false;
  ExposedRange& entry = entries_[slot];
  std::atomic_ref<uint64_t>(entry.bytes).store(bytes, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(entry.base).store(static_cast<uint64_t>(base), std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(entry.id).store(id, std::memory_order_release);  // NOTE [exposure table writes]
  live_[slot] = id;
  return true;
}

void ExposureTable::remove(int owner, uint64_t id) noexcept {
  if (owner < 0 || owner >= world_) return;
  const size_t slot = exposure_slot(owner, id);
  std::lock_guard<std::mutex> lock(mutex_);
  auto held = live_.find(slot);
  if (held != live_.end() && held->second == id) live_.erase(held);
}

ExposedRange ExposureTable::read(int owner, uint64_t id) const {
  if (owner < 0 || owner >= world_) return ExposedRange{0, 0, 0};
  ExposedRange& entry = entries_[exposure_slot(owner, id)];
  ExposedRange copy{};
  copy.id = std::atomic_ref<uint64_t>(entry.id).load(std::memory_order_acquire);
  copy.base = std::atomic_ref<uint64_t>(entry.base).load(std::memory_order_relaxed);
  copy.bytes = std::atomic_ref<uint64_t>(entry.bytes).load(std::memory_order_relaxed);
  return copy;
}

}  // namespace braid::detail
