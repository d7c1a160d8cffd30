// Send/recv pairs in LL128 lines, device side (send_recv_lines_launch.hpp). Each pair direction has blocks of its
// own; the last block to finish advances the count (receiving: and tells the sender).
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/ll128.cuh"
#include "kernels/collective_id.hpp"
#include "kernels/send_recv_lines_launch.hpp"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

constexpr unsigned int kSendRecvId = static_cast<unsigned int>(Collective::kSendRecv);
constexpr int kWarps = kSendRecvLinesThreads / 32;
constexpr int kGroupsPerRound = kSendRecvLinesGroupsPerWarp;  // a warp's overlapping loads or polls

__device__ __forceinline__ SendRecvLinesCounts* counts_of(char* area) { return reinterpret_cast<SendRecvLinesCounts*>(area); }

__device__ __forceinline__ char* slot_of(const SendRecvLinesLaunch& launch, int receiver, int sender, uint64_t parity) {
  return launch.area[receiver] + kSendRecvLinesCountsBytes +
         (parity * launch.pad.world + static_cast<uint64_t>(sender)) * kSendRecvLinesSlotBytes;
}

// Warp w of block b starts at group b * kWarps + w; a round's groups lie `stride` apart.
struct Share {
  uint64_t first;
  uint64_t stride;
};
__device__ __forceinline__ Share share_of(int block, int blocks) {
  const int warp = threadIdx.x / 32;
  return Share{uint64_t(block) * kWarps + warp, uint64_t(blocks) * kWarps};
}

// Whether this block is the last of `blocks` to finish (thread 0; re-arms `finished`).
__device__ __forceinline__ bool last_to_finish(unsigned int* finished, int blocks) {
  if (blocks == 1) return true;
  __threadfence();
  if (atomicAdd(finished, 1u) != static_cast<unsigned int>(blocks) - 1) return false;
  *finished = 0;
  return true;
}

__device__ void send_lines(const SendRecvLinesLaunch& launch, const SendRecvLinesPair& pair, int block) {
  const int me = launch.pad.rank;
  SendRecvLinesCounts* mine = counts_of(launch.area[me]);
  __shared__ uint64_t sequence;
  __shared__ int ready;
  if (threadIdx.x == 0) {
    sequence = mine->sent[pair.peer] + 1;
    // Message n - 2 used this parity: the receiver must have consumed it.
    const uint64_t needed = sequence > 2 ? sequence - 2 : 0;
    ready = device::spin_until(launch.pad, [&] { return device::load_acquire_system(&mine->consumed[pair.peer]) >= needed; },
                               kSendRecvId, kSiteFifoCredit, pair.peer, blockIdx.x)
                ? 1
                : 0;
  }
  __syncthreads();
  if (!ready) return;  // recorded
  const uint64_t flag = sequence;
  char* slot = slot_of(launch, pair.peer, me, flag & 1);
  const LanePart part = lane_part();
  const unsigned int lane = threadIdx.x & 31u;
  const uint64_t groups = send_recv_lines_groups(pair.bytes);
  const Share share = share_of(block, pair.blocks);
  for (uint64_t first = share.first; first < groups; first += kGroupsPerRound * share.stride) {
    uint64_t words[kGroupsPerRound][2];
#pragma unroll
    for (int i = 0; i < kGroupsPerRound; ++i) {
      const uint64_t group = first + uint64_t(i) * share.stride;
      words[i][0] = words[i][1] = 0;
      if (group == 0) {
        if (lane == 0) words[i][0] = pair.bytes;
      } else if (group < groups) {
        const uint64_t offset = (group - 1) * kLL128WarpPayload + part.offset;
        load_part(pair.buffer + offset, offset < pair.bytes ? pair.bytes - offset : 0, part.bytes, words[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kGroupsPerRound; ++i) {
      const uint64_t group = first + uint64_t(i) * share.stride;
      if (group < groups) {
        store_wire16(slot + group * kLL128WarpWire + lane * 16, words[i][0], part.carries_flag ? flag : words[i][1]);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && last_to_finish(&mine->sends_finished[pair.peer], pair.blocks)) mine->sent[pair.peer] = sequence;
}

__device__ void receive_lines(const SendRecvLinesLaunch& launch, const SendRecvLinesPair& pair, int block) {
  const int me = launch.pad.rank;
  SendRecvLinesCounts* mine = counts_of(launch.area[me]);
  __shared__ uint64_t sequence;
  __shared__ int failed;
  if (threadIdx.x == 0) {
    sequence = mine->received[pair.peer] + 1;
    failed = 0;
  }
  __syncthreads();
  const uint64_t flag = sequence;
  const char* slot = slot_of(launch, me, pair.peer, flag & 1);
  const LanePart part = lane_part();
  const unsigned int lane = threadIdx.x & 31u;
  WarpPollBound bound(launch.pad, kSendRecvId, kSiteLLData, pair.peer);
  // Every warp reads the count (group 0) itself, so no warp waits on another.
  uint64_t header[1][2];
  bool ok = poll_groups<1>(slot + lane * 16, kLL128WarpWire, 1, true, flag, bound, header);
  const uint64_t sent = __shfl_sync(0xffffffffu, header[0][0], 0);
  const bool refused = ok && sent != pair.bytes;
  if (ok && !refused) {
    const uint64_t groups = send_recv_lines_groups(pair.bytes);
    const Share share = share_of(block, pair.blocks);
    for (uint64_t first = share.first; first < groups; first += kGroupsPerRound * share.stride) {
      int count = 0;
      while (count < kGroupsPerRound && first + uint64_t(count) * share.stride < groups) ++count;
      const bool has_count = first == 0;
      uint64_t words[kGroupsPerRound][2];
      ok = poll_groups<kGroupsPerRound>(slot + first * kLL128WarpWire + lane * 16, share.stride * kLL128WarpWire, count,
                                        true, flag, bound, words);
      if (!ok) break;
#pragma unroll
      for (int i = 0; i < kGroupsPerRound; ++i) {
        if (i >= count || (i == 0 && has_count)) continue;
        const uint64_t offset = (first + uint64_t(i) * share.stride - 1) * kLL128WarpPayload + part.offset;
        store_part(pair.buffer + offset, offset < pair.bytes ? pair.bytes - offset : 0, part.bytes, words[i]);
      }
    }
  }
  if (!ok && lane == 0) failed = 1;
  if (refused && block == 0 && threadIdx.x == 0) {
    device::record_data_error(launch.pad, device::kErrorSizeMismatch, kSendRecvId, pair.peer,
                              static_cast<long long>(sent), static_cast<long long>(pair.bytes));
  }
  __syncthreads();
  if (failed || threadIdx.x != 0) return;  // recorded
  if (!last_to_finish(&mine->receives_finished[pair.peer], pair.blocks)) return;
  mine->received[pair.peer] = sequence;
  // Every block's loads of the slot are done (each counted in after its barrier): the sender may reuse the parity.
  __threadfence_system();
  device::store_relaxed_system(&counts_of(launch.area[pair.peer])->consumed[me], sequence);
}

__global__ void __launch_bounds__(kSendRecvLinesThreads) send_recv_lines(SendRecvLinesLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]
  int block = static_cast<int>(blockIdx.x);
  for (int i = 0; i < launch.send_count; ++i) {
    if (block < launch.sends[i].blocks) return send_lines(launch, launch.sends[i], block);
    block -= launch.sends[i].blocks;
  }
  for (int i = 0; i < launch.recv_count; ++i) {
    if (block < launch.recvs[i].blocks) return receive_lines(launch, launch.recvs[i], block);
    block -= launch.recvs[i].blocks;
  }
}

}  // namespace

void launch_send_recv_lines(const SendRecvLinesLaunch& launch, cudaStream_t stream) {
  launch_dependent(send_recv_lines, launch.blocks, kSendRecvLinesThreads, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()
