// Host side of device synchronisation: a communicator's signal pad (symmetric), the expected counts and the
// staging epoch (device memory), and the error word (host-mapped), made once at communicator init so that no
// collective allocates (graph capture).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <string>

#include "braid/device/sync_device.hpp"
#include "memory/memory_context.hpp"
#include "memory/symmetric_memory.hpp"

namespace braid {

// Wait sites and collective ids as the device reports them; names for messages live in one table.
enum WaitSite : unsigned int {
  kSiteEntryBarrier = 1,
  kSiteMiddleBarrier = 2,
  kSiteExitBarrier = 3,
  kSiteFifoData = 4,    // a pipelined collective waiting for a peer's piece
  kSiteFifoCredit = 5,  // ... for a peer to hand back a FIFO slot
  kSiteLLData = 6,      // an LL collective polling a peer's line
  kSiteMoeRows = 7,     // MoE dispatch waiting for a peer's round of rows
  kSiteMoeCounts = 8,   // MoE dispatch waiting for a peer's routing counts
  kSiteExchangeBarrier = 9,  // the barrier before a registered buffer's mappings are exchanged
  kSiteMoeCountsCleared = 10,  // MoE dispatch waiting for its own kernel's block 0 to clear the expert counts
  kSiteExchangeRows = 11,      // the epilogue reduce-scatter waiting for a peer's rows (its flag)
  kSiteExchangeFreed = 12,     // ... for a peer to have read what this rank sent in the previous call
  kSiteGatheredRows = 13,      // the all-gather under the GEMM's loads waiting for a peer's rows of A (a flag)
  kSiteProductRows = 14,       // the reduce-scatter by the copy engines waiting for its GEMM's rows of a chunk
};
const char* wait_site_name(unsigned int site);

// The host's side of the ErrorWord protocol (braid/device/sync_device.hpp), on a word in host memory.
// read_error_word: a copy of the record a kernel published (code != 0), or a record with code 0 while none is
// published (a claimed word still being written included). Writes nothing. For the fatal word.
device::ErrorWord read_error_word(device::ErrorWord* word);
// take_error_word: as read_error_word, but a published record is taken out: its code is swapped to 0 (one caller
// gets it), the fields copied, then the word freed for the next failure (claimed = 0, release). For the data word.
// In both copies `claimed` is 0.
device::ErrorWord take_error_word(device::ErrorWord* word);

class DeviceSync {
 public:
  // `channels`: slots per peer on the signal pad (each a counter that kernels signal and wait on). Collective over
  // the ranks of `memory` (the pad is a symmetric allocation).
  DeviceSync(const std::shared_ptr<detail::MemoryContext>& memory, double timeout_s, int channels);
  ~DeviceSync();
  DeviceSync(const DeviceSync&) = delete;
  DeviceSync& operator=(const DeviceSync&) = delete;

  device::SignalPad pad() const { return pad_; }
  uint64_t* epoch() const { return &counters_->staging_epoch; }  // staging parity counter, advanced by kernels
  uint64_t* ll_epoch() const { return &counters_->ll_epoch; }     // LL calls so far, advanced by kernels
  uint64_t* ll128_epoch() const { return &counters_->ll128_epoch; }  // LL128 calls so far, advanced by kernels
  uint64_t* multicast_epoch() const { return &counters_->multicast_epoch; }  // multicast region parity counter
  unsigned int* blocks_done() const { return &counters_->blocks_done; }  // the last block of a launch advances a counter

  // Lets the first `credits` waits on channels [first, first + count) pass before any signal: their expected
  // counts start `credits` below zero (waits compare differences). Call before any kernel uses the pad; the upload
  // runs on the communicator's set-up stream.
  void grant_credits(int first, int count, uint64_t credits);

  // Tests only (comm/test_hooks.hpp): sets the LL call count, so a test reaches sequences (flag wrap, re-stamping)
  // that calls would take hours to reach. Synchronous; no LL call of this communicator may be in flight.
  void set_ll_epoch_for_testing(uint64_t calls_so_far);

  // Publishes a fatal failure the host found (device::kErrorPeerExited naming `peer` and its pid in `value`,
  // device::kErrorRevoked naming the revoking rank in `peer`, or device::kErrorAborted) in the word kernels record
  // theirs in: every wait of this rank's kernels gives up at its next look (spin_until looks every 1024 spins) and
  // the next call raises it. Then it enqueues a copy that marks the rank stopped on the device (NOTE [stopped
  // ranks]) and returns without waiting for it: a wait that gives up on the code marks the rank stopped itself, so
  // a kernel that starts behind one that gave its call up acts on nothing. False when the word already held a
  // failure (the first one stays; the rank is stopped either way). Any thread; never waits for the GPU.
  bool publish_failure(unsigned int code, int peer, long long value);

  // Throws the fatal failure a kernel recorded, if any: kTimeout naming collective, wait site and peer, or
  // kMismatch naming two ranks' plans for one call (device::kErrorPlanMismatch). `collective_name` maps the
  // recorded collective id to a name, `describe_plan` (optional) a plan word. Every collective calls it at entry.
  void raise_recorded_error(const char* (*collective_name)(unsigned int),
                            std::string (*describe_plan)(uint64_t) = nullptr) const;
  // Throws, once, the data a kernel refused (overflow, count mismatch, negative counts), and clears it.
  // Only Communicator::check() calls it: the communicator is still in step, and a collective that threw at its
  // entry on one rank would leave its peers waiting in the call.
  void raise_refused_data(const char* (*collective_name)(unsigned int)) const;

 private:
  std::shared_ptr<detail::SymmetricAllocation> pad_memory_;
  device::SignalPad pad_{};
  device::ErrorWord* error_host_ = nullptr;  // same memory as pad_.error, host view
  struct Counters {
    uint64_t staging_epoch;
    uint64_t ll_epoch;
    uint64_t multicast_epoch;
    unsigned int blocks_done;
    uint64_t ll128_epoch;
    unsigned int stopped;  // SignalPad::stopped (NOTE [stopped ranks]): beside the epochs kernels read at their start
  };
  Counters* counters_ = nullptr;  // device memory
  uint64_t* expected_ = nullptr;
  int device_ = -1;
  // The communicator's set-up stream (MemoryContext, which outlives this): the credits' upload and the stopped flag's
  // copy go on it. Non-blocking, and nothing on it waits for a kernel (NOTE [streams made before the exchanges]).
  cudaStream_t setup_stream_ = nullptr;
  unsigned int* stop_value_ = nullptr;  // pinned host memory holding 1: the copy's source
  std::atomic<bool> stop_enqueued_{false};
};

}  // namespace braid
