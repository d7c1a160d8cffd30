// The arguments of the copy-engine send/recv kernels (send_recv_bulk.cu), plain data passed by value, and the
// layout they share with the host side (send_recv.cpp).
//
// A pair of a send/recv batch whose size takes the copy engines (the selection table's kSendRecv rows) moves as chunks
// of at most one slot each (bulk_chunk): the sender's copy engine writes chunk c into slot c mod 2 of the receiver's
// pipeline area, a small kernel then posts it (the chunk's header, then a count on the slot's data channel) and waits
// for the slot to come back; the receiver's kernels wait for that count, copy the slot out with SMs into the receive
// buffer and hand the slot back (a count on the slot's free channel). The copies go back to back on the caller's stream
// and the kernels on a second one: the kernel of chunk c runs while the engine writes chunk c + 1, and the copy of
// chunk c + 2 waits for it (its slot back), so the engine waits for no kernel launch. The last kernel waits for the
// last slot, so the area is free when the call ends. Both sides wait for exactly as many counts of a channel as the
// other posts, so the counters stay in step across calls (no slot reused early; counters never repeat).
//
// The slots are the sender's own phase-1 FIFO slots in the receiver's area: for channel b, the kFifoDepth
// pieces of (phase 1, channel b, sender) are one row of kFifoDepth × piece_bytes bytes, rows are
// world × kFifoDepth × piece_bytes apart, slot k is channels [32k, 32k + 32): one 2D copy fills it. The chunks'
// headers sit in the sender's first phase-0 piece (channel 0). Only this sender ever writes any of these, FIFO
// pieces or chunks. Before its first chunk the sender waits until the receiver consumed every FIFO piece it ever
// sent it (all of both phases' credits are back), so no earlier piece meets a chunk, and no later one either (the
// last kernel's wait).
//
// A header holds the pair's total bytes and the chunk's index, which the receiver checks against its own: a
// chunk of a pair whose sizes disagree is refused (nothing written, kErrorSizeMismatch recorded); where the two
// sides' chunk counts differ as well, the longer side's wait times out.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "kernels/pipeline_launch.hpp"

namespace braid::kernels {

constexpr int kBulkSlots = 2;
// Per slot (channel + slot): chunks posted into it (sender -> receiver), and times it was handed back.
constexpr int kBulkDataChannels = kBulkSet * kPipelineChannels;
constexpr int kBulkFreeChannels = kBulkDataChannels + kBulkSlots;
constexpr int kBulkRowsPerSlot = kPipelineChannels / kBulkSlots;

struct BulkHeader {
  uint64_t total_bytes;  // the pair's bytes, as the sender counts them
  uint64_t chunk;        // this chunk's index
};


// Where a sender's slots and headers sit in one rank's pipeline area (the host computes every address the
// kernels use).
struct BulkLayout {
  size_t row_bytes;     // kFifoDepth pieces
  size_t row_pitch;     // world × kFifoDepth pieces: from one channel's row to the next
  size_t slot_payload;  // kBulkRowsPerSlot rows

  static BulkLayout of(size_t piece_bytes, int world) {
    BulkLayout layout;
    layout.row_bytes = size_t(kFifoDepth) * piece_bytes;
    layout.row_pitch = size_t(world) * layout.row_bytes;
    layout.slot_payload = size_t(kBulkRowsPerSlot) * layout.row_bytes;
    return layout;
  }
  // Row 0 of slot `slot_index` of `sender` in the area starting at `area`.
  char* slot(char* area, int world, int sender, int slot_index) const {
    const size_t channel = size_t(kPipelineChannels) + size_t(slot_index) * kBulkRowsPerSlot;  // phase 1
    return area + (channel * world + sender) * row_bytes;
  }
  // The header of that slot: in the sender's phase-0 row of channel 0.
  struct BulkHeader* header(char* area, int sender, int slot_index) const;
};

inline BulkHeader* BulkLayout::header(char* area, int sender, int slot_index) const {
  return reinterpret_cast<BulkHeader*>(area + size_t(sender) * row_bytes) + slot_index;  // phase 0, channel 0
}

// The chunks of a pair, the same on both sides: whole slots, the last one what is left. Every chunk but the last
// starts and ends on a slot boundary (a multiple of 256 bytes), so no element straddles two and vectors stay
// aligned. Whole slots, as few chunks as can be: each chunk costs the engine a handover between streams, which
// weighs more than the copy out of the last chunk that nothing overlaps (docs/dev/selection.md).
struct BulkChunk {
  uint64_t offset, bytes;
};

inline uint64_t bulk_chunk_count(const BulkLayout& layout, uint64_t bytes) {
  return (bytes + layout.slot_payload - 1) / layout.slot_payload;
}

// Chunk c (< bulk_chunk_count) of a pair of `bytes`.
inline BulkChunk bulk_chunk(const BulkLayout& layout, uint64_t bytes, uint64_t c) {
  const uint64_t offset = c * layout.slot_payload;
  return {offset, bytes - offset < layout.slot_payload ? bytes - offset : layout.slot_payload};
}

// The sender's kernel (one block): with `drain`, waits until the receiver consumed every FIFO piece this rank
// sent it (before the pair's first chunk); otherwise posts chunk post_chunk, if any, into post_slot (its
// header into the receiver's slot, then a count on the slot's data channel), then waits for wait_slot, if any,
// to come back.
struct BulkSendStep {
  device::SignalPad pad;
  unsigned int collective;  // what errors and timeouts name: send/recv, or the collective whose pairs these are
  int peer;
  bool drain;
  int64_t post_chunk;    // -1: nothing to post
  int post_slot;
  BulkHeader* header;    // the receiver's header of post_slot (peer memory)
  int wait_slot;         // -1: nothing to wait for
  uint64_t total_bytes;
  uint64_t plan;         // this call's plan word (a peer in another collective is a mismatch)
};

// The receiver's kernel between two chunks (one thread): hands back the slot of the previous chunk (free_slot),
// then waits for chunk wait_chunk in its slot and checks its header (a refused chunk is recorded here).
struct BulkRecvStep {
  device::SignalPad pad;
  unsigned int collective;
  int peer;
  int free_slot;             // -1: nothing to hand back
  int64_t wait_chunk;        // -1: nothing to wait for
  const BulkHeader* header;  // this rank's slot header of wait_chunk
  uint64_t total_bytes;      // what this rank expects of the pair
  uint64_t plan;
};

// The receiver's copy of one chunk out of its slot (many blocks; no wait: BulkRecvStep ran before it).
struct BulkCopyOut {
  const char* slot;  // row 0 of the slot
  BulkLayout layout;
  char* recv;        // where this chunk's data goes
  size_t bytes;      // this chunk's data
  const BulkHeader* header;
  uint64_t total_bytes;
  uint64_t chunk;
};

// Reduce-scatter's and reduce's receiver (send_recv_bulk_reduce.cu): instead of copying a chunk out, reduces it
// with the same part of this rank's own input (reduce-scatter: its own block) into the output, element by element
// at the same offsets (so in place works too). The output is then final: on 2 ranks, the only ones these pairs
// serve, one peer's data completes it.
struct BulkReduceOut {
  const char* slot;  // row 0 of the slot
  BulkLayout layout;
  const char* own;   // this chunk's part of this rank's own input (reduce-scatter: its own block)
  char* recv;        // this chunk's part of the output
  size_t bytes;      // this chunk's data
  const BulkHeader* header;
  uint64_t total_bytes;
  uint64_t chunk;
  int world;  // what avg divides by
};

constexpr int kBulkCopyBlocksPerRow = 4;

}  // namespace braid::kernels
