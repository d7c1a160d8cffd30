#include "collectives/call_checks.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "kernels/kernel_pairs.hpp"
#include "core/config.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"

namespace braid::collectives {
namespace {

// The name of the count argument.
const char* count_name(Collective collective) {
  switch (collective) {
    case Collective::kReduceScatter: return "recv_count";
    case Collective::kAllGather: return "send_count";
    default: return "count";
  }
}

// Whether a collective's input or output is `world` blocks of count elements.
bool send_has_blocks(Collective collective) {
  return collective == Collective::kReduceScatter || collective == Collective::kAllToAll;
}
bool recv_has_blocks(Collective collective) {
  return collective == Collective::kAllGather || collective == Collective::kAllToAll;
}

}  // namespace

bool CollectiveCall::reduces() const {
  return collective == Collective::kAllReduce || collective == Collective::kReduce ||
         collective == Collective::kReduceScatter;
}
bool CollectiveCall::rooted() const { return collective == Collective::kReduce || collective == Collective::kBroadcast; }
size_t CollectiveCall::send_elements(int world) const { return send_has_blocks(collective) ? count * world : count; }
size_t CollectiveCall::recv_elements(int world) const { return recv_has_blocks(collective) ? count * world : count; }
bool CollectiveCall::uses_send(int rank) const { return collective != Collective::kBroadcast || rank == root; }
bool CollectiveCall::uses_recv(int rank) const { return collective != Collective::kReduce || rank == root; }

bool validate(const CollectiveCall& call, const CallPlace& place) {
  const char* function = call.function;
  const size_t size = element_size(function, call.type);
  if (call.reduces()) {
    if (static_cast<int>(call.op) < 0 || static_cast<int>(call.op) >= kReduceOpCount) {
      raise_invalid_argument(function, "op", "is {}, not a braid::ReduceOp", static_cast<int>(call.op));
    }
    if (!reduction_supported(call.type, call.op)) {
      raise_invalid_argument(function, "op", "is {}, which braid does not apply to {}", reduce_op_name(call.op),
                             datatype_name(call.type));
    }
    if (!kernels::kernel_pair_built(call.type, call.op)) {
      raise(ErrorCode::kUnsupported,
            "{}: this braid is a developer build with reduction kernels for {} only (CMake BRAID_KERNEL_PAIRS): no "
            "kernel reduces {} with {}", function, kernels::kKernelPairsOption, datatype_name(call.type),
            reduce_op_name(call.op));
    }
  }
  if (call.rooted() && (call.root < 0 || call.root >= place.world)) {
    raise_invalid_argument(function, "root", "is {}; must be in [0, {})", call.root, place.world);
  }
  const char* count = count_name(call.collective);
  const size_t block_bytes = checked_product(function, count, call.count, size);
  const bool blocks = send_has_blocks(call.collective) || recv_has_blocks(call.collective);
  if (blocks && block_bytes > SIZE_MAX / static_cast<size_t>(place.world)) {
    raise_invalid_argument(function, count, "is {}: times {} ranks overflows", call.count, place.world);
  }
  if (call.count == 0) return false;
  const size_t send_bytes = call.send_elements(place.world) * size;
  const size_t recv_bytes = call.recv_elements(place.world) * size;
  if (call.uses_send(place.rank)) check_buffer(function, call.send, "send", send_bytes, place.device);
  if (call.uses_recv(place.rank)) check_buffer(function, call.recv, "recv", recv_bytes, place.device);
  check_in_place(call, place);
  return true;
}

void check_in_place(const CollectiveCall& call, const CallPlace& place) {
  if (call.count == 0 || !call.uses_send(place.rank) || !call.uses_recv(place.rank)) return;
  const size_t size = datatype_size(call.type);
  const size_t send_bytes = call.send_elements(place.world) * size, recv_bytes = call.recv_elements(place.world) * size;
  if (!overlap(call.send, send_bytes, call.recv, recv_bytes)) return;
  const intptr_t from_send = reinterpret_cast<intptr_t>(call.recv) - reinterpret_cast<intptr_t>(call.send);
  const intptr_t block = static_cast<intptr_t>(place.rank) * static_cast<intptr_t>(call.count * size);
  const char* rule = "recv == send";
  intptr_t in_place = 0;
  if (call.collective == Collective::kReduceScatter) {
    rule = "recv == send + rank * recv_count";
    in_place = block;
  } else if (call.collective == Collective::kAllGather) {
    rule = "send == recv + rank * send_count";
    in_place = -block;
  }
  if (from_send != in_place) {
    raise_invalid_argument(call.function, "recv", "({}) overlaps send ({}) without being in place; in place takes {}",
                           call.recv, call.send, rule);
  }
}

AllToAllvCall validate_all_to_allv(const char* function, const void* send, const size_t* send_counts,
                                   const size_t* send_displs, void* recv, const size_t* recv_counts,
                                   const size_t* recv_displs, DataType type, const CallPlace& place) {
  const size_t size = element_size(function, type);
  if (send_counts == nullptr) raise_invalid_argument(function, "send_counts", "is null; it needs {} entries", place.world);
  if (recv_counts == nullptr) raise_invalid_argument(function, "recv_counts", "is null; it needs {} entries", place.world);
  AllToAllvCall call{};
  call.send = send;
  call.send_counts = send_counts;
  call.send_displs = send_displs;
  call.recv = recv;
  call.recv_counts = recv_counts;
  call.recv_displs = recv_displs;
  call.type = type;
  // Returns the end of the furthest block; packed blocks where displs is null.
  auto lay_out = [&](const size_t* counts, const size_t* displs, const char* counts_name, const char* displs_name,
                     uint64_t* bytes, uint64_t* offsets) {
    size_t packed = 0, extent = 0;
    // Packed blocks (displs null): an overflow comes from the counts, which the error names.
    const char* offsets_name = displs != nullptr ? displs_name : counts_name;
    for (int q = 0; q < place.world; ++q) {
      bytes[q] = checked_product(function, counts_name, counts[q], size);
      const size_t displ = displs != nullptr ? displs[q] : packed;
      offsets[q] = checked_product(function, offsets_name, displ, size);
      if (offsets[q] > SIZE_MAX - bytes[q]) {
        if (displs != nullptr) raise_invalid_argument(function, displs_name, "[{}] = {} overflows with its count", q, displ);
        raise_invalid_argument(function, counts_name, "up to [{}] sum past the address space when packed", q);
      }
      packed = (offsets[q] + bytes[q]) / size;
      if (bytes[q] != 0) extent = std::max<size_t>(extent, offsets[q] + bytes[q]);
    }
    return extent;
  };
  call.send_extent = lay_out(send_counts, send_displs, "send_counts", "send_displs", call.send_bytes, call.send_offset);
  call.recv_extent = lay_out(recv_counts, recv_displs, "recv_counts", "recv_displs", call.recv_bytes, call.recv_offset);
  if (send_counts[place.rank] != recv_counts[place.rank]) {
    raise_invalid_argument(function, "recv_counts", "[{}] = {} (this rank) differs from send_counts[{}] = {}", place.rank,
                           recv_counts[place.rank], place.rank, send_counts[place.rank]);
  }
  check_buffer(function, send, "send", call.send_extent, place.device);
  check_buffer(function, recv, "recv", call.recv_extent, place.device);
  if (overlap(send, call.send_extent, recv, call.recv_extent)) {
    raise_invalid_argument(function, "recv", "({}) overlaps send ({}); all-to-all is not in place", recv, send);
  }
  return call;
}

AllToAllvDeviceCall validate_all_to_allv_device(const char* function, const void* send, const int64_t* send_counts,
                                                const int64_t* send_displs, void* recv, size_t recv_capacity,
                                                int64_t* recv_counts, int64_t* recv_displs, DataType type,
                                                const CallPlace& place) {
  const size_t size = element_size(function, type);
  const size_t capacity_bytes = checked_product(function, "recv_capacity", recv_capacity, size);
  if (send == nullptr) raise_invalid_argument(function, "send", "is null");
  check_device_pointer(function, send, "send", place.device);
  check_buffer(function, recv, "recv", capacity_bytes, place.device);
  if (send_counts == nullptr) raise_invalid_argument(function, "send_counts", "is null; it needs {} entries", place.world);
  if (recv_counts == nullptr) raise_invalid_argument(function, "recv_counts", "is null; it needs {} entries", place.world);
  check_device_pointer(function, send_counts, "send_counts", place.device);
  check_device_pointer(function, recv_counts, "recv_counts", place.device);
  if (send_displs != nullptr) check_device_pointer(function, send_displs, "send_displs", place.device);
  if (recv_displs != nullptr) check_device_pointer(function, recv_displs, "recv_displs", place.device);
  if (overlap(send, 1, recv, capacity_bytes)) {
    raise_invalid_argument(function, "recv", "({}) overlaps send ({}); all-to-all is not in place", recv, send);
  }
  return AllToAllvDeviceCall{send, send_counts, send_displs, recv, capacity_bytes, recv_counts, recv_displs, type};
}

PointToPointBatch validate_point_to_point(const char* function, bool single, const PointToPoint* ops, size_t op_count,
                                          const CallPlace& place) {
  auto name = [&](size_t i, const char* field) { return single ? std::string(field) : fmt::format("ops[{}].{}", i, field); };
  if (ops == nullptr && op_count > 0) raise_invalid_argument(function, "ops", "is null but op_count is {}", op_count);
  PointToPointBatch batch{ops, op_count, {}};
  std::vector<CheckedOp>& checked = batch.checked;
  checked.reserve(op_count);
  for (size_t i = 0; i < op_count; ++i) {
    const PointToPoint& op = ops[i];
    if (op.kind != PointToPoint::kSend && op.kind != PointToPoint::kRecv) {
      raise_invalid_argument(function, name(i, "kind").c_str(), "is {}, neither kSend (0) nor kRecv (1)",
                             static_cast<int>(op.kind));
    }
    if (op.peer < 0 || op.peer >= place.world) {
      raise_invalid_argument(function, name(i, "peer").c_str(), "is {}, outside [0, {})", op.peer, place.world);
    }
    const size_t bytes = checked_product(function, name(i, "count").c_str(), op.count,
                                         element_size(function, op.type, name(i, "type").c_str()));
    check_buffer(function, op.buffer, name(i, "buffer").c_str(), bytes, place.device);
    checked.push_back(CheckedOp{op.kind == PointToPoint::kSend, op.peer, static_cast<char*>(op.buffer), bytes});
  }
  // The k-th send to self needs the k-th receive from self of this batch (no later call could supply it), of the
  // same size: the host sees both, so it refuses a mismatch here, not the GPU.
  std::vector<size_t> self_sends, self_recvs;
  for (size_t i = 0; i < op_count; ++i) {
    if (checked[i].peer == place.rank) (checked[i].send ? self_sends : self_recvs).push_back(i);
  }
  if (self_sends.size() != self_recvs.size()) {
    raise_invalid_argument(function, single ? "peer" : "ops",
                           "has {} send(s) to this rank ({}) and {} receive(s) from it; in a batch each send to self "
                           "needs a receive from self",
                           self_sends.size(), place.rank, self_recvs.size());
  }
  for (size_t k = 0; k < self_sends.size(); ++k) {
    const CheckedOp& sent = checked[self_sends[k]];
    const CheckedOp& received = checked[self_recvs[k]];
    if (sent.bytes != received.bytes) {
      raise_invalid_argument(function, name(self_recvs[k], "count").c_str(),
                             "receives {} bytes from self, but the send to self it matches (ops[{}]) sends {} bytes",
                             received.bytes, self_sends[k], sent.bytes);
    }
  }
  return batch;
}

size_t element_size(const char* function, DataType type, const char* argument) {
  const size_t size = datatype_size(type);
  if (size == 0) raise_invalid_argument(function, argument, "is {}, not a braid::DataType", static_cast<int>(type));
  return size;
}

size_t checked_product(const char* function, const char* argument, size_t a, size_t b) {
  if (b != 0 && a > SIZE_MAX / b) raise_invalid_argument(function, argument, "is {}: its size in bytes overflows", a);
  return a * b;
}

void check_buffer(const char* function, const void* pointer, const char* argument, size_t bytes, int device) {
  if (bytes == 0) return;
  if (pointer == nullptr) raise_invalid_argument(function, argument, "is null but {} bytes go through it", bytes);
  check_device_pointer(function, pointer, argument, device);
}

bool pointer_checks_on() {
  static const bool on = Config::get().string("BRAID_CHECK_POINTERS").value_or("on") == "on";
  return on;
}

void check_device_pointer(const char* function, const void* pointer, const char* argument, int device) {
  if (!pointer_checks_on()) return;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();
    raise_invalid_argument(function, argument, "({}) is not memory CUDA knows", pointer);
  }
  if (attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost) {
    raise_invalid_argument(function, argument, "({}) is host memory; collectives need device memory", pointer);
  }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != device) {
    raise_invalid_argument(function, argument, "({}) is memory of GPU {}, but this rank uses GPU {}", pointer,
                           attributes.device, device);
  }
}

}  // namespace braid::collectives
