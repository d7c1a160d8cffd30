#include "backends/nccl/nccl_collectives.hpp"

#include "core/device_guard.hpp"
#include "core/error.hpp"

namespace braid::detail {

void NcclCollectives::register_buffer(const void* buffer, size_t bytes) {
  if (buffer == nullptr || bytes == 0) return;
  if (const auto found = registrations_->containing(reinterpret_cast<uintptr_t>(buffer), bytes)) {
    nccl_->ensure_registered(found->first, reinterpret_cast<void*>(found->second.address), found->second.bytes);
  }
}

void NcclCollectives::collective(const collectives::CollectiveCall& call, Stream stream) {
  const size_t element = datatype_size(call.type);
  register_buffer(call.send, call.send_elements(nccl_->size()) * element);
  register_buffer(call.recv, call.recv_elements(nccl_->size()) * element);
  DeviceGuard guard(nccl_->device());
  const auto [function, collective, send, recv, count, type, call_op, root] = call;
  // NCCL runs one rank's avg as a PreMulSum by 1, whose one-rank kernel its host code lacks for fp8 (invalid
  // argument); over one rank the average is the sum.
  const ReduceOp op = call_op == ReduceOp::kAvg && nccl_->size() == 1 ? ReduceOp::kSum : call_op;
  switch (collective) {
    case Collective::kAllReduce: return nccl_->all_reduce(send, recv, count, type, op, stream);
    case Collective::kReduce: return nccl_->reduce(send, recv, count, type, op, root, stream);
    case Collective::kReduceScatter: return nccl_->reduce_scatter(send, recv, count, type, op, stream);
    case Collective::kAllGather: return nccl_->all_gather(send, recv, count, type, stream);
    case Collective::kBroadcast: return nccl_->broadcast(send, recv, count, type, root, stream);
    case Collective::kAllToAll: return nccl_->all_to_all(send, recv, count, type, stream);
    default: raise(ErrorCode::kInternal, "{}: collective {} is not a call of its own", function,
                   collective_name(static_cast<unsigned int>(collective)));
  }
}

void NcclCollectives::all_to_allv(const collectives::AllToAllvCall& call, Stream stream) {
  register_buffer(call.send, call.send_extent);
  register_buffer(call.recv, call.recv_extent);
  DeviceGuard guard(nccl_->device());
  nccl_->all_to_allv(call.send, call.send_counts, call.send_displs, call.recv, call.recv_counts, call.recv_displs,
                     call.type, stream);
}

void NcclCollectives::send_recv(const collectives::PointToPointBatch& batch, Stream stream) {
  for (const collectives::CheckedOp& op : batch.checked) register_buffer(op.buffer, op.bytes);
  DeviceGuard guard(nccl_->device());
  nccl_->send_recv(batch.ops, batch.count, stream);
}

void NcclCollectives::revoke() {
  raise(ErrorCode::kUnsupported,
        "Communicator::revoke needs the CUDA backend (the ranks of one host tell each other through shared memory); "
        "on NCCL, abort() every rank instead");
}

}  // namespace braid::detail
