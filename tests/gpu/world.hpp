// Runs a test body on every rank: as threads of this process (one per GPU), or, under braid-run, as this
// process's one rank. The same test source covers both, so every test runs in both modes.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>

#include "braid/braid.h"
#include "braid/braid.hpp"

namespace braid::testing {

struct RankContext {
  int rank;
  int world;
  Rendezvous rendezvous;  // ready for Communicator::init; namespaced per test
};

// Ranks in this run: the BRAID_WORLD_SIZE of braid-run, or the thread count chosen in main().
int world_size();
bool in_process_mode();
void set_thread_world(int world);

// Calls body on every rank (threads joined before return). Exceptions become test failures naming the rank.
void for_each_rank(const std::function<void(const RankContext&)>& body);

CommOptions test_options(double timeout_s = 30.0);

// A C communicator (braid.h) at the test's store, its GPU made current (gtest assertions: wrap the call in
// ASSERT_NO_FATAL_FAILURE).
void init_c_communicator(const RankContext& context, braidComm_t* comm);

// for_each_rank with a communicator made for the body (by default: timeout 30 s, the selection table). Where ranks
// share GPUs, every rank's body ends (returns or throws) before any rank destroys its communicator.
void with_communicator(const std::function<void(Communicator&)>& body, const CommOptions& options = test_options());

// More ranks than visible GPUs (BRAID_ALLOW_SHARED_GPU=1): some ranks share a GPU.
bool ranks_share_gpus();
// Some ranks share a GPU as threads of this process, and so its context (and its legacy default stream).
bool ranks_share_a_context();
// NCCL refuses two ranks on one GPU: a test that makes NCCL communicators starts with this.
#define SKIP_WHERE_RANKS_SHARE_GPUS()                                                                     \
  if (::braid::testing::ranks_share_gpus())                                                              \
  GTEST_SKIP() << "NCCL refuses two ranks on one GPU, and ranks share GPUs in this run"

// NOTE [shared-GPU waits]
// Ranks that share a GPU as threads share its CUDA context. A peer that already launched its next collective spins
// until this rank joins it, so this rank must never wait on the host for that peer's work:
// - A call that waits for the whole device (cudaDeviceSynchronize, cudaMalloc, cudaFree, beginning or ending a
//   graph's capture) waits for every kernel in the context, a peer's too. Where ranks share GPUs as threads, the
//   helpers below let every rank reach the wait before any launches more, and leave it together.
// - Allocating page-locked host memory (cudaHostAlloc, cudaMallocHost) is one of CUDA's implicit synchronisations
//   between streams. The staging of uploads and downloads (PinnedStaging) is allocated before the rank threads
//   start.
// - The legacy default stream waits for every thread's default stream: the tests are built with per-thread
//   default streams (tests/gpu/CMakeLists.txt).
// - A copy to or from pageable host memory waits for its stream while it holds a lock of the context that every
//   thread's launches and copies take. A test synchronises a stream with a collective on it before such a copy.
// - cudaGraphLaunch of a graph whose previous launch still runs can wait for that launch inside the driver, holding
//   a lock that every thread's CUDA calls take (seen with graphs of copy-engine calls: every rank's thread sat in
//   cudaGraphLaunch). A test that replays a graph again synchronises its stream first (replay_graph).
// - A stream made, or memory allocated, while a peer's call spins can wait until that call ends (making a stream
//   at some counts of live streams waits for the whole device: NOTE [streams made before the exchanges],
//   src/core/private_copy.hpp), and a stream's work can land behind the peer's in a hardware queue. A test makes
//   its streams and buffers, then meets the other ranks at host_barrier() before its first call.
//
// Every rank of this test reaches this line before any goes on (a no-op under braid-run: each process has its own
// context). Bounded: throws after 60 s.
void host_barrier();
// cudaDeviceSynchronize, between two host barriers where ranks share GPUs as threads.
void device_synchronize();
// cudaFree, between two host barriers where ranks share GPUs as threads.
void device_free(void* pointer);
// cudaGraphInstantiate and cudaGraphUpload of `graph` (on `stream`), then, where ranks share GPUs as threads, a host
// barrier: a peer's capture or instantiation waits behind this rank's replays on their GPU, which wait for that
// peer, so every rank has its graph before any replays it. Every rank must call it. Throws on a CUDA error.
cudaGraphExec_t instantiate_on_every_rank(cudaGraph_t graph, cudaStream_t stream);
// `times` launches of `exec` on `stream`, then a wait for the stream; where ranks share GPUs as threads, a wait
// after every launch (NOTE [shared-GPU waits]). Throws on a CUDA error.
void replay_graph(cudaGraphExec_t exec, cudaStream_t stream, int times);
// cudaFree now, or, where ranks share GPUs as threads, once every rank's thread of the test has ended (for_each_rank):
// for memory that ranks release on their own, whose cudaFree could wait for a peer's kernel that waits for this rank.
void free_when_ranks_end(void* pointer);

// cudaMalloc'd device memory freed with device_free: every rank must drop its buffer at the same point of the test,
// where no rank's kernel still runs. For the leak tests, whose free GPU memory would count what free_when_ranks_end
// holds back until the test's end.
class LockstepBuffer {
 public:
  explicit LockstepBuffer(size_t bytes);
  ~LockstepBuffer();
  LockstepBuffer(const LockstepBuffer&) = delete;
  LockstepBuffer& operator=(const LockstepBuffer&) = delete;
  void* get() const { return pointer_; }

 private:
  void* pointer_ = nullptr;
};

// Page-locked host memory of kBytes for staging copies, taken from a pool while held and given back after.
// Where ranks are threads of this process, for_each_rank fills the pool with a buffer for each rank before any rank
// starts (NOTE [shared-GPU waits]), so a rank that holds one buffer at a time never allocates; more holders than
// that allocate, as a braid-run process's rank does the first time.
class PinnedStaging {
 public:
  static constexpr size_t kBytes = size_t(4) << 20;
  PinnedStaging();
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  void* get() const { return pointer_; }

 private:
  void* pointer_ = nullptr;
};

// Makes the communicator's GPU current in this thread (init leaves the caller's current device as it was).
void make_current(const Communicator& comm);

}  // namespace braid::testing
