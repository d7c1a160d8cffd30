// All-to-all on every rank (threads or braid-run processes), against a host reference:
//   - all_to_all: int8, bfloat16, float32, int64 × per-peer counts {0, 1, 7, 4097, 1 MiB + 3 bytes' worth, and
//     (for a few) one over 64 MiB per rank in total} × cudaMalloc'd buffers aligned and offset by one element ×
//     symmetric buffers (comm.alloc, the same offset on every rank) aligned and offset; with the selection
//     table, and with "alltoall=pipelined" and "alltoall=copyengine" forced (copy engines push into the peers'
//     outputs on symmetric buffers, and into the peers' pipeline areas as send/recv pairs on cudaMalloc'd ones);
//   - all_to_allv with host counts: random uneven counts per (sender, receiver) from a seed every rank shares,
//     zero counts, a rank that sends nothing, a rank that receives nothing, packed (null) and explicit
//     displacements with gaps in a shuffled order; a recv_counts entry that disagrees with the sender (kMismatch,
//     nothing from that peer written, the communicator still usable);
//   - all_to_allv_device: counts in device memory, what arrives packed in rank order, the received counts and
//     offsets written to device arrays; all counts zero, all to one rank, a total above recv_capacity (nothing
//     written, counts written, kInvalidArgument), a negative count (kInvalidArgument);
//   - all_to_allv_device captured in CUDA graphs and replayed 100 times with the device counts changed between
//     replays, outside the graph and by a copy captured inside it;
//   - 10000 mixed calls back to back in batches without host synchronisation, with random per-rank delays;
//   - all_to_all in place (recv == send) on cudaMalloc'd and symmetric buffers, every protocol forced, with a delay
//     on rank 0; beyond 64 MiB on symmetric and cudaMalloc buffers captured and replayed, and on two streams;
//   - argument errors raised before anything is enqueued, naming the argument.
// Every call gets fresh inputs (never zero, never the poison), a poisoned receive buffer with guard bytes around
// every buffer; afterwards every byte of the spans must be what the reference says: the data that arrives, and
// poison (or the input, for send buffers) everywhere else: guards, gaps between blocks, capacity beyond the data.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <numeric>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.hpp"
#include "collective_reference.hpp"
#include "spin_kernel.hpp"
#include "test_helpers.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

constexpr size_t kGuardBytes = 256;  // poisoned bytes before and after every buffer
constexpr size_t kMaxReportedCalls = 8;
constexpr size_t kOneMiBPlus3 = (size_t(1) << 20) + 3;
constexpr size_t kSixtyFourMiB = size_t(64) << 20;

int64_t poison64() {
  int64_t value;
  std::memset(&value, kPoison, sizeof value);
  return value;
}

// ---- One call, as every rank sees it ----

enum class Call { kAllToAll, kAllToAllv, kAllToAllvDevice };

const char* call_name(Call call) {
  switch (call) {
    case Call::kAllToAll: return "all_to_all";
    case Call::kAllToAllv: return "all_to_allv";
    case Call::kAllToAllvDevice: return "all_to_allv_device";
  }
  return "?";
}

// Everything about one call on every rank, so that any rank knows what any peer sends it. Rank-independent:
// every rank builds the same Plan from the shared seed.
struct Plan {
  Call call = Call::kAllToAll;
  DataType type = DataType::kFloat32;
  int world = 1;
  uint64_t seed = 0;                 // of the inputs and the displacement shuffles
  bool aligned = true;               // false: every buffer starts one element past a 256-byte boundary
  size_t count = 0;                  // all_to_all: elements per peer
  std::vector<int64_t> counts;       // [s * world + d]: elements rank s sends rank d (device calls: may be < 0)
  bool pass_send_displs = false;     // explicit send displacements (shuffled, with gaps); else null (packed)
  std::vector<size_t> send_displs;   // [s * world + d]
  std::vector<size_t> recv_counts;   // host calls: [d * world + s], what rank d says it receives from s
  bool pass_recv_displs = false;     // host calls: explicit recv displacements; device calls: ask for recv_displs
  std::vector<size_t> recv_displs;   // host calls: [d * world + s]
  std::vector<size_t> recv_capacity;  // device calls: [d]
  size_t min_send_extent = 0;        // send buffers at least this long (graph test: one buffer for every replay)
  std::vector<size_t> send_extent;   // [rank]: elements of its send buffer
  std::vector<size_t> recv_extent;   // [rank]: elements of its recv buffer
  std::string label;

  int64_t sent(int s, int d) const { return counts[static_cast<size_t>(s) * world + d]; }
  // What a send of sent(s, d) elements delivers: nothing where the count is refused (below zero, or more bytes than
  // 64 bits hold).
  size_t arriving(int s, int d) const {
    const int64_t c = sent(s, d);
    return c < 0 || static_cast<uint64_t>(c) > UINT64_MAX / datatype_size(type) ? 0 : static_cast<size_t>(c);
  }
};

std::string describe(const Plan& p) {
  char text[320];
  int64_t most = 0;
  for (int64_t c : p.counts) most = std::max(most, c);
  std::string shape = p.call == Call::kAllToAll ? "count=" + std::to_string(p.count)
                                                : "counts up to " + std::to_string(most);
  std::string displs;
  if (p.call != Call::kAllToAll) {
    displs = p.pass_send_displs ? " send_displs=explicit" : " send_displs=null";
    if (p.call == Call::kAllToAllv) displs += p.pass_recv_displs ? " recv_displs=explicit" : " recv_displs=null";
    else displs += p.pass_recv_displs ? " recv_displs=out" : " recv_displs=null";
  }
  std::snprintf(text, sizeof text, "%s %s %s%s %s%s%s seed=0x%016llx", call_name(p.call), datatype_name(p.type),
                shape.c_str(), displs.c_str(), p.aligned ? "aligned" : "unaligned", p.label.empty() ? "" : " ",
                p.label.c_str(), static_cast<unsigned long long>(p.seed));
  return text;
}

// Where `owner`'s blocks of these sizes lie in its buffer: packed in rank order, or (gaps) in a shuffled order
// with 1..7 unused elements before, between and after the blocks. `extent`: elements of the buffer.
std::vector<size_t> place_blocks(const std::vector<size_t>& sizes, bool gaps, uint64_t key, size_t& extent) {
  const size_t n = sizes.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  uint64_t draw = 0;
  if (gaps) {
    for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[random_bits(key, draw++) % i]);
  }
  std::vector<size_t> displs(n, 0);
  size_t cursor = 0;
  for (size_t k : order) {
    if (gaps) cursor += 1 + random_bits(key, draw++) % 7;
    displs[k] = cursor;
    cursor += sizes[k];
  }
  if (gaps) cursor += 1 + random_bits(key, draw++) % 7;
  extent = cursor;
  return displs;
}

// Fills in displacements, extents and (where not set) recv_counts and recv_capacity of a plan whose call,
// type, world, seed, counts and displacement choices are set.
void finish(Plan& p) {
  const int w = p.world;
  const size_t ww = static_cast<size_t>(w) * w;
  if (p.counts.size() != ww) throw std::logic_error("plan: counts must have world² entries");
  p.send_displs.assign(ww, 0);
  p.send_extent.assign(w, 0);
  for (int s = 0; s < w; ++s) {
    std::vector<size_t> sizes(w);
    for (int d = 0; d < w; ++d) sizes[d] = p.arriving(s, d);
    size_t extent = 0;
    const std::vector<size_t> row = place_blocks(sizes, p.pass_send_displs, mix64(p.seed ^ (0x5E1D0ull + s)), extent);
    std::copy(row.begin(), row.end(), p.send_displs.begin() + static_cast<size_t>(s) * w);
    p.send_extent[s] = std::max(extent, p.min_send_extent);
  }
  p.recv_extent.assign(w, 0);
  if (p.call == Call::kAllToAllvDevice) {
    if (p.recv_capacity.empty()) {
      p.recv_capacity.assign(w, 0);
      for (int d = 0; d < w; ++d) {
        for (int s = 0; s < w; ++s) p.recv_capacity[d] += p.arriving(s, d);
      }
    }
    p.recv_extent = p.recv_capacity;
    return;
  }
  if (p.recv_counts.empty()) {
    p.recv_counts.assign(ww, 0);
    for (int d = 0; d < w; ++d) {
      for (int s = 0; s < w; ++s) p.recv_counts[static_cast<size_t>(d) * w + s] = p.arriving(s, d);
    }
  }
  p.recv_displs.assign(ww, 0);
  for (int d = 0; d < w; ++d) {
    std::vector<size_t> sizes(p.recv_counts.begin() + static_cast<size_t>(d) * w,
                              p.recv_counts.begin() + static_cast<size_t>(d + 1) * w);
    size_t extent = 0;
    const std::vector<size_t> row = place_blocks(sizes, p.pass_recv_displs, mix64(p.seed ^ (0x4EC0ull + d)), extent);
    std::copy(row.begin(), row.end(), p.recv_displs.begin() + static_cast<size_t>(d) * w);
    p.recv_extent[d] = extent;
  }
}

Plan uniform_plan(DataType type, size_t count, int world, uint64_t seed, bool aligned) {
  Plan p;
  p.call = Call::kAllToAll;
  p.type = type;
  p.world = world;
  p.seed = seed;
  p.aligned = aligned;
  p.count = count;
  p.counts.assign(static_cast<size_t>(world) * world, static_cast<int64_t>(count));
  finish(p);
  return p;
}

Plan v_plan(Call call, DataType type, std::vector<int64_t> counts, int world, uint64_t seed, bool aligned,
            bool pass_send_displs, bool pass_recv_displs, const std::string& label = "") {
  Plan p;
  p.call = call;
  p.type = type;
  p.world = world;
  p.seed = seed;
  p.aligned = aligned;
  p.counts = std::move(counts);
  p.pass_send_displs = pass_send_displs;
  p.pass_recv_displs = pass_recv_displs;
  p.label = label;
  finish(p);
  return p;
}

// Gives every rank's recv buffer of a device plan `slack` more elements than what arrives (per rank: a value in
// [0, max_slack] from the seed when random).
void add_slack(Plan& p, size_t max_slack) {
  for (int d = 0; d < p.world; ++d) {
    p.recv_capacity[d] += max_slack == 0 ? 0 : random_bits(p.seed ^ 0x51ACull, static_cast<uint64_t>(d)) % (max_slack + 1);
  }
  p.recv_extent = p.recv_capacity;
}

// Counts for every (sender, receiver) pair: zero with probability 1/zero_one_in (0: never), else 1..max.
std::vector<int64_t> random_counts(uint64_t key, int world, size_t max, unsigned zero_one_in) {
  std::vector<int64_t> counts(static_cast<size_t>(world) * world, 0);
  for (size_t i = 0; i < counts.size(); ++i) {
    const uint64_t r = random_bits(key, i);
    if (max == 0 || (zero_one_in != 0 && r % zero_one_in == 0)) continue;
    counts[i] = static_cast<int64_t>(1 + (r >> 8) % max);
  }
  return counts;
}

// ---- What must arrive ----

struct Delivery {
  int source;
  size_t recv_offset;  // elements into the receiver's buffer
  size_t send_offset;  // elements into the source's send buffer
  size_t count;
};

size_t arriving_total(const Plan& p, int me) {
  size_t total = 0;
  for (int s = 0; s < p.world; ++s) total += p.arriving(s, me);
  return total;
}

bool overflows(const Plan& p, int me) {
  return p.call == Call::kAllToAllvDevice && arriving_total(p, me) > p.recv_capacity[me];
}

// The blocks the call must write into rank me's recv buffer, by the API's rules: host calls write what q sends
// where recv_counts[q] agrees with it (nothing from q otherwise); device calls pack in rank order, a negative
// count sends nothing, and a total above recv_capacity writes nothing at all.
std::vector<Delivery> deliveries(const Plan& p, int me) {
  std::vector<Delivery> blocks;
  const size_t w = static_cast<size_t>(p.world);
  if (p.call == Call::kAllToAllvDevice) {
    if (overflows(p, me)) return blocks;
    size_t offset = 0;
    for (int s = 0; s < p.world; ++s) {
      const size_t c = p.arriving(s, me);
      blocks.push_back({s, offset, p.send_displs[s * w + me], c});
      offset += c;
    }
    return blocks;
  }
  for (int s = 0; s < p.world; ++s) {
    const size_t c = p.arriving(s, me);
    if (p.recv_counts[me * w + s] != c) continue;
    blocks.push_back({s, p.recv_displs[me * w + s], p.send_displs[s * w + me], c});
  }
  return blocks;
}

// ---- Many calls placed one after another in three arenas (send, recv, device counts) ----

struct Region {
  size_t begin = 0;  // first guard byte
  size_t data = 0;   // first element
  size_t bytes = 0;  // of the buffer (the largest over ranks: the layout is the same on every rank)
  size_t end = 0;    // one past the last guard byte
};

struct Slot {
  const Plan* plan;
  Region send, recv;
  size_t meta = 0;  // device calls: first int64 of [send_counts | send_displs | recv_counts | recv_displs] × world
};

// Rank-independent, so symmetric buffers sit at the same offset on every rank.
class Layout {
 public:
  // Appends p (kept by pointer) when it fits; false (and nothing added) otherwise.
  bool add(const Plan& p, size_t send_capacity, size_t recv_capacity, size_t meta_capacity) {
    const size_t element = datatype_size(p.type);
    Slot slot{&p, {}, {}, 0};
    size_t send_cursor = send_used_, recv_cursor = recv_used_;
    slot.send = place(send_cursor, *std::max_element(p.send_extent.begin(), p.send_extent.end()) * element, element, p.aligned);
    slot.recv = place(recv_cursor, *std::max_element(p.recv_extent.begin(), p.recv_extent.end()) * element, element, p.aligned);
    size_t meta_cursor = meta_used_;
    if (p.call == Call::kAllToAllvDevice) {
      slot.meta = meta_cursor;
      meta_cursor += 4 * static_cast<size_t>(p.world);
    }
    if (send_cursor > send_capacity || recv_cursor > recv_capacity || meta_cursor > meta_capacity) return false;
    send_used_ = send_cursor;
    recv_used_ = recv_cursor;
    meta_used_ = meta_cursor;
    slots_.push_back(slot);
    return true;
  }

  // Bytes of the send and recv arenas a layout holding only p needs.
  static void need(const Plan& p, size_t& send_bytes, size_t& recv_bytes) {
    Layout layout;
    layout.add(p, SIZE_MAX, SIZE_MAX, SIZE_MAX);
    send_bytes = layout.send_used_;
    recv_bytes = layout.recv_used_;
  }

  size_t size() const { return slots_.size(); }
  const Slot& at(size_t i) const { return slots_[i]; }
  size_t send_span() const { return send_used_; }
  size_t recv_span() const { return recv_used_; }
  size_t meta_span() const { return meta_used_; }  // int64 elements

 private:
  static Region place(size_t& cursor, size_t bytes, size_t element, bool aligned) {
    Region region;
    region.begin = cursor;
    region.data = cursor + kGuardBytes + (aligned ? 0 : element);
    region.bytes = bytes;
    region.end = (region.data + bytes + kGuardBytes + 255) / 256 * 256;
    cursor = region.end;
    return region;
  }

  std::vector<Slot> slots_;
  size_t send_used_ = 0, recv_used_ = 0, meta_used_ = 0;
};

// Arena contents of one rank: before the calls (initial) and what they must be after (expected).
struct Images {
  std::vector<unsigned char> send, recv;
  std::vector<int64_t> meta;
  std::vector<unsigned char> meta_checked;  // expected only: 0 where the output is unspecified (overflow displs)
};

Images initial_images(const Layout& layout, int me) {
  Images images;
  images.send.assign(layout.send_span(), kPoison);
  images.recv.assign(layout.recv_span(), kPoison);
  images.meta.assign(layout.meta_span(), poison64());
  for (size_t i = 0; i < layout.size(); ++i) {
    const Slot& slot = layout.at(i);
    const Plan& p = *slot.plan;
    fill_inputs(p.type, input_key(p.seed, me), 0, p.send_extent[me], images.send.data() + slot.send.data);
    if (p.call == Call::kAllToAllvDevice) {
      const size_t w = static_cast<size_t>(p.world);
      for (size_t d = 0; d < w; ++d) {
        images.meta[slot.meta + d] = p.sent(me, static_cast<int>(d));
        if (p.pass_send_displs) images.meta[slot.meta + w + d] = static_cast<int64_t>(p.send_displs[me * w + d]);
      }
    }
  }
  return images;
}

Images expected_images(const Layout& layout, int me, const Images& initial) {
  Images expected = initial;
  expected.meta_checked.assign(initial.meta.size(), 1);
  for (size_t i = 0; i < layout.size(); ++i) {
    const Slot& slot = layout.at(i);
    const Plan& p = *slot.plan;
    const size_t element = datatype_size(p.type);
    for (const Delivery& block : deliveries(p, me)) {
      fill_inputs(p.type, input_key(p.seed, block.source), block.send_offset, block.count,
                  expected.recv.data() + slot.recv.data + block.recv_offset * element);
    }
    if (p.call != Call::kAllToAllvDevice) continue;
    const size_t w = static_cast<size_t>(p.world);
    int64_t offset = 0;
    for (size_t s = 0; s < w; ++s) {
      const int64_t c = static_cast<int64_t>(p.arriving(static_cast<int>(s), me));
      expected.meta[slot.meta + 2 * w + s] = c;  // written even when the total overflows
      if (p.pass_recv_displs) {
        expected.meta[slot.meta + 3 * w + s] = offset;
        // Unspecified where the total overflows recv_capacity: the API only promises the counts then.
        if (overflows(p, me)) expected.meta_checked[slot.meta + 3 * w + s] = 0;
      }
      offset += c;
    }
  }
  return expected;
}

// Where byte `offset` of a slot's region lies, in words.
std::string where(const Plan& p, const Region& region, bool send, size_t offset, int me) {
  const char* name = send ? "send" : "recv";
  if (offset < region.data) return "guard byte " + std::to_string(region.data - offset) + " before " + name;
  if (offset >= region.data + region.bytes) {
    return "guard byte " + std::to_string(offset - region.data - region.bytes + 1) + " after " + name;
  }
  const size_t element = datatype_size(p.type);
  const size_t index = (offset - region.data) / element;
  std::string text = std::string(name) + "[" + std::to_string(index) + "]";
  if (send) return text + (index < p.send_extent[me] ? " (this rank's input)" : " (past this rank's send buffer)");
  for (const Delivery& block : deliveries(p, me)) {
    if (index >= block.recv_offset && index < block.recv_offset + block.count) {
      return text + " (from rank " + std::to_string(block.source) + ", its send[" +
             std::to_string(block.send_offset + index - block.recv_offset) + "])";
    }
  }
  return text + " (nothing arrives here: a gap, a refused block, or capacity past the data)";
}

// One line for a call whose bytes differ from the expected ones ("" when right).
std::string check_slot(const Layout& layout, size_t i, int me, const Images& expected, const Images& got) {
  const Slot& slot = layout.at(i);
  const Plan& p = *slot.plan;
  const size_t element = datatype_size(p.type);
  std::string first;
  size_t differing = 0;
  auto compare = [&](bool send, const Region& region) {
    const unsigned char* want = (send ? expected.send : expected.recv).data();
    const unsigned char* have = (send ? got.send : got.recv).data();
    if (std::memcmp(want + region.begin, have + region.begin, region.end - region.begin) == 0) return;
    for (size_t at = region.begin; at < region.end; ++at) {
      if (want[at] == have[at]) continue;
      if (differing++ == 0) {
        first = where(p, region, send, at, me);
        if (at >= region.data && at < region.data + region.bytes) {
          const size_t start = region.data + (at - region.data) / element * element;
          first += ": expected " + format_element(p.type, want + start) + ", got " + format_element(p.type, have + start);
        } else {
          char bytes[48];
          std::snprintf(bytes, sizeof bytes, ": expected 0x%02x, got 0x%02x", want[at], have[at]);
          first += bytes;
        }
      }
    }
  };
  compare(true, slot.send);
  compare(false, slot.recv);
  std::string meta_problem;
  if (p.call == Call::kAllToAllvDevice) {
    const size_t w = static_cast<size_t>(p.world);
    static const char* const kNames[4] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
    for (size_t k = 0; k < 4 * w; ++k) {
      const size_t at = slot.meta + k;
      if (!expected.meta_checked[at] || expected.meta[at] == got.meta[at]) continue;
      if (meta_problem.empty()) {
        meta_problem = std::string(kNames[k / w]) + "[" + std::to_string(k % w) + "]: expected " +
                       std::to_string(expected.meta[at]) + ", got " + std::to_string(got.meta[at]) +
                       (got.meta[at] == poison64() ? " (never written)" : "");
      }
    }
  }
  if (differing == 0 && meta_problem.empty()) return "";
  std::string line = "rank " + std::to_string(me) + ": call " + std::to_string(i) + " (" + describe(p) + "):";
  if (differing != 0) line += " " + std::to_string(differing) + " byte(s) wrong, first " + first + ";";
  if (!meta_problem.empty()) line += " " + meta_problem + ";";
  return line;
}

// ---- Buffers ----

// The send and recv arenas (cudaMalloc'd, or symmetric: comm.alloc, collective, the same size on every rank)
// and a cudaMalloc'd arena of int64 for device counts.
class TestBuffers {
 public:
  TestBuffers(Communicator& comm, size_t send_bytes, size_t recv_bytes, bool symmetric, size_t meta_count)
      : send_bytes_(std::max<size_t>(send_bytes, 256)), recv_bytes_(std::max<size_t>(recv_bytes, 256)),
        meta_count_(std::max<size_t>(meta_count, 1)), symmetric_(symmetric) {
    if (symmetric) {
      send_memory_ = comm.alloc(send_bytes_);
      recv_memory_ = comm.alloc(recv_bytes_);
      send_ = send_memory_.local();
      recv_ = recv_memory_.local();
    } else {
      send_buffer_ = std::make_unique<DeviceBuffer>(send_bytes_);
      recv_buffer_ = std::make_unique<DeviceBuffer>(recv_bytes_);
      send_ = send_buffer_->get();
      recv_ = recv_buffer_->get();
    }
    meta_buffer_ = std::make_unique<DeviceBuffer>(meta_count_ * sizeof(int64_t));
    // Every rank has its buffers (and the stream its caller made before them) before any rank calls (NOTE
    // [shared-GPU waits]).
    host_barrier();
  }
  TestBuffers(const TestBuffers&) = delete;
  TestBuffers& operator=(const TestBuffers&) = delete;

  unsigned char* send() const { return static_cast<unsigned char*>(send_); }
  unsigned char* recv() const { return static_cast<unsigned char*>(recv_); }
  int64_t* meta() const { return static_cast<int64_t*>(meta_buffer_->get()); }
  size_t send_bytes() const { return send_bytes_; }
  size_t recv_bytes() const { return recv_bytes_; }
  size_t meta_count() const { return meta_count_; }
  bool symmetric() const { return symmetric_; }

 private:
  size_t send_bytes_, recv_bytes_, meta_count_;
  bool symmetric_;
  SymmetricMemory send_memory_, recv_memory_;
  std::unique_ptr<DeviceBuffer> send_buffer_, recv_buffer_, meta_buffer_;
  void* send_ = nullptr;
  void* recv_ = nullptr;
};

// Arena sizes that hold any one of the plans.
void capacities(const std::vector<Plan>& plans, size_t& send_bytes, size_t& recv_bytes) {
  send_bytes = recv_bytes = 256;
  for (const Plan& p : plans) {
    size_t s = 0, r = 0;
    Layout::need(p, s, r);
    send_bytes = std::max(send_bytes, s);
    recv_bytes = std::max(recv_bytes, r);
  }
}

// ---- Running calls ----

struct Outcome {
  std::optional<Error> error;  // raised by a call or by comm.check() after the stream synchronised
  size_t failed = 0;           // calls whose bytes are wrong
  std::vector<std::string> lines;
};

// Copies the images into the arenas (stream-ordered).
void upload(const TestBuffers& buffers, const Images& images, cudaStream_t stream) {
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (upload)");  // NOTE [shared-GPU waits]
  cuda_check(cudaMemcpyAsync(buffers.send(), images.send.data(), images.send.size(), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync (send image)");
  cuda_check(cudaMemcpyAsync(buffers.recv(), images.recv.data(), images.recv.size(), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync (recv image)");
  if (!images.meta.empty()) {
    cuda_check(cudaMemcpyAsync(buffers.meta(), images.meta.data(), images.meta.size() * sizeof(int64_t),
                               cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync (counts image)");
  }
  // Pageable copies may return before the copy has read the host memory: the images stay alive until the
  // caller synchronises (the runner keeps them).
}

Images download(const TestBuffers& buffers, const Images& shape, cudaStream_t stream) {
  Images got;
  got.send.resize(shape.send.size());
  got.recv.resize(shape.recv.size());
  got.meta.resize(shape.meta.size());
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (download)");  // NOTE [shared-GPU waits]
  cuda_check(cudaMemcpyAsync(got.send.data(), buffers.send(), got.send.size(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  cuda_check(cudaMemcpyAsync(got.recv.data(), buffers.recv(), got.recv.size(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  if (!got.meta.empty()) {
    cuda_check(cudaMemcpyAsync(got.meta.data(), buffers.meta(), got.meta.size() * sizeof(int64_t), cudaMemcpyDeviceToHost,
                               stream),
               "cudaMemcpyAsync");
  }
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (download)");
  return got;
}

using Delay = std::function<void(size_t call, cudaStream_t stream)>;

// Runs layouts on one rank: upload, enqueue every call (with optional delays between them), synchronise,
// comm.check(), download, compare.
class Runner {
 public:
  Runner(Communicator& comm, TestBuffers& buffers, cudaStream_t stream)
      : comm_(comm), buffers_(buffers), stream_(stream), host_arrays_(4 * static_cast<size_t>(comm.size())) {}

  // Uploads the layout's initial images. stale_counts: device calls' send counts are uploaded wrong (one more
  // to every peer), for a caller that sets them by a copy of its own (the graph test).
  void begin(const Layout& layout, bool stale_counts = false) {
    layout_ = &layout;
    initial_ = initial_images(layout, comm_.rank());
    Images uploaded = initial_;
    if (stale_counts) {
      for (size_t i = 0; i < layout.size(); ++i) {
        const Slot& slot = layout.at(i);
        if (slot.plan->call != Call::kAllToAllvDevice) continue;
        for (int d = 0; d < slot.plan->world; ++d) uploaded.meta[slot.meta + d] += 1;
      }
    }
    upload(buffers_, uploaded, stream_);
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (upload)");
  }

  // Pointers of call i.
  const void* send_of(size_t i) const { return buffers_.send() + layout_->at(i).send.data; }
  void* recv_of(size_t i) const { return buffers_.recv() + layout_->at(i).recv.data; }
  int64_t* meta_of(size_t i) const { return buffers_.meta() + layout_->at(i).meta; }

  // Enqueues call i of the layout begun.
  void enqueue(size_t i, cudaStream_t stream) {
    const Plan& p = *layout_->at(i).plan;
    const int me = comm_.rank();
    const size_t w = static_cast<size_t>(p.world);
    switch (p.call) {
      case Call::kAllToAll: comm_.all_to_all(send_of(i), recv_of(i), p.count, p.type, stream); return;
      case Call::kAllToAllv: {
        size_t* send_counts = host_arrays_.data();
        size_t* send_displs = send_counts + w;
        size_t* recv_counts = send_displs + w;
        size_t* recv_displs = recv_counts + w;
        for (size_t q = 0; q < w; ++q) {
          send_counts[q] = p.arriving(me, static_cast<int>(q));
          send_displs[q] = p.send_displs[me * w + q];
          recv_counts[q] = p.recv_counts[me * w + q];
          recv_displs[q] = p.recv_displs[me * w + q];
        }
        comm_.all_to_allv(send_of(i), send_counts, p.pass_send_displs ? send_displs : nullptr, recv_of(i), recv_counts,
                          p.pass_recv_displs ? recv_displs : nullptr, p.type, stream);
        // The call is stream-ordered and capturable, so it cannot read host arrays after it returns: scribble
        // over them before the GPU has run it.
        std::fill(host_arrays_.begin(), host_arrays_.end(), size_t(0x5C5C5C5C5C5C5C5Cull));
        return;
      }
      case Call::kAllToAllvDevice: {
        int64_t* meta = meta_of(i);
        comm_.all_to_allv_device(send_of(i), meta, p.pass_send_displs ? meta + w : nullptr, recv_of(i),
                                 p.recv_capacity[me], meta + 2 * w, p.pass_recv_displs ? meta + 3 * w : nullptr, p.type,
                                 stream);
        return;
      }
    }
  }

  // Synchronises, raises what the calls recorded (kept in the outcome), reads everything back and compares.
  // Errors at enqueue time are caught by the caller's enqueue loop (see run()).
  Outcome end(std::optional<Error> error = std::nullopt, size_t max_lines = kMaxReportedCalls) {
    Outcome outcome;
    outcome.error = std::move(error);
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after the calls");
    if (!outcome.error) {
      try {
        comm_.check();
      } catch (const Error& raised) {
        outcome.error = raised;
      }
    }
    const Images got = download(buffers_, initial_, stream_);
    const Images expected = expected_images(*layout_, comm_.rank(), initial_);
    for (size_t i = 0; i < layout_->size(); ++i) {
      std::string line = check_slot(*layout_, i, comm_.rank(), expected, got);
      if (line.empty()) continue;
      if (outcome.failed++ < max_lines) outcome.lines.push_back(std::move(line));
    }
    return outcome;
  }

  // begin + enqueue all (with delays) + end.
  Outcome run(const Layout& layout, const Delay& delay = {}, size_t first_call = 0, size_t max_lines = kMaxReportedCalls) {
    begin(layout);
    std::optional<Error> error;
    try {
      for (size_t i = 0; i < layout.size(); ++i) {
        if (delay) delay(first_call + i, stream_);
        enqueue(i, stream_);
      }
    } catch (const Error& raised) {
      error = raised;
    }
    return end(std::move(error), max_lines);
  }

  // One plan alone.
  Outcome run_one(const Plan& p) {
    Layout layout;
    if (!layout.add(p, buffers_.send_bytes(), buffers_.recv_bytes(), buffers_.meta_count())) {
      throw std::logic_error("a call does not fit the test's buffers: " + describe(p));
    }
    return run(layout);
  }

 private:
  Communicator& comm_;
  TestBuffers& buffers_;
  cudaStream_t stream_;
  const Layout* layout_ = nullptr;
  Images initial_;
  std::vector<size_t> host_arrays_;  // the host count and displacement arrays of all_to_allv calls
};

bool fatal(const Error& error) { return error.code() == ErrorCode::kTimeout || error.code() == ErrorCode::kRemoteError; }

// Runs plans one at a time on buffers of one kind; every call must succeed and be right. Stops at a fatal error.
void run_plans(Communicator& comm, const std::vector<Plan>& plans, bool symmetric, const std::string& label) {
  size_t send_bytes = 0, recv_bytes = 0;
  capacities(plans, send_bytes, recv_bytes);
  StreamHandle stream;
  size_t failed = 0, ran = 0;
  {
    TestBuffers buffers(comm, send_bytes, recv_bytes, symmetric, 4 * static_cast<size_t>(comm.size()));
    Runner runner(comm, buffers, stream.get());
    for (const Plan& p : plans) {
      ++ran;
      const Outcome outcome = runner.run_one(p);
      bool bad = outcome.failed > 0;
      if (outcome.error) {
        bad = true;
        if (failed < kMaxReportedCalls) {
          ADD_FAILURE() << label << ": rank " << comm.rank() << ": " << describe(p) << " threw ("
                        << error_code_name(outcome.error->code()) << "): " << outcome.error->what();
        }
      }
      for (const std::string& line : outcome.lines) {
        if (failed < kMaxReportedCalls) ADD_FAILURE() << label << ": " << line;
      }
      if (bad) ++failed;
      if (outcome.error && fatal(*outcome.error)) {
        ADD_FAILURE() << label << ": rank " << comm.rank() << ": stopped after a fatal error";
        break;
      }
    }
    comm.barrier();  // nobody frees (symmetric) buffers while a peer may still use them
  }
  EXPECT_EQ(failed, 0u) << label << ": rank " << comm.rank() << ": " << failed << " of " << ran << " call(s) failed"
                        << (failed > kMaxReportedCalls ? " (the first ones are reported above)" : "");
  if (comm.rank() == 0) {
    std::printf("[all_to_all] %s (%s buffers): %zu call(s) on %d rank(s)\n", label.c_str(),
                symmetric ? "symmetric" : "cudaMalloc", ran, comm.size());
  }
}

// ---- The reference itself (host only) ----

// Inputs are never zero or the poison; a right image passes; a wrong byte in data, a guard, a gap, or a device
// count is caught and located.
TEST(AllToAllReference, InputsAreNeverZeroOrPoisonAndWrongBytesAreCaught) {
  for (DataType type : kAllDataTypes) {
    const size_t element = datatype_size(type), n = 100000;
    std::vector<unsigned char> bytes(n * element), zero(element, 0), poison(element, kPoison);
    fill_inputs(type, input_key(42, 3), 0, n, bytes.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NE(std::memcmp(bytes.data() + i * element, zero.data(), element), 0) << datatype_name(type) << " input " << i;
      ASSERT_NE(std::memcmp(bytes.data() + i * element, poison.data(), element), 0) << datatype_name(type) << " input " << i;
    }
  }
  const int world = 3, me = 1;
  std::vector<int64_t> counts = random_counts(7, world, 50, 0);
  const Plan host = v_plan(Call::kAllToAllv, DataType::kBFloat16, counts, world, 7, false, true, true, "self-test");
  const Plan device = v_plan(Call::kAllToAllvDevice, DataType::kInt32, counts, world, 8, true, false, true, "self-test");
  const Plan uniform = uniform_plan(DataType::kInt8, 9, world, 9, true);
  Layout layout;
  for (const Plan* p : {&host, &device, &uniform}) ASSERT_TRUE(layout.add(*p, SIZE_MAX, SIZE_MAX, SIZE_MAX));
  const Images initial = initial_images(layout, me);
  const Images expected = expected_images(layout, me, initial);
  ASSERT_NE(initial.recv, expected.recv) << "nothing is expected to arrive";
  for (size_t i = 0; i < layout.size(); ++i) EXPECT_EQ(check_slot(layout, i, me, expected, expected), "");
  // Untouched recv buffers (every call "wrote nothing") fail every call.
  for (size_t i = 0; i < layout.size(); ++i) EXPECT_NE(check_slot(layout, i, me, expected, initial), "") << "call " << i;
  auto corrupted = [&](auto mutate) {
    Images got = expected;
    mutate(got);
    return got;
  };
  const Slot& first = layout.at(0);
  const Delivery block = deliveries(host, me).at(1);  // random counts are at least 1
  const size_t element = datatype_size(host.type);
  const std::string data = check_slot(layout, 0, me, expected, corrupted([&](Images& got) {
    got.recv[first.recv.data + (block.recv_offset + block.count - 1) * element] ^= 1;
  }));
  EXPECT_NE(data.find("from rank " + std::to_string(block.source)), std::string::npos) << data;
  const std::string guard = check_slot(layout, 0, me, expected, corrupted([&](Images& got) {
    got.recv[first.recv.data + first.recv.bytes] ^= 1;
  }));
  EXPECT_NE(guard.find("guard byte 1 after recv"), std::string::npos) << guard;
  const std::string gap = check_slot(layout, 0, me, expected, corrupted([&](Images& got) {
    got.recv[first.recv.data] ^= 1;  // explicit displacements start after a gap of 1..7 elements
  }));
  EXPECT_NE(gap.find("nothing arrives here"), std::string::npos) << gap;
  const std::string input = check_slot(layout, 0, me, expected, corrupted([&](Images& got) { got.send[first.send.data] ^= 1; }));
  EXPECT_NE(input.find("send[0]"), std::string::npos) << input;
  const std::string count = check_slot(layout, 1, me, expected, corrupted([&](Images& got) {
    got.meta[layout.at(1).meta + 2 * world + 2] += 1;
  }));
  EXPECT_NE(count.find("recv_counts[2]"), std::string::npos) << count;
}

// ---- all_to_all: the matrix ----

constexpr DataType kMatrixTypes[] = {DataType::kInt8, DataType::kBFloat16, DataType::kFloat32, DataType::kInt64};

// Per-peer counts: empty, one, odd, just over a 4 KiB page of floats, 1 MiB + 3 bytes' worth.
std::vector<size_t> matrix_counts(DataType type) {
  const size_t element = datatype_size(type);
  return {0, 1, 7, 4097, (kOneMiBPlus3 + element - 1) / element};
}

// A per-peer count whose total per rank (world blocks) is above 64 MiB, and odd.
size_t over_64_mib_count(DataType type, int world) {
  return kSixtyFourMiB / (static_cast<size_t>(world) * datatype_size(type)) + 3;
}

// Which (type, symmetric, aligned) run the over-64-MiB size (each costs a few hundred MB of host work).
using LargeFilter = std::function<bool(DataType, bool symmetric, bool aligned)>;

void run_uniform_matrix(Communicator& comm, const std::string& label, const LargeFilter& large) {
  const uint64_t seed = shared_seed(comm);
  uint64_t index = 0;
  for (bool symmetric : {false, true}) {
    std::vector<Plan> plans;
    for (DataType type : kMatrixTypes) {
      for (bool aligned : {true, false}) {
        std::vector<size_t> counts = matrix_counts(type);
        if (large(type, symmetric, aligned)) counts.push_back(over_64_mib_count(type, comm.size()));
        for (size_t count : counts) plans.push_back(uniform_plan(type, count, comm.size(), mix64(seed + ++index), aligned));
      }
    }
    run_plans(comm, plans, symmetric, label);
  }
}

TEST(AllToAll, MatrixWithTheSelectionTable) {
  with_communicator([](Communicator& comm) {
    run_uniform_matrix(comm, "all_to_all (table)", [](DataType type, bool symmetric, bool aligned) {
      if (!symmetric) return aligned || type == DataType::kInt8;
      return aligned ? (type == DataType::kFloat32 || type == DataType::kBFloat16) : type == DataType::kInt64;
    });
  });
}

TEST(AllToAll, MatrixPipelined) {
  CommOptions options = test_options();
  options.algorithms = "alltoall=pipelined";
  with_communicator(
      [](Communicator& comm) {
        run_uniform_matrix(comm, "all_to_all (alltoall=pipelined)", [](DataType type, bool symmetric, bool aligned) {
          if (!symmetric) return aligned && type == DataType::kFloat32;
          return aligned ? type == DataType::kInt8 : type == DataType::kBFloat16;
        });
      },
      options);
}

// Copy engines push into symmetric outputs, and cudaMalloc'd blocks go as send/recv's copy-engine pairs through
// the peers' pipeline areas (with ranks as threads too: each engine reads this GPU's own memory).
TEST(AllToAll, MatrixCopyEngine) {
  CommOptions options = test_options();
  options.algorithms = "alltoall=copyengine";
  with_communicator(
      [](Communicator& comm) {
        run_uniform_matrix(comm, "all_to_all (alltoall=copyengine)", [](DataType type, bool symmetric, bool aligned) {
          if (!symmetric) return aligned && type == DataType::kBFloat16;
          return aligned ? (type == DataType::kFloat32 || type == DataType::kInt64) : type == DataType::kInt8;
        });
      },
      options);
}

// LL forced: a block up to what one LL slot holds (1 MiB of payload, kLLMaxPayloadBytes in ll_launch.hpp; the
// table takes LL there on 2 ranks) travels as LL lines, a larger one falls back (FIFO pushes, or stores into
// symmetric outputs). Both sides of the slot's edge, odd and unaligned blocks too.
TEST(AllToAll, LLUpToItsSlotAndBeyond) {
  CommOptions options = test_options();
  options.algorithms = "alltoall=ll";
  with_communicator(
      [](Communicator& comm) {
        constexpr size_t kSlotPayload = size_t(1) << 20;
        const uint64_t seed = shared_seed(comm);
        uint64_t index = 0;
        for (bool symmetric : {false, true}) {
          std::vector<Plan> plans;
          for (DataType type : {DataType::kInt8, DataType::kFloat32}) {
            const size_t element = datatype_size(type);
            for (size_t count : {kSlotPayload / element, kSlotPayload * 3 / 4 / element + 3, kSlotPayload / element + 1}) {
              for (bool aligned : {true, false}) {
                plans.push_back(uniform_plan(type, count, comm.size(), mix64(seed + ++index), aligned));
              }
            }
          }
          run_plans(comm, plans, symmetric, "all_to_all (alltoall=ll)");
        }
      },
      options);
}

// Count 0 with null buffers: valid, nothing read or written (as for the other collectives); the next call is
// still in step.
TEST(AllToAll, ZeroCountsWithNullBuffersAreANoOp) {
  with_communicator([](Communicator& comm) {
    StreamHandle stream;
    const std::vector<size_t> zeros(comm.size(), 0);
    try {
      comm.all_to_all(nullptr, nullptr, 0, DataType::kFloat32, stream.get());
      comm.all_to_allv(nullptr, zeros.data(), nullptr, nullptr, zeros.data(), nullptr, DataType::kInt8, stream.get());
    } catch (const Error& error) {
      ADD_FAILURE() << "rank " << comm.rank() << ": count 0 with null buffers threw: " << error.what();
    }
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    comm.check();
    run_plans(comm, {uniform_plan(DataType::kFloat32, 4097, comm.size(), shared_seed(comm), true)}, false,
              "all_to_all after count-0 calls");
  });
}

// ---- all_to_all in place ----

// recv == send: each block is replaced by the one its rank sent here (ncclAlltoAll's result in place). Sizes from
// one element to many FIFO rounds (pieces of every block wrap the FIFOs several times), cudaMalloc'd and symmetric
// buffers (those would take zero-copy stores or copy engines out of place), every protocol forced, and a delay
// on rank 0 so that its peers' pieces are waiting before its own pushes start: a block that overwrote its input
// before pushing it would send the peer's data back.
TEST(AllToAll, InPlaceReplacesEveryBlockWithTheOneItsRankSent) {
  for (const char* algorithms : {"", "alltoall=pipelined", "alltoall=copyengine", "alltoall=ll"}) {
    CommOptions options = test_options();
    options.algorithms = algorithms;
    with_communicator(
        [&](Communicator& comm) {
          const int rank = comm.rank(), world = comm.size();
          const uint64_t seed = shared_seed(comm);
          StreamHandle stream;
          uint64_t index = 0;
          for (bool symmetric : {false, true}) {
            for (DataType type : {DataType::kInt8, DataType::kBFloat16, DataType::kFloat32}) {
              const size_t element = datatype_size(type);
              std::vector<size_t> sizes{1, 7 * 4, 100003, size_t(4) << 20};
              if (type == DataType::kFloat32) sizes.push_back(size_t(40) << 20);  // host work: once per protocol and buffer kind
              for (size_t block_bytes : sizes) {
                const size_t count = std::max<size_t>(1, block_bytes / element);
                const size_t bytes = count * element * world;
                const uint64_t call_seed = mix64(seed + ++index);
                std::vector<unsigned char> host(bytes), expected(bytes);
                for (int q = 0; q < world; ++q) {
                  fill_inputs(type, input_key(call_seed, rank), q * count, count, host.data() + q * count * element);
                  fill_inputs(type, input_key(call_seed, q), rank * count, count, expected.data() + q * count * element);
                }
                std::optional<DeviceBuffer> plain;
                SymmetricMemory shared;
                unsigned char* base;
                if (symmetric) {
                  shared = comm.alloc(bytes + 2 * kGuardBytes);
                  base = static_cast<unsigned char*>(shared.local());
                } else {
                  plain.emplace(bytes + 2 * kGuardBytes);
                  base = static_cast<unsigned char*>(plain->get());
                }
                unsigned char* buffer = base + kGuardBytes;
                cuda_check(cudaMemset(base, kPoison, bytes + 2 * kGuardBytes), "cudaMemset");
                cuda_check(cudaMemcpy(buffer, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
                comm.barrier();
                if (rank == 0) cuda_check(spin_on_stream(stream.get(), 200000), "spin_on_stream");
                comm.all_to_all(buffer, buffer, count, type, stream.get());
                cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
                comm.check();
                std::vector<unsigned char> got(bytes + 2 * kGuardBytes);
                cuda_check(cudaMemcpy(got.data(), base, got.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
                const std::string what = std::string("rank ") + std::to_string(rank) + " " + (algorithms[0] ? algorithms : "table") +
                                         (symmetric ? ", symmetric, " : ", cudaMalloc, ") + datatype_name(type) + " x " +
                                         std::to_string(count) + " a block";
                size_t wrong = 0, first_wrong = SIZE_MAX;
                for (size_t i = 0; i < bytes; ++i) {
                  if (got[kGuardBytes + i] != expected[i]) {
                    ++wrong;
                    first_wrong = std::min(first_wrong, i);
                  }
                }
                EXPECT_EQ(wrong, 0u) << what << ": first wrong byte " << first_wrong << " (block "
                                     << (first_wrong == SIZE_MAX ? -1 : static_cast<long long>(first_wrong / (count * element)))
                                     << ")";
                for (size_t i = 0; i < kGuardBytes; ++i) {
                  ASSERT_EQ(got[i], kPoison) << what << ": guard byte " << i << " before the buffer";
                  ASSERT_EQ(got[kGuardBytes + bytes + i], kPoison) << what << ": guard byte " << i << " after the buffer";
                }
                comm.barrier();  // every rank done with this allocation before it is freed
              }
            }
          }
        },
        options);
  }
}

// In place beyond 64 MiB (2 ranks: the copy engines' swap, each rank's half in tapered chunks through
// its pipeline area's two slots) on symmetric buffers, and on cudaMalloc buffers, which the capture registers (ranks
// as processes: the swap in the graph; as threads: staged), an odd count so the halves split inside an element's
// neighbourhood: captured once and replayed, and eagerly on two streams in turn (cudaMalloc: staged), rank 0
// delayed before each. An all-to-all in place is its own inverse, so after each call every block is the one its
// rank sent, or the original.
TEST(AllToAll, InPlaceBeyond64MiBSwapsInGraphReplaysAndOnTwoStreams) {
  with_communicator([&](Communicator& comm) {
    StreamHandle first, second;  // made once (docs/shared-gpu.md: hardware queues)
    for (const bool symmetric : {true, false}) {
      const int rank = comm.rank(), world = comm.size();
      const DataType type = DataType::kFloat32;
      const size_t element = datatype_size(type);
      const size_t count = ((size_t(80) << 20) / element / static_cast<size_t>(world)) | 1;  // odd, > 64 MiB in all
      const size_t bytes = count * element * world;
      const uint64_t call_seed = mix64(shared_seed(comm) + 0x5A4Aull + symmetric);
      std::vector<unsigned char> original(bytes), swapped(bytes);
      for (int q = 0; q < world; ++q) {
        fill_inputs(type, input_key(call_seed, rank), q * count, count, original.data() + q * count * element);
        fill_inputs(type, input_key(call_seed, q), rank * count, count, swapped.data() + q * count * element);
      }
      SymmetricMemory shared;
      std::optional<DeviceBuffer> plain;
      if (symmetric) {
        shared = comm.alloc(bytes + 2 * kGuardBytes);
      } else {
        plain.emplace(bytes + 2 * kGuardBytes);
      }
      unsigned char* const base = static_cast<unsigned char*>(symmetric ? shared.local() : plain->get());
      const std::string kind = symmetric ? "symmetric, " : "cudaMalloc, ";
      unsigned char* const buffer = base + kGuardBytes;
      cuda_check(cudaMemset(base, kPoison, bytes + 2 * kGuardBytes), "cudaMemset");
      cuda_check(cudaMemcpy(buffer, original.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
      std::vector<unsigned char> got(bytes + 2 * kGuardBytes);
      auto expect_blocks = [&](const std::vector<unsigned char>& expected, const std::string& when) {
        cuda_check(cudaMemcpy(got.data(), base, got.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
        size_t wrong = 0, first_wrong = SIZE_MAX;
        for (size_t i = 0; i < bytes; ++i) {
          if (got[kGuardBytes + i] != expected[i]) {
            ++wrong;
            first_wrong = std::min(first_wrong, i);
          }
        }
        EXPECT_EQ(wrong, 0u) << "rank " << rank << ", " << kind << when << ": first wrong byte " << first_wrong;
        for (size_t i = 0; i < kGuardBytes; ++i) {
          ASSERT_EQ(got[i], kPoison) << when << ": guard byte " << i << " before the buffer";
          ASSERT_EQ(got[kGuardBytes + bytes + i], kPoison) << when << ": guard byte " << i << " after the buffer";
        }
      };

      GraphHandles graph;
      comm.barrier();
      cuda_check(cudaStreamBeginCapture(first.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      comm.all_to_all(buffer, buffer, count, type, first.get());
      cuda_check(cudaStreamEndCapture(first.get(), &graph.graph), "cudaStreamEndCapture");
      cuda_check(cudaGraphInstantiate(&graph.exec, graph.graph, 0), "cudaGraphInstantiate");
      expect_blocks(original, "after the capture, before any replay");
      for (int replay = 1; replay <= 3; ++replay) {
        comm.barrier();
        if (rank == 0) cuda_check(spin_on_stream(first.get(), 200000), "spin_on_stream");
        cuda_check(cudaGraphLaunch(graph.exec, first.get()), "cudaGraphLaunch");
        cuda_check(cudaStreamSynchronize(first.get()), "cudaStreamSynchronize");
        comm.check();
        expect_blocks(replay % 2 == 1 ? swapped : original, "replay " + std::to_string(replay));
      }
      // Now swapped: two eager calls on two streams, the second after the first by the communicator's order alone.
      comm.barrier();
      if (rank == 0) cuda_check(spin_on_stream(first.get(), 200000), "spin_on_stream");
      comm.all_to_all(buffer, buffer, count, type, first.get());
      comm.all_to_all(buffer, buffer, count, type, second.get());
      cuda_check(cudaStreamSynchronize(second.get()), "cudaStreamSynchronize");
      cuda_check(cudaStreamSynchronize(first.get()), "cudaStreamSynchronize");
      comm.check();
      expect_blocks(swapped, "two eager calls on two streams");
      comm.barrier();  // every rank done with the allocation before it is freed
    }
  });
}

// The copy engines forced in place on symmetric buffers at small sizes (2 ranks: the swap), captured and replayed:
// blocks of 1 and 3 bytes leave rank 1's half empty (its side streams never join the capture), 100003 bytes split
// the pair at 256 bytes; the graphs of every size replay in one stream, twice, so each block returns to its rank.
TEST(AllToAll, InPlaceOnTheEnginesCapturedWhateverTheBlockSize) {
  CommOptions options = test_options();
  options.algorithms = "alltoall=copyengine";
  with_communicator(
      [&](Communicator& comm) {
        const int rank = comm.rank(), world = comm.size();
        const DataType type = DataType::kInt8;
        const std::vector<size_t> counts{1, 3, 100003};
        const uint64_t seed = mix64(shared_seed(comm) + 0xC0FFEEull);
        StreamHandle stream;
        std::vector<SymmetricMemory> buffers;
        std::vector<std::vector<unsigned char>> originals, swapped;
        std::vector<GraphHandles> graphs(counts.size());
        for (size_t i = 0; i < counts.size(); ++i) {
          const size_t count = counts[i], bytes = count * world;
          originals.emplace_back(bytes);
          swapped.emplace_back(bytes);
          for (int q = 0; q < world; ++q) {
            fill_inputs(type, input_key(seed + i, rank), q * count, count, originals.back().data() + q * count);
            fill_inputs(type, input_key(seed + i, q), rank * count, count, swapped.back().data() + q * count);
          }
          buffers.push_back(comm.alloc(bytes));
          cuda_check(cudaMemcpy(buffers.back().local(), originals.back().data(), bytes, cudaMemcpyHostToDevice),
                     "cudaMemcpy");
        }
        comm.barrier();
        for (size_t i = 0; i < counts.size(); ++i) {
          void* const buffer = buffers[i].local();
          cuda_check(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
          comm.all_to_all(buffer, buffer, counts[i], type, stream.get());
          cuda_check(cudaStreamEndCapture(stream.get(), &graphs[i].graph), "cudaStreamEndCapture");
          cuda_check(cudaGraphInstantiate(&graphs[i].exec, graphs[i].graph, 0), "cudaGraphInstantiate");
        }
        for (int replay = 1; replay <= 2; ++replay) {
          if (rank == 0) cuda_check(spin_on_stream(stream.get(), 100000), "spin_on_stream");
          for (GraphHandles& graph : graphs) cuda_check(cudaGraphLaunch(graph.exec, stream.get()), "cudaGraphLaunch");
          cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
          comm.check();
          for (size_t i = 0; i < counts.size(); ++i) {
            std::vector<unsigned char> got(counts[i] * world);
            cuda_check(cudaMemcpy(got.data(), buffers[i].local(), got.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
            EXPECT_TRUE(got == (replay == 1 ? swapped[i] : originals[i]))
                << "rank " << rank << ", " << counts[i] << " a block, replay " << replay;
          }
        }
        comm.barrier();  // every rank done with the allocations before they are freed
      },
      options);
}

// ---- all_to_allv, host counts ----

std::vector<Plan> host_v_plans(int world, uint64_t seed) {
  std::vector<Plan> plans;
  uint64_t index = 0;
  auto next_seed = [&] { return mix64(seed + ++index); };
  const size_t ww = static_cast<size_t>(world) * world;
  for (DataType type : kMatrixTypes) {
    for (size_t max : {size_t(5), size_t(3000), (size_t(1) << 20) / datatype_size(type) + 1}) {
      for (int displs = 0; displs < 4; ++displs) {
        const uint64_t s = next_seed();
        plans.push_back(v_plan(Call::kAllToAllv, type, random_counts(s, world, max, 5), world, s, (displs + index) % 2 == 0,
                               (displs & 1) != 0, (displs & 2) != 0, "random"));
      }
    }
  }
  // Edge cases, float32 and int8, packed and with gaps.
  for (DataType type : {DataType::kFloat32, DataType::kInt8}) {
    for (bool gaps : {false, true}) {
      uint64_t s = next_seed();
      plans.push_back(v_plan(Call::kAllToAllv, type, std::vector<int64_t>(ww, 0), world, s, gaps, gaps, gaps, "all counts 0"));
      // The last rank sends nothing; rank 0 receives nothing (with 1 rank: one and the same).
      s = next_seed();
      std::vector<int64_t> counts = random_counts(s, world, 4000, 0);
      for (int q = 0; q < world; ++q) {
        counts[static_cast<size_t>(world - 1) * world + q] = 0;
        counts[static_cast<size_t>(q) * world + 0] = 0;
      }
      plans.push_back(v_plan(Call::kAllToAllv, type, counts, world, s, true, gaps, !gaps,
                             "rank " + std::to_string(world - 1) + " sends nothing, rank 0 receives nothing"));
      // One pair only: the last rank to rank 0.
      s = next_seed();
      counts.assign(ww, 0);
      counts[static_cast<size_t>(world - 1) * world + 0] = 12345;
      plans.push_back(v_plan(Call::kAllToAllv, type, counts, world, s, !gaps, gaps, gaps, "one pair only"));
      // Every rank only to itself.
      s = next_seed();
      counts.assign(ww, 0);
      for (int q = 0; q < world; ++q) counts[static_cast<size_t>(q) * world + q] = 777 + q;
      plans.push_back(v_plan(Call::kAllToAllv, type, counts, world, s, true, gaps, gaps, "to itself only"));
    }
  }
  return plans;
}

TEST(AllToAllv, HostCountsRandomUnevenAndEdgeCases) {
  with_communicator([](Communicator& comm) {
    const uint64_t seed = shared_seed(comm);
    const std::vector<Plan> plans = host_v_plans(comm.size(), seed);
    run_plans(comm, plans, false, "all_to_allv");
    run_plans(comm, plans, true, "all_to_allv");
  });
}

// Rank 0 says it receives another count from rank 1 than rank 1 sends: rank 0 raises kMismatch naming both
// counts (at check() after synchronising), nothing from rank 1 lands in rank 0's buffer, everything else does,
// and the communicator still works. Other ranks may report the mismatch too (kMismatch) or not at all.
TEST(AllToAllv, CountMismatchIsReportedAndTheCommunicatorStaysUsable) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  with_communicator([](Communicator& comm) {
    const int me = comm.rank(), world = comm.size();
    const uint64_t seed = shared_seed(comm);
    std::vector<Plan> plans;
    for (int variant = 0; variant < 3; ++variant) {
      const uint64_t s = mix64(seed + variant);
      std::vector<int64_t> counts = random_counts(s, world, 3000, 0);
      counts[static_cast<size_t>(1) * world + 0] = 2000 + variant;  // what rank 1 sends rank 0
      Plan p;
      p.call = Call::kAllToAllv;
      p.type = variant == 1 ? DataType::kBFloat16 : DataType::kFloat32;
      p.world = world;
      p.seed = s;
      p.counts = counts;
      p.pass_recv_displs = variant == 2;
      p.recv_counts.assign(static_cast<size_t>(world) * world, 0);
      for (int d = 0; d < world; ++d) {
        for (int q = 0; q < world; ++q) p.recv_counts[static_cast<size_t>(d) * world + q] = p.arriving(q, d);
      }
      const size_t sent = 2000 + variant;
      const size_t expected = variant == 0 ? sent + 3 : variant == 1 ? sent - 1 : 0;  // more, fewer, none
      p.recv_counts[0 * static_cast<size_t>(world) + 1] = expected;
      p.label = "rank 0 expects " + std::to_string(expected) + " from rank 1, which sends " + std::to_string(sent);
      finish(p);
      plans.push_back(std::move(p));
    }
    const Plan after = uniform_plan(DataType::kFloat32, 4097, world, mix64(seed + 99), true);
    std::vector<Plan> all = plans;
    all.push_back(after);
    size_t send_bytes = 0, recv_bytes = 0;
    capacities(all, send_bytes, recv_bytes);
    StreamHandle stream;
    TestBuffers buffers(comm, send_bytes, recv_bytes, false, 4 * static_cast<size_t>(world));
    Runner runner(comm, buffers, stream.get());
    for (const Plan& p : plans) {
      const Outcome outcome = runner.run_one(p);
      for (const std::string& line : outcome.lines) ADD_FAILURE() << line;
      const size_t sent = p.arriving(1, 0), expected = p.recv_counts[1];
      if (me == 0 && !outcome.error) {
        ADD_FAILURE() << "rank 0: no error raised by check() after " << describe(p);
      } else if (me == 0) {
        EXPECT_EQ(outcome.error->code(), ErrorCode::kMismatch) << outcome.error->what();
        const std::string message = outcome.error->what();
        EXPECT_TRUE(names_number(message, static_cast<long long>(sent)) && names_number(message, static_cast<long long>(expected)))
            << "rank 0: the message does not name both counts (" << expected << " expected, " << sent << " sent): " << message;
      } else if (outcome.error) {
        EXPECT_EQ(outcome.error->code(), ErrorCode::kMismatch)
            << "rank " << me << ": " << describe(p) << " raised: " << outcome.error->what();
      }
      if (outcome.error && fatal(*outcome.error)) return;
      // Raised once: a second check() is quiet.
      try {
        comm.check();
      } catch (const Error& error) {
        ADD_FAILURE() << "rank " << me << ": the mismatch was raised twice: " << error.what();
      }
      // The communicator still works.
      const Outcome next = runner.run_one(after);
      if (next.error) ADD_FAILURE() << "rank " << me << ": the call after a mismatch threw: " << next.error->what();
      for (const std::string& line : next.lines) ADD_FAILURE() << "the call after a mismatch: " << line;
    }
    comm.barrier();
  });
}

// ---- all_to_allv_device ----

std::vector<Plan> device_plans(int world, uint64_t seed) {
  std::vector<Plan> plans;
  uint64_t index = 0;
  auto next_seed = [&] { return mix64(seed + ++index); };
  const size_t ww = static_cast<size_t>(world) * world;
  const Call device = Call::kAllToAllvDevice;
  for (DataType type : kMatrixTypes) {
    for (size_t max : {size_t(5), size_t(3000), (size_t(1) << 20) / datatype_size(type) + 1}) {
      for (int variant = 0; variant < 4; ++variant) {
        const uint64_t s = next_seed();
        Plan p = v_plan(device, type, random_counts(s, world, max, 5), world, s, (variant + index) % 2 == 0,
                        (variant & 1) != 0, (variant & 2) != 0, "random");
        add_slack(p, variant == 3 ? 0 : 100);
        plans.push_back(std::move(p));
      }
    }
  }
  for (DataType type : {DataType::kFloat32, DataType::kInt8}) {
    // All counts zero: nothing to receive, capacity 0 and some.
    for (size_t slack : {size_t(0), size_t(17)}) {
      Plan p = v_plan(device, type, std::vector<int64_t>(ww, 0), world, next_seed(), true, slack != 0, true, "all counts 0");
      add_slack(p, slack);
      plans.push_back(std::move(p));
    }
    // All to one: every rank sends everything to rank 0 (exact capacity, and with room to spare).
    for (size_t slack : {size_t(0), size_t(1000)}) {
      const uint64_t s = next_seed();
      std::vector<int64_t> counts(ww, 0);
      for (int q = 0; q < world; ++q) counts[static_cast<size_t>(q) * world] = 1 + static_cast<int64_t>(random_bits(s, q) % 50000);
      Plan p = v_plan(device, type, counts, world, s, slack == 0, slack != 0, true, "all to rank 0");
      add_slack(p, slack);
      plans.push_back(std::move(p));
    }
    // The last rank sends nothing, rank 0 receives nothing.
    const uint64_t s = next_seed();
    std::vector<int64_t> counts = random_counts(s, world, 4000, 0);
    for (int q = 0; q < world; ++q) {
      counts[static_cast<size_t>(world - 1) * world + q] = 0;
      counts[static_cast<size_t>(q) * world + 0] = 0;
    }
    plans.push_back(v_plan(device, type, counts, world, s, false, true, true, "a rank sends nothing, one receives nothing"));
  }
  return plans;
}

TEST(AllToAllvDevice, CountsAndDataIncludingZeroAndAllToOne) {
  with_communicator([](Communicator& comm) {
    const std::vector<Plan> plans = device_plans(comm.size(), shared_seed(comm));
    run_plans(comm, plans, false, "all_to_allv_device");
    run_plans(comm, plans, true, "all_to_allv_device");
  });
}

// Runs `bad` (whose failure rank `culprit` must raise as `code`, naming the numbers in `named`), then a correct
// call. Other ranks may raise the same code or nothing; every byte must be as the API says either way.
void expect_data_error(Communicator& comm, Runner& runner, const Plan& bad, int culprit, ErrorCode code,
                       const std::vector<long long>& named, const Plan& after) {
  const int me = comm.rank();
  const Outcome outcome = runner.run_one(bad);
  for (const std::string& line : outcome.lines) ADD_FAILURE() << line;
  if (me == culprit) {
    if (!outcome.error) {
      ADD_FAILURE() << "rank " << me << ": no error raised by check() after " << describe(bad);
    } else {
      EXPECT_EQ(outcome.error->code(), code) << "rank " << me << ": " << outcome.error->what();
      for (long long value : named) {
        EXPECT_TRUE(names_number(outcome.error->what(), value))
            << "rank " << me << ": the message does not name " << value << ": " << outcome.error->what();
      }
    }
  } else if (outcome.error) {
    EXPECT_EQ(outcome.error->code(), code) << "rank " << me << ": " << describe(bad) << " raised: " << outcome.error->what();
  }
  if (outcome.error && fatal(*outcome.error)) throw *outcome.error;
  try {
    comm.check();
  } catch (const Error& error) {
    ADD_FAILURE() << "rank " << me << ": raised a second time: " << error.what();
  }
  const Outcome next = runner.run_one(after);
  if (next.error) ADD_FAILURE() << "rank " << me << ": the call after " << describe(bad) << " threw: " << next.error->what();
  for (const std::string& line : next.lines) ADD_FAILURE() << "the call after a refused one: " << line;
}

// More arrives at rank 0 than its recv_capacity: nothing is written into its recv (still poison), the received
// counts are, and check() raises kInvalidArgument with the figures; then a correct call works.
TEST(AllToAllvDevice, TotalAboveCapacityWritesNothingAndIsReported) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size();
    const uint64_t seed = shared_seed(comm);
    std::vector<Plan> plans;
    for (int variant = 0; variant < 2; ++variant) {
      const uint64_t s = mix64(seed + variant);
      std::vector<int64_t> counts = random_counts(s, world, 5000, 0);
      Plan p = v_plan(Call::kAllToAllvDevice, variant == 0 ? DataType::kFloat32 : DataType::kInt8, counts, world, s,
                      variant == 0, variant == 1, true);
      const size_t total = arriving_total(p, 0);
      p.recv_capacity[0] = variant == 0 ? total - 1 : 0;  // one short; none at all
      p.recv_extent = p.recv_capacity;
      p.label = "rank 0 receives " + std::to_string(total) + " into capacity " + std::to_string(p.recv_capacity[0]);
      plans.push_back(std::move(p));
    }
    Plan after = v_plan(Call::kAllToAllvDevice, DataType::kFloat32, random_counts(mix64(seed + 7), world, 3000, 4), world,
                        mix64(seed + 7), true, false, true, "after");
    std::vector<Plan> all = plans;
    all.push_back(after);
    size_t send_bytes = 0, recv_bytes = 0;
    capacities(all, send_bytes, recv_bytes);
    StreamHandle stream;
    TestBuffers buffers(comm, send_bytes, recv_bytes, false, 4 * static_cast<size_t>(world));
    Runner runner(comm, buffers, stream.get());
    for (const Plan& p : plans) {
      expect_data_error(comm, runner, p, 0, ErrorCode::kInvalidArgument,
                        {static_cast<long long>(arriving_total(p, 0)), static_cast<long long>(p.recv_capacity[0])}, after);
    }
    comm.barrier();
  });
}

// The last rank is given `refused` (float32 elements) as its send count for rank 0: it sends nothing there and
// check() raises kInvalidArgument with the figure. Rank 0 records 0 elements from it (the API says nothing is sent;
// this test takes that to mean a received count of 0) and gets everything else. Then a correct call works.
void expect_refused_send_count(Communicator& comm, int64_t refused, const std::string& label) {
  const int world = comm.size();
  const uint64_t seed = shared_seed(comm);
  std::vector<int64_t> counts = random_counts(seed, world, 3000, 0);
  counts[static_cast<size_t>(world - 1) * world + 0] = refused;
  const Plan bad = v_plan(Call::kAllToAllvDevice, DataType::kFloat32, counts, world, seed, true, false, true,
                          "rank " + std::to_string(world - 1) + " sends " + label + " to rank 0");
  const Plan after = v_plan(Call::kAllToAllvDevice, DataType::kFloat32, random_counts(mix64(seed + 1), world, 3000, 4),
                            world, mix64(seed + 1), true, true, true, "after");
  size_t send_bytes = 0, recv_bytes = 0;
  capacities({bad, after}, send_bytes, recv_bytes);
  StreamHandle stream;
  TestBuffers buffers(comm, send_bytes, recv_bytes, false, 4 * static_cast<size_t>(world));
  Runner runner(comm, buffers, stream.get());
  expect_data_error(comm, runner, bad, world - 1, ErrorCode::kInvalidArgument, {refused}, after);
  comm.barrier();
}

TEST(AllToAllvDevice, NegativeCountIsReported) {
  with_communicator([](Communicator& comm) { expect_refused_send_count(comm, -7, "-7"); });
}

// A count whose bytes 64 bits do not hold (2^62 float32 elements: 2^64 bytes) is refused as a negative one is.
TEST(AllToAllvDevice, CountPastSixtyFourBitsOfBytesIsReported) {
  with_communicator([](Communicator& comm) { expect_refused_send_count(comm, int64_t(1) << 62, "2^62 float32"); });
}

// ---- CUDA graph ----

class PinnedHost {
 public:
  explicit PinnedHost(size_t bytes) { cuda_check(cudaMallocHost(&pointer_, std::max<size_t>(bytes, 1)), "cudaMallocHost"); }
  ~PinnedHost() { cudaFreeHost(pointer_); }
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  int64_t* get() const { return static_cast<int64_t*>(pointer_); }

 private:
  void* pointer_ = nullptr;
};

// all_to_allv_device captured once and replayed 100 times, the device counts changed between replays: for the
// first 50 by a cudaMemcpyAsync on the stream outside the graph, for the last 50 by a copy from pinned host memory
// captured inside a second graph (the host rewrites that memory between replays). Counts vary: random, all zero
// (every 10th), everything to one rank (every 10th). Every replay's data, counts and offsets are checked.
TEST(AllToAllvDevice, GraphReplaysWithChangingDeviceCounts) {
  with_communicator([](Communicator& comm) {
    const int me = comm.rank(), world = comm.size();
    const size_t w = static_cast<size_t>(world);
    const uint64_t seed = shared_seed(comm);
    constexpr int kReplays = 100;
    constexpr size_t kMaxCount = 20000;  // per pair
    const DataType type = DataType::kBFloat16;
    // The plans of the replays: the same buffers and capacity (world × max), different counts.
    std::vector<Plan> plans;
    for (int r = 0; r < kReplays; ++r) {
      const uint64_t s = mix64(seed + r);
      std::vector<int64_t> counts;
      if (r % 10 == 3) {
        counts.assign(w * w, 0);
      } else if (r % 10 == 7) {
        counts.assign(w * w, 0);
        const int target = (r / 10) % world;
        for (size_t q = 0; q < w; ++q) counts[q * w + target] = static_cast<int64_t>(kMaxCount - q);
      } else {
        counts = random_counts(s, world, kMaxCount, 6);
      }
      Plan p;
      p.call = Call::kAllToAllvDevice;
      p.type = type;
      p.world = world;
      p.seed = seed;  // one send buffer for all replays: the same inputs
      p.aligned = false;
      p.counts = std::move(counts);
      p.pass_recv_displs = true;
      p.min_send_extent = w * kMaxCount;
      p.recv_capacity.assign(w, w * kMaxCount);
      p.label = "replay " + std::to_string(r);
      finish(p);
      plans.push_back(std::move(p));
    }
    size_t send_bytes = 0, recv_bytes = 0;
    capacities(plans, send_bytes, recv_bytes);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    TestBuffers buffers(comm, send_bytes, recv_bytes, false, 4 * w);
    Runner runner(comm, buffers, stream);
    PinnedHost pinned(w * sizeof(int64_t));
    size_t failed = 0;

    auto capture = [&](GraphHandles& graph, const Layout& layout, bool copy_counts_inside) {
      runner.begin(layout);
      cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      try {
        if (copy_counts_inside) {
          cuda_check(cudaMemcpyAsync(runner.meta_of(0), pinned.get(), w * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
                     "cudaMemcpyAsync (captured)");
        }
        runner.enqueue(0, stream);
      } catch (...) {
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(stream, &broken);
        if (broken != nullptr) cudaGraphDestroy(broken);
        throw;
      }
      cuda_check(cudaStreamEndCapture(stream, &graph.graph), "cudaStreamEndCapture");
      graph.exec = instantiate_on_every_rank(graph.graph, stream);
    };

    for (int phase = 0; phase < 2; ++phase) {
      const bool inside = phase == 1;
      GraphHandles graph;
      {
        Layout layout;
        layout.add(plans[0], buffers.send_bytes(), buffers.recv_bytes(), buffers.meta_count());
        capture(graph, layout, inside);  // nothing runs: begin() only uploaded replay 0's images
      }
      for (int r = phase * kReplays / 2; r < (phase + 1) * kReplays / 2; ++r) {
        Layout layout;
        layout.add(plans[r], buffers.send_bytes(), buffers.recv_bytes(), buffers.meta_count());
        // Outside: the upload writes the counts (with the poisoned outputs and the inputs). Inside: the upload
        // writes wrong counts, and the graph's own copy from pinned memory must set the right ones.
        runner.begin(layout, /*stale_counts=*/inside);
        if (inside) {
          for (size_t q = 0; q < w; ++q) pinned.get()[q] = plans[r].sent(me, static_cast<int>(q));
        }
        cuda_check(cudaGraphLaunch(graph.exec, stream), "cudaGraphLaunch");
        const Outcome outcome = runner.end();
        if (outcome.error) {
          ADD_FAILURE() << "rank " << me << ": replay " << r << " threw: " << outcome.error->what();
          if (fatal(*outcome.error)) return;
        }
        for (const std::string& line : outcome.lines) {
          if (failed < kMaxReportedCalls) ADD_FAILURE() << line;
        }
        if (outcome.error || outcome.failed > 0) ++failed;
      }
    }
    EXPECT_EQ(failed, 0u) << "rank " << me << ": " << failed << " of " << kReplays << " replays wrong";
    comm.barrier();
  });
}

// ---- Back to back, with random delays ----

constexpr size_t kStressCalls = 10000;
constexpr size_t kStressBatch = 32;                  // calls enqueued between two host synchronisations
constexpr size_t kStressArenaBytes = size_t(72) << 20;
constexpr uint32_t kMaxHostSleepUs = 200;
constexpr uint32_t kMaxDeviceSpinNs = 20000;

// Call i of the sequence every rank runs (a function of the shared seed, i and the world size only):
// 40% all_to_all, 30% all_to_allv, 30% all_to_allv_device; every datatype; per-peer sizes 2% empty, 0.5% about
// 4 MiB, the rest 1 B .. 256 KiB (log-uniform); uneven counts with zeros for the -v calls.
Plan stress_plan(uint64_t seed, size_t i, int world) {
  const uint64_t key = mix64(seed ^ (0x57E55ull + i));
  uint64_t draw = 0;
  auto next = [&] { return random_bits(key, draw++); };
  const uint64_t kind = next() % 10;
  const Call call = kind < 4 ? Call::kAllToAll : kind < 7 ? Call::kAllToAllv : Call::kAllToAllvDevice;
  const DataType type = kAllDataTypes[next() % std::size(kAllDataTypes)];
  const size_t element = datatype_size(type);
  const bool aligned = next() % 3 != 0;
  const uint64_t size_class = next() % 1000;
  size_t bytes = 0;
  if (size_class < 20) {
    bytes = 0;
  } else if (size_class < 25) {
    bytes = (size_t(4) << 20) + next() % 4096;
  } else {
    const unsigned octave = static_cast<unsigned>(next() % 18);
    bytes = (size_t(1) << octave) + next() % (size_t(1) << octave);
  }
  const size_t count = bytes == 0 ? 0 : std::max<size_t>(1, bytes / element);
  const uint64_t plan_seed = mix64(key ^ 0xC0FFEEull);
  if (call == Call::kAllToAll) return uniform_plan(type, count, world, plan_seed, aligned);
  std::vector<int64_t> counts = random_counts(plan_seed, world, count, 5);
  const bool send_gaps = next() % 2 == 0, recv_flag = next() % 4 != 0;
  Plan p = v_plan(call, type, std::move(counts), world, plan_seed, aligned, send_gaps, recv_flag, "stress");
  if (call == Call::kAllToAllvDevice) add_slack(p, next() % 3 == 0 ? 0 : 64);
  return p;
}

// This rank's delay before call `call` (its own random stream): 1/4 host sleep, 1/4 device spin, 1/2 none.
void delay_before(uint64_t delay_key, size_t call, cudaStream_t stream) {
  const uint64_t r = random_bits(delay_key, call);
  switch (r % 4) {
    case 0: std::this_thread::sleep_for(std::chrono::microseconds((r >> 8) % (kMaxHostSleepUs + 1))); break;
    case 1: cuda_check(spin_on_stream(stream, static_cast<uint32_t>((r >> 8) % (kMaxDeviceSpinNs + 1))), "spin kernel launch"); break;
    default: break;
  }
}

// Batches alternate between cudaMalloc'd arenas and symmetric ones (the same layout on every rank, so every
// call's buffers sit at the same offset everywhere: the zero-copy paths).
TEST(AllToAllStress, BackToBackMixedWithRandomDelays) {
  with_communicator([](Communicator& comm) {
    const int me = comm.rank(), world = comm.size();
    const uint64_t seed = shared_seed(comm);
    const uint64_t delay_key = mix64(seed ^ mix64(0xDE1A7ull + static_cast<uint64_t>(me)));
    std::vector<Plan> calls;
    calls.reserve(kStressCalls);
    for (size_t i = 0; i < kStressCalls; ++i) calls.push_back(stress_plan(seed, i, world));
    const size_t meta_count = kStressBatch * 4 * static_cast<size_t>(world);
    StreamHandle stream_handle;
    const cudaStream_t stream = stream_handle.get();
    size_t failed = 0, batches = 0, next = 0;
    const auto start = std::chrono::steady_clock::now();
    {
      TestBuffers plain(comm, kStressArenaBytes, kStressArenaBytes, false, meta_count);
      TestBuffers symmetric(comm, kStressArenaBytes, kStressArenaBytes, true, meta_count);
      Runner plain_runner(comm, plain, stream), symmetric_runner(comm, symmetric, stream);
      while (next < calls.size()) {
        Runner& runner = batches % 2 == 0 ? plain_runner : symmetric_runner;
        Layout layout;
        while (next < calls.size() && layout.size() < kStressBatch &&
               layout.add(calls[next], kStressArenaBytes, kStressArenaBytes, meta_count)) {
          ++next;
        }
        if (layout.size() == 0) throw std::logic_error("a stress call does not fit the arenas: " + describe(calls[next]));
        const size_t first = next - layout.size();
        ++batches;
        const size_t lines_left = failed < kMaxReportedCalls ? kMaxReportedCalls - failed : 0;
        const Outcome outcome = runner.run(layout, [&](size_t call, cudaStream_t s) { delay_before(delay_key, call, s); },
                                           first, lines_left);
        if (outcome.error) {
          ADD_FAILURE() << "rank " << me << ": calls " << first << ".." << next - 1 << " (seed 0x" << std::hex << seed
                        << std::dec << ") threw: " << outcome.error->what();
          return;  // the communicator's state is unknown: stop
        }
        for (const std::string& line : outcome.lines) ADD_FAILURE() << line << " [call i of this batch is call " << first << " + i]";
        failed += outcome.failed;
      }
      comm.barrier();  // no rank frees its symmetric arenas while a peer may still use them
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(failed, 0u) << "rank " << me << ": " << failed << " of " << calls.size() << " calls failed (seed 0x"
                          << std::hex << seed << std::dec << ")";
    if (me == 0) {
      std::printf("[all_to_all stress] %zu calls in %zu batches on %d rank(s): %.2f s\n", calls.size(), batches, world,
                  seconds);
    }
  });
}

// ---- Argument errors ----

TEST(AllToAll, ArgumentErrorsRaiseBeforeEnqueueNamingTheArgument) {
  with_communicator([](Communicator& comm) {
    const int rank = comm.rank(), world = comm.size();
    const size_t w = static_cast<size_t>(world);
    constexpr size_t n = 1024;  // elements per peer
    StreamHandle stream;
    const cudaStream_t st = stream.get();
    DeviceBuffer send_buffer(n * 8 * w), recv_buffer(n * 8 * w);
    DeviceBuffer device_counts(4 * w * sizeof(int64_t));
    cuda_check(cudaMemset(send_buffer.get(), 0, send_buffer.bytes()), "cudaMemset");
    cuda_check(cudaMemset(recv_buffer.get(), kPoison, recv_buffer.bytes()), "cudaMemset");
    std::vector<int64_t> ones(w, 1);
    cuda_check(cudaMemcpy(device_counts.get(), ones.data(), w * sizeof(int64_t), cudaMemcpyHostToDevice), "cudaMemcpy");
    const auto* s = static_cast<const unsigned char*>(send_buffer.get());
    auto* r = static_cast<unsigned char*>(recv_buffer.get());
    auto* counts = static_cast<int64_t*>(device_counts.get());  // [send_counts | recv_counts | recv_displs]
    int64_t* received = counts + w;
    int64_t* offsets = counts + 2 * w;
    const DataType f32 = DataType::kFloat32;
    const std::vector<size_t> c(w, n);
    const size_t capacity = n * w;

    // Null buffers with counts above zero.
    expect_invalid_argument(rank, "all_to_all(send = null)", {"'send'"}, [&] { comm.all_to_all(nullptr, r, n, f32, st); });
    expect_invalid_argument(rank, "all_to_all(recv = null)", {"'recv'"}, [&] { comm.all_to_all(s, nullptr, n, f32, st); });
    expect_invalid_argument(rank, "all_to_allv(send = null)", {"'send'"},
                            [&] { comm.all_to_allv(nullptr, c.data(), nullptr, r, c.data(), nullptr, f32, st); });
    expect_invalid_argument(rank, "all_to_allv(recv = null)", {"'recv'"},
                            [&] { comm.all_to_allv(s, c.data(), nullptr, nullptr, c.data(), nullptr, f32, st); });
    expect_invalid_argument(rank, "all_to_allv_device(send = null)", {"'send'"},
                            [&] { comm.all_to_allv_device(nullptr, counts, nullptr, r, capacity, received, offsets, f32, st); });
    expect_invalid_argument(rank, "all_to_allv_device(recv = null, recv_capacity > 0)", {"'recv'"},
                            [&] { comm.all_to_allv_device(s, counts, nullptr, nullptr, capacity, received, offsets, f32, st); });

    // Null count arrays.
    expect_invalid_argument(rank, "all_to_allv(send_counts = null)", {"'send_counts'"},
                            [&] { comm.all_to_allv(s, nullptr, nullptr, r, c.data(), nullptr, f32, st); });
    expect_invalid_argument(rank, "all_to_allv(recv_counts = null)", {"'recv_counts'"},
                            [&] { comm.all_to_allv(s, c.data(), nullptr, r, nullptr, nullptr, f32, st); });
    expect_invalid_argument(rank, "all_to_allv_device(send_counts = null)", {"'send_counts'"},
                            [&] { comm.all_to_allv_device(s, nullptr, nullptr, r, capacity, received, offsets, f32, st); });
    expect_invalid_argument(rank, "all_to_allv_device(recv_counts = null)", {"'recv_counts'"},
                            [&] { comm.all_to_allv_device(s, counts, nullptr, r, capacity, nullptr, offsets, f32, st); });

    // Overlapping send and recv: recv one element into send (all_to_all in place, recv == send, is served), and
    // the same buffer for all_to_allv.
    unsigned char* shared = r;
    expect_invalid_argument(rank, "all_to_all(recv = send + 1 element)", {"'send'", "'recv'"},
                            [&] { comm.all_to_all(shared, shared + 4, n / 2, f32, st); });
    expect_invalid_argument(rank, "all_to_allv(recv == send)", {"'send'", "'recv'"},
                            [&] { comm.all_to_allv(shared, c.data(), nullptr, shared, c.data(), nullptr, f32, st); });
    expect_invalid_argument(rank, "all_to_allv_device(recv == send)", {"'send'", "'recv'"},
                            [&] { comm.all_to_allv_device(shared, counts, nullptr, shared, capacity, received, offsets, f32, st); });

    // Datatypes outside the enum.
    for (int value : {-1, kDataTypeCount, 1000}) {
      const DataType bad = static_cast<DataType>(value);
      const std::string at = "(type = " + std::to_string(value) + ")";
      expect_invalid_argument(rank, "all_to_all" + at, {"'type'"}, [&] { comm.all_to_all(s, r, n, bad, st); });
      expect_invalid_argument(rank, "all_to_allv" + at, {"'type'"},
                              [&] { comm.all_to_allv(s, c.data(), nullptr, r, c.data(), nullptr, bad, st); });
      expect_invalid_argument(rank, "all_to_allv_device" + at, {"'type'"},
                              [&] { comm.all_to_allv_device(s, counts, nullptr, r, capacity, received, offsets, bad, st); });
    }

    // Sizes whose bytes overflow size_t.
    const size_t overflowing = SIZE_MAX / 4 + 1;
    expect_invalid_argument(rank, "all_to_all(count × 4 bytes overflows)", {"count'"},
                            [&] { comm.all_to_all(s, r, overflowing, f32, st); });
    const size_t overflowing_times_world = SIZE_MAX / (4 * w) + 1;
    expect_invalid_argument(rank, "all_to_all(world × count × 4 bytes overflows)", {"count'"},
                            [&] { comm.all_to_all(s, r, overflowing_times_world, f32, st); });
    std::vector<size_t> huge = c;
    huge[0] = overflowing;
    expect_invalid_argument(rank, "all_to_allv(send_counts[0] × 4 bytes overflows)", {"'send_counts'"},
                            [&] { comm.all_to_allv(s, huge.data(), nullptr, r, c.data(), nullptr, f32, st); });
    expect_invalid_argument(rank, "all_to_allv(recv_counts[0] × 4 bytes overflows)", {"'recv_counts'"},
                            [&] { comm.all_to_allv(s, c.data(), nullptr, r, huge.data(), nullptr, f32, st); });
    expect_invalid_argument(rank, "all_to_allv_device(recv_capacity × 4 bytes overflows)", {"'recv_capacity'"},
                            [&] { comm.all_to_allv_device(s, counts, nullptr, r, overflowing, received, offsets, f32, st); });

    // Nothing was enqueued: recv still holds the poison, and the communicator is in step.
    cuda_check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    std::vector<unsigned char> bytes(recv_buffer.bytes());
    cuda_check(cudaMemcpy(bytes.data(), recv_buffer.get(), bytes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    const size_t written = bytes.size() - static_cast<size_t>(std::count(bytes.begin(), bytes.end(), kPoison));
    EXPECT_EQ(written, 0u) << "rank " << rank << ": a refused call wrote " << written << " byte(s) of recv";
    comm.check();
    const uint64_t seed = shared_seed(comm);
    run_plans(comm,
              {uniform_plan(DataType::kFloat32, 4097, world, seed, true),
               v_plan(Call::kAllToAllv, DataType::kInt8, random_counts(seed, world, 100, 4), world, seed, true, true, true),
               v_plan(Call::kAllToAllvDevice, DataType::kInt64, random_counts(seed, world, 100, 4), world, seed, false,
                      true, true)},
              false, "after refused calls");
  });
}

}  // namespace
}  // namespace braid::testing
