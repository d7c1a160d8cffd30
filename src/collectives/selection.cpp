#include "collectives/selection.hpp"

#include <algorithm>
#include <climits>
#include <sstream>

#include "core/error.hpp"

namespace braid {
namespace {

struct Row {
  Collective collective;
  size_t max_bytes;  // the row serves sizes up to this
  Algorithm algorithm;
  Buffers buffers = Buffers::kAny;  // kSymmetric: only for symmetric buffers (zero copy); kAny: for every buffer
  int max_world = INT_MAX;          // the row serves world sizes up to this
};

// THE table, first matching row wins. Cut-offs are the crossings of the per-algorithm sweeps of 2026-11-22
// (4×H200, bf16 with CUDA graphs for all-reduce, float32 for the rest; bench/results/*-allreduce-algos.txt and
// *-tuning.txt):
//   - LL needs no barrier but sends every byte twice its size to every peer: it wins through 256 KiB on any
//     buffer, through 512 KiB on buffers peers cannot map (one shot, staged or zero copy, never beats it).
//   - LL rows never depend on the buffers: ranks choose between LL lines and barrier kernels from the call
//     alone (size, world, datatype, BRAID_ALGO), since LL polls compare no plans (a rank whose own buffers
//     picked a barrier kernel would leave its peer polling until the timeout). So all-reduce takes LL through
//     512 KiB on symmetric buffers too. On 2 ranks LL beats the zero-copy two shot there anyway (7.7 vs 9.4 µs
//     at 512 KiB, bf16, graphs, bench/results/*-x2-registered-vs-cudamalloc-*); on 4 ranks the two shot was
//     faster at 512 KiB (12.5 vs 14.7 µs), which symmetric buffers give up from 256 to 512 KiB.
//   - Any buffer: staged one shot wins at 1 MiB, the pipelined two shot (FIFO pushes) beyond. On 2 ranks a one
//     shot moves as many bytes over NVLink as a two shot (each rank reads its peer's whole input) with one
//     barrier instead of a pipeline, and wins through 16 MiB (2×H200, bf16, graphs,
//     bench/results/*-x2-allreduce-oneshot-two-ranks.txt: 13.4 vs 22.5 µs at 2 MiB, 34.3 vs 42.0 at 8 MiB, 67.6
//     vs 70.7 at 16 MiB; the two shot from 32 MiB, 124 vs 135).
//   - Symmetric buffers: the zero-copy two shot wins beyond LL's sizes (15.9 µs at 1 MiB against 20.3 for
//     zero-copy one shot, 318 GB/s busbw at 512 MiB against 301 pipelined).
//   - Reduce-scatter: pipelined and staged tie at 16 MiB, pipelined wins beyond (262 vs 186 GB/s at 256 MiB).
//   - All-gather: staged wins through 64 MiB, pipelined beyond (314 vs 286 GB/s at 256 MiB).
//   - Reduce-scatter and all-gather on buffers peers map (the input, resp. the output): "pipelined" runs the
//     zero-copy kernels (loads from the peers' inputs, resp. stores into their outputs; no staging, no FIFO)
//     beyond 4 MiB: staged wins below (one barrier a call against two), they tie at 4 MiB, zero copy wins
//     beyond (2×H200, float32, graphs, bench/results/*-x2-zero-copy-rs-ag.txt: reduce-scatter 32.9 vs 46.3 µs
//     at 16 MiB, 408 vs 682 at 256 MiB; all-gather 31.5 vs 36.8, 390 vs 576). Not yet swept on 4 ranks.
//   - All-to-all: LL lines through 512 KiB (no barrier, no signal); beyond, FIFO pushes on any buffer, and on
//     symmetric buffers direct stores into the peers' outputs while a call is small (the copy engines'
//     launches and barrier kernels cost more than they save), copy engines pulling from the peers' inputs
//     beyond (a copy engine moves ~397 GB/s a link, SM stores to three peers ~344). Sweeps on 2×H200
//     (2026-11-22, float32, graphs; bench/results/*-x2-alltoall-*): LL 3.4 µs at 8 KiB and 5.0 at 512 KiB
//     (FIFO pushes 9.3 / 11.7, stores 6.7 / 8.4); stores beat copy engines through 32 MiB (63 vs 71 µs),
//     copy engines win at 256 MiB (447 µs, 601 GB/s algbw). Not yet swept on 4 ranks. On 2 ranks LL also
//     serves 1 and 2 MiB (a block of up to 1 MiB, what an LL slot holds; bench/results/*-x2-alltoall-ll-2mib.txt):
//     7.1 / 10.9 µs against 13.9 / 15.5 for FIFO pushes, 9.4 / 10.6 for direct stores on symmetric buffers and
//     NCCL's 12.3 / 14.7. On more ranks LL sends more bytes for the same size and was not measured there.
//   - Reduce-scatter and all-gather by LL (each peer's block, resp. the input, to every peer as LL lines; no
//     barrier): on 2×H200 (float32, graphs, bench/results/*-x2-ll-rs-ag.txt) reduce-scatter 3.1 µs at 8 KiB,
//     5.3 at 512 KiB and 8.1 at 1 MiB against staged 6.0 / 8.4 / 9.2 and NCCL's 5.8 / 7.7 / 9.6; staged wins
//     from 2 MiB (10.8 vs 11.3). All-gather 3.1 / 5.1 / 7.2 / 10.2 at 8 KiB / 512 KiB / 1 / 2 MiB against staged
//     5.9 / 8.1 / 8.9 / 10.5 and NCCL's 6.0 / 8.1 / 10.5 / 16.2; staged from 4 MiB. On more ranks LL moves as
//     many bytes as all-to-all's LL at the same size, whose 512 KiB cut-off they share; not measured there.
//   - Reduce by LL (the LL all-reduce, stored by the root alone): on 2×H200 (float32, graphs,
//     bench/results/*-x2-ll-reduce.txt) 3.5 µs at 8 KiB, 4.4 at 64 KiB, 7.6 at 512 KiB against staged 5.5 / 8.7 /
//     9.8 and NCCL's 5.0 / 5.3 / 7.6; staged wins from 1 MiB (10.5 vs 11.0). It moves what LL all-reduce moves,
//     so on more ranks it takes all-reduce's 256 KiB cut-off; not measured there.
//   - Broadcast by LL (the root's input to every peer as LL lines, tokens between the others; no barrier): on
//     2×H200 (float32, graphs, bench/results/*-x2-broadcast-ll-compare-nccl.txt) 2.8 µs at 8 KiB, 3.6 at
//     128 KiB, 5.3 at 512 KiB, 8.1 at 1 MiB against staged 5.0 / 5.9 / 6.9 / 8.4 and NCCL's 5.6 / 6.0 / 8.1 /
//     11.3; staged wins from 2 MiB (11.3 vs 16.0). The root sends every byte twice to each of W-1 peers, a
//     staged root serves it once to each: the time LL saves (~2 µs of barrier) pays for the extra bytes up to
//     about 1 MiB / (W-1), hence 256 KiB beyond 2 ranks (not measured there).
//   - Reduce beyond 16 MiB: the pipelined two shot whose gather goes to the root alone (the root takes in
//     (world-1)/world of the buffer a phase, by stores, where staged has it load world-1 whole buffers): on
//     2×H200 (float32, bench/results/*-x2-pipelined-reduce-compare-nccl.txt) they tie at 16 MiB (63 µs), then
//     108 vs 129 µs at 32 MiB and 775 vs 1026 at 256 MiB (NCCL 737). On more ranks staged loads more bytes
//     still; not measured there.
//   - 2 ranks, any buffer (bench/results/*-x2-large-sweeps-a217e81.txt, float32): the pipelined reduce-scatter
//     beats staged from 16 MiB (36.4 vs 45.8 µs, graphs), the pipelined all-gather from 32 MiB (71.8 vs 73.9).
//   - Broadcast beyond 16 MiB: the pipelined all-gather with the root alone pushing (stores into the peers'
//     FIFOs, where staged has every peer load the root's staging chunk by chunk): on 2×H200 (float32,
//     bench/results/*-x2-pipelined-broadcast-compare-nccl.txt) 99.7 vs 104.9 µs at 32 MiB, 799 vs 846 at 256 MiB
//     (NCCL 751); staged 52.6 vs 54.2 at 16 MiB. Not measured on more ranks.
//   - Copy engines on buffers peers map (copy_engine.hpp; 2×H200, float32, symmetric buffers,
//     bench/results/*-x2-own-copy-16.txt, with the own block's copy on 16 blocks): all-gather pushes beat the
//     zero-copy stores beyond 64 MiB (104.2 vs 102.6 µs at 64 MiB, 188.7 vs 198.2 at 128 MiB, 702 vs 762 at
//     512 MiB), broadcast pushes beat the pipelined stores beyond 32 MiB (100.6 vs 98.5 µs at 32 MiB, 184.4 vs
//     192.7 at 64 MiB, 1368 vs 1534 at 512 MiB). On more ranks the broadcast root
//     would push world-1 copies of its input one after another, so its row is for 2 ranks; the all-gather
//     row holds for every world (each rank pushes one block to each peer, one peer at a time, every GPU
//     taking one copy a step): not measured there. Reductions have no copy-engine algorithm: pulls into
//     staging and a local reduction lost to the zero-copy loads on 2 ranks (reduce-scatter 841 vs 806 µs at
//     512 MiB) and tied the pipelined reduce (1517 vs 1535).
//   - All-to-all-v: FIFO pushes (no rank knows where its data sits in a peer's buffer, so nothing is direct).
//   - Multicast (all-reduce, reduce, all-gather beyond LL's sizes) is never measured: it runs only where
//     BRAID_ENABLE_MULTICAST opened it, never on the shared hosts braid is measured on. Its rows follow what it
//     moves: each byte crosses NVLink once each way, where the unicast two shot sends 2 (world - 1) / world of
//     the buffer; NCCL takes NVLS for the same collectives from mid sizes (docs/multicast.md).
constexpr Row kTable[] = {
    {Collective::kAllReduce, size_t(256) << 10, Algorithm::kLL},
    {Collective::kAllReduce, SIZE_MAX, Algorithm::kMulticast},
    {Collective::kAllReduce, size_t(512) << 10, Algorithm::kLL},
    {Collective::kAllReduce, SIZE_MAX, Algorithm::kTwoShot, Buffers::kSymmetric},
    {Collective::kAllReduce, size_t(16) << 20, Algorithm::kOneShot, Buffers::kAny, 2},
    {Collective::kAllReduce, size_t(1) << 20, Algorithm::kOneShot},
    {Collective::kAllReduce, SIZE_MAX, Algorithm::kTwoShot},
    {Collective::kReduce, size_t(512) << 10, Algorithm::kLL, Buffers::kAny, 2},
    {Collective::kReduce, size_t(256) << 10, Algorithm::kLL},
    {Collective::kReduce, SIZE_MAX, Algorithm::kMulticast},
    {Collective::kReduce, size_t(16) << 20, Algorithm::kStaged},
    {Collective::kReduce, SIZE_MAX, Algorithm::kPipelined},
    {Collective::kReduceScatter, size_t(1) << 20, Algorithm::kLL, Buffers::kAny, 2},
    {Collective::kReduceScatter, size_t(512) << 10, Algorithm::kLL},
    {Collective::kReduceScatter, size_t(4) << 20, Algorithm::kStaged},
    {Collective::kReduceScatter, SIZE_MAX, Algorithm::kPipelined, Buffers::kSymmetric},
    {Collective::kReduceScatter, size_t(8) << 20, Algorithm::kStaged, Buffers::kAny, 2},
    {Collective::kReduceScatter, SIZE_MAX, Algorithm::kPipelined, Buffers::kAny, 2},
    {Collective::kReduceScatter, size_t(16) << 20, Algorithm::kStaged},
    {Collective::kReduceScatter, SIZE_MAX, Algorithm::kPipelined},
    {Collective::kAllGather, size_t(2) << 20, Algorithm::kLL, Buffers::kAny, 2},
    {Collective::kAllGather, size_t(512) << 10, Algorithm::kLL},
    {Collective::kAllGather, SIZE_MAX, Algorithm::kMulticast},
    {Collective::kAllGather, size_t(4) << 20, Algorithm::kStaged},
    {Collective::kAllGather, size_t(64) << 20, Algorithm::kPipelined, Buffers::kSymmetric},
    {Collective::kAllGather, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kSymmetric},
    {Collective::kAllGather, size_t(16) << 20, Algorithm::kStaged, Buffers::kAny, 2},
    {Collective::kAllGather, SIZE_MAX, Algorithm::kPipelined, Buffers::kAny, 2},
    {Collective::kAllGather, size_t(64) << 20, Algorithm::kStaged},
    {Collective::kAllGather, SIZE_MAX, Algorithm::kPipelined},
    {Collective::kBroadcast, size_t(1) << 20, Algorithm::kLL, Buffers::kAny, 2},
    {Collective::kBroadcast, size_t(256) << 10, Algorithm::kLL},
    {Collective::kBroadcast, size_t(16) << 20, Algorithm::kStaged},
    {Collective::kBroadcast, size_t(32) << 20, Algorithm::kPipelined},
    {Collective::kBroadcast, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kSymmetric, 2},
    {Collective::kBroadcast, SIZE_MAX, Algorithm::kPipelined},
    {Collective::kAllToAll, size_t(2) << 20, Algorithm::kLL, Buffers::kAny, 2},
    {Collective::kAllToAll, size_t(512) << 10, Algorithm::kLL},
    {Collective::kAllToAll, size_t(32) << 20, Algorithm::kPipelined, Buffers::kSymmetric},
    {Collective::kAllToAll, SIZE_MAX, Algorithm::kCopyEngine, Buffers::kSymmetric},
    {Collective::kAllToAll, SIZE_MAX, Algorithm::kPipelined},
    {Collective::kAllToAllv, SIZE_MAX, Algorithm::kPipelined},
    // Send/recv: the table is asked once per pair, with the pair's bytes (send_recv.cpp); copy engines where
    // they reach the peer's pipeline area (always: it is the communicator's own symmetric memory).
    {Collective::kSendRecv, size_t(64) << 20, Algorithm::kPipelined},
    {Collective::kSendRecv, SIZE_MAX, Algorithm::kCopyEngine},
    {Collective::kSendRecv, SIZE_MAX, Algorithm::kPipelined},
};

// Which algorithms each collective can run (what BRAID_ALGO may ask for).
struct Serves {
  Collective collective;
  Algorithm algorithm;
};
constexpr Serves kServes[] = {
    {Collective::kAllReduce, Algorithm::kLL},         {Collective::kAllReduce, Algorithm::kOneShot},
    {Collective::kAllReduce, Algorithm::kTwoShot},    {Collective::kReduce, Algorithm::kStaged},
    {Collective::kReduceScatter, Algorithm::kPipelined}, {Collective::kAllGather, Algorithm::kPipelined},
    {Collective::kReduceScatter, Algorithm::kStaged},    {Collective::kAllGather, Algorithm::kStaged},
    {Collective::kBroadcast, Algorithm::kStaged},        {Collective::kAllToAll, Algorithm::kPipelined},
    {Collective::kAllToAll, Algorithm::kCopyEngine},     {Collective::kAllToAllv, Algorithm::kPipelined},
    {Collective::kAllToAll, Algorithm::kLL},          {Collective::kReduceScatter, Algorithm::kLL},
    {Collective::kAllGather, Algorithm::kLL},         {Collective::kReduce, Algorithm::kLL},
    {Collective::kBroadcast, Algorithm::kLL},          {Collective::kReduce, Algorithm::kPipelined},
    {Collective::kBroadcast, Algorithm::kPipelined},    {Collective::kAllGather, Algorithm::kCopyEngine},
    {Collective::kBroadcast, Algorithm::kCopyEngine},   {Collective::kAllReduce, Algorithm::kMulticast},
    {Collective::kReduce, Algorithm::kMulticast},       {Collective::kAllGather, Algorithm::kMulticast},
    {Collective::kSendRecv, Algorithm::kPipelined},     {Collective::kSendRecv, Algorithm::kCopyEngine},
};

constexpr Collective kCollectives[] = {Collective::kAllReduce, Collective::kReduce,   Collective::kReduceScatter,
                                       Collective::kAllGather, Collective::kBroadcast, Collective::kAllToAll,
                                       Collective::kAllToAllv, Collective::kSendRecv};
constexpr Algorithm kAlgorithms[] = {Algorithm::kLL,        Algorithm::kOneShot,    Algorithm::kTwoShot,
                                     Algorithm::kPipelined, Algorithm::kStaged,     Algorithm::kCopyEngine,
                                     Algorithm::kMulticast};

// All-to-all-v launches this many blocks whatever its size: a block is a channel paired with the same block of
// every peer, and ranks that send different amounts must still launch the same number.
constexpr int kAllToAllvBlocks = 32;
// Send/recv batches launch this many, whatever their sizes, for the same reason. Every block a channel: on
// 2×H200 (float32, to the next rank and from the previous one, braid-bench sendrecv) 64 blocks against 32 took
// 23.9 against 27.4 µs at 4 MiB, 68.4 against 77.2 at 16 MiB, 235 against 272 at 64 MiB and 884 against 1036 at
// 256 MiB, and the same within 0.1 µs from 8 KiB to 1 MiB in graphs. Not measured on 4 ranks.
constexpr int kSendRecvBlocks = kMaxBlocks;

bool serves(Collective collective, Algorithm algorithm) {
  for (const Serves& entry : kServes) {
    if (entry.collective == collective && entry.algorithm == algorithm) return true;
  }
  return false;
}

// Blocks (channels) of one launch: enough to keep NVLink busy for large messages, few for small ones (each
// block is a channel of signals with every peer). LL blocks carry 8 KB of payload each, zero-copy blocks and
// the staged one shot's 16 KB (their loads come straight from peers' memory or staging: more blocks keep more
// of them in flight; one shot 16 KB against 64 KB on 2×H200, bf16, graphs: 10.5 → 8.9 µs at 512 KiB, 11.4 →
// 10.1 at 1 MiB, 14.0 → 13.3 at 2 MiB, equal from 4 MiB; not measured on 4 ranks), staged ones 16 KB
// beyond 32 KiB and one block through it, the others 64 KB. Staged, 16 KB against 64 KB (2×H200, float32,
// graphs, bench/results/*-x2-staged-blocks.txt): broadcast 7.1 → 6.0 µs at 64 KiB and 7.7 → 6.1 at 128 KiB,
// staged reduce 9.4 → 7.5 and all-gather 7.8 → 6.9 at 128 KiB, equal from 4 MiB (64 blocks either way); at
// 32 KiB a second block cost 0.2–0.5 µs. Not measured on 4 ranks.
int blocks_for(Algorithm algorithm, size_t bytes, Buffers buffers) {
  constexpr size_t kOneStagedBlockBytes = size_t(32) << 10;
  if (algorithm == Algorithm::kStaged && bytes <= kOneStagedBlockBytes) return 1;
  const bool loads_from_peers =
      buffers == Buffers::kSymmetric || algorithm == Algorithm::kStaged || algorithm == Algorithm::kOneShot;
  const size_t per_block = algorithm == Algorithm::kLL ? size_t(8) << 10
                           : loads_from_peers          ? size_t(16) << 10
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
      raise(ErrorCode::kInvalidArgument, "BRAID_ALGO='{}': unknown algorithm '{}' (ll, oneshot, twoshot, pipelined, staged, copyengine, multicast)", text, value);
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
    case Algorithm::kOneShot: return "oneshot";
    case Algorithm::kTwoShot: return "twoshot";
    case Algorithm::kPipelined: return "pipelined";
    case Algorithm::kStaged: return "staged";
    case Algorithm::kCopyEngine: return "copyengine";
    case Algorithm::kMulticast: return "multicast";
  }
  return "?";
}

namespace {

bool gate_open(Algorithm algorithm, const Gates& gates) {
  switch (algorithm) {
    case Algorithm::kMulticast: return gates.multicast;
    case Algorithm::kCopyEngine: return gates.copy_engines;
    case Algorithm::kLL: return gates.ll_fits;
    default: return true;
  }
}

}  // namespace

Choice select_algorithm(Collective collective, size_t bytes, int world, DataType, const std::string& override_text,
                        Buffers buffers, Gates gates) {
  Algorithm algorithm = Algorithm::kStaged;
  for (const Row& row : kTable) {
    if (row.collective == collective && bytes <= row.max_bytes && world <= row.max_world &&
        (row.buffers == Buffers::kAny || row.buffers == buffers) && gate_open(row.algorithm, gates)) {
      algorithm = row.algorithm;
      break;
    }
  }
  Algorithm forced = algorithm;
  if (!override_text.empty() && override_for(collective, override_text, &forced) && !gate_open(forced, gates)) {
    // A multicast asked for where it cannot run takes the table's choice; any other protocol, FIFO pushes.
    forced = forced != Algorithm::kMulticast && serves(collective, Algorithm::kPipelined) ? Algorithm::kPipelined
                                                                                            : algorithm;
  }
  algorithm = forced;
  if (collective == Collective::kAllToAllv) return Choice{algorithm, kAllToAllvBlocks};
  if (collective == Collective::kSendRecv) return Choice{algorithm, kSendRecvBlocks};
  return Choice{algorithm, blocks_for(algorithm, bytes, buffers)};
}

bool runs_ll(Collective collective, size_t bytes, int world, DataType type, const std::string& override_text,
             Gates gates) {
  gates.copy_engines = false;
  return select_algorithm(collective, bytes, world, type, override_text, Buffers::kAny, gates).algorithm ==
         Algorithm::kLL;
}

}  // namespace braid
