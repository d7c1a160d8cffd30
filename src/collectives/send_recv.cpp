// Point-to-point batches (Communicator::send, recv, send_recv) of the CUDA backend, host side. A batch is an all-to-all-v restricted to
// the peers it names: the pipelined all-to-all kernel (all_to_all_pipelined.cu) pushes only to the launch's
// send_peers and pulls only from its recv_peers. Each direction of a pair is a FIFO stream of its own on the
// signal pad, so the k-th send to q meets q's k-th receive from this rank whatever else either rank does, and
// ranks a batch does not name never hear of it.
//
// A launch carries at most one send to and one receive from each peer, so a batch with several ops for one peer
// is split: launch k carries the k-th send to and the k-th receive from every peer. Where both sides of a pair
// batch its ops alike, launch k of one waits only on launch k of the other, never on a launch queued behind it.
// Every launch has the table's send/recv width (select_algorithm), whatever its sizes: a piece of block b goes to
// the FIFO of block b on the peer, so both sides must launch the same blocks.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/all_to_all.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/collectives.hpp"
#include "collectives/kernels.hpp"
#include "collectives/selection.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid::collectives {
namespace {

// The launches of a batch: launch k holds the k-th send to and the k-th receive from each peer. Per launch and
// direction, fifo.send (fifo.recv) is the lowest address among its buffers and each peer's offset is its buffer's
// address minus that base (user buffers of one batch lie anywhere: the kernel only adds offsets to the base).
std::vector<kernels::AllToAllLaunch> plan_launches(const CollectiveContext& state, const std::vector<CheckedOp>& ops) {
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
    plan.push_back(pipelined_launch(state, Collective::kSendRecv, send_base[k], recv_base[k], 1));
    plan.back().send_peers = plan.back().recv_peers = 0;
    plan.back().mismatch_in_bytes = true;  // ops of several datatypes: sizes are compared (and reported) in bytes
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    kernels::AllToAllLaunch& launch = plan[launch_of[i]];
    const CheckedOp& op = ops[i];
    const char* base = op.send ? launch.fifo.send : launch.fifo.recv;
    const uint64_t offset = op.bytes == 0 ? 0 : reinterpret_cast<uintptr_t>(op.buffer) - reinterpret_cast<uintptr_t>(base);
    (op.send ? launch.send_bytes : launch.recv_bytes)[op.peer] = op.bytes;
    (op.send ? launch.send_offset : launch.recv_offset)[op.peer] = offset;
    // This rank's own pair needs no mask: the kernel copies send_bytes[rank] itself.
    if (op.peer != state.rank) (op.send ? launch.send_peers : launch.recv_peers) |= 1u << op.peer;
  }
  return plan;
}

}  // namespace

void send_recv(CollectiveContext& state, const PointToPointBatch& batch, Stream stream) {
  std::vector<kernels::AllToAllLaunch> launches = plan_launches(state, batch.checked);
  const CallPlan choice = pairwise_plan(state, Collective::kSendRecv, DataType::kUint8);
  const uint64_t plan = all_to_all_plan(Collective::kSendRecv, choice.algorithm, choice.blocks, 0, DataType::kUint8, false);
  for (kernels::AllToAllLaunch& launch : launches) launch.fifo.plan = plan;
  BRAID_TRACE("send_recv: {} op(s) in {} launch(es) of {} blocks", batch.count, launches.size(), choice.blocks);
  DeviceGuard guard(state.device);
  for (const kernels::AllToAllLaunch& launch : launches) {
    kernels::launch_all_to_all_pipelined(launch, choice.blocks, stream);
    check_launch("send_recv kernel launch");
  }
}

}  // namespace braid::collectives
