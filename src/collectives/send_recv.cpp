// Point-to-point batches (Communicator::send, recv, send_recv), host side. A batch is an all-to-all-v restricted to
// the peers it names: the pipelined all-to-all kernel (all_to_all_pipelined.cu) pushes only to the launch's
// send_peers and pulls only from its recv_peers. Each direction of a pair is a FIFO stream of its own on the
// signal pad, so the k-th send to q meets q's k-th receive from this rank whatever else either rank does, and
// ranks a batch does not name never hear of it.
//
// A launch carries at most one send to and one receive from each peer, so a batch with several ops for one peer
// is split: launch k carries the k-th send to and the k-th receive from every peer. Where both sides of a pair
// batch its ops alike, launch k of one waits only on launch k of the other, never on a launch queued behind it.
// Every launch has the width all-to-all-v has (select_algorithm), whatever its sizes: a piece of block b goes to
// the FIFO of block b on the peer, so both sides must launch the same blocks.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "braid/braid.hpp"
#include "collectives/all_to_all.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/kernels.hpp"
#include "collectives/selection.hpp"
#include "comm/comm_state.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid {
namespace {

using collectives::check_buffer;
using collectives::checked_product;
using collectives::element_size;

// A checked op: the user's op with its size in bytes.
struct Op {
  bool send;
  int peer;
  char* buffer;
  size_t bytes;
};

// How errors name an op's fields: send() and recv() by their own parameters ("peer"), a batch by index
// ("ops[2].peer").
struct Naming {
  const char* function;
  bool single;
  std::string operator()(size_t i, const char* field) const { return single ? field : fmt::format("ops[{}].{}", i, field); }
};

std::vector<Op> check_ops(const detail::CommState& state, const Naming& name, const PointToPoint* ops, size_t count) {
  const char* function = name.function;
  if (ops == nullptr && count > 0) raise_invalid_argument(function, "ops", "is null but count is {}", count);
  std::vector<Op> checked;
  checked.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const PointToPoint& op = ops[i];
    if (op.kind != PointToPoint::kSend && op.kind != PointToPoint::kRecv) {
      raise_invalid_argument(function, name(i, "kind").c_str(), "is {}, neither kSend (0) nor kRecv (1)",
                             static_cast<int>(op.kind));
    }
    if (op.peer < 0 || op.peer >= state.size) {
      raise_invalid_argument(function, name(i, "peer").c_str(), "is {}, outside [0, {})", op.peer, state.size);
    }
    const size_t bytes = checked_product(function, name(i, "count").c_str(), op.count,
                                         element_size(function, op.type, name(i, "type").c_str()));
    check_buffer(function, op.buffer, name(i, "buffer").c_str(), bytes, state.device);
    checked.push_back(Op{op.kind == PointToPoint::kSend, op.peer, static_cast<char*>(op.buffer), bytes});
  }
  // Sends to self are this rank's own block of a launch: the k-th needs the k-th receive from self of this batch
  // (no later call could supply it), of the same size (the host sees both, so it is refused here, not on the GPU).
  std::vector<size_t> self_sends, self_recvs;
  for (size_t i = 0; i < count; ++i) {
    if (checked[i].peer == state.rank) (checked[i].send ? self_sends : self_recvs).push_back(i);
  }
  if (self_sends.size() != self_recvs.size()) {
    raise_invalid_argument(function, name.single ? "peer" : "ops",
                           "has {} send(s) to this rank ({}) and {} receive(s) from it; in a batch each send to self "
                           "needs a receive from self",
                           self_sends.size(), state.rank, self_recvs.size());
  }
  for (size_t k = 0; k < self_sends.size(); ++k) {
    const Op& sent = checked[self_sends[k]];
    const Op& received = checked[self_recvs[k]];
    if (sent.bytes != received.bytes) {
      raise_invalid_argument(function, name(self_recvs[k], "count").c_str(),
                             "receives {} bytes from self, but the send to self it matches (ops[{}]) sends {} bytes",
                             received.bytes, self_sends[k], sent.bytes);
    }
  }
  return checked;
}

// The launches of a batch: launch k holds the k-th send to and the k-th receive from each peer. Per launch and
// direction, fifo.send (fifo.recv) is the lowest address among its buffers and each peer's offset is its buffer's
// address minus that base (user buffers of one batch lie anywhere: the kernel only adds offsets to the base).
std::vector<kernels::AllToAllLaunch> plan_launches(const detail::CommState& state, const std::vector<Op>& ops) {
  std::vector<size_t> launch_of(ops.size());
  std::vector<size_t> sends(state.size, 0), recvs(state.size, 0);
  size_t launches = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    launch_of[i] = (ops[i].send ? sends : recvs)[ops[i].peer]++;
    launches = std::max(launches, launch_of[i] + 1);
  }
  std::vector<char*> send_base(launches, nullptr), recv_base(launches, nullptr);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].bytes == 0) continue;  // its buffer may be null: never read, never a base
    char*& base = (ops[i].send ? send_base : recv_base)[launch_of[i]];
    if (base == nullptr || std::less<>{}(ops[i].buffer, base)) base = ops[i].buffer;  // a total order across allocations
  }
  std::vector<kernels::AllToAllLaunch> plan;
  for (size_t k = 0; k < launches; ++k) {
    plan.push_back(collectives::pipelined_launch(state, Collective::kSendRecv, send_base[k], recv_base[k], 1));
    plan.back().send_peers = plan.back().recv_peers = 0;
    plan.back().mismatch_in_bytes = true;  // ops of several datatypes: sizes are compared (and reported) in bytes
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    kernels::AllToAllLaunch& launch = plan[launch_of[i]];
    const Op& op = ops[i];
    const char* base = op.send ? launch.fifo.send : launch.fifo.recv;
    const uint64_t offset = op.bytes == 0 ? 0 : reinterpret_cast<uintptr_t>(op.buffer) - reinterpret_cast<uintptr_t>(base);
    (op.send ? launch.send_bytes : launch.recv_bytes)[op.peer] = op.bytes;
    (op.send ? launch.send_offset : launch.recv_offset)[op.peer] = offset;
    // This rank's own pair needs no mask: the kernel copies send_bytes[rank] itself.
    if (op.peer != state.rank) (op.send ? launch.send_peers : launch.recv_peers) |= 1u << op.peer;
  }
  return plan;
}

void run_batch(const std::shared_ptr<detail::CommState>& state_ptr, const Naming& name, const PointToPoint* ops,
               size_t count, Stream stream) {
  detail::CommState& state = collectives::enter(state_ptr, name.function);
  const std::vector<Op> checked = check_ops(state, name, ops, count);
  if (count == 0) return;
  const auto order = detail::ordered(state, stream);
  if (state.nccl) {
    for (const Op& op : checked) collectives::register_with_nccl(state, op.buffer, op.bytes);
    DeviceGuard guard(state.device);
    state.nccl->send_recv(ops, count, stream);
    return;
  }
  std::vector<kernels::AllToAllLaunch> launches = plan_launches(state, checked);
  const Choice choice = select_algorithm(Collective::kAllToAllv, 0, state.size, DataType::kUint8, state.algorithm_override);
  const uint64_t plan = collectives::all_to_all_plan(Collective::kSendRecv, choice.algorithm, choice.blocks, 0,
                                                     DataType::kUint8, false);
  for (kernels::AllToAllLaunch& launch : launches) launch.fifo.plan = plan;
  BRAID_TRACE("send_recv: {} op(s) in {} launch(es) of {} blocks", count, launches.size(), choice.blocks);
  DeviceGuard guard(state.device);
  for (const kernels::AllToAllLaunch& launch : launches) {
    kernels::launch_all_to_all_pipelined(launch, choice.blocks, stream);
    collectives::check_launch("send_recv kernel launch");
  }
}

}  // namespace

void Communicator::send(const void* buffer, size_t count, DataType type, int peer, Stream stream) {
  const PointToPoint op{PointToPoint::kSend, peer, const_cast<void*>(buffer), count, type};  // only read
  run_batch(state_, Naming{"Communicator::send", true}, &op, 1, stream);
}

void Communicator::recv(void* buffer, size_t count, DataType type, int peer, Stream stream) {
  const PointToPoint op{PointToPoint::kRecv, peer, buffer, count, type};
  run_batch(state_, Naming{"Communicator::recv", true}, &op, 1, stream);
}

void Communicator::send_recv(const PointToPoint* ops, size_t count, Stream stream) {
  run_batch(state_, Naming{"Communicator::send_recv", false}, ops, count, stream);
}

}  // namespace braid
