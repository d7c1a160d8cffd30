// Communicator's calls that enqueue work, one path for each: enter (raise what an earlier call recorded), check
// the arguments (collectives/call_checks.hpp), take the communicator's ordering scope, and hand the call to the
// backend chosen at init. Calls with nothing to move enqueue nothing.
#include "braid/braid.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/collectives.hpp"
#include "comm/comm_state.hpp"
#include "core/error.hpp"
#include "memory/shareable.hpp"
#include "memory/symmetric_memory.hpp"

namespace braid {
namespace {

using collectives::CollectiveCall;

// Checks `call`, then runs it on the backend in the communicator's order.
void run_collective(const std::shared_ptr<detail::CommState>& state_ptr, const CollectiveCall& call, Stream stream) {
  detail::CommState& state = detail::enter(state_ptr, call.function, stream);
  if (!collectives::validate(call, detail::place_of(state))) return;
  const auto order = detail::ordered(state, stream);
  state.backend->collective(call, stream);
}

void run_point_to_point(const std::shared_ptr<detail::CommState>& state_ptr, const char* function, bool single,
                        const PointToPoint* ops, size_t op_count, Stream stream) {
  detail::CommState& state = detail::enter(state_ptr, function, stream);
  const collectives::PointToPointBatch batch =
      collectives::validate_point_to_point(function, single, ops, op_count, detail::place_of(state));
  if (op_count == 0) return;
  const auto order = detail::ordered(state, stream);
  state.backend->send_recv(batch, stream);
}

}  // namespace

void Communicator::all_reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, Stream stream) {
  run_collective(state_, {"Communicator::all_reduce", Collective::kAllReduce, send, recv, count, type, op, 0}, stream);
}

void Communicator::reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root, Stream stream) {
  run_collective(state_, {"Communicator::reduce", Collective::kReduce, send, recv, count, type, op, root}, stream);
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op,
                                  Stream stream) {
  run_collective(state_, {"Communicator::reduce_scatter", Collective::kReduceScatter, send, recv, recv_count, type, op, 0},
                 stream);
}

void Communicator::all_gather(const void* send, void* recv, size_t send_count, DataType type, Stream stream) {
  run_collective(state_, {"Communicator::all_gather", Collective::kAllGather, send, recv, send_count, type, ReduceOp::kSum, 0},
                 stream);
}

void Communicator::broadcast(const void* send, void* recv, size_t count, DataType type, int root, Stream stream) {
  run_collective(state_, {"Communicator::broadcast", Collective::kBroadcast, send, recv, count, type, ReduceOp::kSum, root},
                 stream);
}

void Communicator::all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream) {
  run_collective(state_, {"Communicator::all_to_all", Collective::kAllToAll, send, recv, count, type, ReduceOp::kSum, 0},
                 stream);
}

void Communicator::all_to_all(const GlobalMemory& send, void* recv, size_t count, DataType type, Stream stream) {
  const char* function = "Communicator::all_to_all";
  detail::CommState& state = detail::enter(state_, function, stream);
  collectives::CollectiveContext& cuda = detail::cuda_context(state, "Communicator::all_to_all on GlobalMemory");
  const size_t size = collectives::element_size(function, type);
  const size_t block_bytes = collectives::checked_product(function, "count", count, size);
  const size_t bytes = collectives::checked_product(function, "count", block_bytes, static_cast<size_t>(state.size));
  // The same communicator: owner-based, so memory of a destroyed communicator never passes for a new one's.
  const bool ours = !send.communicator_.owner_before(state_) && !state_.owner_before(send.communicator_);
  if (!send || !ours) {
    raise_invalid_argument(function, "send", "is not this communicator's global memory (import_global of {} ranks)", state.size);
  }
  for (int q = 0; q < state.size; ++q) {
    if (send.bytes(q) < bytes) {
      raise_invalid_argument(function, "send", "holds {} bytes on rank {}; {} blocks of {} bytes need {}", send.bytes(q), q,
                             state.size, block_bytes, bytes);
    }
  }
  if (count == 0) return;
  collectives::check_buffer(function, recv, "recv", bytes, state.device);
  if (collectives::overlap(recv, bytes, send.peer(state.rank), send.bytes(state.rank))) {
    raise_invalid_argument(function, "recv", "overlaps this rank's range of send, which the peers read during the call");
  }
  PeerBuffers table{};
  for (int q = 0; q < state.size; ++q) table.at[q] = static_cast<char*>(send.peer(q));
  // A peer's range that is another GPU's cudaMalloc memory of this process (ranks as threads) is read by SM
  // loads: a copy engine's copy from it would be ordered against that GPU's legacy stream, so a peer waiting
  // there (cudaDeviceSynchronize, a legacy-stream copy) would wait on this rank's copy, which waits in the entry
  // barrier for that very peer.
  bool same_process_peers = false;
  for (const auto& mapping : send.mappings_) same_process_peers = same_process_peers || mapping->in_place();
  const auto order = detail::ordered(state, stream);
  collectives::all_to_all_global(cuda, table, same_process_peers, recv, count, type, stream);
}

void Communicator::all_to_allv(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                               const size_t* recv_counts, const size_t* recv_displs, DataType type, Stream stream) {
  const char* function = "Communicator::all_to_allv";
  detail::CommState& state = detail::enter(state_, function, stream);
  const collectives::AllToAllvCall call = collectives::validate_all_to_allv(
      function, send, send_counts, send_displs, recv, recv_counts, recv_displs, type, detail::place_of(state));
  const auto order = detail::ordered(state, stream);
  state.backend->all_to_allv(call, stream);
}

void Communicator::all_to_allv_device(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                                      void* recv, size_t recv_capacity, int64_t* recv_counts, int64_t* recv_displs,
                                      DataType type, Stream stream) {
  const char* function = "Communicator::all_to_allv_device";
  detail::CommState& state = detail::enter(state_, function, stream);
  collectives::CollectiveContext& cuda = detail::cuda_context(state, function);  // NCCL needs the counts on the host
  const collectives::AllToAllvDeviceCall call = collectives::validate_all_to_allv_device(
      function, send, send_counts, send_displs, recv, recv_capacity, recv_counts, recv_displs, type, detail::place_of(state));
  const auto order = detail::ordered(state, stream);
  collectives::all_to_allv_device(cuda, call, stream);
}

void Communicator::send(const void* buffer, size_t count, DataType type, int peer, Stream stream) {
  const PointToPoint op{PointToPoint::kSend, peer, const_cast<void*>(buffer), count, type};  // only read
  run_point_to_point(state_, "Communicator::send", true, &op, 1, stream);
}

void Communicator::recv(void* buffer, size_t count, DataType type, int peer, Stream stream) {
  const PointToPoint op{PointToPoint::kRecv, peer, buffer, count, type};
  run_point_to_point(state_, "Communicator::recv", true, &op, 1, stream);
}

void Communicator::send_recv(const PointToPoint* ops, size_t op_count, Stream stream) {
  run_point_to_point(state_, "Communicator::send_recv", false, ops, op_count, stream);
}

void Communicator::check() { detail::usable(state_, "Communicator::check").backend->check(); }

void Communicator::abort() noexcept {
  if (!state_) return;
  if (state_->backend) state_->backend->abort();
  if (state_->store) state_->store->interrupt();  // barrier, host_allgather and the exchanges end too
  if (state_->fds) state_->fds->interrupt();      // and a wait for a peer's fd
}

void Communicator::revoke() { detail::usable(state_, "Communicator::revoke").backend->revoke(); }

}  // namespace braid
