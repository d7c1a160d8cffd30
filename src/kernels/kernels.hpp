// Launchers of the collective kernels. Staged and LL launches carry one chunk, pipelined ones the whole call.
#pragma once

#include <cuda_runtime_api.h>

#include "braid/device/sync_device.hpp"
#include "braid/types.hpp"

namespace braid::kernels {

struct StagedLaunch;
struct PipelineLaunch;
struct LLLaunch;
struct ZeroCopyLaunch;
struct AllToAllLaunch;
struct AllToAllDirectLaunch;
struct MulticastLaunch;
struct BulkSendStep;
struct BulkRecvStep;
struct BulkCopyOut;
struct BulkReduceOut;

// All-reduce (send_rank_stride 0), reduce (root >= 0) and reduce-scatter.
void launch_reduce_ll(DataType type, ReduceOp op, const LLLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_reduce_ll128(DataType type, ReduceOp op, const LLLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_reduce_one_shot(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_reduce_two_shot(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_reduce_two_shot_zero_copy(DataType type, ReduceOp op, const ZeroCopyLaunch& launch, int blocks,
                                          cudaStream_t stream);
void launch_reduce(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
// Staged in two phases, one part per rank (Algorithm::kSplit).
void launch_reduce_split(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_reduce_two_shot(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream);
// Two ranks: pushes into the root's FIFOs.
void launch_reduce_pushed(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream);
// Three ranks or more.
void launch_reduce_chain(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream);
void launch_reduce_scatter(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream);
void launch_reduce_scatter_staged(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_reduce_scatter_zero_copy(DataType type, ReduceOp op, const ZeroCopyLaunch& launch, int blocks,
                                     cudaStream_t stream);
void launch_all_gather(const PipelineLaunch& launch, int blocks, cudaStream_t stream);
// Two ranks.
void launch_broadcast_pipelined(const PipelineLaunch& launch, int blocks, cudaStream_t stream);
// Three ranks or more.
void launch_broadcast_chain(const PipelineLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_gather_staged(const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_gather_zero_copy(const ZeroCopyLaunch& launch, int blocks, cudaStream_t stream);
void launch_broadcast(const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_broadcast_split(const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_broadcast_ll(const LLLaunch& launch, int blocks, cudaStream_t stream);
// LL all-to-all and all-gather.
void launch_blocks_ll(const LLLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_to_all_pipelined(const AllToAllLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_to_all_direct(const AllToAllDirectLaunch& launch, int blocks, cudaStream_t stream);
// Copy-engine send/recv: the kernels between chunks, and the receiver's copy-out or reduction.
void launch_bulk_send_step(const BulkSendStep& step, cudaStream_t stream);
// Waits until `peer` has consumed every phase-1 FIFO piece this rank sent it, before anything is copied into its area.
void launch_fifo_drain(const device::SignalPad& pad, unsigned int collective, int peer, uint64_t plan,
                       cudaStream_t stream);
void launch_bulk_recv_step(const BulkRecvStep& step, cudaStream_t stream);
void launch_bulk_copy_out(const BulkCopyOut& copy, int blocks, cudaStream_t stream);
void launch_bulk_reduce_out(DataType type, ReduceOp op, const BulkReduceOut& reduce, int blocks, cudaStream_t stream);
// A copy within this GPU's memory.
void launch_copy_local(void* destination, const void* source, size_t bytes, int blocks, cudaStream_t stream);
// For the (type, op) pairs multicast_serves admits.
void launch_all_reduce_multicast(DataType type, ReduceOp op, const MulticastLaunch& launch, int blocks,
                                 cudaStream_t stream);
void launch_reduce_multicast(DataType type, ReduceOp op, const MulticastLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_gather_multicast(const MulticastLaunch& launch, int blocks, cudaStream_t stream);
// One block: a barrier with every peer on signal channel 0 (orders copy-engine work).
void launch_barrier(const device::SignalPad& pad, unsigned int collective, unsigned int site, uint64_t plan,
                    cudaStream_t stream);

constexpr int kThreadsPerBlock = 512;

}  // namespace braid::kernels
