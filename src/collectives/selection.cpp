#include "collectives/selection.hpp"

#include <algorithm>
#include <climits>
#include <sstream>

#include "collectives/protocols.hpp"
#include "core/error.hpp"

namespace braid {
namespace {

// kFp8: the fp8 types alone, whose reductions convert every element to float32 and back (other cut-offs).
enum class Types { kAny, kFp8 };

struct Row {
  Collective collective;
  size_t max_bytes;  // the row serves sizes up to this
  Algorithm algorithm;
  Buffers buffers = Buffers::kAny;  // kSymmetric: only where peers map the buffers
  int max_world = INT_MAX;
  Types types = Types::kAny;
};

bool serves_type(Types types, DataType type) {
  return types == Types::kAny || type == DataType::kFloat8E4M3 || type == DataType::kFloat8E5M2;
}

// THE table, first matching row wins; each cut-off is where two sweeps crossed (docs/dev/selection.md). LL rows
// never depend on the buffers: an LL poll notices another plan only where the peer runs a barrier kernel
// (docs/dev/protocol.md), so ranks must choose LL from the call alone.
constexpr Row kTable[] = {
    {Collective::kAllReduce, size_t(128) << 10, Algorithm::kLL, Buffers::kAny, 2},
    {Collective::kAllReduce, size_t(512) << 10, Algorithm::kLL128, Buffers::kAny, 2, Types::kFp8},
    {Collective::kAllReduce, size_t(1) << 20, Algorithm::kOneShot, Buffers::kAny, 2, Types::kFp8},
    {Collective::kAllReduce, size_t(1) << 20, Algorithm::kLL128, Buffers::kAny, 2},
    {Collective::kAllReduce, size_t(64) << 10, Algorithm::kLL, Buffers::kAny, 4},
    {Collective::kAllReduce, size_t(512) << 10, Algorithm::kLL128, Buffers::kAny, 4},
    {Collective::kAllReduce, size_t(256) << 10, Algorithm::kLL},
    {Collective::kAllReduce, SIZE_MAX, Algorithm::kMulticast},
    {Collective::kAllReduce, size_t(512) << 10, Algorithm::kLL},
    {Collective::kAllReduce, size_t(1) << 20, Algorithm::kOneShot, Buffers::kAny, 2},
    {Collective::kAllReduce, size_t(64) << 20, Algorithm::kTwoShot, Buffers::kSymmetric, 2},
    {Collective::kAllReduce, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kSymmetric, 2},
    {Collective::kAllReduce, SIZE_MAX, Algorithm::kTwoShot, Buffers::kSymmetric},
    {Collective::kAllReduce, size_t(16) << 20, Algorithm::kOneShot, Buffers::kAny, 2},
    {Collective::kAllReduce, SIZE_MAX, Algorithm::kTwoShot},
    {Collective::kReduce, size_t(512) << 10, Algorithm::kLL, Buffers::kAny, 2, Types::kFp8},
    {Collective::kReduce, size_t(256) << 10, Algorithm::kLL, Buffers::kAny, 2},
    {Collective::kReduce, size_t(128) << 10, Algorithm::kLL},
    {Collective::kReduce, size_t(256) << 10, Algorithm::kPipelined},  // more ranks: the chain below multicast's sizes
    {Collective::kReduce, SIZE_MAX, Algorithm::kMulticast},
    {Collective::kReduce, size_t(1) << 20, Algorithm::kStaged, Buffers::kAny, 2, Types::kFp8},
    {Collective::kReduce, SIZE_MAX, Algorithm::kPipelined},
    {Collective::kReduceScatter, size_t(512) << 10, Algorithm::kLL},
    {Collective::kReduceScatter, size_t(2) << 20, Algorithm::kStaged, Buffers::kAny, 2},
    {Collective::kReduceScatter, size_t(128) << 20, Algorithm::kPipelined, Buffers::kSymmetric, 2},
    {Collective::kReduceScatter, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kSymmetric, 2},
    {Collective::kReduceScatter, size_t(4) << 20, Algorithm::kStaged},
    {Collective::kReduceScatter, SIZE_MAX, Algorithm::kPipelined, Buffers::kSymmetric},
    {Collective::kReduceScatter, size_t(8) << 20, Algorithm::kStaged, Buffers::kAny, 2, Types::kFp8},
    {Collective::kReduceScatter, size_t(64) << 20, Algorithm::kPipelined, Buffers::kAny, 2},
    {Collective::kReduceScatter, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kAny, 2},
    {Collective::kReduceScatter, SIZE_MAX, Algorithm::kPipelined, Buffers::kAny, 2},
    {Collective::kReduceScatter, size_t(16) << 20, Algorithm::kStaged},
    {Collective::kReduceScatter, SIZE_MAX, Algorithm::kPipelined},
    {Collective::kAllGather, size_t(1) << 20, Algorithm::kLL, Buffers::kAny, 2},
    {Collective::kAllGather, size_t(512) << 10, Algorithm::kLL},
    {Collective::kAllGather, SIZE_MAX, Algorithm::kMulticast},
    {Collective::kAllGather, size_t(4) << 20, Algorithm::kStaged},
    {Collective::kAllGather, size_t(64) << 20, Algorithm::kPipelined, Buffers::kSymmetric},
    {Collective::kAllGather, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kSymmetric},
    {Collective::kAllGather, size_t(16) << 20, Algorithm::kStaged, Buffers::kAny, 2},
    {Collective::kAllGather, size_t(128) << 20, Algorithm::kPipelined, Buffers::kAny, 2},
    {Collective::kAllGather, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kAny, 2},
    {Collective::kAllGather, SIZE_MAX, Algorithm::kPipelined, Buffers::kAny, 2},
    {Collective::kAllGather, size_t(64) << 20, Algorithm::kStaged},
    {Collective::kAllGather, SIZE_MAX, Algorithm::kPipelined},
    {Collective::kBroadcast, size_t(512) << 10, Algorithm::kLL, Buffers::kAny, 2},
    {Collective::kBroadcast, size_t(16) << 20, Algorithm::kStaged, Buffers::kAny, 2},
    {Collective::kBroadcast, size_t(32) << 20, Algorithm::kPipelined, Buffers::kAny, 2},
    {Collective::kBroadcast, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kSymmetric, 2},
    {Collective::kBroadcast, size_t(128) << 20, Algorithm::kPipelined, Buffers::kAny, 2},
    {Collective::kBroadcast, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kAny, 2},
    {Collective::kBroadcast, SIZE_MAX, Algorithm::kPipelined, Buffers::kAny, 2},
    {Collective::kBroadcast, size_t(256) << 10, Algorithm::kLL},
    {Collective::kBroadcast, SIZE_MAX, Algorithm::kPipelined},
    {Collective::kAllToAll, size_t(2) << 20, Algorithm::kLL, Buffers::kAny, 2},
    {Collective::kAllToAll, size_t(512) << 10, Algorithm::kLL},
    {Collective::kAllToAll, size_t(32) << 20, Algorithm::kPipelined, Buffers::kSymmetric},
    {Collective::kAllToAll, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kSymmetric},
    {Collective::kAllToAll, size_t(64) << 20, Algorithm::kPipelined, Buffers::kAny, 2},
    {Collective::kAllToAll, size_t(32) << 20, Algorithm::kPipelined, Buffers::kAny},
    {Collective::kAllToAll, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kAny, 4},
    {Collective::kAllToAll, SIZE_MAX, Algorithm::kPipelined},
    {Collective::kAllToAllv, SIZE_MAX, Algorithm::kPipelined},
    // Send/recv: asked once per pair, with the pair's bytes (send_recv.cpp).
    {Collective::kSendRecv, size_t(256) << 10, Algorithm::kLL128},
    {Collective::kSendRecv, size_t(64) << 20, Algorithm::kPipelined},
    {Collective::kSendRecv, SIZE_MAX, Algorithm::kCopyEngine},
    {Collective::kSendRecv, SIZE_MAX, Algorithm::kPipelined},
};

constexpr Collective kCollectives[] = {Collective::kAllReduce, Collective::kReduce,   Collective::kReduceScatter,
                                       Collective::kAllGather, Collective::kBroadcast, Collective::kAllToAll,
                                       Collective::kAllToAllv, Collective::kSendRecv};
constexpr Algorithm kAlgorithms[] = {Algorithm::kLL,        Algorithm::kOneShot,    Algorithm::kTwoShot,
                                     Algorithm::kPipelined, Algorithm::kStaged,     Algorithm::kCopyEngine,
                                     Algorithm::kMulticast, Algorithm::kSplit,      Algorithm::kLL128};

// All-to-all-v's blocks whatever its size: a block is a channel paired with the same block of every peer, and
// ranks sending different amounts must launch alike.
constexpr int kAllToAllvBlocks = 32;
// The same for send/recv; 64 move large messages faster than 32 at no cost to small ones (docs/dev/selection.md).
constexpr int kSendRecvBlocks = kMaxBlocks;

// What BRAID_ALGO may ask for: the protocols with a row in the registry.
bool serves(Collective collective, Algorithm algorithm) {
  return collectives::find_protocol(collective, algorithm) != nullptr;
}

// Bytes a block (docs/dev/selection.md): LL 4 KB where every peer gets the whole buffer (a line a thread: a
// second would arrive that much later), else 8 KB; LL128 15 KiB (a round of its warps); loads from peers or
// staging 16 KB (more blocks keep more loads in flight), staged one block up to 32 KiB; else 64 KB.
int blocks_for(Algorithm algorithm, Collective collective, size_t bytes, Buffers buffers) {
  constexpr size_t kOneStagedBlockBytes = size_t(32) << 10;
  const bool staged = algorithm == Algorithm::kStaged || algorithm == Algorithm::kSplit;
  if (staged && bytes <= kOneStagedBlockBytes) return 1;
  const bool loads_from_peers = buffers == Buffers::kSymmetric || staged || algorithm == Algorithm::kOneShot;
  const bool whole_buffer_to_peers = collective == Collective::kAllReduce || collective == Collective::kReduce ||
                                     collective == Collective::kBroadcast;
  const size_t per_block = algorithm == Algorithm::kLL    ? (whole_buffer_to_peers ? size_t(4) : size_t(8)) << 10
                           : algorithm == Algorithm::kLL128 ? size_t(15) << 10
                           : loads_from_peers            ? size_t(16) << 10
                                                         : size_t(64) << 10;
  const size_t blocks = (bytes + per_block - 1) / per_block;
  return static_cast<int>(std::clamp<size_t>(blocks, 1, kMaxBlocks));
}

const char* short_name(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce: return "allreduce";
    case Collective::kReduce: return "reduce";
    case Collective::kReduceScatter: return "reducescatter";
    case Collective::kAllGather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kAllToAll: return "alltoall";
    case Collective::kAllToAllv: return "alltoallv";
    case Collective::kMoeDispatch: return "moedispatch";
    case Collective::kMoeCombine: return "moecombine";
    case Collective::kSendRecv: return "sendrecv";
  }
  return "?";
}

// BRAID_ALGO: comma-separated "collective=algorithm".
bool override_for(Collective collective, const std::string& text, Algorithm* algorithm) {
  std::stringstream entries(text);
  std::string entry;
  bool found = false;
  while (std::getline(entries, entry, ',')) {
    if (entry.empty()) continue;
    size_t eq = entry.find('=');
    if (eq == std::string::npos) {
      raise(ErrorCode::kInvalidArgument, "BRAID_ALGO='{}': entry '{}' is not collective=algorithm", text, entry);
    }
    std::string name = entry.substr(0, eq), value = entry.substr(eq + 1);
    const Collective* named = nullptr;
    for (const Collective& candidate : kCollectives) {
      if (name == short_name(candidate)) named = &candidate;
    }
    if (named == nullptr) {
      raise(ErrorCode::kInvalidArgument, "BRAID_ALGO='{}': unknown collective '{}' (allreduce, reduce, reducescatter, allgather, broadcast, alltoall, alltoallv, sendrecv)", text, name);
    }
    const Algorithm* parsed = nullptr;
    for (const Algorithm& candidate : kAlgorithms) {
      if (value == algorithm_name(candidate)) parsed = &candidate;
    }
    if (parsed == nullptr) {
      raise(ErrorCode::kInvalidArgument, "BRAID_ALGO='{}': unknown algorithm '{}' (ll, ll128, oneshot, twoshot, pipelined, staged, copyengine, multicast, split)", text, value);
    }
    if (!serves(*named, *parsed)) raise(ErrorCode::kInvalidArgument, "BRAID_ALGO='{}': {} cannot run as {}", text, name, value);
    if (*named == collective) {
      *algorithm = *parsed;
      found = true;
    }
  }
  return found;
}

}  // namespace

const char* collective_name(unsigned int collective) {
  switch (static_cast<Collective>(collective)) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kReduce: return "reduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllGather: return "all_gather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kAllToAll: return "all_to_all";
    case Collective::kAllToAllv: return "all_to_allv";
    case Collective::kMoeDispatch: return "moe_dispatch";
    case Collective::kMoeCombine: return "moe_combine";
    case Collective::kSendRecv: return "send_recv";
  }
  return "collective";
}

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kLL: return "ll";
    case Algorithm::kLL128: return "ll128";
    case Algorithm::kOneShot: return "oneshot";
    case Algorithm::kTwoShot: return "twoshot";
    case Algorithm::kPipelined: return "pipelined";
    case Algorithm::kStaged: return "staged";
    case Algorithm::kCopyEngine: return "copyengine";
    case Algorithm::kSplit: return "split";
    case Algorithm::kMulticast: return "multicast";
  }
  return "?";
}

namespace {

bool gate_open(Collective collective, Algorithm algorithm, const Gates& gates) {
  return collectives::gate_open(collectives::gate_of(collective, algorithm), gates);
}

}  // namespace

Choice select_algorithm(Collective collective, size_t bytes, int world, DataType type, const std::string& override_text,
                        Buffers buffers, Gates gates) {
  Algorithm algorithm = Algorithm::kStaged;
  for (const Row& row : kTable) {
    if (row.collective == collective && bytes <= row.max_bytes && world <= row.max_world &&
        (row.buffers == Buffers::kAny || row.buffers == buffers) && serves_type(row.types, type) &&
        gate_open(collective, row.algorithm, gates)) {
      algorithm = row.algorithm;
      break;
    }
  }
  Algorithm forced = algorithm;
  if (!override_text.empty() && override_for(collective, override_text, &forced) && !gate_open(collective, forced, gates)) {
    forced = forced != Algorithm::kMulticast && serves(collective, Algorithm::kPipelined) ? Algorithm::kPipelined
                                                                                            : algorithm;
  }
  algorithm = forced;
  if (collective == Collective::kAllToAllv) return Choice{algorithm, kAllToAllvBlocks};
  if (collective == Collective::kSendRecv) return Choice{algorithm, kSendRecvBlocks};
  return Choice{algorithm, blocks_for(algorithm, collective, bytes, buffers)};
}

bool runs_ll(Collective collective, size_t bytes, int world, DataType type, const std::string& override_text,
             Gates gates) {
  gates.copy_engines = false;
  const Algorithm algorithm =
      select_algorithm(collective, bytes, world, type, override_text, Buffers::kAny, gates).algorithm;
  return algorithm == Algorithm::kLL || algorithm == Algorithm::kLL128;
}

}  // namespace braid
