#include "collectives/selection.hpp"

#include <algorithm>
#include <sstream>

#include "core/error.hpp"
#include "sync/device_sync.hpp"

namespace braid {
namespace {

struct Row {
  Collective collective;
  size_t max_bytes;  // the row serves sizes up to this
  Algorithm algorithm;
};

// THE table. One shot reads every peer's whole buffer: fewest barriers, best below a few hundred KB.
// Two shot moves each byte over NVLink about half as often: best for large all-reduces.
constexpr Row kTable[] = {
    {Collective::kAllReduce, size_t(256) << 10, Algorithm::kOneShot},
    {Collective::kAllReduce, SIZE_MAX, Algorithm::kTwoShot},
    {Collective::kReduce, SIZE_MAX, Algorithm::kStaged},
    {Collective::kReduceScatter, SIZE_MAX, Algorithm::kStaged},
    {Collective::kAllGather, SIZE_MAX, Algorithm::kStaged},
    {Collective::kBroadcast, SIZE_MAX, Algorithm::kStaged},
};

// Enough blocks to keep NVLink busy for large messages, few for small ones (each block is a channel of
// barriers with every peer).
int blocks_for(size_t bytes) {
  constexpr size_t kBytesPerBlock = size_t(64) << 10;
  size_t blocks = (bytes + kBytesPerBlock - 1) / kBytesPerBlock;
  return static_cast<int>(std::clamp<size_t>(blocks, 1, 64));
}

const char* short_name(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce: return "allreduce";
    case Collective::kReduce: return "reduce";
    case Collective::kReduceScatter: return "reducescatter";
    case Collective::kAllGather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
  }
  return "?";
}

// BRAID_ALGO: comma-separated "collective=algorithm"; only algorithms that serve the collective are accepted.
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
    if (name != "allreduce" && name != "reduce" && name != "reducescatter" && name != "allgather" && name != "broadcast") {
      raise(ErrorCode::kInvalidArgument, "BRAID_ALGO='{}': unknown collective '{}' (allreduce, reduce, reducescatter, allgather, broadcast)", text, name);
    }
    Algorithm parsed;
    if (value == "oneshot") parsed = Algorithm::kOneShot;
    else if (value == "twoshot") parsed = Algorithm::kTwoShot;
    else if (value == "staged") parsed = Algorithm::kStaged;
    else raise(ErrorCode::kInvalidArgument, "BRAID_ALGO='{}': unknown algorithm '{}' (oneshot, twoshot, staged)", text, value);
    const bool allreduce = name == "allreduce";
    if (allreduce == (parsed == Algorithm::kStaged)) {
      raise(ErrorCode::kInvalidArgument, "BRAID_ALGO='{}': {} cannot run as {}", text, name, value);
    }
    if (name == short_name(collective)) {
      *algorithm = parsed;
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
  }
  return "collective";
}

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kOneShot: return "oneshot";
    case Algorithm::kTwoShot: return "twoshot";
    case Algorithm::kStaged: return "staged";
  }
  return "?";
}

Choice select_algorithm(Collective collective, size_t bytes, int world, DataType, const std::string& override_text) {
  (void)world;  // every row serves every world size today; the column is here for the tuning to come
  Choice choice{Algorithm::kStaged, std::min(blocks_for(bytes), DeviceSync::kMaxChannels)};
  for (const Row& row : kTable) {
    if (row.collective == collective && bytes <= row.max_bytes) {
      choice.algorithm = row.algorithm;
      break;
    }
  }
  if (!override_text.empty()) override_for(collective, override_text, &choice.algorithm);
  return choice;
}

}  // namespace braid
