// The receiver of reduce-scatter's and reduce's copy-engine pairs: each chunk plus this rank's input into the output.
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/kernels.hpp"
#include "kernels/send_recv_bulk_launch.hpp"
#include "core/kernel_modules.hpp"

namespace braid::kernels {
namespace {

// Unit u reduces what bulk_copy_out would copy; vectors where input and output are aligned.
template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreadsPerBlock) bulk_reduce_out(BulkReduceOut reduce) {
  start_dependent_kernel();
  const BulkHeader header = *reduce.header;  // awaited by the step kernel before
  if (header.total_bytes != reduce.total_bytes || header.chunk != reduce.chunk) return;  // refused: nothing written
  const bool vectors = ((reinterpret_cast<uintptr_t>(reduce.own) | reinterpret_cast<uintptr_t>(reduce.recv)) &
                        (kVectorBytes - 1)) == 0;
  for (int unit = blockIdx.x; unit < kBulkRowsPerSlot * kBulkCopyBlocksPerRow; unit += gridDim.x) {
    const size_t row = unit / kBulkCopyBlocksPerRow;
    const int part = unit % kBulkCopyBlocksPerRow;
    const size_t first = row * reduce.layout.row_bytes;
    if (first >= reduce.bytes) break;
    const size_t elements = (min(first + reduce.layout.row_bytes, reduce.bytes) - first) / sizeof(T);
    const Slice slice = block_slice<T>(elements, part, kBulkCopyBlocksPerRow);
    const char* sources[2] = {reduce.own + first, reduce.slot + row * reduce.layout.row_pitch};
    char* destination = reduce.recv + first;
    if (vectors) {
      block_reduce<T, Op>(sources, 2, &destination, 1, slice, 0, 0, reduce.world);
      continue;
    }
    for (size_t e = slice.begin + threadIdx.x; e < slice.end; e += blockDim.x) {
      const acc_t<T> own = to_acc(reinterpret_cast<const T*>(sources[0])[e]);
      const acc_t<T> peer = to_acc(reinterpret_cast<const T*>(sources[1])[e]);
      reinterpret_cast<T*>(destination)[e] = from_acc<T>(finish<Op>(combine<Op>(own, peer), reduce.world));
    }
  }
}

}  // namespace

void launch_bulk_reduce_out(DataType type, ReduceOp op, const BulkReduceOut& reduce, int blocks, cudaStream_t stream) {
  BRAID_LAUNCH_TYPED(bulk_reduce_out, type, op, blocks, stream, reduce);
}

}  // namespace braid::kernels

BRAID_KERNEL_MODULE()
