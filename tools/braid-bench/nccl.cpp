#include "nccl.hpp"

#include <array>
#include <limits>
#include <stdexcept>
#include <vector>

namespace braid::bench {

std::shared_ptr<NcclLibrary> NcclLibrary::load(const std::string& path) {
  try {
    return std::shared_ptr<NcclLibrary>(new NcclLibrary(detail::NcclLibrary::load(path)));
  } catch (const Error& error) {
    throw std::runtime_error(std::string("--compare nccl: ") + error.what() + "\n  (set --nccl-lib PATH)");
  }
}

std::string NcclLibrary::all_to_all_method() const {
  if (library_->has_all_to_all()) return "ncclAlltoAll";
  if (library_->has_send_recv()) return "ncclSend/ncclRecv";
  return "";
}

NcclComm::NcclComm(const std::shared_ptr<NcclLibrary>& library, Communicator& comm) {
  std::vector<std::string> ids =
      comm.host_allgather(comm.rank() == 0 ? detail::NcclBackend::make_unique_id(*library->library()) : "");
  // No watchdog (an infinite timeout): the NCCL rows time NCCL alone, without the events that bound braid's
  // NCCL backend.
  rank_ = comm.rank();
  ranks_ = comm.size();
  backend_ = std::make_unique<detail::NcclBackend>(library->library(), comm.rank(), comm.size(), comm.device(),
                                                   ids[0], detail::NcclRegisterMode::kNo,
                                                   std::numeric_limits<double>::infinity());
}

void NcclComm::call(Collective coll, const void* send, void* recv, const Shape& shape, DataType type, ReduceOp op,
                    int root, Stream stream) {
  switch (coll) {
    case Collective::kAllReduce: backend_->all_reduce(send, recv, shape.count, type, op, stream); return;
    case Collective::kReduce: backend_->reduce(send, recv, shape.count, type, op, root, stream); return;
    case Collective::kReduceScatter: backend_->reduce_scatter(send, recv, shape.recv_count, type, op, stream); return;
    case Collective::kAllGather: backend_->all_gather(send, recv, shape.send_count, type, stream); return;
    case Collective::kBroadcast: backend_->broadcast(send, recv, shape.count, type, root, stream); return;
    case Collective::kAllToAll: backend_->all_to_all(send, recv, shape.count, type, stream); return;
    case Collective::kSendRecv: {
      const std::array<PointToPoint, 2> ops = send_recv_ring(rank_, ranks_, send, recv, shape, type);
      backend_->send_recv(ops.data(), ops.size(), stream);
      return;
    }
  }
}

}  // namespace braid::bench
