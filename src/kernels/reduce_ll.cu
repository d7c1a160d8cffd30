// All-reduce, reduce and reduce-scatter in LL lines (ll.cuh): each rank stores into every peer's LL area the
// block that peer reduces, then polls its own.
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/ll.cuh"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_ll(LLLaunch launch) {
  static_assert(kLLLineBytes % sizeof(T) == 0, "a line holds whole elements");
  constexpr int kPerLine = kLLLineBytes / sizeof(T);
  start_dependent_kernel();
  const int world = launch.pad.world, rank = launch.pad.rank;
  const size_t bytes = launch.count * sizeof(T), lines = (bytes + kLLLineBytes - 1) / kLLLineBytes;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  const bool one_block = launch.send_rank_stride == 0;
  // Every rank receives every line, as the two-parity argument needs.
  const bool stores = launch.root < 0 || launch.root == rank;
  const char* own = launch.send + rank * launch.send_rank_stride;
  // Loaded before the flag is read, so the two round trips overlap.
  const uint2 first_line = first < lines ? load_line(own + first * kLLLineBytes, bytes - first * kLLLineBytes)
                                         : make_uint2(0, 0);
  const LLCall call = ll_call(launch);
  if (call.stopped) return;  // NOTE [stopped ranks]
  const uint32_t flag = call.flag;
  auto slot = [&](int receiver, int sender) { return ll_slot(launch, call, receiver, sender); };
  send_plan_lines(launch, call.parity, flag);
  PlanLineHold plan = plan_line_hold(launch, call.parity);

  for (size_t i = first; i < lines; i += stride) {
    const size_t offset = i * kLLLineBytes, left = bytes - offset;
    uint2 line = make_uint2(0, 0);
    if (one_block) line = i == first ? first_line : load_line(own + offset, left);
    for (int p = 1; p < world; ++p) {
      const int peer = (rank + p) % world;
      if (!one_block) line = load_line(launch.send + peer * launch.send_rank_stride + offset, left);
      store_wire(slot(peer, rank) + i * kLLWireBytes, line, flag);
    }
  }
  count_ll_call(launch, call);
  bool arrived = true;  // false once a poll timed out (recorded)
  for (size_t i = first; arrived && i < lines; i += stride) {
    acc_t<T> acc[kPerLine];
    for (int r = 0; arrived && r < world; ++r) {
      uint2 line;
      if (r == rank) {
        line = i == first ? first_line : load_line(own + i * kLLLineBytes, bytes - i * kLLLineBytes);
      } else {
        const char* wire = slot(rank, r) + i * kLLWireBytes;
        arrived = device::spin_until(launch.pad, [&] { return plan.poll(wire, flag, &line); }, launch.collective,
                                     kSiteLLData, r, blockIdx.x, ll_plan_check(launch), ll_progress(wire, flag));
        if (!arrived) break;
      }
      const T* values = reinterpret_cast<const T*>(&line);
#pragma unroll
      for (int e = 0; e < kPerLine; ++e) acc[e] = r == 0 ? to_acc(values[e]) : combine<Op>(acc[e], to_acc(values[e]));
    }
    if (!arrived) break;
    alignas(8) T out[kPerLine];
#pragma unroll
    for (int e = 0; e < kPerLine; ++e) out[e] = from_acc<T>(finish<Op>(acc[e], world));
    if (stores) {
      store_line(launch.recv + i * kLLLineBytes, *reinterpret_cast<const uint2*>(out), bytes - i * kLLLineBytes);
    }
  }
  if (arrived) check_plan_line(launch, plan, flag);  // NOTE [plan lines]
  restamp_unwritten_lines(launch, call, [&](int) { return lines; });  // every peer sent `lines` lines
}

}  // namespace

void launch_reduce_ll(DataType type, ReduceOp op, const LLLaunch& launch, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(reduce_ll, type, op, blocks, stream, launch);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()
