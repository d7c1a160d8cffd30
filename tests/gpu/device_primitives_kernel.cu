#include "device_primitives_kernel.hpp"

#include "braid/device/copy_device.hpp"
#include "braid/device/ll_device.hpp"
#include "braid/device/sync_device.hpp"

namespace braid::testing {
namespace {

__global__ void group_copy_kernel(CopyGroup group, char* destination, char* second, const char* source, size_t bytes) {
  switch (group) {
    case CopyGroup::kBlock: device::block_copy(destination, source, bytes); break;
    case CopyGroup::kWarp:
      if (threadIdx.x < 32) device::warp_copy(destination, source, bytes);
      break;
    case CopyGroup::kBlockToTwo: {
      char* const destinations[2] = {destination, second};
      device::block_copy_to(destinations, 2, source, bytes);
      break;
    }
  }
}

__global__ void ll_send_kernel(char* wire, const char* source, size_t bytes, uint32_t flag) {
  const size_t lines = (bytes + device::kLLLineBytes - 1) / device::kLLLineBytes;
  for (size_t line = blockIdx.x * blockDim.x + threadIdx.x; line < lines; line += gridDim.x * blockDim.x) {
    const size_t offset = line * device::kLLLineBytes;
    device::store_wire(wire + line * device::kLLWireBytes, device::load_line(source + offset, bytes - offset), flag);
  }
}

__global__ void ll_receive_kernel(const char* wire, char* destination, size_t bytes, uint32_t flag, uint64_t timeout_ns,
                                  unsigned long long* arrived) {
  const size_t lines = (bytes + device::kLLLineBytes - 1) / device::kLLLineBytes;
  const unsigned long long start = device::global_time_ns();
  unsigned long long mine = 0;
  for (size_t line = blockIdx.x * blockDim.x + threadIdx.x; line < lines; line += gridDim.x * blockDim.x) {
    uint2 payload;
    bool got = false;
    while (!(got = device::load_wire(wire + line * device::kLLWireBytes, flag, &payload)) &&
           device::global_time_ns() - start < timeout_ns) {
    }
    if (!got) continue;
    const size_t offset = line * device::kLLLineBytes;
    device::store_line(destination + offset, payload, bytes - offset);
    ++mine;
  }
  atomicAdd(arrived, mine);
}

}  // namespace

cudaError_t launch_group_copy(CopyGroup group, char* destination, char* second, const char* source, size_t bytes,
                              cudaStream_t stream) {
  group_copy_kernel<<<1, 256, 0, stream>>>(group, destination, second, source, bytes);
  return cudaGetLastError();
}

cudaError_t launch_ll_send(char* wire, const char* source, size_t bytes, uint32_t flag, cudaStream_t stream) {
  ll_send_kernel<<<8, 256, 0, stream>>>(wire, source, bytes, flag);
  return cudaGetLastError();
}

cudaError_t launch_ll_receive(const char* wire, char* destination, size_t bytes, uint32_t flag, uint64_t timeout_ns,
                              unsigned long long* arrived, cudaStream_t stream) {
  ll_receive_kernel<<<8, 256, 0, stream>>>(wire, destination, bytes, flag, timeout_ns, arrived);
  return cudaGetLastError();
}

}  // namespace braid::testing
