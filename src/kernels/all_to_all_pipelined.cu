// All-to-all(v), pipelined: each direction of a pair of ranks is a FIFO stream (pipeline.cuh). Every pair
// exchanges at least one piece per block (round 0), each headed by the pair's total, by which the receiver lays
// out (device counts) or checks (host counts) its output. A refused total is still drained, so both sides count
// the same pieces and the FIFO counters stay in step.
#include "kernels/all_to_all_launch.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/kernels.hpp"
#include "kernels/pipeline.cuh"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

__device__ __forceinline__ bool has_bit(unsigned int mask, int bit) { return (mask >> bit) & 1u; }

// Worked out once per pair: 64-bit divisions are long.
struct PairGrid {
  size_t max_payload;
  __device__ void cut(uint64_t bytes, uint64_t& payload, uint64_t& rounds) const {
    payload = pair_piece_payload(bytes, gridDim.x, max_payload);
    const uint64_t pieces = PieceGrid<uint8_t>{bytes, payload, 1}.rounds();
    rounds = pieces > 0 ? pieces : 1;  // an empty pair still sends its header
  }
};

struct Sizes {
  uint64_t send_bytes[kMaxWorld], send_offset[kMaxWorld], send_payload[kMaxWorld], send_pair_rounds[kMaxWorld];
  uint64_t recv_bytes[kMaxWorld], recv_offset[kMaxWorld], recv_payload[kMaxWorld], recv_pair_rounds[kMaxWorld];
  uint64_t send_rounds, recv_rounds;  // most rounds of any pair this rank sends / receives
  unsigned int accepted;              // peers (and self) whose data goes into the output

  __device__ Slice send_slice(int q, uint64_t round) const {
    return PieceGrid<uint8_t>{send_bytes[q], send_payload[q], 1}.slice(round, 0);
  }
  __device__ Slice recv_slice(int q, uint64_t round) const {
    return PieceGrid<uint8_t>{recv_bytes[q], recv_payload[q], 1}.slice(round, 0);
  }
};

// The send sizes (device counts checked for sign) and, with host counts, the receive sizes.
__device__ void read_send_sizes(const AllToAllLaunch& launch, const PairGrid& grid, Sizes& sizes) {
  const int world = launch.fifo.pad.world, q = threadIdx.x;
  const bool device_counts = launch.device_send_counts != nullptr;
  if (q < world) {
    if (device_counts) {
      // Counts and displacements whose bytes 64 bits do not hold are refused as negative ones are.
      const uint64_t most = UINT64_MAX / launch.element_bytes;
      int64_t count = launch.device_send_counts[q];
      if (count < 0 || uint64_t(count) > most) {
        if (blockIdx.x == 0) device::record_data_error(launch.fifo.pad, device::kErrorNegativeCount, launch.fifo.collective, q, count, 0);
        count = 0;
      }
      sizes.send_bytes[q] = uint64_t(count) * launch.element_bytes;
      if (launch.device_send_displs != nullptr) {
        const int64_t displ = launch.device_send_displs[q];
        const bool refused = displ < 0 || uint64_t(displ) > most ||
                             uint64_t(displ) * launch.element_bytes > UINT64_MAX - sizes.send_bytes[q];
        sizes.send_offset[q] = refused ? 0 : uint64_t(displ) * launch.element_bytes;
        if (refused) {
          if (blockIdx.x == 0) device::record_data_error(launch.fifo.pad, device::kErrorNegativeDisplacement, launch.fifo.collective, q, displ, 0);
          sizes.send_bytes[q] = 0;
        }
      }
    } else {
      sizes.send_bytes[q] = launch.send_bytes[q];
      sizes.send_offset[q] = launch.send_offset[q];
      sizes.recv_bytes[q] = launch.recv_bytes[q];
      sizes.recv_offset[q] = launch.recv_offset[q];
    }
    grid.cut(sizes.send_bytes[q], sizes.send_payload[q], sizes.send_pair_rounds[q]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (device_counts && launch.device_send_displs == nullptr) {
      uint64_t offset = 0;
      for (int p = 0; p < world; ++p) {
        if (offset > UINT64_MAX - sizes.send_bytes[p]) {  // packed past 64 bits of bytes: refused as a count
          if (blockIdx.x == 0) {
            device::record_data_error(launch.fifo.pad, device::kErrorNegativeCount, launch.fifo.collective, p,
                                      static_cast<long long>(sizes.send_bytes[p] / launch.element_bytes), 0);
          }
          sizes.send_bytes[p] = 0;
          grid.cut(0, sizes.send_payload[p], sizes.send_pair_rounds[p]);
        }
        sizes.send_offset[p] = offset;
        offset += sizes.send_bytes[p];
      }
    }
    uint64_t rounds = 0;
    for (int p = 0; p < world; ++p) {
      if (p != launch.fifo.pad.rank && has_bit(launch.send_peers, p)) rounds = max(rounds, sizes.send_pair_rounds[p]);
    }
    sizes.send_rounds = rounds;
    sizes.recv_rounds = 1;  // until round 0's headers tell
    sizes.accepted = ~0u;
  }
  __syncthreads();
}

// After round 0's headers: receive sizes and rounds, and the layout (device counts) or check (host counts).
__device__ void read_headers(const AllToAllLaunch& launch, const PairGrid& grid, Sizes& sizes, const int* slots,
                             const WarpGroup& group) {
  const PipelineLaunch& fifo = launch.fifo;
  const int world = fifo.pad.world, rank = fifo.pad.rank, q = group.lane();
  const bool device_counts = launch.device_send_counts != nullptr;
  if (q < world && q != rank && !has_bit(launch.recv_peers, q)) {
    sizes.recv_bytes[q] = 0;
  } else if (q < world && q != rank) {
    const uint64_t sent = reinterpret_cast<const AllToAllHeader*>(fifo_piece(fifo, rank, 0, q, slots[q]))->pair_bytes;
    if (!device_counts && sent != sizes.recv_bytes[q]) {
      atomicAnd(&sizes.accepted, ~(1u << q));
      if (blockIdx.x == 0) {
        const unsigned int code = launch.mismatch_in_bytes ? device::kErrorSizeMismatch : device::kErrorCountMismatch;
        device::record_data_error(fifo.pad, code, fifo.collective, q, static_cast<long long>(sent / launch.element_bytes),
                                  static_cast<long long>(sizes.recv_bytes[q] / launch.element_bytes));
      }
    }
    sizes.recv_bytes[q] = sent;  // the pair's rounds follow it, accepted or not
  }
  if (q < world && q != rank) grid.cut(sizes.recv_bytes[q], sizes.recv_payload[q], sizes.recv_pair_rounds[q]);
  group.sync();
  if (q == 0) {
    if (device_counts) {
      sizes.recv_bytes[rank] = sizes.send_bytes[rank];
      uint64_t offset = 0;  // saturated: a total past 64 bits is past any capacity
      for (int p = 0; p < world; ++p) {
        sizes.recv_offset[p] = offset;
        offset = offset > UINT64_MAX - sizes.recv_bytes[p] ? UINT64_MAX : offset + sizes.recv_bytes[p];
      }
      if (offset > launch.recv_capacity) {
        sizes.accepted = 0;
        if (blockIdx.x == 0) {
          device::record_data_error(fifo.pad, device::kErrorOverflow, fifo.collective, -1,
                                    static_cast<long long>(offset / launch.element_bytes),
                                    static_cast<long long>(launch.recv_capacity / launch.element_bytes));
        }
      }
    }
    uint64_t rounds = 1;
    for (int p = 0; p < world; ++p) {
      if (p != rank) rounds = max(rounds, sizes.recv_pair_rounds[p]);
    }
    sizes.recv_rounds = rounds;
  }
  group.sync();
  if (device_counts && blockIdx.x == 0 && q < world) {
    launch.device_recv_counts[q] = static_cast<int64_t>(sizes.recv_bytes[q] / launch.element_bytes);
    if (launch.device_recv_displs != nullptr) {
      launch.device_recv_displs[q] = static_cast<int64_t>(sizes.recv_offset[q] / launch.element_bytes);
    }
  }
}

__global__ void __launch_bounds__(kThreadsPerBlock) all_to_all_pipelined(AllToAllLaunch launch) {
  start_dependent_kernel();
  if (device::rank_stopped(launch.fifo.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const PipelineLaunch& fifo = launch.fifo;
  const int world = fifo.pad.world, rank = fifo.pad.rank;
  __shared__ Sizes sizes;
  __shared__ int push_slot[kMaxWorld], pull_slot[kMaxWorld];
  // In place: rounds whose input this block's pushers have read; the copy group overwrites a round only after it
  // (a round is the same slice on both sides: uniform sizes). kPushStopped: the pushers stopped at a failed wait.
  constexpr uint64_t kAllPushed = ~uint64_t(0) - 1, kPushStopped = ~uint64_t(0);
  __shared__ uint64_t pushed_rounds;
  if (threadIdx.x == 0) pushed_rounds = 0;  // read_send_sizes' barriers publish it
  const PairGrid grid{fifo.piece_bytes - kAllToAllHeaderBytes};
  read_send_sizes(launch, grid, sizes);

  // Two warp groups from here on (push, copy out), meeting only through the FIFO counters.
  const WarpGroup group = WarpGroup::half_of_block(kPushThreads);
  const bool pusher = group.id == 0;

  // Peers of `named` with a piece in `round` (all in round 0).
  auto active = [&](unsigned int named, const uint64_t* pair_rounds, uint64_t round) {
    unsigned int peers = 0;
    for (int p = 0; p < world; ++p) {
      if (p != rank && has_bit(named, p) && (round == 0 || round < pair_rounds[p])) peers |= 1u << p;
    }
    return peers;
  };

  auto push = [&](uint64_t round) {
    const unsigned int peers = active(launch.send_peers, sizes.send_pair_rounds, round);
    if (!wait_peers(fifo, kFree1, kSiteFifoCredit, push_slot, peers, group)) return false;
    for (int step = 1; step < world; ++step) {
      const int q = (rank + step) % world;  // rotated
      if (!has_bit(peers, q)) continue;
      char* piece = fifo_piece(fifo, q, 0, rank, push_slot[q]);
      if (group.lane() == 0) *reinterpret_cast<AllToAllHeader*>(piece) = AllToAllHeader{sizes.send_bytes[q], 0};
      const Slice part = sizes.send_slice(q, round);
      group.copy(piece + kAllToAllHeaderBytes, fifo.send + sizes.send_offset[q] + part.begin, part.end - part.begin);
    }
    post_peers(fifo, kData1, peers, group);
    return true;
  };

  // Published once the whole push group read the round (post_peers' barrier). The wait is bounded: the pushers
  // advance or stop within their bounded waits.
  auto publish_pushed = [&](uint64_t rounds) {
    if (!launch.in_place || group.lane() != 0) return;
    __threadfence_block();
    *reinterpret_cast<volatile uint64_t*>(&pushed_rounds) = rounds;
  };
  auto input_read = [&](uint64_t round) {
    if (!launch.in_place) return true;
    uint64_t seen;
    while ((seen = *reinterpret_cast<volatile uint64_t*>(&pushed_rounds)) <= round) {
    }
    __threadfence_block();
    return seen != kPushStopped;
  };

  auto pull = [&](uint64_t round) {
    const unsigned int peers = active(launch.recv_peers, sizes.recv_pair_rounds, round);
    if (!wait_peers(fifo, kData1, kSiteFifoData, pull_slot, peers, group)) return false;
    if (round == 0) read_headers(launch, grid, sizes, pull_slot, group);
    if (!input_read(round)) return false;
    for (int step = 1; step < world; ++step) {
      const int q = (rank - step + world) % world;
      if (!has_bit(peers, q) || !has_bit(sizes.accepted, q)) continue;
      const Slice part = sizes.recv_slice(q, round);
      group.copy(fifo.recv + sizes.recv_offset[q] + part.begin,
                 fifo_piece(fifo, rank, 0, q, pull_slot[q]) + kAllToAllHeaderBytes, part.end - part.begin);
    }
    post_peers(fifo, kFree1, peers, group);
    return true;
  };

  // The own block, in as many parts as send rounds, each filling a round's wait. With device counts its place is
  // known only from round 0's headers: that part follows round 0's pull.
  const uint64_t own_rounds = sizes.send_rounds > 0 ? sizes.send_rounds : 1;
  const uint64_t own_bytes = sizes.send_bytes[rank];
  const uint64_t own_part = ((own_bytes + own_rounds - 1) / own_rounds + 15) / 16 * 16;
  auto copy_own = [&](uint64_t round) {
    if (!has_bit(sizes.accepted, rank)) return;
    const uint64_t begin = min(own_bytes, round * own_part), end = min(own_bytes, begin + own_part);
    const Slice part = block_slice<uint8_t>(end - begin, blockIdx.x, gridDim.x);
    group.copy(fifo.recv + sizes.recv_offset[rank] + begin + part.begin,
               fifo.send + sizes.send_offset[rank] + begin + part.begin, part.end - part.begin);
  };

  if (pusher) {
    for (uint64_t round = 0; round < max(sizes.send_rounds, uint64_t(1)); ++round) {
      if (!push(round)) {  // round 0 carries the header, even with nothing to send
        publish_pushed(kPushStopped);
        return;
      }
      publish_pushed(round + 1);
    }
    publish_pushed(kAllPushed);
  } else {
    const bool own_place_known = launch.device_send_counts == nullptr;
    for (uint64_t round = 0; round < sizes.recv_rounds || round < own_rounds; ++round) {
      const bool own_first = round < own_rounds && (round > 0 || own_place_known);
      if (own_first) copy_own(round);
      if (round < sizes.recv_rounds && !pull(round)) return;  // set by round 0's headers
      if (round < own_rounds && !own_first) copy_own(round);
    }
  }
}

}  // namespace

void launch_all_to_all_pipelined(const AllToAllLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(all_to_all_pipelined, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()
