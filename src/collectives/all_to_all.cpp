// All-to-all(v), host side: check arguments at the boundary, raise what an earlier kernel recorded, choose the
// path, enqueue. Four paths:
//   - LL lines (blocks_ll.cu): uniform blocks that fit an LL slot, any buffer;
//   - pipelined FIFO pushes (all_to_all_pipelined.cu): any buffer, any counts, host or device counts;
//   - direct stores into the peers' outputs (all_to_all_direct.cu): uniform blocks on symmetric buffers;
//     direct loads from the peers' inputs for the one-sided all-to-all on same-process cudaMalloc memory;
//   - copy engines pulling from the peers' inputs between two barrier kernels: uniform blocks on symmetric
//     buffers, large sizes.
// All-to-all-v is always pipelined: no rank knows where its data sits in a peer's buffers (the peer's
// displacements), and its FIFO headers carry the counts a receiver needs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>

#include "braid/braid.hpp"
#include "collectives/all_to_all.hpp"
#include "collectives/all_to_all_launch.hpp"
#include "collectives/call_buffers.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/copy_engine.hpp"
#include "collectives/kernels.hpp"
#include "collectives/ll_launch.hpp"
#include "collectives/plan.hpp"
#include "collectives/selection.hpp"
#include "comm/comm_state.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "memory/shareable.hpp"
#include "memory/symmetric_memory.hpp"

namespace braid {

kernels::AllToAllLaunch collectives::pipelined_launch(const detail::CommState& state, Collective collective,
                                                      const void* send, void* recv, size_t element_bytes) {
  kernels::AllToAllLaunch launch{};
  launch.fifo.send = static_cast<const char*>(send);
  launch.fifo.recv = static_cast<char*>(recv);
  launch.fifo.collective = static_cast<unsigned int>(collective);
  launch.element_bytes = static_cast<uint32_t>(element_bytes);
  launch.send_peers = launch.recv_peers = kernels::kEveryPeer;
  launch.mismatch_in_bytes = false;
  if (state.nccl) return launch;  // only the counts and offsets are used: NCCL moves the data
  launch.fifo.area = reinterpret_cast<char* const*>(state.pipeline.device_peers());
  launch.fifo.piece_bytes = kernels::pipeline_piece_bytes(state.pipeline.bytes(), state.size);
  launch.fifo.pad = state.sync->pad();
  return launch;
}

uint64_t collectives::all_to_all_plan(Collective collective, Algorithm algorithm, int blocks, size_t count, DataType type,
                                      bool zero_copy, uint64_t send, uint64_t recv) {
  collectives::PlanArguments plan{};
  plan.collective = collective;
  plan.algorithm = algorithm;
  plan.zero_copy = zero_copy;
  plan.blocks = blocks;
  plan.count = count;
  plan.type = static_cast<uint64_t>(type);
  plan.root = -1;
  plan.send_identity = send;
  plan.recv_identity = recv;
  return collectives::plan_word(plan);
}

namespace {

using collectives::all_to_all_copy_engine;
using collectives::all_to_all_plan;
using collectives::check_buffer;
using collectives::check_device_pointer;
using collectives::check_launch;
using collectives::checked_product;
using collectives::element_size;
using collectives::enter;
using collectives::overlap;
using collectives::pipelined_launch;

}  // namespace

void Communicator::all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream) {
  const char* function = "Communicator::all_to_all";
  detail::CommState& state = enter(state_, function);
  const size_t size = element_size(function, type);
  const size_t block_bytes = checked_product(function, "count", count, size);
  const size_t bytes = checked_product(function, "count", block_bytes, static_cast<size_t>(state.size));
  if (count == 0) return;
  check_buffer(function, send, "send", bytes, state.device);
  check_buffer(function, recv, "recv", bytes, state.device);
  if (overlap(send, bytes, recv, bytes)) {
    raise_invalid_argument(function, "recv", "({}) overlaps send ({}); all-to-all is not in place", recv, send);
  }
  const auto order = detail::ordered(state, stream);
  if (state.nccl) {
    collectives::register_with_nccl(state, send, bytes);
    collectives::register_with_nccl(state, recv, bytes);
    DeviceGuard guard(state.device);
    state.nccl->all_to_all(send, recv, count, type, stream);
    return;
  }
  // LL lines, where the table says LL and a block fits an LL slot, never depend on the buffers (runs_ll): such a
  // call looks up nothing and exchanges nothing.
  const size_t ll_slot_bytes = state.ll.bytes() / 2 / state.size;
  const bool ll = runs_ll(Collective::kAllToAll, bytes, state.size, type, state.algorithm_override) &&
                  block_bytes <= ll_slot_bytes / kernels::kLLWireBytes * kernels::kLLLineBytes;
  std::optional<PeerRange> send_range, recv_range;
  if (!ll) {
    send_range = collectives::call_buffer_range(state, Collective::kAllToAll, collectives::ExchangedBuffer::kSend, send, bytes);
    recv_range = collectives::call_buffer_range(state, Collective::kAllToAll, collectives::ExchangedBuffer::kRecv, recv, bytes);
  }
  const bool symmetric = send_range && recv_range;
  const Choice choice = select_algorithm(Collective::kAllToAll, bytes, state.size, type, state.algorithm_override,
                                         symmetric ? Buffers::kSymmetric : Buffers::kAny);
  BRAID_TRACE("all_to_all: {} elements a block, {}{} with {} blocks", count, algorithm_name(choice.algorithm),
              symmetric ? " (symmetric buffers)" : "", choice.blocks);
  DeviceGuard guard(state.device);
  if (ll) {
    kernels::LLLaunch launch{};
    launch.send = static_cast<const char*>(send);
    launch.recv = static_cast<char*>(recv);
    launch.count = block_bytes;
    launch.send_rank_stride = launch.recv_rank_stride = block_bytes;
    launch.collective = static_cast<unsigned int>(Collective::kAllToAll);
    launch.area = reinterpret_cast<char* const*>(state.ll.device_peers());
    launch.slot_bytes = ll_slot_bytes;
    launch.pad = state.sync->pad();
    launch.epoch = state.sync->ll_epoch();
    launch.blocks_done = state.sync->blocks_done();
    kernels::launch_blocks_ll(launch, choice.blocks, stream);
    check_launch("all_to_all kernel launch");
    return;
  }
  if (symmetric && choice.algorithm == Algorithm::kCopyEngine && !send_range->same_process_peers) {
    all_to_all_copy_engine(state, send_range->buffers, recv, block_bytes,
                           all_to_all_plan(Collective::kAllToAll, Algorithm::kCopyEngine, choice.blocks, count, type,
                                           true, send_range->identity, recv_range->identity),
                           stream);
    return;
  }
  if (symmetric && choice.algorithm != Algorithm::kLL) {  // pipelined on buffers peers map: direct stores
    kernels::AllToAllDirectLaunch launch{};
    launch.send.at[state.rank] = const_cast<char*>(static_cast<const char*>(send));  // only read
    launch.recv = recv_range->buffers;
    launch.block_bytes = block_bytes;
    launch.loads = false;
    launch.collective = static_cast<unsigned int>(Collective::kAllToAll);
    launch.pad = state.sync->pad();
    launch.plan = all_to_all_plan(Collective::kAllToAll, Algorithm::kPipelined, choice.blocks, count, type, true,
                                  send_range->identity, recv_range->identity);
    kernels::launch_all_to_all_direct(launch, choice.blocks, stream);
    check_launch("all_to_all kernel launch");
    return;
  }
  // Any buffer (and copyengine asked for on buffers peers cannot map): FIFO pushes with every pair's size known.
  kernels::AllToAllLaunch launch = pipelined_launch(state, Collective::kAllToAll, send, recv, size);
  for (int q = 0; q < state.size; ++q) {
    launch.send_bytes[q] = launch.recv_bytes[q] = block_bytes;
    launch.send_offset[q] = launch.recv_offset[q] = q * block_bytes;
  }
  launch.fifo.plan = all_to_all_plan(Collective::kAllToAll, Algorithm::kPipelined, choice.blocks, count, type, false);
  kernels::launch_all_to_all_pipelined(launch, choice.blocks, stream);
  check_launch("all_to_all kernel launch");
}

void Communicator::all_to_all(const GlobalMemory& send, void* recv, size_t count, DataType type, Stream stream) {
  const char* function = "Communicator::all_to_all";
  detail::CommState& state = enter(state_, function);
  detail::require_cuda_backend(state, "Communicator::all_to_all on GlobalMemory");
  const size_t size = element_size(function, type);
  const size_t block_bytes = checked_product(function, "count", count, size);
  const size_t bytes = checked_product(function, "count", block_bytes, static_cast<size_t>(state.size));
  if (!send || send.world_size() != state.size || send.rank() != state.rank) {
    raise_invalid_argument(function, "send", "is not this communicator's global memory (import_global of {} ranks)", state.size);
  }
  for (int q = 0; q < state.size; ++q) {
    if (send.bytes(q) < bytes) {
      raise_invalid_argument(function, "send", "holds {} bytes on rank {}; {} blocks of {} bytes need {}", send.bytes(q), q,
                             state.size, block_bytes, bytes);
    }
  }
  if (count == 0) return;
  check_buffer(function, recv, "recv", bytes, state.device);
  PeerBuffers table{};
  for (int q = 0; q < state.size; ++q) table.at[q] = static_cast<char*>(send.peer(q));
  // A peer's range that is another GPU's cudaMalloc memory of this process (ranks as threads) is read by SM
  // loads: a copy engine's copy from it would be ordered against that GPU's legacy stream, so a peer waiting
  // there (cudaDeviceSynchronize, a legacy-stream copy) would wait on this rank's copy, which waits in the entry
  // barrier for that very peer.
  bool same_process_peers = false;
  for (const auto& mapping : send.mappings_) same_process_peers = same_process_peers || mapping->in_place();
  BRAID_TRACE("all_to_all (one-sided): {} elements a block, {}", count, same_process_peers ? "SM loads" : "copy engines");
  const auto order = detail::ordered(state, stream);
  if (!same_process_peers) {
    all_to_all_copy_engine(state, table, recv, block_bytes,
                           all_to_all_plan(Collective::kAllToAll, Algorithm::kCopyEngine, 0, count, type, true), stream);
    return;
  }
  kernels::AllToAllDirectLaunch launch{};
  launch.send = table;
  launch.recv.at[state.rank] = static_cast<char*>(recv);
  launch.block_bytes = block_bytes;
  launch.loads = true;
  launch.collective = static_cast<unsigned int>(Collective::kAllToAll);
  launch.pad = state.sync->pad();
  const Choice choice = select_algorithm(Collective::kAllToAll, bytes, state.size, type, "", Buffers::kSymmetric);
  launch.plan = all_to_all_plan(Collective::kAllToAll, Algorithm::kPipelined, choice.blocks, count, type, true);
  kernels::launch_all_to_all_direct(launch, choice.blocks, stream);  // as many blocks as symmetric buffers get
  check_launch("all_to_all kernel launch");
}

void Communicator::all_to_allv(const void* send, const size_t* send_counts, const size_t* send_displs, void* recv,
                               const size_t* recv_counts, const size_t* recv_displs, DataType type, Stream stream) {
  const char* function = "Communicator::all_to_allv";
  detail::CommState& state = enter(state_, function);
  const size_t size = element_size(function, type);
  if (send_counts == nullptr) raise_invalid_argument(function, "send_counts", "is null; it needs {} entries", state.size);
  if (recv_counts == nullptr) raise_invalid_argument(function, "recv_counts", "is null; it needs {} entries", state.size);
  kernels::AllToAllLaunch launch = pipelined_launch(state, Collective::kAllToAllv, send, recv, size);
  // Each side's extent: the end of its furthest block, in bytes; packed blocks when no displacements are given.
  auto lay_out = [&](const size_t* counts, const size_t* displs, const char* counts_name, const char* displs_name,
                     uint64_t* bytes, uint64_t* offsets) {
    size_t packed = 0, extent = 0;
    for (int q = 0; q < state.size; ++q) {
      bytes[q] = checked_product(function, counts_name, counts[q], size);
      const size_t displ = displs != nullptr ? displs[q] : packed;
      offsets[q] = checked_product(function, displs_name, displ, size);
      if (offsets[q] > SIZE_MAX - bytes[q]) raise_invalid_argument(function, displs_name, "[{}] = {} overflows with its count", q, displ);
      packed = (offsets[q] + bytes[q]) / size;
      if (bytes[q] != 0) extent = std::max<size_t>(extent, offsets[q] + bytes[q]);
    }
    return extent;
  };
  const size_t send_extent = lay_out(send_counts, send_displs, "send_counts", "send_displs", launch.send_bytes, launch.send_offset);
  const size_t recv_extent = lay_out(recv_counts, recv_displs, "recv_counts", "recv_displs", launch.recv_bytes, launch.recv_offset);
  if (send_counts[state.rank] != recv_counts[state.rank]) {
    raise_invalid_argument(function, "recv_counts", "[{}] = {} (this rank) differs from send_counts[{}] = {}", state.rank,
                           recv_counts[state.rank], state.rank, send_counts[state.rank]);
  }
  check_buffer(function, send, "send", send_extent, state.device);
  check_buffer(function, recv, "recv", recv_extent, state.device);
  if (overlap(send, send_extent, recv, recv_extent)) {
    raise_invalid_argument(function, "recv", "({}) overlaps send ({}); all-to-all is not in place", recv, send);
  }
  const auto order = detail::ordered(state, stream);
  if (state.nccl) {
    collectives::register_with_nccl(state, send, send_extent);
    collectives::register_with_nccl(state, recv, recv_extent);
    DeviceGuard guard(state.device);
    state.nccl->all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs, type, stream);
    return;
  }
  // Every rank launches, even one with nothing to move: its peers wait for its (empty) headers.
  const Choice choice = select_algorithm(Collective::kAllToAllv, 0, state.size, type, state.algorithm_override);
  launch.fifo.plan = all_to_all_plan(Collective::kAllToAllv, choice.algorithm, choice.blocks, 0, type, false);
  BRAID_TRACE("all_to_allv: {} bytes out, {} in, {} with {} blocks", send_extent, recv_extent,
              algorithm_name(choice.algorithm), choice.blocks);
  DeviceGuard guard(state.device);
  kernels::launch_all_to_all_pipelined(launch, choice.blocks, stream);
  check_launch("all_to_allv kernel launch");
}

void Communicator::all_to_allv_device(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                                      void* recv, size_t recv_capacity, int64_t* recv_counts, int64_t* recv_displs,
                                      DataType type, Stream stream) {
  const char* function = "Communicator::all_to_allv_device";
  detail::CommState& state = enter(state_, function);
  detail::require_cuda_backend(state, function);  // NCCL needs the counts on the host
  const size_t size = element_size(function, type);
  const size_t capacity_bytes = checked_product(function, "recv_capacity", recv_capacity, size);
  // The counts are only known on the device: send must be a device buffer whatever they turn out to be.
  if (send == nullptr) raise_invalid_argument(function, "send", "is null");
  check_device_pointer(function, send, "send", state.device);
  check_buffer(function, recv, "recv", capacity_bytes, state.device);
  if (send_counts == nullptr) raise_invalid_argument(function, "send_counts", "is null; it needs {} entries", state.size);
  if (recv_counts == nullptr) raise_invalid_argument(function, "recv_counts", "is null; it needs {} entries", state.size);
  check_device_pointer(function, send_counts, "send_counts", state.device);
  check_device_pointer(function, recv_counts, "recv_counts", state.device);
  if (send_displs != nullptr) check_device_pointer(function, send_displs, "send_displs", state.device);
  if (recv_displs != nullptr) check_device_pointer(function, recv_displs, "recv_displs", state.device);
  if (overlap(send, 1, recv, capacity_bytes)) {
    raise_invalid_argument(function, "recv", "({}) overlaps send ({}); all-to-all is not in place", recv, send);
  }
  kernels::AllToAllLaunch launch = pipelined_launch(state, Collective::kAllToAllv, send, recv, size);
  launch.device_send_counts = send_counts;
  launch.device_send_displs = send_displs;
  launch.device_recv_counts = recv_counts;
  launch.device_recv_displs = recv_displs;
  launch.recv_capacity = capacity_bytes;
  const Choice choice = select_algorithm(Collective::kAllToAllv, 0, state.size, type, state.algorithm_override);
  launch.fifo.plan = all_to_all_plan(Collective::kAllToAllv, choice.algorithm, choice.blocks, 0, type, false);
  BRAID_TRACE("all_to_allv_device: capacity {} elements, {} with {} blocks", recv_capacity,
              algorithm_name(choice.algorithm), choice.blocks);
  const auto order = detail::ordered(state, stream);
  kernels::launch_all_to_all_pipelined(launch, choice.blocks, stream);
  check_launch("all_to_allv_device kernel launch");
}

}  // namespace braid
