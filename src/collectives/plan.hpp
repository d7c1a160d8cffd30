// What one rank's kernels will do for a call, as one 64-bit word that the ranks compare at the call's first
// barrier (device::barrier's `plan`): ranks that chose another algorithm, launch width or buffer kind for the
// same call, or that passed another size, datatype, op, root or symmetric-buffer offset, fail the call with
// kMismatch before they touch each other's data.
//
// Layout: bits 60-63 the algorithm + 1 (15: the barrier before a buffer's exchange, exchange_plan_word), 56-59 the
// collective, 55 zero copy (the kernels read or write the peers' own buffers), 48-54 the blocks of a launch, 0-47 a
// hash of the call's arguments and of the identity of every buffer the peers map (the same on every rank that passes
// the same symmetric or registered buffer).
#pragma once

#include <cstdint>
#include <string>

#include "collectives/selection.hpp"

namespace braid::collectives {

struct PlanArguments {
  Collective collective;
  Algorithm algorithm;
  bool zero_copy;
  int blocks;
  uint64_t count;       // elements (or bytes) as the call counts them
  uint64_t type;        // DataType
  uint64_t op;          // ReduceOp, or 0
  int64_t root;         // or -1
  uint64_t send_identity;  // PeerRange::identity of a buffer the peers map, else 0
  uint64_t recv_identity;
};

uint64_t plan_word(const PlanArguments& plan);

// Which buffer of a call an exchange maps (exchange_plan_word).
enum class ExchangedBuffer { kSend = 1, kRecv = 2 };
// Why the buffer's mappings are exchanged: the first use of a registered buffer at an address, or the automatic
// registration of a buffer that is neither symmetric nor registered, in a call being captured into a CUDA graph.
enum class ExchangeKind { kRegistered = 0, kAutomatic = 1 };

// The plan of the barrier that precedes an exchange of a buffer's mappings (on the host): a rank that does not
// join the same kind of exchange runs the call's kernels (or another exchange) instead, and the two plans differ,
// so both fail with kMismatch rather than one waiting in an exchange the other never joins.
uint64_t exchange_plan_word(Collective collective, ExchangedBuffer buffer, uint64_t bytes,
                            ExchangeKind kind = ExchangeKind::kRegistered);

// "all_reduce two_shot zero copy, 32 blocks": what a word says in words (the hash only as "arguments 0x...").
std::string describe_plan(uint64_t word);

}  // namespace braid::collectives
