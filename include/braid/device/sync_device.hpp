// Device-side synchronisation between the ranks of a communicator: signal, wait and barrier over a signal pad,
// bounded by a timeout. Usable from braid's collectives and from users' kernels:
//   - signal(peer): system-scope release add on the peer's slot for (channel, me);
//   - wait(peer): acquire spin until my slot for (channel, peer) reaches the count this channel expects next.
// Counters only grow and expected counts live in device memory, so back-to-back calls and CUDA-graph replays
// stay in step. A channel is one thread block's private set of slots; one thread per (channel, peer) waits.
//
// No public call returns a communicator's own pad (braid's calls alone use it). A user's kernel uses a pad of
// its own, which the host builds once on every rank, as braid builds its own, with `channels` of its choice:
//   - counters and plan words: SymmetricMemory m = comm.alloc(3 * channels * comm.size() * sizeof(uint64_t))
//     (zeroed; a pad whose barriers announce no plan and whose waits pass no PlanCheck needs only the first
//     third); local = m.local(),
//     peers = m.device_peers() (both cast to the SignalPad field's type);
//   - expected: channels * comm.size() uint64_t of this rank's device memory, zeroed (cudaMalloc, cudaMemset);
//   - error, data_error: two zeroed ErrorWords that kernels write and this rank's host reads (host-mapped memory:
//     cudaHostAlloc with cudaHostAllocMapped, then cudaHostGetDevicePointer); neither may be null;
//   - rank = comm.rank(), world = comm.size(), channels, timeout_ns (e.g. comm.timeout_s() * 1e9);
//   - stopped (optional, may stay null): one zeroed unsigned int of this rank's device memory, set by every thread
//     that gives a call up on a failure in `error`, so that barriers with a plan of later kernels answer
//     kStoppedPlan, and barriers with plan 0 fail at once without signalling (their peers then time out) (NOTE
//     [stopped ranks]). signal and wait do not read it: a kernel of yours checks rank_stopped itself.
// Communicator::check() and braid's calls never read such a pad's words: the user's host code reads them as said
// under ErrorWord below, and decides what a failure there means. docs/api.md (sync_device.hpp) has the code.
#pragma once

#include <cstdint>

namespace braid::device {

// A failure a kernel recorded for the host, in host-mapped memory. Plain data; kernels (users' too) write it only
// through record_error, record_data_error and answer_mismatch below (spin_until and barrier call them), the host
// when it publishes a failure (kErrorPeerExited, kErrorAborted, kErrorRevoked: the same claim and publish steps)
// and as said under "Clearing". The protocol:
//   1. claim: a kernel that fails swaps `claimed` from 0 to 1 (atomic compare-and-swap, acquire, system scope).
//      A kernel that loses the claim writes nothing: the word holds an earlier failure, and this one is dropped.
//   2. the winner writes every other field;
//   3. publish: the winner stores `code` (nonzero) with a system-scope release: whoever reads that code (with
//      acquire) sees the fields. No kernel writes the word after that.
// The host reads `code` with acquire, and the fields only when it is nonzero: a word with `claimed` 1 and
// `code` 0 is still being written and is not reported yet.
// Clearing: kernels never clear a word. In a communicator's own pad, the fatal word (SignalPad::error: timeouts,
// plan mismatches) is never cleared: the communicator is unusable. The data-error word (SignalPad::data_error)
// is cleared by the host alone, in Communicator::check() when no fatal failure is recorded (check() raises that
// one first): it swaps `code` to 0 (so one caller takes the record), copies the fields, then stores 0 to
// `claimed` (release); a user's host code clears a word of its own pad the same way. Until then every claim
// fails, so no kernel writes a field the host still reads, and a new record is claimed only after the old one's
// `code` is 0 (it cannot be wiped by the old one's clearing).
struct ErrorWord {
  unsigned int code;        // 0: none published; one of the kError* codes below; stored last (release)
  unsigned int claimed;     // 0: free; 1: a kernel won the word (it is writing or has published a record)
  unsigned int collective;  // what the kernel was doing (braid's collective id, or a user's tag)
  unsigned int site;        // which wait inside it (timeouts; 0 for data errors)
  int rank;                 // who noticed
  int peer;                 // for whom (timeouts), or whose data (data errors; -1 where no one peer's)
  int channel;              // timeouts; 0 for data errors; -1 for failures the host publishes (a peer's exit,
                            // an abort, a revocation: braid's own pad)
  unsigned long long waited_ns;  // timeouts; 0 for data errors
  long long value;          // data errors: what arrived (elements; bytes for kErrorSizeMismatch), unless the
                            // code's comment below says otherwise; timeouts: the peer's step the wait saw at
                            // the timeout (WaitProgress), 0 where it reports none
  long long limit;          // data errors: what was allowed or expected (elements; bytes for kErrorSizeMismatch;
                            // 0 for negative counts and displacements); timeouts: the peer's step the wait
                            // needed, 0 where it reports none
};
// Fatal: a wait gave up; the signal counters are out of step and the communicator is unusable.
constexpr unsigned int kErrorTimeout = 1;
// Data errors: a kernel refused data it was given and wrote none of it, but kept every counter in step, so the
// communicator stays usable. Communicator::check() raises them once and clears the word, unless a fatal failure
// is recorded, which it raises instead (collectives do not:
// a rank that threw at a call's entry would leave its peers waiting in that call).
constexpr unsigned int kErrorOverflow = 2;       // more arrived than the receive capacity holds
constexpr unsigned int kErrorCountMismatch = 3;  // a peer sent another count than this rank expected
// A device-side send count below zero, or whose bytes 64 bits do not hold, alone or, where no displacements are
// given, packed after the earlier peers' counts (all_to_allv_device).
constexpr unsigned int kErrorNegativeCount = 4;
// A device-side displacement below zero, or whose bytes (with its count's) 64 bits do not hold.
constexpr unsigned int kErrorNegativeDisplacement = 5;
constexpr unsigned int kErrorBadExpert = 6;             // an expert id outside [-1, experts)
constexpr unsigned int kErrorTooManyTokens = 7;         // a token count above the buffer's maximum or below zero
constexpr unsigned int kErrorSizeMismatch = 8;          // a peer sent another byte size than this rank expected
constexpr unsigned int kErrorRepeatedExpert = 10;       // a token naming one expert twice (value: the id, limit: the token)
// Fatal: at a barrier, a peer announced another plan for the call than this rank's (another algorithm, buffer
// kind or offset, size, datatype, op or root), or an LL call's plan line from a peer differs (site kSiteLLData),
// or, in a wait with a PlanCheck, a peer kept another plan announced for the grace period (the record's channel
// is then the check's barrier channel, its site the wait's): value is this rank's plan word, limit the peer's. Also
// where an entry barrier passed but a peer announced a registered buffer this rank holds no exposure of (value:
// the call's first announcement word, limit 0). Nothing of the peers' data was used; the communicator is
// unusable. The host raises it as kMismatch (braid::ErrorCode), as the notes below call it.
constexpr unsigned int kErrorPlanMismatch = 9;
// Fatal, published by the host, not by a kernel (the same claim and publish steps): `peer`'s process exited while
// the communicator was in use (value: its pid).
constexpr unsigned int kErrorPeerExited = 11;
// Fatal, published by the host: this rank aborted the communicator (Communicator::abort).
constexpr unsigned int kErrorAborted = 12;
// Fatal, published by the host: `peer` revoked the communicator (Communicator::revoke).
constexpr unsigned int kErrorRevoked = 13;

// The signal pad of one rank, as a kernel sees it. Trivially copyable: pass it by value.
struct SignalPad {
  uint64_t* local;               // [channels][world]: local[c * world + p] counts signals received from p,
                                 // then [channels][world][2] plan words (barrier): the plan p announced at its
                                 // barriers on c, by the parity of the barrier's count
  uint64_t* const* peers;        // device array [world]: every rank's pad (same layout), mapped here
  uint64_t* expected;            // [channels][world], device memory private to this rank
  ErrorWord* error;              // host-mapped: fatal failures (timeouts, plan mismatches)
  ErrorWord* data_error;         // host-mapped: refused data (kErrorOverflow, ...), which does not stop waits
  int rank;
  int world;
  int channels;
  unsigned long long timeout_ns;
  unsigned int* stopped = nullptr;  // this rank's device memory, or null: nonzero once a thread gave its call up
};

// Barriers use channels [0, kBarrierChannels) of a pad (a launch's blocks); the channels beyond count FIFO
// pieces and credits. A pad's waits for data belong on channels from kBarrierChannels: after a plan mismatch,
// answer_mismatch signals every channel below it to every peer, so a plain wait there may pass with no data.
constexpr int kBarrierChannels = 64;

// The plan a stopped rank (NOTE [stopped ranks]: any failure in its fatal word, a mismatch among them) answers
// every peer's barrier with: no call's plan word (no plan word has every bit set), so every peer that meets it
// fails with kMismatch too.
constexpr uint64_t kStoppedPlan = ~uint64_t(0);

// NOTE [stopped ranks]
// A rank is stopped once its fatal word holds a failure. Its host then raises at every call's entry, but kernels
// it enqueued before the failure landed still start, and they must not act on their call: peers may have failed
// in the middle of a call, the counters are out of step, and a piece such a kernel posted or a plan it announced
// could be taken by a peer as another call's (a peer would then finish with wrong data and no error). So a kernel
// that starts on a stopped rank writes nothing a peer reads and posts nothing (braid's kernels check
// rank_stopped themselves; signal and wait do not read it, only barrier does); at a barrier it announces
// kStoppedPlan instead of its plan (so a peer parked there fails with kMismatch) and fails without waiting.
// SignalPad::stopped holds the state in device memory, read with a plain load. Every thread that gives its call up
// on a failure sets it before its kernel can end (mark_stopped): one that is about to claim the fatal word
// (record_error, answer_mismatch), whether it wins the claim or not, and one whose wait ends on a failure already in
// the word (a peer's exit, an abort or a revocation the host published, or another wait's). So a kernel of the same
// stream that starts behind one that gave its call up sees it (the kernel boundary), whoever published the failure
// and however late the host's own copy of the flag lands (verify/models/host_failure.pml); one of the same launch
// may see it or not, as it may see the failure or not.
// verify/models/agreement.pml proves that with this rule every rank fails with kMismatch and none uses another
// call's data.

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

// A whole 8-byte word that a peer may read with load_acquire_system while it is written (a value and its tag in
// one word): relaxed, system scope, never torn.
__device__ __forceinline__ void store_relaxed_system(uint64_t* address, uint64_t value) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

__device__ __forceinline__ void add_release_system(uint64_t* address, uint64_t value) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

__device__ __forceinline__ unsigned int cas_acquire_system(unsigned int* address, unsigned int compare,
                                                           unsigned int value) {
  unsigned int old;
  asm volatile("atom.acquire.sys.global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(address), "r"(compare), "r"(value)
               : "memory");
  return old;
}

__device__ __forceinline__ void store_release_system(unsigned int* address, unsigned int value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

// Step 1 of the ErrorWord protocol: true when this thread won `word` and must fill and publish it.
__device__ __forceinline__ bool claim_error_word(ErrorWord* word) {
  return cas_acquire_system(&word->claimed, 0u, 1u) == 0u;
}

// Step 3: the fields this thread wrote are visible to whoever reads a nonzero `code`.
__device__ __forceinline__ void publish_error_word(ErrorWord* word, unsigned int code) {
  store_release_system(&word->code, code);
}

// Step 2 for the fatal word: fills in what the host reports.
__device__ inline void write_error_fields(const SignalPad& pad, unsigned int collective, unsigned int site, int peer,
                                          int channel, unsigned long long waited_ns, long long value, long long limit) {
  ErrorWord* word = pad.error;
  word->collective = collective;
  word->site = site;
  word->rank = pad.rank;
  word->peer = peer;
  word->channel = channel;
  word->waited_ns = waited_ns;
  word->value = value;
  word->limit = limit;
}

// Whether this rank had stopped when the caller looked (NOTE [stopped ranks]); never with a null pad.stopped. A
// plain load, so that it overlaps the caller's other loads: what it must see was set by a kernel before this one
// on the stream (visible at this kernel's start, as launch counters are); a set by another block of this launch
// may be seen or not.
__device__ __forceinline__ bool rank_stopped(const SignalPad& pad) { return pad.stopped != nullptr && *pad.stopped != 0; }

// Marks this rank stopped (NOTE [stopped ranks]); a thread giving its call up calls it before it returns.
__device__ __forceinline__ void mark_stopped(const SignalPad& pad) {
  if (pad.stopped != nullptr) *static_cast<volatile unsigned int*>(pad.stopped) = 1u;  // written through to L2
}

// Whether this rank's fatal word already holds a failure (another wait's, or one the host published); if so, marks
// this rank stopped, as the caller then gives its call up (NOTE [stopped ranks]).
__device__ __forceinline__ bool failure_recorded(const SignalPad& pad) {
  if (*static_cast<volatile unsigned int*>(&pad.error->code) == 0) return false;
  mark_stopped(pad);
  return true;
}

// Step 1 for the fatal word: marks this rank stopped (NOTE [stopped ranks]: also when the claim is lost, as this
// thread's call ends either way), then claims the word.
__device__ __forceinline__ bool claim_fatal_word(const SignalPad& pad) {
  mark_stopped(pad);
  return claim_error_word(pad.error);
}

// Records the first failure of this communicator for the host; later ones are dropped.
__device__ inline void record_error(const SignalPad& pad, unsigned int code, unsigned int collective, unsigned int site,
                                    int peer, int channel, unsigned long long waited_ns, long long value = 0,
                                    long long limit = 0) {
  if (!claim_fatal_word(pad)) return;
  write_error_fields(pad, collective, site, peer, channel, waited_ns, value, limit);
  publish_error_word(pad.error, code);
}

// Tells `peer` that this rank passed a point on `channel`. Call after the writes the peer must see: the release
// orders this thread's earlier accesses before it, and is cumulative, so writes of other threads of the block
// that a __syncthreads ordered before this thread's call are covered too (no fence needed in between).
__device__ __forceinline__ void signal(const SignalPad& pad, int channel, int peer) {
  add_release_system(pad.peers[peer] + channel * pad.world + pad.rank, 1);
}

// The plan word `sender` announced at its barrier number `count` on `channel`, in the pad whose counters start
// at `base` (this rank's pad, or a peer's as mapped here).
__device__ __forceinline__ uint64_t* plan_slot(const SignalPad& pad, uint64_t* base, int channel, int sender,
                                               uint64_t count) {
  return base + pad.channels * pad.world + (static_cast<size_t>(channel) * pad.world + sender) * 2 + (count & 1);
}

__device__ __forceinline__ uint64_t load_relaxed_system(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

// How long another plan must stay announced, with a wait unmet, before it counts as a mismatch (spin_until).
constexpr unsigned long long kPlanGraceNs = 1000000;


// What a FIFO kernel (pushes, no barrier) checks while it waits for a peer: its own plan, and the
// barrier channel of its block (barriers use channels [0, kernels' blocks)).
struct PlanCheck {
  uint64_t plan = 0;  // 0: nothing checked
  int barrier_channel = 0;
};

// The plan word `peer` announced for this rank's next barrier on the check's channel (0: none, or nothing checked:
// plan 0, peer out of range or this rank); spin_until's MismatchWatch compares it with this rank's. A barrier
// clears every slot it reads, so a nonzero slot is an announcement for a barrier still to come: the peer's barrier
// kernel for the call this rank runs without one (a mismatch), or, when the peer has finished
// this call already, for its next call; then everything this rank waits for from it in this call has landed or
// is about to (a kernel ends after its stores are performed), so spin_until tells the two apart by waiting a
// grace period (kPlanGraceNs) with the announcement still there before it calls it a mismatch.
__device__ inline uint64_t announced_plan(const SignalPad& pad, const PlanCheck& check, int peer) {
  if (check.plan == 0 || peer < 0 || peer >= pad.world || peer == pad.rank) return 0;
  const uint64_t count = pad.expected[check.barrier_channel * pad.world + peer] + 1;
  return load_acquire_system(plan_slot(pad, pad.local, check.barrier_channel, peer, count));
}

// After a mismatch found by announced_plan or in an LL plan line: records kErrorPlanMismatch here, and answers the next
// barrier of every peer on every barrier channel with kStoppedPlan (a signal and the plan), so every peer fails with
// kMismatch at its barrier, or in a FIFO wait on this rank (which sees the plan announced), instead of waiting out the
// timeout. Every peer and channel, not only those that already announced: beyond two ranks a peer's barrier may wait on
// this rank while this rank waited on another one, and may reach its barrier only after this rank has stopped; a peer
// of this rank's own plan must fail too, as this rank's data never comes. Only the thread that records the error
// answers (one answer a barrier). A peer gets the answer at its next barrier whichever call that is: this rank's
// communicator is unusable from now on.
__device__ inline void answer_mismatch(const SignalPad& pad, const PlanCheck& check, int peer, uint64_t theirs,
                                       unsigned int collective, unsigned int site) {
  if (!claim_fatal_word(pad)) return;  // another failure is recorded (and answered) already
  const int channels = pad.channels < kBarrierChannels ? pad.channels : kBarrierChannels;
  for (int other = 0; other < pad.world; ++other) {
    if (other == pad.rank) continue;
    for (int channel = 0; channel < channels; ++channel) {
      const uint64_t count = pad.expected[channel * pad.world + other] + 1;
      store_relaxed_system(plan_slot(pad, pad.peers[other], channel, pad.rank, count), kStoppedPlan);
      signal(pad, channel, other);
    }
  }
  write_error_fields(pad, collective, site, peer, check.barrier_channel, 0, static_cast<long long>(check.plan),
                     static_cast<long long>(theirs));
  publish_error_word(pad.error, kErrorPlanMismatch);
}

// Counters are compared by their difference, so an expected count may start below zero (credits granted in
// advance, as the pipeline FIFOs do) and a wrap-around never stalls a wait.
__device__ __forceinline__ bool reached(uint64_t value, uint64_t target) {
  return static_cast<int64_t>(value - target) >= 0;
}

// The plan check of one wait while it is unmet (PlanCheck): it tells a peer that runs another plan for this call
// from one that has finished the call and announced its next barrier. A peer past this call announces its next
// barrier only after all it sent this call has landed (a kernel's stores are performed before the next kernel on
// its stream starts), and a peer parked at a barrier of this call sends nothing more: another plan announced
// for a grace period (kPlanGraceNs) while the wait stays unmet is a mismatch. Look every so often while unmet.
struct MismatchWatch {
  unsigned long long announced_at = 0;  // when another plan was first seen announced; 0: none seen

  // True once `peer` has kept another plan announced for the grace period; `theirs` receives it. The caller
  // tests its wait once more after that (unmet: a mismatch, answer_mismatch) or has tested it since the first
  // sighting.
  __device__ bool grace_over(const SignalPad& pad, const PlanCheck& check, int peer, uint64_t* theirs) {
    *theirs = announced_plan(pad, check, peer);
    if (*theirs == 0 || *theirs == check.plan) {
      announced_at = 0;
      return false;
    }
    const unsigned long long now = global_time_ns();
    if (announced_at == 0) {
      announced_at = now;
      return false;
    }
    return now - announced_at > kPlanGraceNs;
  }
};

// What a wait tells on its timeout, so the error says how far the peer got: `needed`, the step of the peer it
// waits for (a signal count, an LL call's flag), and `seen()`, the step it finds there now (read once, at the
// timeout). needed 0: nothing told (the record's value and limit stay 0).
struct NoProgress {
  __device__ long long operator()() const { return 0; }
};
template <typename Seen = NoProgress>
struct WaitProgress {
  long long needed = 0;
  Seen seen{};
};
template <typename Seen>
__device__ inline WaitProgress<Seen> wait_progress(long long needed, Seen seen) {
  return WaitProgress<Seen>{needed, seen};
}
// What a wait for the signal counter at `slot` to reach `target` tells: the target, and the count there then.
__device__ inline auto counter_progress(const uint64_t* slot, uint64_t target) {
  return wait_progress(static_cast<long long>(target),
                       [slot] { return static_cast<long long>(load_acquire_system(slot)); });
}

// Bounded spin of one thread until `ready()` holds (true at once where it already does). On timeout it records, where
// the fatal word is still free, (collective, site, peer, channel) and, from `progress`, the peer's step it saw (value)
// and the one it needed (limit), and returns false; it also gives up when the fatal word holds a failure (another
// wait's or the host's; looked at every 1024 polls), and when `check` finds that `peer` runs another plan for the call
// (MismatchWatch). Every wait on a signal counter spins here (LL128's polls use a per-warp bound of their own to the
// same effect).
template <typename Ready, typename Seen = NoProgress>
__device__ inline bool spin_until(const SignalPad& pad, Ready&& ready, unsigned int collective, unsigned int site,
                                  int peer, int channel, const PlanCheck& check = PlanCheck{},
                                  const WaitProgress<Seen>& progress = WaitProgress<Seen>{}) {
  if (ready()) return true;
  const unsigned long long start = global_time_ns();
  MismatchWatch watch;
  for (unsigned int spins = 1;; ++spins) {
    if (ready()) return true;
    if ((spins & 1023u) == 0) {
      unsigned long long waited = global_time_ns() - start;
      if (waited > pad.timeout_ns) {
        const long long seen = progress.needed != 0 ? progress.seen() : 0;
        record_error(pad, kErrorTimeout, collective, site, peer, channel, waited, seen, progress.needed);
        return false;
      }
      if (failure_recorded(pad)) return false;  // another wait failed, or the host published a failure
      uint64_t theirs = 0;
      if (watch.grace_over(pad, check, peer, &theirs) && !ready()) {
        answer_mismatch(pad, check, peer, theirs, collective, site);
        return false;
      }
    }
  }
}

// Waits for the next signal of `peer` on `channel`. Exactly one thread waits per (channel, peer) at a time.
// Returns true as soon as the signal is there (looked at first, so a signal that already arrived wins over a
// failure recorded meanwhile). While it is not, returns false on a timeout (kErrorTimeout recorded where the
// fatal word was still free, value the peer's count then, limit the count waited for), once the fatal word holds
// a failure (another wait's or the host's: nothing recorded; looked at every 1024 polls), or, with a PlanCheck, on
// a plan mismatch (kErrorPlanMismatch). `count_out`, when given, receives the count this wait waits for, set also
// when it fails (FIFOs derive their slot from it).
__device__ inline bool wait(const SignalPad& pad, int channel, int peer, unsigned int collective, unsigned int site,
                            uint64_t* count_out = nullptr, const PlanCheck& check = PlanCheck{}) {
  uint64_t* expected = pad.expected + channel * pad.world + peer;
  const uint64_t target = *expected + 1;
  *expected = target;
  if (count_out != nullptr) *count_out = target;
  const uint64_t* slot = pad.local + channel * pad.world + peer;
  return spin_until(pad, [&] { return reached(load_acquire_system(slot), target); }, collective, site, peer, channel,
                    check, counter_progress(slot, target));
}

// barrier's step for one peer, by the thread of that peer: true when the peer reached the barrier with this plan.
__device__ inline bool barrier_with_peer(const SignalPad& pad, int channel, int peer, unsigned int collective,
                                         unsigned int site, uint64_t plan) {
  uint64_t* expected = pad.expected + channel * pad.world + peer;
  const uint64_t count = *expected + 1;  // what the wait below reaches
  if (rank_stopped(pad)) {
    // NOTE [stopped ranks]: the answer, and no wait. Without a plan there is no answer to give, and a signal
    // would let the peer on to this rank's data.
    if (plan != 0) {
      signal(pad, channel, peer);
      store_relaxed_system(plan_slot(pad, pad.peers[peer], channel, pad.rank, count), kStoppedPlan);
      *expected = count;
    }
    return false;
  }
  signal(pad, channel, peer);  // its release covers the block's writes (ordered by barrier's __syncthreads)
  if (plan == 0) return wait(pad, channel, peer, collective, site);
  // The announcement follows the signal: ahead of it, the release would wait for a store to the peer to land.
  store_relaxed_system(plan_slot(pad, pad.peers[peer], channel, pad.rank, count), plan);
  uint64_t* announced = plan_slot(pad, pad.local, channel, peer, count);
  *expected = count;
  const uint64_t* slot = pad.local + channel * pad.world + peer;
  uint64_t theirs = 0;
  if (!spin_until(pad, [&] {
        theirs = load_relaxed_system(announced);
        return reached(load_acquire_system(slot), count) && theirs != 0;
      }, collective, site, peer, channel, PlanCheck{}, counter_progress(slot, count))) {
    return false;
  }
  store_relaxed_system(announced, 0);  // read: what announced_plan finds there later is a new announcement
  if (theirs == plan) return true;
  record_error(pad, kErrorPlanMismatch, collective, site, peer, channel, 0, static_cast<long long>(plan),
               static_cast<long long>(theirs));
  return false;
}

// Barrier of this block's channel with the same channel of every peer. Every thread of a one-dimensional block
// of at least pad.world threads calls it (thread p signals and waits for peer p); the block's writes before it
// are visible to peers after it. Returns false (for every thread) on failure;
// the kernel should then return.
//
// `plan` (not 0): what this rank's call will do (a word braid derives from the call), announced to every peer right after the
// signal. The rank polls the peer's signal and its announcement for this very barrier together (one round of
// loads, not two after each other), then clears the announcement and compares it with its own; on a difference
// it records kErrorPlanMismatch and fails: ranks that disagree on a
// call stop before they touch each other's data. A barrier's count is the same on both sides of a channel
// (barriers alone use its counters), so the announcement sits in the slot of the count's parity; the peer
// writes that slot again only two barriers later, after this rank's next signal, which follows this read and
// the clearing of the slot (what announced_plan relies on). Every barrier of a pad passes a plan, or none does
// (plan 0: nothing announced or compared). On a stopped rank it announces kStoppedPlan (with a plan) and fails
// without waiting (NOTE [stopped ranks]).
__device__ inline bool barrier(const SignalPad& pad, int channel, unsigned int collective, unsigned int site,
                               uint64_t plan = 0) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < pad.world && peer != pad.rank && !barrier_with_peer(pad, channel, peer, collective, site, plan)) {
    failed = 1;
  }
  __syncthreads();
  return failed == 0;
}

// Records the first refused-data failure of this pad for the host (see kErrorOverflow); later ones are dropped
// until the host takes it (Communicator::check() for braid's pad; for a pad of yours, your host code, or
// braid.SignalPad.check() for a pad made by braid.SignalPad). Waits go on.
__device__ inline void record_data_error(const SignalPad& pad, unsigned int code, unsigned int collective, int peer,
                                         long long value, long long limit) {
  ErrorWord* word = pad.data_error;
  if (!claim_error_word(word)) return;
  word->collective = collective;
  word->site = 0;
  word->rank = pad.rank;
  word->peer = peer;
  word->channel = 0;
  word->waited_ns = 0;
  word->value = value;
  word->limit = limit;
  publish_error_word(word, code);
}

#endif  // __CUDACC__

}  // namespace braid::device
