#include "backends/cuda/cuda_backend.hpp"

#include "collectives/collectives.hpp"
#include "core/error.hpp"

namespace braid::detail {

void CudaBackend::collective(const collectives::CollectiveCall& call, Stream stream) {
  switch (call.collective) {
    case Collective::kAllReduce: return collectives::all_reduce(context_, call, stream);
    case Collective::kReduce: return collectives::reduce(context_, call, stream);
    case Collective::kReduceScatter: return collectives::reduce_scatter(context_, call, stream);
    case Collective::kAllGather: return collectives::all_gather(context_, call, stream);
    case Collective::kBroadcast: return collectives::broadcast(context_, call, stream);
    case Collective::kAllToAll: return collectives::all_to_all(context_, call, stream);
    default: raise(ErrorCode::kInternal, "{}: collective {} is not a call of its own", call.function,
                   collective_name(static_cast<unsigned int>(call.collective)));
  }
}

void CudaBackend::all_to_allv(const collectives::AllToAllvCall& call, Stream stream) {
  collectives::all_to_allv(context_, call, stream);
}

void CudaBackend::send_recv(const collectives::PointToPointBatch& batch, Stream stream) {
  collectives::send_recv(context_, batch, stream);
}

void CudaBackend::raise_recorded_failure() { collectives::raise_recorded_failure(context_); }

void CudaBackend::check() { collectives::check(context_); }

}  // namespace braid::detail
