// Arguments and layout of the copy-engine send/recv (send_recv.cpp, send_recv_bulk.cu): the sender's engine
// writes chunks into two slots of the receiver's pipeline area (its phase-1 FIFO pieces, once the receiver drained
// them), each posted by a data count and handed back by a free count. Protocol: docs/dev/protocol.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/device/sync_device.hpp"
#include "kernels/pipeline_launch.hpp"

namespace braid::kernels {

constexpr int kBulkSlots = 2;
// + slot: chunks posted into it, and its hand-backs.
constexpr int kBulkDataChannels = kBulkSet * kPipelineChannels;
constexpr int kBulkFreeChannels = kBulkDataChannels + kBulkSlots;
constexpr int kBulkRowsPerSlot = kPipelineChannels / kBulkSlots;

struct BulkHeader {
  uint64_t total_bytes;
  uint64_t chunk;
};

struct BulkLayout {
  size_t row_bytes;     // kFifoDepth pieces
  size_t row_pitch;     // from one channel's row to the next
  size_t slot_payload;
  size_t window = 0;    // window_of: where the slots begin, each one contiguous run; 0: the rows' layout

  static BulkLayout of(size_t piece_bytes, int world) {
    BulkLayout layout;
    layout.row_bytes = size_t(kFifoDepth) * piece_bytes;
    layout.row_pitch = size_t(world) * layout.row_bytes;
    layout.slot_payload = size_t(kBulkRowsPerSlot) * layout.row_bytes;
    return layout;
  }
  // NOTE [contiguous window]
  // An area of `area_bytes` that one sender fills (2 ranks) as two headers' rows and then two contiguous slots:
  // each chunk then moves in one copy, and chunks may be as large as the engines need (each copy costs an engine a
  // fixed time; 64 MiB chunks measured best for the pushes into the peer's output, docs/dev/selection.md), while
  // a pair of `chunked_bytes` still makes at least two, so that one chunk's reduction runs beside the next's copy.
  // Rows stay kBulkRowsPerSlot a slot, of a multiple of 256 bytes. slot_payload 0: the area has no room.
  static BulkLayout window_of(size_t area_bytes, size_t chunked_bytes) {
    constexpr size_t kMaxSlotBytes = size_t(64) << 20;
    constexpr size_t kRowAlignment = 256;
    constexpr size_t kRows = kBulkRowsPerSlot;
    constexpr size_t kHeaderRows = 2;  // one a rank, where header() puts them
    const size_t fits = area_bytes / (kHeaderRows + kBulkSlots * kRows) / kRowAlignment * kRowAlignment;
    const size_t half = (chunked_bytes + 1) / 2;
    size_t row = (half + kRows * kRowAlignment - 1) / (kRows * kRowAlignment) * kRowAlignment;
    row = row < kRowAlignment ? kRowAlignment : row;
    row = row < kMaxSlotBytes / kRows ? row : kMaxSlotBytes / kRows;
    row = row < fits ? row : fits;
    BulkLayout layout{};
    if (row < kBulkSlots * sizeof(BulkHeader)) return layout;
    layout.row_bytes = layout.row_pitch = row;
    layout.slot_payload = kRows * row;
    layout.window = kHeaderRows * row;
    return layout;
  }
  char* slot(char* area, int world, int sender, int slot_index) const {
    if (window != 0) return area + window + size_t(slot_index) * slot_payload;
    const size_t channel = size_t(kPipelineChannels) + size_t(slot_index) * kBulkRowsPerSlot;  // phase 1
    return area + (channel * world + sender) * row_bytes;
  }
  struct BulkHeader* header(char* area, int sender, int slot_index) const;
};

inline BulkHeader* BulkLayout::header(char* area, int sender, int slot_index) const {
  return reinterpret_cast<BulkHeader*>(area + size_t(sender) * row_bytes) + slot_index;
}

// A pair's chunks, alike on both sides: whole slots, then the rest.
struct BulkChunk {
  uint64_t offset, bytes;
};

inline uint64_t bulk_chunk_count(const BulkLayout& layout, uint64_t bytes) {
  return (bytes + layout.slot_payload - 1) / layout.slot_payload;
}

inline BulkChunk bulk_chunk(const BulkLayout& layout, uint64_t bytes, uint64_t c) {
  const uint64_t offset = c * layout.slot_payload;
  return {offset, bytes - offset < layout.slot_payload ? bytes - offset : layout.slot_payload};
}

// The sender's kernel (one block): drains, or posts post_chunk and waits for wait_slot.
struct BulkSendStep {
  device::SignalPad pad;
  unsigned int collective;  // what errors and timeouts name
  int peer;
  bool drain;
  int64_t post_chunk;    // -1: none
  int post_slot;
  BulkHeader* header;    // peer memory; null: the post is its count alone
  int wait_slot;         // -1: none
  uint64_t total_bytes;
  uint64_t plan;
};

// The receiver's kernel between chunks (one thread): hands back free_slot, awaits wait_chunk, checks its header.
struct BulkRecvStep {
  device::SignalPad pad;
  unsigned int collective;
  int peer;
  int free_slot;             // -1: none
  int64_t wait_chunk;        // -1: none
  const BulkHeader* header;  // null: nothing to check beyond the count
  uint64_t total_bytes;
  uint64_t plan;
};

// A step of one pair with the fields every step of that pair shares (a BulkSendStep or a BulkRecvStep); the
// caller sets the rest (slots, chunks, header), which change from chunk to chunk.
template <typename Step>
Step bulk_step(const device::SignalPad& pad, unsigned int collective, int peer, uint64_t total_bytes, uint64_t plan) {
  Step step{};
  step.pad = pad;
  step.collective = collective;
  step.peer = peer;
  step.total_bytes = total_bytes;
  step.plan = plan;
  return step;
}

struct BulkCopyOut {
  const char* slot;
  BulkLayout layout;
  char* recv;
  size_t bytes;
  const BulkHeader* header;
  uint64_t total_bytes;
  uint64_t chunk;
};

// Reduce-scatter's and reduce's receiver on 2 ranks.
struct BulkReduceOut {
  const char* slot;
  BulkLayout layout;
  const char* own;   // this chunk's part of this rank's input
  char* recv;
  size_t bytes;
  const BulkHeader* header;
  uint64_t total_bytes;
  uint64_t chunk;
  int world;  // what avg divides by
};

constexpr int kBulkCopyBlocksPerRow = 4;

}  // namespace braid::kernels
