#include "group.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "route.hpp"
#include "shim.hpp"

namespace braid::shim {
namespace {

struct PendingInit {
  ncclComm_t comm;
  std::function<void()> init;
};

// This thread's group: depth of nested ncclGroupStart calls, what they kept, and the first call of it that failed.
struct ThreadGroup {
  int depth = 0;
  std::vector<PendingInit> inits;
  std::vector<Op> ops;
  ncclResult_t error = ncclSuccess;
  std::string error_text;
  void clear() {
    inits.clear();
    ops.clear();
    error = ncclSuccess;
    error_text.clear();
  }
};
thread_local ThreadGroup t_group;

bool point_to_point(Op::Kind kind) {
  return kind == Op::kSend || kind == Op::kRecv || kind == Op::kGather || kind == Op::kScatter;
}

// A communicator's sends and receives of one group, run as one braid batch.
struct Batch {
  ncclComm_t comm;
  std::vector<PointToPoint> items;
  std::vector<cudaStream_t> streams;  // the calls' streams, first one first
};

// The point-to-point pattern of `op` as braid items (bytes, so any datatype travels).
void add_items(const Op& op, Batch& batch) {
  const size_t bytes = op.count * nccl_type_size(op.type);
  auto item = [&](PointToPoint::Kind kind, int peer, const void* buffer) {
    batch.items.push_back(PointToPoint{kind, peer, const_cast<void*>(buffer), bytes, DataType::kUint8});
  };
  const ncclComm& comm = *op.comm;
  switch (op.kind) {
    case Op::kSend: item(PointToPoint::kSend, op.root, op.send); break;
    case Op::kRecv: item(PointToPoint::kRecv, op.root, op.recv); break;
    case Op::kGather:  // every rank sends its block to the root, which receives block r from rank r
      item(PointToPoint::kSend, op.root, op.send);
      if (comm.rank == op.root) {
        for (int r = 0; r < comm.size; ++r) item(PointToPoint::kRecv, r, static_cast<char*>(op.recv) + r * bytes);
      }
      break;
    case Op::kScatter:  // the root sends block r to rank r; every rank receives its own
      if (comm.rank == op.root) {
        for (int r = 0; r < comm.size; ++r) item(PointToPoint::kSend, r, static_cast<const char*>(op.send) + r * bytes);
      }
      item(PointToPoint::kRecv, op.root, op.recv);
      break;
    default: raise(ErrorCode::kInternal, "{} is not a point-to-point call", op_name(op.kind));
  }
  if (std::find(batch.streams.begin(), batch.streams.end(), op.stream) == batch.streams.end()) {
    batch.streams.push_back(op.stream);
  }
}

// The batch on its first stream; the others join it before and wait for it after (events kept per
// communicator, made outside any capture's stream work), as NCCL joins a group's streams.
void run_batch(Batch& batch) {
  ncclComm& comm = *batch.comm;
  if (batch.items.empty()) return;
  const cudaStream_t main = batch.streams.front();
  const size_t others = batch.streams.size() - 1;
  if (others == 0) {
    comm.braid->send_recv(batch.items.data(), batch.items.size(), main);
    return;
  }
  DeviceGuard guard(comm.device);
  std::lock_guard<std::mutex> lock(comm.events_mutex);
  while (comm.events.size() < others + 1) {
    cudaEvent_t event = nullptr;
    BRAID_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    comm.events.push_back(event);
  }
  for (size_t i = 1; i <= others; ++i) {
    BRAID_CUDA(cudaEventRecord(comm.events[i], batch.streams[i]));
    BRAID_CUDA(cudaStreamWaitEvent(main, comm.events[i], 0));
  }
  comm.braid->send_recv(batch.items.data(), batch.items.size(), main);
  BRAID_CUDA(cudaEventRecord(comm.events[0], main));
  for (size_t i = 1; i <= others; ++i) BRAID_CUDA(cudaStreamWaitEvent(batch.streams[i], comm.events[0], 0));
}

// A collective on braid. Moves without arithmetic travel as bytes where braid lacks the datatype.
void run_on_braid(const Op& op) {
  Communicator& braid = *op.comm->braid;
  DataType type = DataType::kUint8;
  ReduceOp reduce_op = ReduceOp::kSum;
  size_t count = op.count;
  if (!detail::from_nccl(op.type, &type)) {
    type = DataType::kUint8;
    count = op.count * nccl_type_size(op.type);
  }
  detail::from_nccl(op.op, &reduce_op);  // route() made sure reductions have it
  switch (op.kind) {
    case Op::kAllReduce: braid.all_reduce(op.send, op.recv, count, type, reduce_op, op.stream); break;
    case Op::kReduce: braid.reduce(op.send, op.recv, count, type, reduce_op, op.root, op.stream); break;
    case Op::kReduceScatter: braid.reduce_scatter(op.send, op.recv, count, type, reduce_op, op.stream); break;
    case Op::kAllGather: braid.all_gather(op.send, op.recv, count, type, op.stream); break;
    case Op::kBroadcast: braid.broadcast(op.send, op.recv, count, type, op.root, op.stream); break;
    case Op::kAllToAll: braid.all_to_all(op.send, op.recv, count, type, op.stream); break;
    default: raise(ErrorCode::kInternal, "{} is not a collective", op_name(op.kind));
  }
}

// A call on the real NCCL (inside the real group run_ops opened).
void run_on_nccl(const Op& op) {
  const ncclComm& comm = *op.comm;
  const auto& api = require_real(comm, op_name(op.kind)).api();
  ncclComm_t real = comm.real;
  ncclResult_t result = ncclSuccess;
  switch (op.kind) {
    case Op::kAllReduce: result = api.all_reduce(op.send, op.recv, op.count, op.type, op.op, real, op.stream); break;
    case Op::kReduce: result = api.reduce(op.send, op.recv, op.count, op.type, op.op, op.root, real, op.stream); break;
    case Op::kReduceScatter:
      result = api.reduce_scatter(op.send, op.recv, op.count, op.type, op.op, real, op.stream);
      break;
    case Op::kAllGather: result = api.all_gather(op.send, op.recv, op.count, op.type, real, op.stream); break;
    case Op::kBroadcast: result = api.broadcast(op.send, op.recv, op.count, op.type, op.root, real, op.stream); break;
    case Op::kAllToAll:
      if (api.all_to_all == nullptr) raise(ErrorCode::kUnsupported, "the real NCCL has no ncclAlltoAll");
      result = api.all_to_all(op.send, op.recv, op.count, op.type, real, op.stream);
      break;
    case Op::kSend:
    case Op::kRecv:
      if (api.send == nullptr || api.recv == nullptr) raise(ErrorCode::kUnsupported, "the real NCCL has no ncclSend");
      result = op.kind == Op::kSend ? api.send(op.send, op.count, op.type, op.root, real, op.stream)
                                    : api.recv(op.recv, op.count, op.type, op.root, real, op.stream);
      break;
    case Op::kGather:
      if (api.gather == nullptr) raise(ErrorCode::kUnsupported, "the real NCCL has no ncclGather");
      result = api.gather(op.send, op.recv, op.count, op.type, op.root, real, op.stream);
      break;
    case Op::kScatter:
      if (api.scatter == nullptr) raise(ErrorCode::kUnsupported, "the real NCCL has no ncclScatter");
      result = api.scatter(op.send, op.recv, op.count, op.type, op.root, real, op.stream);
      break;
  }
  check_real(comm, result, op_name(op.kind));
}

// Runs a group's calls: braid collectives in call order, then each communicator's send/receive batch; NCCL's
// share inside one real group (closed even when a braid call throws, so the real NCCL is never left mid-group).
void run_ops(const std::vector<Op>& ops) {
  std::vector<Route> routes;
  const detail::NcclLibrary* library = nullptr;
  for (const Op& op : ops) {
    routes.push_back(route(op));
    log_route(op, routes.back());
    if (!routes.back().braid) library = &require_real(*op.comm, op_name(op.kind));
  }
  struct RealGroup {
    const detail::NcclLibrary* library;
    bool open = false;
    ~RealGroup() {
      if (open) library->api().group_end();
    }
  } real_group{library};
  if (library != nullptr) {
    check_real(*library, library->api().group_start(), "ncclGroupStart");
    real_group.open = true;
  }
  std::vector<Batch> batches;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (!routes[i].braid) {
      run_on_nccl(op);
    } else if (point_to_point(op.kind)) {
      auto batch = std::find_if(batches.begin(), batches.end(), [&](const Batch& b) { return b.comm == op.comm; });
      if (batch == batches.end()) batch = batches.insert(batches.end(), Batch{op.comm, {}, {}});
      add_items(op, *batch);
    } else {
      run_on_braid(op);
    }
  }
  for (Batch& batch : batches) run_batch(batch);
  if (library != nullptr) {
    real_group.open = false;
    check_real(*library, library->api().group_end(), "ncclGroupEnd");
  }
}

// Runs kept inits, each in its own thread when there are several (each is collective over its ranks, and one
// thread may hold several ranks of one communicator).
ncclResult_t run_inits(std::vector<PendingInit>& inits) {
  std::vector<ncclResult_t> results(inits.size(), ncclSuccess);
  std::vector<std::string> errors(inits.size());
  auto run = [&](size_t i) {
    results[i] = guarded("ncclGroupEnd (communicator init)", inits[i].init);
    if (results[i] != ncclSuccess) errors[i] = last_error();
  };
  if (inits.size() == 1) {
    run(0);
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < inits.size(); ++i) threads.emplace_back(run, i);
    for (std::thread& thread : threads) thread.join();
  }
  // A communicator whose init failed reports it (ncclCommGetAsyncError) and stays unusable; the end returns the first.
  ncclResult_t first = ncclSuccess;
  for (size_t i = 0; i < inits.size(); ++i) {
    if (results[i] == ncclSuccess) continue;
    inits[i].comm->async_error = errors[i];
    inits[i].comm->async_state = results[i];
    if (first == ncclSuccess) {
      first = results[i];
      set_last_error(errors[i]);
    }
  }
  return first;
}

}  // namespace

const char* op_name(Op::Kind kind) {
  switch (kind) {
    case Op::kAllReduce: return "all_reduce";
    case Op::kReduce: return "reduce";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllGather: return "all_gather";
    case Op::kBroadcast: return "broadcast";
    case Op::kAllToAll: return "all_to_all";
    case Op::kSend: return "send";
    case Op::kRecv: return "recv";
    case Op::kGather: return "gather";
    case Op::kScatter: return "scatter";
  }
  return "unknown";
}

ncclResult_t submit(const Op& op) {
  if (t_group.depth > 0) {
    t_group.ops.push_back(op);
    return ncclSuccess;
  }
  return guarded(op_name(op.kind), [&] { run_ops({op}); });
}

ncclResult_t submit_init(ncclComm_t comm, std::function<void()> init, bool nonblocking) {
  if (t_group.depth > 0) {
    t_group.inits.push_back(PendingInit{comm, std::move(init)});
    return ncclSuccess;
  }
  if (nonblocking) return run_in_background(*comm, "communicator init", std::move(init));
  return guarded("communicator init", init);
}

ncclResult_t group_failure(ncclResult_t result) {
  if (result != ncclSuccess && t_group.depth > 0 && t_group.error == ncclSuccess) {
    t_group.error = result;
    t_group.error_text = last_error();
  }
  return result;
}

ncclResult_t group_start() {
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t group_end(ncclSimInfo_t* simulation) {
  const char* function = simulation != nullptr ? "ncclGroupSimulateEnd" : "ncclGroupEnd";
  if (t_group.depth == 0) {
    set_last_error(std::string(function) + ": not in a group (no ncclGroupStart before it)");
    return ncclInvalidUsage;
  }
  if (--t_group.depth > 0) return ncclSuccess;
  std::vector<PendingInit> inits = std::move(t_group.inits);
  std::vector<Op> ops = std::move(t_group.ops);
  ncclResult_t failed = t_group.error;
  std::string failure = std::string(function) + ": the group's call failed: " + t_group.error_text;
  t_group.clear();
  if (failed == ncclSuccess && simulation != nullptr) {  // NCCL reads the first `size` bytes, magic included
    ncclSimInfo_t given{};
    std::memcpy(&given, simulation, std::min(simulation->size, sizeof(ncclSimInfo_t)));
    if (given.magic != ncclSimInfo_t(NCCL_SIM_INFO_INITIALIZER).magic) {
      failed = ncclInvalidArgument;
      failure = std::string(function) + ": argument 'simInfo' was not initialised with NCCL_SIM_INFO_INITIALIZER";
    }
  }
  if (failed != ncclSuccess) {  // NOTE [group failure]
    for (PendingInit& init : inits) {
      init.comm->async_error = failure;
      init.comm->async_state = failed;
    }
    set_last_error(failure);
    return failed;
  }
  const ncclResult_t init_result = run_inits(inits);
  // braid makes no estimate; written only where the caller's struct (its size) holds the field
  if (simulation != nullptr && simulation->size >= offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float)) {
    simulation->estimatedTime = NCCL_UNDEF_FLOAT;
  }
  if (init_result != ncclSuccess || simulation != nullptr) return init_result;  // a simulation launches nothing
  return guarded("ncclGroupEnd", [&] { run_ops(ops); });
}

}  // namespace braid::shim
