#include "core/side_stream.hpp"

#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"

namespace braid {

SideStream::SideStream(int device, bool greatest_priority) : device_(device) {
  DeviceGuard guard(device_);
  if (greatest_priority) {
    int least = 0, greatest = 0;
    BRAID_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    BRAID_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  } else {
    BRAID_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  // No timing: the event only orders streams (and is cheaper to record).
  if (cudaError_t error = cudaEventCreateWithFlags(&handover_, cudaEventDisableTiming); error != cudaSuccess) {
    cudaStreamDestroy(stream_);
    BRAID_CUDA(error);
  }
}

SideStream::~SideStream() {
  DeviceGuard guard(device_);
  cudaEventDestroy(handover_);
  cudaStreamDestroy(stream_);
}

void SideStream::order(cudaStream_t before, cudaStream_t after) {
  BRAID_CUDA(cudaEventRecord(handover_, before));
  BRAID_CUDA(cudaStreamWaitEvent(after, handover_, 0));
}

}  // namespace braid
