// Launchers of the collective kernels (one .cu file per algorithm). Each enqueues one launch on `stream`.
// Staged and LL launches carry one chunk that fits their buffer (collectives.cpp splits user calls); pipelined
// launches carry the whole call.
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

// LL reduction: all-reduce (launch.send_rank_stride 0), reduce (and launch.root) and reduce-scatter
// (reduce_ll.cu).
void launch_reduce_ll(DataType type, ReduceOp op, const LLLaunch& launch, int blocks, cudaStream_t stream);
// LL128 all-reduce (all_reduce_ll128.cu): LLLaunch over the LL128 area (ll128_launch.hpp).
void launch_all_reduce_ll128(DataType type, ReduceOp op, const LLLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_reduce_one_shot(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_reduce_two_shot(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_reduce_two_shot_zero_copy(DataType type, ReduceOp op, const ZeroCopyLaunch& launch, int blocks,
                                          cudaStream_t stream);
void launch_reduce(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
// Reduce and broadcast staged in two phases, one part per rank (Algorithm::kSplit; reduce.cu, broadcast.cu).
void launch_reduce_split(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
// Reduce as the pipelined two shot whose gather goes to launch.root alone (all_reduce_two_shot.cu): partial
// results never leave float32 for half, bfloat16 and fp8, so they round once.
void launch_reduce_two_shot(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream);
// Reduce on two ranks as pushes of the other rank's whole input into the root's FIFOs, reduced there
// (reduce_pushed.cu).
void launch_reduce_pushed(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream);
// Reduce pipelined along a chain of the ranks that ends at the root, each adding its input (reduce_chain.cu):
// three ranks or more.
void launch_reduce_chain(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream);
void launch_reduce_scatter(DataType type, ReduceOp op, const PipelineLaunch& launch, int blocks, cudaStream_t stream);
void launch_reduce_scatter_staged(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_reduce_scatter_zero_copy(DataType type, ReduceOp op, const ZeroCopyLaunch& launch, int blocks,
                                     cudaStream_t stream);
void launch_all_gather(const PipelineLaunch& launch, int blocks, cudaStream_t stream);
// Broadcast as the pipelined all-gather with the root alone pushing (all_gather.cu): two ranks.
void launch_broadcast_pipelined(const PipelineLaunch& launch, int blocks, cudaStream_t stream);
// Broadcast pipelined along a chain of the ranks from the root (broadcast_chain.cu): three ranks or more.
void launch_broadcast_chain(const PipelineLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_gather_staged(const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_gather_zero_copy(const ZeroCopyLaunch& launch, int blocks, cudaStream_t stream);
void launch_broadcast(const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_broadcast_split(const StagedLaunch& launch, int blocks, cudaStream_t stream);
// LL broadcast: the root's input to every peer as LL lines, tokens between the other ranks (broadcast_ll.cu).
void launch_broadcast_ll(const LLLaunch& launch, int blocks, cudaStream_t stream);
// LL blocks, one from every rank to every rank: all-to-all and all-gather (blocks_ll.cu).
void launch_blocks_ll(const LLLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_to_all_pipelined(const AllToAllLaunch& launch, int blocks, cudaStream_t stream);
// Stores into every peer's recv, or loads from every peer's send (AllToAllDirectLaunch::loads), between barriers.
void launch_all_to_all_direct(const AllToAllDirectLaunch& launch, int blocks, cudaStream_t stream);
// Copy-engine send/recv (send_recv_bulk.cu; send_recv_bulk_launch.hpp): the sender's and the receiver's kernels
// between chunks, and the receiver's copy of a chunk out of its slot, or reduction with its own block
// (reduce-scatter, reduce: send_recv_bulk_reduce.cu).
void launch_bulk_send_step(const BulkSendStep& step, cudaStream_t stream);
void launch_bulk_recv_step(const BulkRecvStep& step, cudaStream_t stream);
void launch_bulk_copy_out(const BulkCopyOut& copy, int blocks, cudaStream_t stream);
void launch_bulk_reduce_out(DataType type, ReduceOp op, const BulkReduceOut& reduce, int blocks, cudaStream_t stream);
// A copy on this GPU's own memory, no peer involved, beside copy engines (local_kernels.cu).
void launch_copy_local(void* destination, const void* source, size_t bytes, int blocks, cudaStream_t stream);
// NVLink multicast, behind BRAID_ENABLE_MULTICAST (all_reduce_multicast.cu, reduce_multicast.cu,
// all_gather_multicast.cu); the (type, op) pairs multicast_serves admits.
void launch_all_reduce_multicast(DataType type, ReduceOp op, const MulticastLaunch& launch, int blocks,
                                 cudaStream_t stream);
void launch_reduce_multicast(DataType type, ReduceOp op, const MulticastLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_gather_multicast(const MulticastLaunch& launch, int blocks, cudaStream_t stream);
// One block that passes a barrier with every peer on signal channel 0 (orders copy-engine work), announcing
// `plan` (collectives/plan.hpp).
void launch_barrier(const device::SignalPad& pad, unsigned int collective, unsigned int site, uint64_t plan,
                    cudaStream_t stream);

constexpr int kThreadsPerBlock = 512;

}  // namespace braid::kernels
