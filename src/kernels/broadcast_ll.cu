// Broadcast, low latency (LL): no barrier and no signal. The root stores its input into every peer's LL area as
// flag-in-data lines (ll.cuh), the flag being this LL call's sequence number, and every other rank polls its
// own area until the root's lines carry the flag and copies them into its output.
//
// Every rank, the root too, also stores its plan line into every peer's area and waits for every peer's (ll.cuh,
// NOTE [plan lines]). LL reuses a parity only because every LL call receives from every peer (reduce_ll.cu): a
// rank that finished call k+1 knows every peer began it, so finished call k and no longer reads the parity call
// k+2 rewrites. A root that only sent could run two calls ahead of a peer still reading its lines, and a
// non-root that heard only from the root could overwrite what another non-root still reads.
//
// launch.count: bytes (datatype-blind); launch.root: the root; launch.send: the root's input (null elsewhere).
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
  send_plan_lines(launch, call.parity, call.flag);  // every rank, the root too: what every peer receives of it
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
  bool arrived = true;  // false once a poll timed out (recorded): this thread stops, the block still finishes
  if (rank != root) {
    for (size_t i = first; arrived && i < lines; i += stride) {
      const size_t offset = i * kLLLineBytes;
      const char* wire = ll_slot(launch, call, rank, root) + i * kLLWireBytes;
      uint2 line;
      arrived = device::spin_until(launch.pad, [&] { return plan.poll(wire, call.flag, &line); }, launch.collective,
                                   kSiteLLData, root, blockIdx.x, ll_plan_check(launch));
      if (arrived) store_line(launch.recv + offset, line, bytes - offset);
    }
  }
  if (arrived) check_plan_line(launch, plan, call.flag);  // NOTE [plan lines]
  // The root sent `lines` lines, every other rank its plan line alone.
  restamp_unwritten_lines(launch, call, [&](int sender) { return sender == root ? lines : size_t(0); });
}

}  // namespace

void launch_broadcast_ll(const LLLaunch& launch, int blocks, cudaStream_t stream) {
  launch_dependent(broadcast_ll, blocks, kThreadsPerBlock, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()
