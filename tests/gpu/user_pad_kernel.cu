#include "user_pad_kernel.hpp"

#include "braid/device/copy_device.hpp"

namespace braid::testing {
namespace {

__global__ void gather_slices_kernel(device::SignalPad pad, char* const* slots, const char* mine, size_t bytes,
                                     char* gathered) {
  const size_t per_block = (bytes + gridDim.x - 1) / gridDim.x;
  const size_t begin = blockIdx.x * per_block < bytes ? blockIdx.x * per_block : bytes;
  const size_t end = begin + per_block < bytes ? begin + per_block : bytes;
  for (int peer = 0; peer < pad.world; ++peer) {
    device::block_copy(slots[peer] + pad.rank * bytes + begin, mine + begin, end - begin);
  }
  if (!device::barrier(pad, blockIdx.x, /*collective=*/1000, /*site=*/0)) return;
  for (int sender = 0; sender < pad.world; ++sender) {
    device::block_copy(gathered + sender * bytes + begin, slots[pad.rank] + sender * bytes + begin, end - begin);
  }
  device::barrier(pad, blockIdx.x, /*collective=*/1000, /*site=*/1);
}

__global__ void ring_tokens_kernel(device::SignalPad pad, uint64_t* const* mailboxes, int first_channel, int rounds,
                                   const uint64_t* key_word, unsigned long long* wrong, unsigned long long* failed) {
  if (threadIdx.x != 0) return;
  const int block = blockIdx.x, blocks = gridDim.x, channel = first_channel + block;
  const int next = (pad.rank + 1) % pad.world, previous = (pad.rank + pad.world - 1) % pad.world;
  const uint64_t key = *key_word;
  const auto mailbox = [&](uint64_t* base, int sender, int round) {
    return base + (static_cast<size_t>(sender) * blocks + block) * rounds + round;
  };
  unsigned long long mismatches = 0;
  for (int round = 0; round < rounds; ++round) {
    *mailbox(mailboxes[next], pad.rank, round) = ring_token(key, pad.rank, block, round);
    device::signal(pad, channel, next);  // its release orders the token's store before the count
    if (!device::wait(pad, channel, previous, /*collective=*/2000, /*site=*/static_cast<unsigned int>(round))) {
      atomicAdd(failed, 1ull);
      break;
    }
    if (*mailbox(mailboxes[pad.rank], previous, round) != ring_token(key, previous, block, round)) ++mismatches;
  }
  if (mismatches != 0) atomicAdd(wrong, mismatches);
}

__global__ void wait_once_kernel(device::SignalPad pad, int channel, int peer, unsigned int collective,
                                 unsigned int site, uint64_t plan, int barrier_channel, int* passed) {
  const device::PlanCheck check{plan, barrier_channel};
  *passed = device::wait(pad, channel, peer, collective, site, nullptr, check) ? 1 : 0;
}

__global__ void barrier_kernel(device::SignalPad pad, int channel, unsigned int collective, unsigned int site,
                               uint64_t plan, int* passed) {
  const bool met = device::barrier(pad, channel, collective, site, plan);
  if (threadIdx.x == 0) *passed = met ? 1 : 0;
}

__global__ void record_data_error_kernel(device::SignalPad pad, unsigned int code, unsigned int collective, int peer,
                                         long long value, long long limit) {
  device::record_data_error(pad, code, collective, peer, value, limit);
}

}  // namespace

cudaError_t launch_gather_slices(const device::SignalPad& pad, char* const* slots, const char* mine, size_t bytes,
                                 char* gathered, int blocks, cudaStream_t stream) {
  gather_slices_kernel<<<blocks, 256, 0, stream>>>(pad, slots, mine, bytes, gathered);
  return cudaGetLastError();
}

cudaError_t launch_ring_tokens(const device::SignalPad& pad, uint64_t* const* mailboxes, int first_channel, int blocks,
                               int rounds, const uint64_t* key, unsigned long long* wrong, unsigned long long* failed,
                               cudaStream_t stream) {
  ring_tokens_kernel<<<blocks, 32, 0, stream>>>(pad, mailboxes, first_channel, rounds, key, wrong, failed);
  return cudaGetLastError();
}

cudaError_t launch_wait_once(const device::SignalPad& pad, int channel, int peer, unsigned int collective,
                             unsigned int site, uint64_t plan, int barrier_channel, int* passed, cudaStream_t stream) {
  wait_once_kernel<<<1, 1, 0, stream>>>(pad, channel, peer, collective, site, plan, barrier_channel, passed);
  return cudaGetLastError();
}

cudaError_t launch_barrier(const device::SignalPad& pad, int channel, unsigned int collective, unsigned int site,
                           uint64_t plan, int* passed, cudaStream_t stream) {
  barrier_kernel<<<1, 32, 0, stream>>>(pad, channel, collective, site, plan, passed);
  return cudaGetLastError();
}

cudaError_t launch_record_data_error(const device::SignalPad& pad, unsigned int code, unsigned int collective, int peer,
                                     long long value, long long limit, cudaStream_t stream) {
  record_data_error_kernel<<<1, 1, 0, stream>>>(pad, code, collective, peer, value, limit);
  return cudaGetLastError();
}

}  // namespace braid::testing
