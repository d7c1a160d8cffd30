#include "core/side_stream.hpp"

#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"

namespace braid {

SideStream::SideStream(int device) : device_(device) {
  DeviceGuard guard(device_);
  BRAID_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // No timing: the events only order streams (and are cheaper to record).
  auto create = [&](cudaEvent_t& event) {
    if (cudaError_t error = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); error != cudaSuccess) {
      destroy();
      BRAID_CUDA(error);
    }
  };
  create(handover_);
  for (cudaEvent_t& event : marks_) create(event);
}

SideStream::~SideStream() {
  DeviceGuard guard(device_);
  destroy();
}

void SideStream::destroy() {
  if (handover_ != nullptr) cudaEventDestroy(handover_);
  for (cudaEvent_t event : marks_) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void SideStream::order(cudaStream_t before, cudaStream_t after) {
  BRAID_CUDA(cudaEventRecord(handover_, before));
  BRAID_CUDA(cudaStreamWaitEvent(after, handover_, 0));
}

void SideStream::mark(int index, cudaStream_t stream) { BRAID_CUDA(cudaEventRecord(marks_[index], stream)); }

void SideStream::after_mark(int index, cudaStream_t stream) {
  BRAID_CUDA(cudaStreamWaitEvent(stream, marks_[index], 0));
}

}  // namespace braid
