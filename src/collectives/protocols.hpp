// The protocol registry: one row per (collective, protocol, buffer mode, what it needs of the buffers), with the
// gate that must be open for the row to run, the rule that sizes one launch, and the function that enqueues it. See NOTE [protocol registry].
#pragma once

#include <cstddef>
#include <span>

#include "braid/types.hpp"
#include "collectives/selection.hpp"

namespace braid::collectives {

// NOTE [protocol registry]
// The selection table (selection.cpp) names a protocol per size; the planner (planner.cpp) takes that protocol's
// row here, of those that serve the world (`worlds`) the first zero-copy row whose `needs` the buffers meet, else
// the staged one, and fills the plan from it; launch() runs the row's function. Adding a protocol is one row and
// one launch function; a protocol with no row cannot be chosen, BRAID_ALGO names only protocols with a row, and a
// plan without a row is kInternal, never a silent fallback. tests/cpu/test_protocols.cpp walks every row against
// the table, the planner and BRAID_ALGO at every world from 1 to 8.

// kAnnounced: eager calls whose kernel learns at its entry barrier where every rank's buffer lies (each rank
// announces an exposed range, or none) and runs zero copy or staged accordingly (announced_launch.hpp).
enum class BufferMode { kStagedCopy, kZeroCopy, kAnnounced };
const char* buffer_mode_name(BufferMode mode);  // "staged copy", "zero copy", "announced"

// What must hold for the row to be chosen at all (Gates, selection.hpp). One gate per (collective, protocol).
enum class Gate {
  kOpen,
  kMulticast,    // Gates::multicast
  kCopyEngines,  // Gates::copy_engines
  kLLFits,       // Gates::ll_fits
  kLL128,        // Gates::ll128
};
bool gate_open(Gate gate, const Gates& gates);

// What a zero-copy row needs of the buffers (BufferFacts, planner.hpp); a staged row needs nothing.
enum class Needs {
  kNothing,
  kPeersMap,        // every peer maps the buffers the kernels use
  kPeersMapOutput,  // every peer maps its output to the copy engines (not same-process, not in place)
  kPeersMapInPlace,  // an all-to-all in place whose buffer every peer maps to the copy engines (not same-process)
  kAnnouncedBuffers,  // the call announces its buffers (BufferFacts::announced): NOTE [announced calls] (planner.cpp)
};

// The world sizes a row's launch serves; the planner never takes a row for another (its launch would refuse it with
// kInternal).
enum class Worlds {
  kAny,
  kTwo,          // the one peer's buffer or pipeline area completes the call
  kTwoOrMore,    // every receive reduces into this rank's own block: one rank has none
  kMoreThanTwo,  // 2 ranks take the row of kTwo instead
};
bool serves_world(Worlds worlds, int world);
// Whether some row of (collective, algorithm) serves `world`: where none does, the protocol's gate stays shut.
bool some_row_serves(Collective collective, Algorithm algorithm, int world);

// The units (elements; bytes where the collective moves bytes) one launch carries (AreaCapacities, planner.hpp).
enum class ChunkRule {
  kWholeCall,              // one launch streams the whole call
  kLLPayload,              // a sender's LL slot
  kLL128Payload,           // a sender's LL128 slot
  kMulticastHalf,          // half the multicast region
  kMulticastHalfPerRank,   // half the multicast region shared by every rank's block, in 16-byte vectors
  kStagingHalf,            // half the staging area
  kStagingHalfPerRank,     // half the staging area shared by every rank's block, each rounded up to 256 bytes
};

struct CollectiveContext;
struct PlannedCall;  // launches.hpp
using LaunchFunction = void (*)(CollectiveContext& context, const PlannedCall& planned, Stream stream);

struct Protocol {
  Collective collective;
  Algorithm algorithm;  // its name (algorithm_name) is what BRAID_ALGO asks for
  BufferMode mode;
  Gate gate;
  Needs needs;
  ChunkRule chunk;
  // Null only where a call's pairs each take a protocol of their own inside one grouped launch (all-to-all-v,
  // send/recv: send_recv.cpp), never for a collective launched whole.
  LaunchFunction launch;
  Worlds worlds = Worlds::kAny;
};

std::span<const Protocol> protocols();

// The first row of (collective, algorithm), or null: the protocol does not serve the collective.
const Protocol* find_protocol(Collective collective, Algorithm algorithm);
// The gate of (collective, algorithm); kOpen where no row exists.
Gate gate_of(Collective collective, Algorithm algorithm);

}  // namespace braid::collectives
