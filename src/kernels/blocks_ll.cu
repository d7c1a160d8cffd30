// All-to-all and all-gather, low latency (LL): no barrier and no signal. Every rank stores its block for rank q
// (all-to-all: block q of its input, launch.send_rank_stride apart; all-gather: its input, stride 0) into q's LL
// area as flag-in-data lines (ll.cuh), the flag being this LL call's sequence number, then polls its own area
// until every peer's lines carry the flag and copies them into its output (sender r's block at r ×
// launch.recv_rank_stride). One NVLink crossing of latency; the algorithm for small uniform blocks. Parity
// reuse is all-reduce LL's argument (reduce_ll.cu): every LL call receives from every peer, so a rank
// rewrites parity p only after every peer finished reading it.
//
// launch.count: bytes of one block (each rank sends one to every rank).
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/ll.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) blocks_ll(LLLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank;
  const LLCall call = ll_call(launch);
  if (call.stopped) return;  // NOTE [stopped ranks]
  const size_t bytes = launch.count, lines = (bytes + kLLLineBytes - 1) / kLLLineBytes;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  send_plan_lines(launch, call.parity, call.flag);
  PlanLineHold plan = plan_line_hold(launch, call.parity);
  for (size_t i = first; i < lines; i += stride) {
    const size_t offset = i * kLLLineBytes, left = bytes - offset;
    for (int p = 1; p < world; ++p) {
      const int q = (rank + p) % world;  // a different first receiver on every rank
      store_wire(ll_slot(launch, call, q, rank) + i * kLLWireBytes,
                 load_line(launch.send + q * launch.send_rank_stride + offset, left), call.flag);
    }
    store_line(launch.recv + rank * launch.recv_rank_stride + offset,
               load_line(launch.send + rank * launch.send_rank_stride + offset, left), left);
  }
  count_ll_call(launch, call);
  bool arrived = true;  // false once a poll timed out (recorded): this thread stops, the block still finishes
  for (size_t i = first; arrived && i < lines; i += stride) {
    const size_t offset = i * kLLLineBytes, left = bytes - offset;
    for (int p = 1; arrived && p < world; ++p) {
      const int r = (rank - p + world) % world;
      const char* wire = ll_slot(launch, call, rank, r) + i * kLLWireBytes;
      uint2 line;
      arrived = device::spin_until(launch.pad, [&] { return plan.poll(wire, call.flag, &line); }, launch.collective,
                                   kSiteLLData, r, blockIdx.x, ll_plan_check(launch));
      if (arrived) store_line(launch.recv + r * launch.recv_rank_stride + offset, line, left);
    }
  }
  if (arrived) check_plan_line(launch, plan, call.flag);  // NOTE [plan lines]
  restamp_unwritten_lines(launch, call, [&](int) { return lines; });  // every peer sent `lines` lines
}

}  // namespace

void launch_blocks_ll(const LLLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(blocks_ll, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()
