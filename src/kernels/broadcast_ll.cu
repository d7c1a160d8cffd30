// Broadcast, LL (ll.cuh): the root stores its input into every peer's LL area; the others poll for it. Every rank
// exchanges plan lines with every peer (NOTE [plan lines]). launch.count: bytes; launch.send: null but at root.
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/ll.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) broadcast_ll(LLLaunch launch) {
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank, root = launch.root;
  const LLCall call = ll_call(launch);
  if (call.stopped) return;  // NOTE [stopped ranks]
  const size_t bytes = launch.count, lines = (bytes + kLLLineBytes - 1) / kLLLineBytes;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  send_plan_lines(launch, call.parity, call.flag);
  PlanLineHold plan = plan_line_hold(launch, call.parity);
  if (rank == root) {
    for (size_t i = first; i < lines; i += stride) {
      const size_t offset = i * kLLLineBytes, left = bytes - offset;
      const uint2 line = load_line(launch.send + offset, left);
      for (int p = 1; p < world; ++p) {
        const int q = (rank + p) % world;
        store_wire(ll_slot(launch, call, q, rank) + i * kLLWireBytes, line, call.flag);
      }
      if (launch.recv != launch.send) store_line(launch.recv + offset, line, left);
    }
  }
  count_ll_call(launch, call);
  bool arrived = true;  // false: a poll failed (recorded); the block still finishes
  if (rank != root) {
    for (size_t i = first; arrived && i < lines; i += stride) {
      const size_t offset = i * kLLLineBytes;
      const char* wire = ll_slot(launch, call, rank, root) + i * kLLWireBytes;
      uint2 line;
      arrived = device::spin_until(launch.pad, [&] { return plan.poll(wire, call.flag, &line); }, launch.collective,
                                   kSiteLLData, root, blockIdx.x, ll_plan_check(launch),
                                   ll_progress(wire, call.flag));
      if (arrived) store_line(launch.recv + offset, line, bytes - offset);
    }
  }
  if (arrived) check_plan_line(launch, plan, call.flag);  // NOTE [plan lines]
  restamp_unwritten_lines(launch, call, [&](int sender) { return sender == root ? lines : size_t(0); });
}

}  // namespace

void launch_broadcast_ll(const LLLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(broadcast_ll, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()
