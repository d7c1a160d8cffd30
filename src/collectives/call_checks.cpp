#include "collectives/call_checks.hpp"
#include "collectives/plan.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "collectives/selection.hpp"
#include "comm/comm_state.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid::collectives {

void check_device_pointer(const char* function, const void* pointer, const char* argument, int device) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();
    raise_invalid_argument(function, argument, "({}) is not memory CUDA knows", pointer);
  }
  if (attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost) {
    raise_invalid_argument(function, argument, "({}) is host memory; collectives need device memory", pointer);
  }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != device) {
    raise_invalid_argument(function, argument, "({}) is memory of GPU {}, but this rank uses GPU {}", pointer,
                           attributes.device, device);
  }
}

void raise_recorded_failure(detail::CommState& state, const char* (*collective_name)(unsigned int)) {
  if (state.nccl) {
    state.nccl->check();
  } else {
    state.sync->raise_recorded_error(collective_name, describe_plan);
  }
}

detail::CommState& enter(const std::shared_ptr<detail::CommState>& state_ptr, const char* function) {
  detail::CommState& state = detail::usable(state_ptr, function);
  set_log_rank(state.rank);
  raise_recorded_failure(state, collective_name);
  return state;
}

size_t element_size(const char* function, DataType type, const char* argument) {
  const size_t size = datatype_size(type);
  if (size == 0) raise_invalid_argument(function, argument, "is {}, not a braid::DataType", static_cast<int>(type));
  return size;
}

size_t checked_product(const char* function, const char* argument, size_t a, size_t b) {
  if (b != 0 && a > SIZE_MAX / b) raise_invalid_argument(function, argument, "is {}: its size in bytes overflows", a);
  return a * b;
}

void check_buffer(const char* function, const void* pointer, const char* argument, size_t bytes, int device) {
  if (bytes == 0) return;
  if (pointer == nullptr) raise_invalid_argument(function, argument, "is null but {} bytes go through it", bytes);
  check_device_pointer(function, pointer, argument, device);
}

void register_with_nccl(detail::CommState& state, const void* buffer, size_t bytes) {
  if (buffer == nullptr || bytes == 0) return;
  if (const auto found = state.registrations->containing(reinterpret_cast<uintptr_t>(buffer), bytes)) {
    state.nccl->ensure_registered(found->first, reinterpret_cast<void*>(found->second.address), found->second.bytes);
  }
}

void check_launch(const char* what) {
  cudaError_t result = cudaGetLastError();
  if (result != cudaSuccess) raise_cuda(result, what, __FILE__, __LINE__);
}

}  // namespace braid::collectives
