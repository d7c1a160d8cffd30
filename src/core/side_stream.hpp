// A second stream of the communicator's GPU, so one collective can run work beside its copy engines' (the
// copy-engine collectives: this rank's own block by an SM kernel while the engines move the peers' blocks).
// Work moves between the two with
// order(): an event recorded on one stream and waited on by the other right away, so one event serves every
// hand-over. Graph capture follows the hand-overs: the side stream joins the caller's capture at the first
// order(caller, side) and must be ordered back into the caller's stream before the call returns.
// Made at communicator init (collectives never create CUDA objects).
//
// NOTE [side streams at the greatest priority]
// A collective's side-stream work (the copy-engine pairs' kernels of each chunk, the own block's kernel beside the
// copy engines) runs while the caller's other streams compute. A kernel starts only on free multiprocessors: at the
// default priority, one queued behind a compute kernel that fills the GPU waits for that kernel's last block, and
// every chunk after it waits too, so the copies stall. At the greatest priority the block scheduler gives it the
// next multiprocessor a block frees. The copy engines are not affected, and a GPU running nothing else runs the
// side streams' work the same at either priority. Kernels on the caller's stream keep its priority: launched at
// the greatest one instead, they made the same FSDP2 step no shorter. Where ranks share a GPU (a test mode) the
// side streams keep the default priority: a rank's kernel that spins until a peer's work on the same GPU is done
// must not be scheduled ahead of that work.
#pragma once

#include <cuda_runtime_api.h>

namespace braid {

class SideStream {
 public:
  // `greatest_priority`: the GPU's greatest stream priority (NOTE [side streams at the greatest priority]), else
  // the default one.
  SideStream(int device, bool greatest_priority);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t get() const { return stream_; }
  // Everything enqueued on `before` so far happens before anything enqueued on `after` from now on.
  void order(cudaStream_t before, cudaStream_t after);

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t handover_ = nullptr;
};

}  // namespace braid
