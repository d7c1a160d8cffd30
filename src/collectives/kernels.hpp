// Launchers of the collective kernels (one .cu file per algorithm). Each enqueues one launch on `stream`
// for one chunk that fits the staging half; collectives.cpp splits user calls into chunks.
#pragma once

#include <cuda_runtime_api.h>

#include "braid/types.hpp"

namespace braid::kernels {

struct StagedLaunch;

void launch_all_reduce_one_shot(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_reduce_two_shot(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_reduce(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_reduce_scatter(DataType type, ReduceOp op, const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_all_gather(size_t element_bytes, const StagedLaunch& launch, int blocks, cudaStream_t stream);
void launch_broadcast(size_t element_bytes, const StagedLaunch& launch, int blocks, cudaStream_t stream);

constexpr int kThreadsPerBlock = 512;

}  // namespace braid::kernels
