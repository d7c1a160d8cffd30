// Device-side synchronisation between the ranks of a communicator: signal, wait and barrier over the
// communicator's signal pad, bounded by a timeout. Usable from braid's collectives and from users' kernels
// (DESIGN.md "Synchronisation"):
//   - signal(peer): system-scope release add on the peer's slot for (channel, me);
//   - wait(peer): acquire spin until my slot for (channel, peer) reaches the count this channel expects next.
// Counters only grow and expected counts live in device memory, so back-to-back calls and CUDA-graph replays
// stay in step. A channel is one thread block's private set of slots; one thread per (channel, peer) waits.
#pragma once

#include <cstdint>

namespace braid::device {

// Written by a kernel that failed; read by the host (host-mapped memory). The first failure wins.
struct ErrorWord {
  unsigned int code;        // 0: none; one of the kError* codes below
  unsigned int collective;  // what the kernel was doing (braid's collective id, or a user's tag)
  unsigned int site;        // which wait inside it (timeouts)
  int rank;                 // who noticed
  int peer;                 // for whom (timeouts), or whose data (data errors)
  int channel;
  unsigned long long waited_ns;
  long long value;          // data errors: what arrived (elements; bytes for kErrorSizeMismatch)
  long long limit;          // data errors: what was allowed or expected (elements; bytes for kErrorSizeMismatch)
};
// Fatal: a wait gave up; the signal counters are out of step and the communicator is unusable.
constexpr unsigned int kErrorTimeout = 1;
// Data errors: a kernel refused data it was given and wrote none of it, but kept every counter in step, so the
// communicator stays usable. Communicator::check() raises them once and clears the word (collectives do not:
// a rank that threw at a call's entry would leave its peers waiting in that call).
constexpr unsigned int kErrorOverflow = 2;       // more arrived than the receive capacity holds
constexpr unsigned int kErrorCountMismatch = 3;  // a peer sent another count than this rank expected
constexpr unsigned int kErrorNegativeCount = 4;  // a device-side count below zero
constexpr unsigned int kErrorNegativeDisplacement = 5;  // a device-side displacement below zero
constexpr unsigned int kErrorBadExpert = 6;             // an expert id outside [-1, experts)
constexpr unsigned int kErrorTooManyTokens = 7;         // a token count above the buffer's maximum
constexpr unsigned int kErrorSizeMismatch = 8;          // a peer sent another byte size than this rank expected

// The signal pad of one rank, as a kernel sees it. Trivially copyable: pass it by value.
struct SignalPad {
  uint64_t* local;               // [channels][world]: local[c * world + p] counts signals received from p
  uint64_t* const* peers;        // device array [world]: every rank's pad (same layout), mapped here
  uint64_t* expected;            // [channels][world], device memory private to this rank
  ErrorWord* error;              // host-mapped: fatal failures (timeouts)
  ErrorWord* data_error;         // host-mapped: refused data (kErrorOverflow, ...), which does not stop waits
  int rank;
  int world;
  int channels;
  unsigned long long timeout_ns;
};

#if defined(__CUDACC__)

__device__ __forceinline__ unsigned long long global_time_ns() {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__device__ __forceinline__ uint64_t load_acquire_system(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ void add_release_system(uint64_t* address, uint64_t value) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

// Records the first failure of this communicator for the host; later ones are dropped.
__device__ inline void record_error(const SignalPad& pad, unsigned int code, unsigned int collective, unsigned int site,
                                    int peer, int channel, unsigned long long waited_ns) {
  if (atomicCAS(&pad.error->code, 0u, code) == 0u) {
    pad.error->collective = collective;
    pad.error->site = site;
    pad.error->rank = pad.rank;
    pad.error->peer = peer;
    pad.error->channel = channel;
    pad.error->waited_ns = waited_ns;
    __threadfence_system();
  }
}

// Tells `peer` that this rank passed a point on `channel`. Call after the writes the peer must see: the release
// orders this thread's earlier accesses before it, and is cumulative, so writes of other threads of the block
// that a __syncthreads ordered before this thread's call are covered too (no fence needed in between).
__device__ __forceinline__ void signal(const SignalPad& pad, int channel, int peer) {
  add_release_system(pad.peers[peer] + channel * pad.world + pad.rank, 1);
}

// Counters are compared by their difference, so an expected count may start below zero (credits granted in
// advance, as the pipeline FIFOs do) and a wrap-around never stalls a wait.
__device__ __forceinline__ bool reached(uint64_t value, uint64_t target) {
  return static_cast<int64_t>(value - target) >= 0;
}

// Bounded spin of one thread until `ready()` holds. On timeout it records (collective, site, peer, channel) and
// returns false; it also gives up when another wait of this rank already failed. Every device wait spins here.
template <typename Ready>
__device__ inline bool spin_until(const SignalPad& pad, Ready&& ready, unsigned int collective, unsigned int site,
                                  int peer, int channel) {
  if (ready()) return true;
  const unsigned long long start = global_time_ns();
  for (unsigned int spins = 1;; ++spins) {
    if (ready()) return true;
    if ((spins & 1023u) == 0) {
      unsigned long long waited = global_time_ns() - start;
      if (waited > pad.timeout_ns) {
        record_error(pad, kErrorTimeout, collective, site, peer, channel, waited);
        return false;
      }
      if (*static_cast<volatile unsigned int*>(&pad.error->code) != 0) return false;  // another wait failed
    }
  }
}

// Waits for the next signal of `peer` on `channel`. Exactly one thread waits per (channel, peer) at a time.
// Returns false when the timeout passed (or another wait of this rank already failed) after recording it.
// `count_out`, when given, receives the count this wait reached (FIFOs derive their slot from it).
__device__ inline bool wait(const SignalPad& pad, int channel, int peer, unsigned int collective, unsigned int site,
                            uint64_t* count_out = nullptr) {
  uint64_t* expected = pad.expected + channel * pad.world + peer;
  const uint64_t target = *expected + 1;
  *expected = target;
  if (count_out != nullptr) *count_out = target;
  const uint64_t* slot = pad.local + channel * pad.world + peer;
  return spin_until(pad, [&] { return reached(load_acquire_system(slot), target); }, collective, site, peer, channel);
}

// Barrier of this block's channel with the same channel of every peer. Every thread of the block calls it;
// the block's writes before it are visible to peers after it. Returns false (for every thread) on failure;
// the kernel should then return.
__device__ inline bool barrier(const SignalPad& pad, int channel, unsigned int collective, unsigned int site) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < pad.world && peer != pad.rank) {
    signal(pad, channel, peer);  // its release covers the block's writes (ordered by the __syncthreads above)
    if (!wait(pad, channel, peer, collective, site)) failed = 1;
  }
  __syncthreads();
  return failed == 0;
}

// Records the first refused-data failure of this communicator for the host (see kErrorOverflow). Waits go on.
__device__ inline void record_data_error(const SignalPad& pad, unsigned int code, unsigned int collective, int peer,
                                         long long value, long long limit) {
  if (atomicCAS(&pad.data_error->code, 0u, code) == 0u) {
    pad.data_error->collective = collective;
    pad.data_error->rank = pad.rank;
    pad.data_error->peer = peer;
    pad.data_error->value = value;
    pad.data_error->limit = limit;
    __threadfence_system();
  }
}

#endif  // __CUDACC__

}  // namespace braid::device
