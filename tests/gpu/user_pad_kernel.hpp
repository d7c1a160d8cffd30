// Kernels of the test's own over braid/device/sync_device.hpp, driving a signal pad as a user's kernel does
// (docs/api.md, sync_device.hpp); test_user_signal_pad.cpp builds the pads and checks what the kernels did.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"

namespace braid::testing {

// docs/api.md's gather_slices, and after it the read it leaves to the caller: block b pushes slice b of `mine`
// (`bytes` long) into slot pad.rank of every rank's `slots` (world * bytes), meets block b of every peer, copies
// slice b of every rank's slot from this rank's `slots` into `gathered` (world * bytes), then meets them again so
// that no peer's next launch writes a slot before this rank has read it. One block per channel, `blocks` <=
// pad.channels.
cudaError_t launch_gather_slices(const device::SignalPad& pad, char* const* slots, const char* mine, size_t bytes,
                                 char* gathered, int blocks, cudaStream_t stream);

// Tokens around the ring with signal and wait alone: block b, thread 0, for each of `rounds` rounds writes a token
// (of *key, this rank, b and the round) into mailbox [pad.rank][b][round] of the next rank's `mailboxes`
// ([world][blocks][rounds] uint64_t), signals the next rank on channel first_channel + b, waits for the previous
// rank on that channel, and reads the previous rank's token from this rank's mailbox. Adds the tokens that were
// not what the previous rank wrote to *wrong, and the waits that failed to *failed.
cudaError_t launch_ring_tokens(const device::SignalPad& pad, uint64_t* const* mailboxes, int first_channel, int blocks,
                               int rounds, const uint64_t* key, unsigned long long* wrong, unsigned long long* failed,
                               cudaStream_t stream);

// The token launch_ring_tokens writes, for the host's reference.
__host__ __device__ inline uint64_t ring_token(uint64_t key, int sender, int block, int round) {
  uint64_t x = key + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(1 + round + 4096 * (block + 64 * sender));
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One thread waits once for `peer` on `channel`, with a PlanCheck of `plan` on `barrier_channel` (plan 0: none);
// *passed becomes 1 if the wait returned true, else 0.
cudaError_t launch_wait_once(const device::SignalPad& pad, int channel, int peer, unsigned int collective,
                             unsigned int site, uint64_t plan, int barrier_channel, int* passed, cudaStream_t stream);

// One block of 32 threads meets every peer at a barrier on `channel` with `plan`; *passed becomes 1 if the barrier
// returned true (for every thread), else 0.
cudaError_t launch_barrier(const device::SignalPad& pad, int channel, unsigned int collective, unsigned int site,
                           uint64_t plan, int* passed, cudaStream_t stream);

// One thread records a refused-data failure into pad.data_error (record_data_error).
cudaError_t launch_record_data_error(const device::SignalPad& pad, unsigned int code, unsigned int collective, int peer,
                                     long long value, long long limit, cudaStream_t stream);

}  // namespace braid::testing
