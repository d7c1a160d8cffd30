// Copy-engine send/recv, device side (send_recv_bulk_launch.hpp): the step kernels and the SM copy-out.
#include "kernels/dependent_launch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/collective_id.hpp"
#include "kernels/send_recv_bulk_launch.hpp"
#include "core/kernel_modules.hpp"
#include "sync/device_sync.hpp"

namespace braid::kernels {
namespace {

// Whether `peer` consumed every phase-1 FIFO piece this rank sent it (all credits back). Consumes nothing.
__device__ bool fifo_drained(const device::SignalPad& pad, unsigned int collective, int channel, int peer) {
  const uint64_t* slot = pad.local + channel * pad.world + peer;
  const uint64_t all_back = pad.expected[channel * pad.world + peer] + kFifoDepth;
  return device::spin_until(pad, [&] { return device::reached(device::load_acquire_system(slot), all_back); },
                            collective, kSiteFifoCredit, peer, channel);
}

__global__ void bulk_send_step(BulkSendStep step) {
  start_dependent_kernel();
  if (device::rank_stopped(step.pad)) return;  // NOTE [stopped ranks]
  if (step.drain) {  // thread t: channel t % kPipelineChannels of phase t / kPipelineChannels
    const int set = threadIdx.x < kPipelineChannels ? kFree1 : kFree2;
    fifo_drained(step.pad, step.collective, set * kPipelineChannels + threadIdx.x % kPipelineChannels, step.peer);
    return;  // a failed wait is recorded: the later steps fail at once
  }
  if (threadIdx.x != 0) return;
  if (step.post_chunk >= 0) {
    if (step.header != nullptr) *step.header = BulkHeader{step.total_bytes, static_cast<uint64_t>(step.post_chunk)};
    // Its release covers the header; the engine's copy ended before this kernel started.
    device::signal(step.pad, kBulkDataChannels + step.post_slot, step.peer);
  }
  if (step.wait_slot >= 0) {
    device::wait(step.pad, kBulkFreeChannels + step.wait_slot, step.peer, step.collective, kSiteFifoCredit, nullptr,
                 device::PlanCheck{step.plan, 0});
  }
}

__global__ void bulk_recv_step(BulkRecvStep step) {  // one thread
  start_dependent_kernel();
  if (device::rank_stopped(step.pad)) return;  // NOTE [stopped ranks]
  if (step.free_slot >= 0) device::signal(step.pad, kBulkFreeChannels + step.free_slot, step.peer);
  if (step.wait_chunk < 0) return;
  const int slot = static_cast<int>(step.wait_chunk % kBulkSlots);
  if (!device::wait(step.pad, kBulkDataChannels + slot, step.peer, step.collective, kSiteFifoData, nullptr,
                    device::PlanCheck{step.plan, 0})) {
    return;
  }
  if (step.header == nullptr) return;  // the count alone
  const volatile BulkHeader* arrived = step.header;
  const BulkHeader header{arrived->total_bytes, arrived->chunk};
  if (header.total_bytes != step.total_bytes || header.chunk != static_cast<uint64_t>(step.wait_chunk)) {
    device::record_data_error(step.pad, device::kErrorSizeMismatch, step.collective, step.peer,
                              static_cast<long long>(header.total_bytes), static_cast<long long>(step.total_bytes));
  }
}

// Unit u copies part u % kBulkCopyBlocksPerRow of row u / kBulkCopyBlocksPerRow.
__global__ void __launch_bounds__(kThreadsPerBlock) bulk_copy_out(BulkCopyOut copy) {
  start_dependent_kernel();
  const BulkHeader header = *copy.header;  // awaited by the step kernel before
  if (header.total_bytes != copy.total_bytes || header.chunk != copy.chunk) return;  // refused: nothing written
  for (int unit = blockIdx.x; unit < kBulkRowsPerSlot * kBulkCopyBlocksPerRow; unit += gridDim.x) {
    const size_t row = unit / kBulkCopyBlocksPerRow;
    const int part = unit % kBulkCopyBlocksPerRow;
    const size_t first = row * copy.layout.row_bytes;
    if (first >= copy.bytes) break;
    const size_t end = min(first + copy.layout.row_bytes, copy.bytes);
    const Slice slice = block_slice<uint8_t>(end - first, part, kBulkCopyBlocksPerRow);
    block_copy(copy.recv + first + slice.begin, copy.slot + row * copy.layout.row_pitch + slice.begin,
               slice.end - slice.begin);
  }
}

}  // namespace

void launch_bulk_send_step(const BulkSendStep& step, cudaStream_t stream) {
  launch_dependent(bulk_send_step, 1, 2 * kPipelineChannels, stream, step);
}

void launch_fifo_drain(const device::SignalPad& pad, unsigned int collective, int peer, uint64_t plan,
                       cudaStream_t stream) {
  BulkSendStep drain{};
  drain.pad = pad;
  drain.collective = collective;
  drain.peer = peer;
  drain.drain = true;
  drain.post_chunk = -1;
  drain.wait_slot = -1;
  drain.plan = plan;
  launch_bulk_send_step(drain, stream);
}

void launch_bulk_recv_step(const BulkRecvStep& step, cudaStream_t stream) { launch_dependent(bulk_recv_step, 1, 1, stream, step); }

void launch_bulk_copy_out(const BulkCopyOut& copy, int blocks, cudaStream_t stream) {
  launch_dependent(bulk_copy_out, blocks, kThreadsPerBlock, stream, copy);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()
