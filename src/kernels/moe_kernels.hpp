// Launchers of the MoE kernels; each enqueues its launches on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include "braid/types.hpp"
#include "kernels/moe_launch.hpp"

namespace braid::kernels::moe {

constexpr int kReduceBlocks = 264;

void launch_dispatch(const MoeLaunch& launch, DataType index_type, cudaStream_t stream);
void launch_combine(const MoeLaunch& launch, DataType type, cudaStream_t stream);
// Rank-major (moe_rank_major.cu): one launch each.
void launch_rank_dispatch(const MoeLaunch& launch, DataType index_type, cudaStream_t stream);
void launch_rank_combine(const MoeLaunch& launch, DataType type, cudaStream_t stream);
// Fixed rows in LL128 lines (moe_lines.cu; slot_lines != 0): one launch.
void launch_line_dispatch(const MoeLaunch& launch, DataType index_type, cudaStream_t stream);

}  // namespace braid::kernels::moe
