// Lets this thread make setup calls (mapping peers' memory, IPC handles) while a CUDA graph capture runs, in
// this thread or, in global capture mode, in any other thread of the process (ranks as threads): such calls
// enqueue nothing, but global mode refuses every "potentially unsafe" call and breaks the capture. The thread's
// own mode is relaxed for the scope and restored after, as cudaThreadExchangeStreamCaptureMode intends.
#pragma once

#include <cuda_runtime_api.h>

namespace braid {

class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() noexcept { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace braid
