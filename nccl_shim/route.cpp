#include "route.hpp"

#include <mutex>
#include <set>
#include <sstream>
#include <tuple>

#include "backends/nccl/nccl_library.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "shim.hpp"

namespace braid::shim {
namespace {

// The kinds BRAID_SHIM_FALLBACK can name, as bits of a mask.
unsigned int kind_bit(Op::Kind kind) {
  switch (kind) {
    case Op::kSend:
    case Op::kRecv:
    case Op::kGather:
    case Op::kScatter: return 1u << Op::kSend;  // "sendrecv": every point-to-point pattern
    default: return 1u << kind;
  }
}

// BRAID_SHIM_FALLBACK, parsed once: a comma-separated list of allreduce, reduce, reducescatter, allgather,
// broadcast, alltoall, sendrecv, or all. A name outside the list is an error naming the variable.
unsigned int forced_fallbacks() {
  static const unsigned int mask = [] {
    const std::string text = Config::get().string("BRAID_SHIM_FALLBACK").value_or("");
    unsigned int bits = 0;
    std::stringstream list(text);
    std::string name;
    while (std::getline(list, name, ',')) {
      name.erase(0, name.find_first_not_of(" \t"));
      name.erase(name.find_last_not_of(" \t") + 1);
      if (name.empty()) continue;
      if (name == "all") bits |= ~0u;
      else if (name == "allreduce") bits |= kind_bit(Op::kAllReduce);
      else if (name == "reduce") bits |= kind_bit(Op::kReduce);
      else if (name == "reducescatter") bits |= kind_bit(Op::kReduceScatter);
      else if (name == "allgather") bits |= kind_bit(Op::kAllGather);
      else if (name == "broadcast") bits |= kind_bit(Op::kBroadcast);
      else if (name == "alltoall") bits |= kind_bit(Op::kAllToAll);
      else if (name == "sendrecv") bits |= kind_bit(Op::kSend);
      else {
        raise(ErrorCode::kInvalidArgument, "BRAID_SHIM_FALLBACK names '{}'; the choices are allreduce, reduce, "
              "reducescatter, allgather, broadcast, alltoall, sendrecv and all", name);
      }
    }
    return bits;
  }();
  return mask;
}

bool reduces(Op::Kind kind) { return kind == Op::kAllReduce || kind == Op::kReduce || kind == Op::kReduceScatter; }

// Bytes the call moves as nccl-tests sizes it, for the log's size classes.
size_t call_bytes(const Op& op) {
  const size_t bytes = op.count * nccl_type_size(op.type);
  switch (op.kind) {
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll:
    case Op::kGather:
    case Op::kScatter: return bytes * static_cast<size_t>(op.comm->size);
    default: return bytes;
  }
}

// "[64 KiB, 128 KiB)": the power-of-two range `bytes` falls in.
std::string size_class(size_t bytes) {
  if (bytes == 0) return "0 B";
  int log = 0;
  while ((bytes >> (log + 1)) != 0) ++log;
  auto text = [](int power) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    return fmt::format("{} {}", 1ull << (power % 10), units[power / 10]);
  };
  return fmt::format("[{}, {})", text(log), text(log + 1));
}

}  // namespace

size_t nccl_type_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

Route route(const Op& op) {
  const ncclComm& comm = *op.comm;
  if (!comm.braid_on_cuda) {
    return {false, comm.braid ? "braid's CUDA backend cannot serve these ranks" : "the unique id was NCCL's"};
  }
  if ((forced_fallbacks() & kind_bit(op.kind)) != 0) return {false, "BRAID_SHIM_FALLBACK"};
  if (reduces(op.kind)) {
    DataType type;
    ReduceOp reduce_op;
    if (!detail::from_nccl(op.type, &type)) return {false, "datatype braid does not reduce"};
    if (!detail::from_nccl(op.op, &reduce_op)) return {false, "operator braid does not have"};
    if (!reduction_supported(type, reduce_op)) return {false, "a (datatype, operator) pair braid does not reduce"};
  }
  return {true, nullptr};
}

void log_route(const Op& op, const Route& route) {
  if (!log_enabled(LogLevel::kInfo)) return;
  static std::mutex mutex;
  static std::set<std::tuple<int, std::string, bool>> seen;
  const std::string size = size_class(call_bytes(op));
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!seen.emplace(static_cast<int>(op.kind), size, route.braid).second) return;
  }
  if (route.braid) {
    BRAID_INFO("braid shim: {} {} served by braid", op_name(op.kind), size);
  } else {
    BRAID_INFO("braid shim: {} {} served by nccl ({})", op_name(op.kind), size, route.reason);
  }
}

}  // namespace braid::shim
