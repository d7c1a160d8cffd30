// All-to-all and all-gather, LL (ll.cuh): every rank stores its block for rank q (all-gather: send_rank_stride
// 0) into q's LL area, then polls its own for every peer's. launch.count: bytes of one block.
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
      const int q = (rank + p) % world;  // rotated
      store_wire(ll_slot(launch, call, q, rank) + i * kLLWireBytes,
                 load_line(launch.send + q * launch.send_rank_stride + offset, left), call.flag);
    }
    store_line(launch.recv + rank * launch.recv_rank_stride + offset,
               load_line(launch.send + rank * launch.send_rank_stride + offset, left), left);
  }
  count_ll_call(launch, call);
  bool arrived = true;  // false: a poll failed (recorded); the block still finishes
  for (size_t i = first; arrived && i < lines; i += stride) {
    const size_t offset = i * kLLLineBytes, left = bytes - offset;
    for (int p = 1; arrived && p < world; ++p) {
      const int r = (rank - p + world) % world;
      const char* wire = ll_slot(launch, call, rank, r) + i * kLLWireBytes;
      uint2 line;
      arrived = device::spin_until(launch.pad, [&] { return plan.poll(wire, call.flag, &line); }, launch.collective,
                                   kSiteLLData, r, blockIdx.x, ll_plan_check(launch), ll_progress(wire, call.flag));
      if (arrived) store_line(launch.recv + r * launch.recv_rank_stride + offset, line, left);
    }
  }
  if (arrived) check_plan_line(launch, plan, call.flag);  // NOTE [plan lines]
  restamp_unwritten_lines(launch, call, [&](int) { return lines; });
}

}  // namespace

void launch_blocks_ll(const LLLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(blocks_ll, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()
