// MoE dispatch and combine (braid/moe.hpp) on every rank (threads or braid-run processes), against a host reference:
//   - dispatch + combine for random routings (top-K distinct experts per token, random weights) over a matrix of
//     shapes: bfloat16, float16, float32 rows; fp8 dispatch (e4m3, e5m2, with scales of 4, 12 and 16 bytes a
//     row); int32 and int64 expert ids; K = 1, 2, 4, 8; H = 7, 72, 128, 256, 384, 512; expert_alignment 1, 8, 64;
//     and per shape: a different T on every rank with -1 ids, T = 0, T = 1,
//     T = max_tokens, every token of every rank to rank 0's experts, a rank that sends nothing with a rank that
//     receives nothing, a rank whose tokens choose no expert, a token listing an expert twice, and the expert
//     writing its output over the dispatched rows (combine reading them there; not with fp8 dispatch); each routing dispatched twice (the
//     same layout both times), combined weighted after the first and unweighted after the second;
//   - T read on the device (num_tokens_device, the host count passed as 0);
//   - dispatch + an expert kernel + combine captured in one CUDA graph, replayed 100 times with the routing, the
//     rows and the device T changed between replays by copies outside the graph;
//   - two MoeBuffers of different shapes in two graphs on two streams at once (captured at their first use);
//   - refused data: an expert id outside [-1, E), a device T above max_tokens, rows above capacity_rows: check()
//     raises kInvalidArgument on the rank at fault after the stream synchronised, everything else is as the API
//     says, and a correct dispatch/combine follows;
//   - MoeBuffer::create refuses bad shapes naming the field; dispatch refuses x_scales where the shape has none
//     and wants them where it has; worst_case_rows and symmetric_bytes;
//   - rank-major synchronisation: every rank adding into one rank's expert counts at once; a dispatch whose wait for
//     its own blocks is never met gives up at the timeout (kTimeout, no hang); a second combine of one dispatch
//     waits for a late peer before it rewrites combine_input, and a combine of combine_input right after a combine
//     that copied y is refused naming y.
// What every rank checks after each dispatch (all its output views poisoned before it, with every rank idle):
// expert_counts, expert_offsets, and every row in [0, offsets[L]): the data (bit for bit the source token's row)
// and the metadata (weight, local expert, source rank, source token; 0 / -1 for padding), and with fp8 dispatch
// the row's scales (bit for bit the source token's). After combine: every
// element of out[0, T) within a tolerance of the host reference, and the poisoned rows of out past T untouched.
// The expert is y[row] = s(local_expert[row]) * x[row] with s in {1, -1, 2, -2} (times the row's scales after an
// fp8 dispatch, powers of two; exact in every type; NaN in padding rows and past offsets[L], which combine must
// never read), so the reference knows every y.
//
// Semantics taken from moe.hpp and the MoE brief: rank r holds experts [r * L, (r + 1) * L); a local expert's
// block holds the rows of every (source rank s, token t, k) whose id is that expert, ordered by s, then t, then k;
// offsets[j + 1] = align_up(offsets[j] + counts[j], alignment) (padding after every block, the last one too);
// weights of padding rows are 0, their local_expert / source_rank / source_token -1. Combine: out[t] = sum over
// valid k of (weighted ? w[t, k] : 1) * y[row of (t, k)], float32 accumulation; a token with no valid expert gets
// zeros. Refused pairs (ids outside [-1, E)) contribute nothing. Tolerance: 2^-7 (bfloat16), 2^-10 (float16),
// 2^-20 (float32) times (partials + 1) times the sum of |terms|, partials = the ranks the token's experts are on
// (braid rounds each rank's partial sum to the row type for transport).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.hpp"
#include "braid/moe.hpp"
#include "collective_reference.hpp"
#include "test_helpers.hpp"
#include "moe/moe_test_hooks.hpp"
#include "moe_expert_kernel.hpp"
#include "spin_kernel.hpp"
#include "world.hpp"

namespace braid::testing {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr size_t kGuardTokens = 4;     // rows of out (and of the inputs) past max_tokens: out's stay poisoned
constexpr size_t kMaxLines = 6;        // problem lines printed per rank and round
constexpr size_t kMaxFailedRounds = 8; // rounds whose problems are printed per rank and test

uint64_t bits_at(uint64_t key, uint64_t index) { return mix64(key + (index + 1) * kGolden); }

// A stream of random draws.
struct Draws {
  uint64_t key;
  uint64_t index = 0;
  uint64_t next() { return bits_at(key, index++); }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
};

size_t align_up(size_t value, size_t alignment) { return (value + alignment - 1) / alignment * alignment; }

// ---- Shapes ----

struct Config {
  DataType type;
  DataType index_type;
  size_t hidden;
  int top_k;
  int experts;  // rounded up to a multiple of the world size (down where that passes kMoeMaxExperts)
  int alignment;
  size_t max_tokens;
  std::optional<DataType> dispatch_type = std::nullopt;  // fp8 dispatch
};

// The matrix: every row type, both id types, K = 1, 2, 4, 8, H = 7 (rows of 14 or 28 bytes), 72, 128, 256,
// alignment 1, 8, 64.
constexpr Config kConfigs[] = {
    {DataType::kBFloat16, DataType::kInt64, 128, 8, 16, 1, 96},
    {DataType::kBFloat16, DataType::kInt32, 256, 8, 64, 64, 64},
    {DataType::kFloat16, DataType::kInt64, 72, 1, 16, 1, 128},
    {DataType::kFloat16, DataType::kInt32, 7, 8, 64, 1, 64},
    {DataType::kFloat32, DataType::kInt64, 7, 1, 16, 64, 64},
    {DataType::kFloat32, DataType::kInt32, 128, 8, 16, 64, 64},
    {DataType::kBFloat16, DataType::kInt64, 72, 1, 64, 64, 128},
    {DataType::kFloat32, DataType::kInt64, 256, 2, 8, 8, 80},
    {DataType::kBFloat16, DataType::kInt32, 7, 4, 16, 1, 72},
    {DataType::kFloat16, DataType::kInt64, 128, 4, 64, 8, 48},
    // fp8 dispatch: scales of 4 bytes a row (word copies), 12 (unaligned to 16) and 16 (vectors).
    {DataType::kBFloat16, DataType::kInt64, 128, 8, 16, 1, 96, DataType::kFloat8E4M3},
    {DataType::kFloat16, DataType::kInt32, 384, 4, 64, 64, 64, DataType::kFloat8E5M2},
    {DataType::kFloat32, DataType::kInt64, 512, 1, 16, 8, 80, DataType::kFloat8E4M3},
};

// A buffer's layout as the tests name it: MoeShape::layout, and low_latency (rank-major's fixed rows).
struct Layout {
  MoeLayout layout = MoeLayout::kExpertMajor;
  bool low_latency = false;
  Layout() = default;
  Layout(MoeLayout l, bool fixed = false) : layout(l), low_latency(fixed) {}  // NOLINT: a MoeLayout is a Layout
};
const Layout kLowLatency{MoeLayout::kRankMajor, true};

// `layout`: a rank-major one takes the config with expert_alignment 1 (the layout has no expert blocks).
MoeShape make_shape(const Config& c, int world, Layout layout = {}) {
  MoeShape shape;
  shape.layout = layout.layout;
  shape.low_latency = layout.low_latency;
  shape.hidden = c.hidden;
  shape.type = c.type;
  shape.index_type = c.index_type;
  shape.max_tokens = c.max_tokens;
  shape.top_k = c.top_k;
  const int rounded_up = (c.experts + world - 1) / world * world;
  shape.experts = rounded_up <= kMoeMaxExperts ? rounded_up : kMoeMaxExperts / world * world;
  shape.expert_alignment = layout.layout == MoeLayout::kRankMajor ? 1 : c.alignment;
  shape.dispatch_type = c.dispatch_type;
  return shape;
}

DataType dispatch_type_of(const MoeShape& s) { return s.dispatch_type.value_or(s.type); }
size_t scales_per_row(const MoeShape& s) { return s.dispatch_type ? s.hidden / kMoeScaleColumns : 0; }

bool rank_major(const MoeShape& s) { return s.layout == MoeLayout::kRankMajor; }

std::string describe(const MoeShape& s) {
  char text[260];
  std::snprintf(text, sizeof text, "%s %s%s%s H=%zu K=%d E=%d alignment=%d max_tokens=%zu ids=%s capacity_rows=%zu",
                !rank_major(s) ? "expert-major" : s.low_latency ? "rank-major low-latency" : "rank-major", datatype_name(s.type), s.dispatch_type ? " dispatched as " : "",
                s.dispatch_type ? datatype_name(*s.dispatch_type) : "", s.hidden, s.top_k, s.experts, s.expert_alignment, s.max_tokens,
                datatype_name(s.index_type), s.capacity_rows);
  return text;
}

// ---- Inputs: every rank's are a function of (round seed, rank), so any rank knows any rank's ----

// A random sign and mantissa, exponents in [low, low + span): finite, normal, never zero, never the poison's
// exponent (0xA5.. has exponent 9 in float16, 75 in bfloat16 and float32). Doubled, they stay finite.
template <typename Bits, int kMantissaBits, int kExponentBits, unsigned kLow, unsigned kSpan>
Bits float_bits(uint64_t r) {
  const uint64_t sign = r >> 63;
  const uint64_t exponent = kLow + ((r >> 53) & 0x3FF) % kSpan;
  const uint64_t mantissa = r & ((uint64_t(1) << kMantissaBits) - 1);
  return static_cast<Bits>((sign << (kMantissaBits + kExponentBits)) | (exponent << kMantissaBits) | mantissa);
}

void fill_rows(DataType type, uint64_t key, size_t count, unsigned char* out) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t r = bits_at(key, i);
    switch (type) {
      case DataType::kFloat16: {
        const uint16_t b = float_bits<uint16_t, 10, 5, 10, 11>(r);  // 2^-5 .. 2^6
        std::memcpy(out + 2 * i, &b, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t b = float_bits<uint16_t, 7, 8, 112, 31>(r);  // 2^-15 .. 2^16
        std::memcpy(out + 2 * i, &b, 2);
        break;
      }
      case DataType::kFloat32: {
        const uint32_t b = float_bits<uint32_t, 23, 8, 112, 31>(r);
        std::memcpy(out + 4 * i, &b, 4);
        break;
      }
      // fp8: normal, never NaN or infinite; times a scale (2^-4 .. 2^4) and an expert scale (2), still exact and
      // finite in float16.
      case DataType::kFloat8E4M3: out[i] = float_bits<uint8_t, 3, 4, 1, 14>(r); break;  // 2^-6 .. 2^7
      case DataType::kFloat8E5M2: out[i] = float_bits<uint8_t, 2, 5, 8, 15>(r); break;  // 2^-7 .. 2^7
      default: throw std::logic_error("moe test: rows are bfloat16, float16, float32 or fp8");
    }
  }
}

uint64_t load_bits(DataType type, const unsigned char* p) {
  if (datatype_size(type) == 1) return *p;
  if (datatype_size(type) == 2) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return b;
  }
  uint32_t b;
  std::memcpy(&b, p, 4);
  return b;
}

void store_bits(DataType type, uint64_t bits, unsigned char* p) {
  if (datatype_size(type) == 2) {
    const uint16_t b = static_cast<uint16_t>(bits);
    std::memcpy(p, &b, 2);
  } else {
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(p, &b, 4);
  }
}

enum class Route {
  kRandom,           // K distinct experts of all E
  kNone,             // every id -1
  kToRank,           // K distinct experts of rank `target` (-1 for the positions past its L)
  kAvoidLastRank,    // K distinct experts of ranks 0..W-2 (-1 past them; all -1 when W = 1)
  kDuplicates,       // random, and in 2 tokens of 3 one expert listed twice
  kFirstToRankZero,  // id 0 an expert of rank 0, the others distinct experts of all E
};

struct RankPlan {
  size_t tokens = 0;
  Route route = Route::kRandom;
  unsigned none_one_in = 0;  // each id is -1 with probability 1 / none_one_in (0: never)
  size_t invalid = 0;        // ids outside [-1, E) planted at random positions
  int target = 0;            // kToRank
};

struct RankInput {
  size_t tokens = 0;
  std::vector<int64_t> ids;      // [tokens, K]
  std::vector<float> weights;    // [tokens, K]
  std::vector<unsigned char> x;  // [tokens, H] of the dispatch type
  std::vector<float> scales;     // fp8 dispatch: [tokens, H / kMoeScaleColumns], powers of two in 2^-4 .. 2^4
};

// `count` distinct values of [first, first + n) in random positions; -1 in the positions past n.
void distinct(Draws& d, int64_t first, int n, int count, int64_t* out) {
  std::vector<int64_t> pool(static_cast<size_t>(std::max(n, 0)));
  std::iota(pool.begin(), pool.end(), first);
  for (int i = 0; i < count; ++i) {
    if (i < n) {
      std::swap(pool[i], pool[i + d.below(static_cast<uint64_t>(n - i))]);
      out[i] = pool[i];
    } else {
      out[i] = -1;
    }
  }
  for (int i = count - 1; i > 0; --i) std::swap(out[i], out[d.below(static_cast<uint64_t>(i) + 1)]);
}

RankInput make_input(const MoeShape& s, int world, uint64_t key, const RankPlan& p) {
  const int K = s.top_k, E = s.experts, L = E / world;
  RankInput in;
  in.tokens = p.tokens;
  in.ids.assign(p.tokens * K, -1);
  in.weights.assign(p.tokens * K, 0.0f);
  Draws d{mix64(key ^ 0x1D5ull)};
  for (size_t t = 0; t < p.tokens; ++t) {
    int64_t* ids = in.ids.data() + t * K;
    switch (p.route) {
      case Route::kRandom: distinct(d, 0, E, K, ids); break;
      case Route::kNone: break;
      case Route::kToRank: distinct(d, static_cast<int64_t>(p.target) * L, L, K, ids); break;
      case Route::kAvoidLastRank: distinct(d, 0, E - L, K, ids); break;
      case Route::kDuplicates:
        distinct(d, 0, E, K, ids);
        if (K >= 2) {
          const uint64_t r = d.below(3);
          if (r == 0) ids[K - 1] = ids[0];
          if (r == 1) ids[1] = ids[0];
        }
        break;
      case Route::kFirstToRankZero:
        ids[0] = static_cast<int64_t>(d.below(static_cast<uint64_t>(L)));
        if (K > 1) {
          distinct(d, 0, E - 1, K - 1, ids + 1);
          for (int k = 1; k < K; ++k) {
            if (ids[k] >= ids[0]) ++ids[k];
          }
        }
        break;
    }
    for (int k = 0; k < K; ++k) {
      if (p.none_one_in != 0 && d.below(p.none_one_in) == 0) ids[k] = -1;
      in.weights[t * K + k] = static_cast<float>(1 + d.below(1024)) / 1024.0f;  // (0, 1], exact
    }
  }
  const int64_t bad[] = {E, E + 5, -2, -1000};
  for (size_t i = 0; i < p.invalid && p.tokens > 0; ++i) in.ids[d.below(in.ids.size())] = bad[i % std::size(bad)];
  in.x.resize(p.tokens * s.hidden * datatype_size(dispatch_type_of(s)));
  fill_rows(dispatch_type_of(s), mix64(key ^ 0xA11ull), p.tokens * s.hidden, in.x.data());
  in.scales.resize(p.tokens * scales_per_row(s));
  for (size_t i = 0; i < in.scales.size(); ++i) in.scales[i] = std::ldexp(1.0f, static_cast<int>(bits_at(key ^ 0x5CA1Eull, i) % 9) - 4);
  return in;
}

// One dispatch + expert + combine, as every rank makes it.
struct Round {
  std::string label;
  uint64_t seed = 0;
  std::vector<RankInput> inputs;       // every rank's
  std::vector<int64_t> device_tokens;  // per rank, T passed on the device (may exceed max_tokens); empty: host T
  bool weighted = true;
  bool in_place_expert = false;  // the expert writes over the dispatched rows; combine reads them there
  bool redispatch = false;       // rank-major: new rows on the last round's routing (MoeBuffer::redispatch)
};

Round make_round(const MoeShape& s, int world, uint64_t seed, const std::vector<RankPlan>& plans, std::string label,
                 bool weighted = true, bool in_place_expert = false) {
  Round round;
  round.label = std::move(label);
  round.seed = seed;
  round.weighted = weighted;
  round.in_place_expert = in_place_expert;
  for (int r = 0; r < world; ++r) round.inputs.push_back(make_input(s, world, mix64(seed ^ mix64(0x5EED00ull + r)), plans[r]));
  return round;
}

// T of every rank, different on every rank where max_tokens allows, in [low, max_tokens].
std::vector<size_t> different_tokens(uint64_t key, int world, size_t low, size_t max_tokens) {
  std::vector<size_t> tokens;
  std::set<size_t> taken;
  const size_t span = max_tokens - low + 1;
  for (int r = 0; r < world; ++r) {
    size_t t = low + bits_at(key, static_cast<uint64_t>(r)) % span;
    for (size_t tries = 0; taken.count(t) != 0 && tries < span; ++tries) t = t == max_tokens ? low : t + 1;
    taken.insert(t);
    tokens.push_back(t);
  }
  return tokens;
}

std::vector<RankPlan> plans_of(const std::vector<size_t>& tokens, Route route, unsigned none_one_in = 0) {
  std::vector<RankPlan> plans;
  for (size_t t : tokens) plans.push_back(RankPlan{t, route, none_one_in, 0, 0});
  return plans;
}

// ---- The reference ----

bool valid_id(int64_t id, int experts) { return id >= 0 && id < experts; }

bool sends(const MoeShape& s, const Round& round, int rank) {
  return round.device_tokens.empty() || round.device_tokens[rank] <= static_cast<int64_t>(s.max_tokens);
}

// Token t's k-th id as dispatch takes it: -1 for "no expert", for an id outside [-1, E) and for the repeat of an id
// the token named at a smaller k (both refused).
int64_t effective_id(const MoeShape& s, const RankInput& in, size_t t, int k) {
  const int K = s.top_k;
  const int64_t id = in.ids[t * K + k];
  if (!valid_id(id, s.experts)) return -1;
  for (int j = 0; j < k; ++j) {
    if (in.ids[t * K + j] == id) return -1;
  }
  return id;
}

// Ids dispatch refuses and check() reports: outside [-1, E), or a token's repeat.
bool has_refused_ids(const MoeShape& s, const RankInput& in) {
  for (size_t t = 0; t < in.tokens; ++t) {
    for (int k = 0; k < s.top_k; ++k) {
      const int64_t id = in.ids[t * s.top_k + k];
      if (id != -1 && effective_id(s, in, t, k) == -1) return true;
    }
  }
  return false;
}

struct RowRef {
  int source = -1;  // -1: padding
  int64_t token = -1;
  int k = -1;
  int expert = -1;  // local
};

struct DispatchRef {
  std::vector<int64_t> counts, offsets;
  std::vector<RowRef> rows;  // [offsets[L]]
};

DispatchRef dispatch_reference(const MoeShape& s, int world, const Round& round, int me) {
  const int L = s.experts / world, K = s.top_k;
  DispatchRef ref;
  ref.counts.assign(L, 0);
  ref.offsets.assign(L + 1, 0);
  for (int j = 0; j < L; ++j) {
    const int64_t expert = static_cast<int64_t>(me) * L + j;
    ref.offsets[j] = static_cast<int64_t>(ref.rows.size());
    for (int source = 0; source < world; ++source) {
      if (!sends(s, round, source)) continue;
      const RankInput& in = round.inputs[source];
      for (size_t t = 0; t < in.tokens; ++t) {
        for (int k = 0; k < K; ++k) {
          if (effective_id(s, in, t, k) == expert) ref.rows.push_back(RowRef{source, static_cast<int64_t>(t), k, j});
        }
      }
    }
    ref.counts[j] = static_cast<int64_t>(ref.rows.size()) - ref.offsets[j];
    ref.rows.resize(align_up(ref.rows.size(), static_cast<size_t>(s.expert_alignment)));
  }
  ref.offsets[L] = static_cast<int64_t>(ref.rows.size());
  return ref;
}

size_t rows_needed(const MoeShape& s, int world, const Round& round, int me) {
  return static_cast<size_t>(dispatch_reference(s, world, round, me).offsets.back());
}

// What check() must raise on `me` after the round: refused ids it sent, a refused T, or rows above its capacity.
bool must_raise(const MoeShape& s, int world, size_t capacity, const Round& round, int me) {
  if (!sends(s, round, me)) return true;
  if (has_refused_ids(s, round.inputs[me])) return true;
  return !rank_major(s) && rows_needed(s, world, round, me) > capacity;
}

bool any_overflow(const MoeShape& s, int world, size_t capacity, const Round& round) {
  if (rank_major(s)) return false;  // world * max_tokens rows hold every routing
  for (int r = 0; r < world; ++r) {
    if (rows_needed(s, world, round, r) > capacity) return true;
  }
  return false;
}

double tolerance_unit(DataType type) {
  switch (type) {
    case DataType::kBFloat16: return 0x1p-7;
    case DataType::kFloat16: return 0x1p-10;
    default: return 0x1p-20;
  }
}

// ---- Problems of one round on one rank ----

struct Problems {
  std::vector<std::string> lines;
  size_t count = 0;
  void add(const std::string& line) {
    if (lines.size() < kMaxLines) lines.push_back(line);
    ++count;
  }
};

std::string format_row_ref(const RowRef& r) {
  if (r.source < 0) return "padding";
  return "expert " + std::to_string(r.expert) + ", rank " + std::to_string(r.source) + " token " +
         std::to_string(r.token) + " k " + std::to_string(r.k);
}

// ---- One MoeBuffer and the buffers around it, on one rank ----

struct Outcome {
  std::optional<Error> error;  // raised by comm.check() after the stream synchronised
  Problems problems;
};

// How often Rig calls dispatch and combine in a row for one round, and whether ranks pause between calls.
struct Repeats {
  int dispatches = 1, combines = 1;
  uint64_t pause_seed = 0;  // 0: no pauses
  bool hooks = false;       // rank-major: every call split by a MoeHook, other work enqueued between the halves
};

class Rig {
 public:
  Rig(Communicator& comm, const MoeShape& shape, cudaStream_t stream)
      : comm_(comm),
        shape_(shape),
        world_(comm.size()),
        me_(comm.rank()),
        L_(shape.experts / comm.size()),
        dispatch_type_(dispatch_type_of(shape)),
        element_(datatype_size(dispatch_type_)),
        row_bytes_(shape.hidden * element_),
        out_element_(datatype_size(shape.type)),
        out_row_bytes_(shape.hidden * out_element_),
        scale_count_(scales_per_row(shape)),
        stream_(stream),
        moe_(MoeBuffer::create(comm, shape)),
        capacity_(moe_.capacity_rows()),
        x_((shape.max_tokens + kGuardTokens) * row_bytes_),
        scales_(std::max<size_t>((shape.max_tokens + kGuardTokens) * scale_count_ * sizeof(float), 1)),
        ids_((shape.max_tokens + kGuardTokens) * shape.top_k * sizeof(int64_t)),
        weights_((shape.max_tokens + kGuardTokens) * shape.top_k * sizeof(float)),
        out_((shape.max_tokens + kGuardTokens) * out_row_bytes_),
        y_(std::max<size_t>(capacity_, 1) * out_row_bytes_),
        tokens_device_(sizeof(int64_t)),
        scratch_(size_t(1) << 20) {
    remember(testing::moe_output_views(moe_));  // so the first round's views are poisoned too
  }

  MoeBuffer& moe() { return moe_; }
  const MoeShape& shape() const { return shape_; }
  size_t capacity() const { return capacity_; }
  cudaStream_t stream() const { return stream_; }

  // Every rank idle (its earlier work done, peers' too), this rank's output views and out poisoned, its inputs
  // uploaded, and every rank past that before anyone dispatches. Collective.
  void prepare(const Round& round) {
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    comm_.barrier();
    for (const MoeDispatchOutput& view : views_) poison(view, round.redispatch);
    cuda_check(cudaMemsetAsync(out_.get(), kPoison, out_.bytes(), stream_), "cudaMemsetAsync (out)");
    const RankInput& in = round.inputs[me_];
    const size_t K = static_cast<size_t>(shape_.top_k);
    if (in.tokens > shape_.max_tokens + kGuardTokens) throw std::logic_error("moe test: more tokens than the buffers");
    host_ids_.resize(in.ids.size() * sizeof(int64_t));
    for (size_t i = 0; i < in.ids.size(); ++i) {
      if (shape_.index_type == DataType::kInt32) {
        const int32_t id = static_cast<int32_t>(in.ids[i]);
        std::memcpy(host_ids_.data() + 4 * i, &id, 4);
      } else {
        std::memcpy(host_ids_.data() + 8 * i, &in.ids[i], 8);
      }
    }
    const size_t index_bytes = datatype_size(shape_.index_type);
    if (in.tokens > 0) {
      cuda_check(cudaMemcpyAsync(ids_.get(), host_ids_.data(), in.tokens * K * index_bytes, cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync (ids)");
      cuda_check(cudaMemcpyAsync(weights_.get(), in.weights.data(), in.tokens * K * sizeof(float), cudaMemcpyHostToDevice,
                                 stream_),
                 "cudaMemcpyAsync (weights)");
      cuda_check(cudaMemcpyAsync(x_.get(), in.x.data(), in.x.size(), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (x)");
      if (!in.scales.empty()) {
        cuda_check(cudaMemcpyAsync(scales_.get(), in.scales.data(), in.scales.size() * sizeof(float), cudaMemcpyHostToDevice,
                                   stream_),
                   "cudaMemcpyAsync (x_scales)");
      }
    }
    host_tokens_ = round.device_tokens.empty() ? 0 : round.device_tokens[me_];
    cuda_check(cudaMemcpyAsync(tokens_device_.get(), &host_tokens_, sizeof host_tokens_, cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync (device T)");
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (prepare)");
    comm_.barrier();
  }

  // Enqueues dispatch, the expert and combine on `stream` (capturable: the round's inputs are in the buffers
  // already; with device tokens the host count passed is 0). With `repeats`, dispatch and combine are each called
  // that many times in a row, so every call after the first follows a call of its own kind (the order in which
  // MoE skips no entry barrier), with host pauses between calls that differ between ranks (not capturable).
  MoeDispatchOutput enqueue(const Round& round, cudaStream_t stream, Repeats repeats = {}) {
    uint64_t pause = repeats.pause_seed;
    auto maybe_pause = [&] {
      if (repeats.pause_seed == 0) return;
      pause = mix64(pause + static_cast<uint64_t>(me_) + 1);
      std::this_thread::sleep_for(std::chrono::microseconds(pause % 300));
    };
    MoeDispatchOutput view{};
    for (int d = 0; d < repeats.dispatches; ++d) {
      maybe_pause();
      MoeHook hook;
      view = dispatch(round, stream, repeats.hooks ? &hook : nullptr);
      if (repeats.hooks) between_halves(hook, stream);
    }
    const void* y = expert(round, view, stream);
    for (int c = 0; c < repeats.combines; ++c) {
      maybe_pause();
      MoeHook hook;
      combine(round, view, y, stream, repeats.hooks ? &hook : nullptr);
      if (repeats.hooks) between_halves(hook, stream);
    }
    return view;
  }

  // The round's dispatch (or redispatch) on `stream`, split by `hook` when given. With device tokens the host
  // count passed is 0.
  MoeDispatchOutput dispatch(const Round& round, cudaStream_t stream, MoeHook* hook) {
    const bool device_tokens = !round.device_tokens.empty();
    const size_t tokens = device_tokens ? 0 : round.inputs[me_].tokens;
    const int64_t* tokens_device = device_tokens ? static_cast<const int64_t*>(tokens_device_.get()) : nullptr;
    const float* weights = static_cast<const float*>(weights_.get());
    const float* scales = scale_count_ > 0 ? static_cast<const float*>(scales_.get()) : nullptr;
    MoeDispatchOutput view;
    if (round.redispatch) {
      view = moe_.redispatch(handle_, x_.get(), scales, stream, hook);
    } else {
      view = scale_count_ > 0 ? moe_.dispatch(x_.get(), scales, ids_.get(), weights, tokens, tokens_device, stream, hook)
                              : moe_.dispatch(x_.get(), ids_.get(), weights, tokens, tokens_device, stream, hook);
    }
    handle_ = view.handle;
    remember(view);
    return view;
  }

  // The experts' output for a dispatch received (the test's expert kernel on `stream`); returns the y to combine.
  // Rank-major: the experts' sums straight into combine_input (no copy in combine) or into a buffer of the test's.
  const void* expert(const Round& round, const MoeDispatchOutput& view, cudaStream_t stream) {
    if (rank_major(shape_)) {
      void* y = round.in_place_expert ? view.combine_input : y_.get();
      cuda_check(moe_expert_tokens(dispatch_type_, view.x, view.scales, kMoeScaleColumns, shape_.type, y, view.topk_expert,
                                   round.weighted ? view.topk_weights : nullptr, shape_.top_k, shape_.max_tokens,
                                   view.received_tokens, world_, shape_.hidden, L_, stream),
                 "expert kernel launch");
      return y;
    }
    void* y = round.in_place_expert ? view.x : y_.get();
    cuda_check(moe_expert_rows(dispatch_type_, view.x, view.scales, kMoeScaleColumns, shape_.type, y, view.local_expert,
                               view.expert_offsets + L_, view.capacity_rows, shape_.hidden, L_, stream),
               "expert kernel launch");
    return y;
  }

  // The round's combine of y (rank-major: through the dispatch's handle, the weights already in y).
  void combine(const Round& round, const MoeDispatchOutput& view, const void* y, cudaStream_t stream, MoeHook* hook) {
    if (rank_major(shape_)) {
      moe_.combine(view.handle, y, out_.get(), false, stream, hook);
    } else {
      moe_.combine(y, out_.get(), round.weighted, stream, hook);
    }
  }

  // Synchronises, takes what check() raises, reads the outputs back and compares them with the reference.
  Outcome finish(const Round& round, const MoeDispatchOutput& view) {
    Outcome outcome;
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after the round");
    try {
      comm_.check();
    } catch (const Error& error) {
      outcome.error = error;
    }
    if (outcome.error && outcome.error->code() == ErrorCode::kTimeout) return outcome;  // nothing more to learn
    if (rank_major(shape_)) {
      compare_rank_major_dispatch(round, view, outcome.problems);
    } else {
      compare_dispatch(round, view, outcome.problems);
    }
    const bool overflowed = any_overflow(shape_, world_, capacity_, round);
    if (sends(shape_, round, me_) && !overflowed) compare_combine(round, outcome.problems);
    return outcome;
  }

  Outcome run(const Round& round, Repeats repeats = {}) {
    prepare(round);
    const MoeDispatchOutput view = enqueue(round, stream_, repeats);
    return finish(round, view);
  }

  // Judges an outcome: errors as the rules say, problems as failures. Returns whether the round was right.
  bool judge(const Round& round, const Outcome& outcome, size_t& failed_rounds) {
    Problems problems = outcome.problems;
    const bool must = must_raise(shape_, world_, capacity_, round, me_);
    bool any = false;
    for (int r = 0; r < world_; ++r) any = any || must_raise(shape_, world_, capacity_, round, r);
    if (must) {
      if (!outcome.error) {
        problems.add("check() raised nothing; expected kInvalidArgument (this rank sent refused ids, a T above "
                     "max_tokens, or receives more rows than capacity_rows)");
      } else if (outcome.error->code() != ErrorCode::kInvalidArgument) {
        problems.add(std::string("check() raised ") + error_code_name(outcome.error->code()) +
                     ", expected kInvalidArgument: " + outcome.error->what());
      }
    } else if (outcome.error) {
      if (!any || outcome.error->code() != ErrorCode::kInvalidArgument) {
        problems.add(std::string("check() raised: ") + outcome.error->what());
      }
    }
    if (outcome.error) {
      if (outcome.error->code() == ErrorCode::kTimeout) throw *outcome.error;  // the communicator is gone
      try {
        comm_.check();
      } catch (const Error& again) {
        problems.add(std::string("check() raised a second time: ") + again.what());
      }
    }
    if (problems.count == 0) return true;
    if (failed_rounds++ < kMaxFailedRounds) {
      std::string text = "rank " + std::to_string(me_) + ": " + describe(shape_) + ": " + round.label + " (seed 0x";
      char seed[24];
      std::snprintf(seed, sizeof seed, "%016llx", static_cast<unsigned long long>(round.seed));
      text += std::string(seed) + "): " + std::to_string(problems.count) + " problem(s)";
      for (const std::string& line : problems.lines) text += "\n    " + line;
      ADD_FAILURE() << text;
    }
    return false;
  }

  bool run_and_judge(const Round& round, size_t& failed_rounds, Repeats repeats = {}) {
    return judge(round, run(round, repeats), failed_rounds);
  }

  // A call's receiving half after other work on the stream (a fill of a scratch buffer): the hook must hold it
  // until then.
  void between_halves(MoeHook& hook, cudaStream_t stream) {
    if (!hook.pending()) throw std::logic_error("moe test: a call with a hook left nothing to receive");
    cuda_check(cudaMemsetAsync(scratch_.get(), 0x3C, scratch_.bytes(), stream), "cudaMemsetAsync (between halves)");
    hook.receive(stream);
    if (hook.pending()) throw std::logic_error("moe test: MoeHook::receive left the hook pending");
  }

  // out's rows [0, tokens) as combine left them (after the stream synchronised).
  std::vector<unsigned char> out_rows(size_t tokens) {
    std::vector<unsigned char> out(tokens * out_row_bytes_);
    if (!out.empty()) cuda_check(cudaMemcpy(out.data(), out_.get(), out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy (out)");
    return out;
  }

 private:
  void remember(const MoeDispatchOutput& view) {
    for (const MoeDispatchOutput& known : views_) {
      if (known.x == view.x && known.expert_counts == view.expert_counts && known.expert_offsets == view.expert_offsets &&
          known.weights == view.weights && known.local_expert == view.local_expert &&
          known.source_rank == view.source_rank && known.source_token == view.source_token && known.scales == view.scales) {
        return;
      }
    }
    views_.push_back(view);
  }

  // `rows_only`: before a redispatch, which leaves the metadata and counts as they are, only what it writes.
  void poison(const MoeDispatchOutput& v, bool rows_only = false) {
    const size_t rows = v.capacity_rows;
    auto set = [&](const void* p, size_t bytes) {
      if (p != nullptr && bytes > 0) {
        cuda_check(cudaMemsetAsync(const_cast<void*>(p), kPoison, bytes, stream_), "cudaMemsetAsync (poison a view)");
      }
    };
    set(v.x, rows * row_bytes_);
    set(v.scales, rows * scale_count_ * sizeof(float));
    set(v.combine_input, rows * out_row_bytes_);
    if (rows_only) return;
    set(v.weights, rows * sizeof(float));
    set(v.local_expert, rows * sizeof(int32_t));
    set(v.source_rank, rows * sizeof(int32_t));
    set(v.source_token, rows * sizeof(int32_t));
    set(v.expert_counts, static_cast<size_t>(L_) * sizeof(int64_t));
    set(v.expert_offsets, static_cast<size_t>(L_ + 1) * sizeof(int64_t));
    set(v.received_tokens, static_cast<size_t>(world_) * sizeof(int64_t));
    set(v.topk_expert, rows * shape_.top_k * sizeof(int32_t));
    set(v.topk_weights, rows * shape_.top_k * sizeof(float));
    set(v.combine_input, rows * out_row_bytes_);
  }

  // Which view fields are set: those of the buffer's layout, and no others (moe.hpp).
  void compare_fields(const MoeDispatchOutput& v, Problems& problems) {
    const bool rank = rank_major(shape_);
    auto field = [&](const char* name, const void* p, bool wanted) {
      if ((p != nullptr) != wanted) problems.add(std::string("MoeDispatchOutput::") + name + (wanted ? " is null" : " is set"));
    };
    field("x", v.x, true);
    field("expert_counts", v.expert_counts, true);
    field("source_rank", v.source_rank, true);
    field("source_token", v.source_token, true);
    field("scales", v.scales, scale_count_ > 0);
    field("expert_offsets", v.expert_offsets, !rank);
    field("weights", v.weights, !rank);
    field("local_expert", v.local_expert, !rank);
    field("received_tokens", v.received_tokens, rank);
    field("topk_expert", v.topk_expert, rank);
    field("topk_weights", v.topk_weights, rank);
    field("combine_input", v.combine_input, rank);
  }

  // Rank-major: received_tokens, expert_counts (pairs per local expert), and every row s * max_tokens + i with
  // i < received_tokens[s]: bit for bit source s's i-th token for this rank (in token order), its source rank and
  // token, its top_k local experts (-1 where not here) and weights (0 there), and its scales with fp8 dispatch.
  // Low-latency (fixed rows): received_tokens[s] is s's T, row s * max_tokens + t is token t of s when it has an
  // expert here, else a hole (source rank and token -1, every expert -1, every weight 0).
  void compare_rank_major_dispatch(const Round& round, const MoeDispatchOutput& view, Problems& problems) {
    compare_fields(view, problems);
    const size_t K = static_cast<size_t>(shape_.top_k), M = shape_.max_tokens, rows = M * world_;
    if (view.capacity_rows != rows || capacity_ != rows) {
      problems.add("capacity_rows " + std::to_string(view.capacity_rows) + " (buffer " + std::to_string(capacity_) +
                   "), expected world * max_tokens = " + std::to_string(rows));
      return;
    }
    const std::vector<int64_t> received = download(view.received_tokens, world_);
    const std::vector<int64_t> counts = download(view.expert_counts, L_);
    std::vector<unsigned char> x(rows * row_bytes_);
    cuda_check(cudaMemcpyAsync(x.data(), view.x, x.size(), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    const std::vector<int32_t> experts = download(view.topk_expert, rows * K);
    const std::vector<float> weights = download(view.topk_weights, rows * K);
    const std::vector<int32_t> source_rank = download(view.source_rank, rows);
    const std::vector<int32_t> source_token = download(view.source_token, rows);
    const std::vector<float> scales = view.scales == nullptr ? std::vector<float>() : download(view.scales, rows * scale_count_);
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (download)");
    std::vector<int64_t> want_counts(L_, 0);
    size_t bad_rows = 0;
    std::string first_bad;
    for (int source = 0; source < world_; ++source) {
      std::vector<size_t> tokens;  // source's tokens with an expert here, in order
      const RankInput& in = round.inputs[source];
      if (sends(shape_, round, source)) {
        for (size_t t = 0; t < in.tokens; ++t) {
          bool here = false;
          for (size_t k = 0; k < K; ++k) {
            const int64_t id = effective_id(shape_, in, t, static_cast<int>(k));
            if (id >= 0 && id / L_ == me_) {
              here = true;
              ++want_counts[id % L_];
            }
          }
          if (here) tokens.push_back(t);
        }
      }
      const size_t want_received = !shape_.low_latency ? tokens.size() : sends(shape_, round, source) ? in.tokens : 0;
      if (received[source] != static_cast<int64_t>(want_received)) {
        problems.add("received_tokens[" + std::to_string(source) + "]: expected " + std::to_string(want_received) + ", got " +
                     std::to_string(received[source]));
        continue;
      }
      if (shape_.low_latency) {  // the holes: the tokens below s's T with no expert here
        size_t next = 0;
        for (size_t t = 0; t < want_received; ++t) {
          if (next < tokens.size() && tokens[next] == t) {
            ++next;
            continue;
          }
          const size_t row = source * M + t;
          bool hole = source_rank[row] == -1 && source_token[row] == -1;
          for (size_t k = 0; k < K; ++k) hole = hole && experts[row * K + k] == -1 && weights[row * K + k] == 0.0f;
          if (!hole && bad_rows++ == 0) {
            first_bad = "row " + std::to_string(row) + " (rank " + std::to_string(source) + " token " + std::to_string(t) +
                        "): not marked a hole (source rank " + std::to_string(source_rank[row]) + " token " +
                        std::to_string(source_token[row]) + ")";
          }
        }
      }
      for (size_t i = 0; i < tokens.size(); ++i) {
        const size_t t = tokens[i], row = source * M + (shape_.low_latency ? t : i);
        std::string wrong;
        if (std::memcmp(x.data() + row * row_bytes_, in.x.data() + t * row_bytes_, row_bytes_) != 0) wrong += " data";
        if (source_rank[row] != source || source_token[row] != static_cast<int32_t>(t)) {
          wrong += " source (rank " + std::to_string(source_rank[row]) + " token " + std::to_string(source_token[row]) + ")";
        }
        for (size_t k = 0; k < K; ++k) {
          const int64_t id = effective_id(shape_, in, t, static_cast<int>(k));
          const bool here = id >= 0 && id / L_ == me_;
          const int32_t want_expert = here ? static_cast<int32_t>(id % L_) : -1;
          const float want_weight = here ? in.weights[t * K + k] : 0.0f;
          if (experts[row * K + k] != want_expert || std::memcmp(&weights[row * K + k], &want_weight, sizeof(float)) != 0) {
            wrong += " pair " + std::to_string(k) + " (expert " + std::to_string(experts[row * K + k]) + ", expected " +
                     std::to_string(want_expert) + ")";
          }
        }
        if (scale_count_ > 0 && std::memcmp(scales.data() + row * scale_count_, in.scales.data() + t * scale_count_,
                                            scale_count_ * sizeof(float)) != 0) {
          wrong += " scales";
        }
        if (!wrong.empty() && bad_rows++ == 0) {
          first_bad = "row " + std::to_string(row) + " (rank " + std::to_string(source) + " token " + std::to_string(t) + "):" + wrong;
        }
      }
    }
    if (bad_rows > 0) problems.add(std::to_string(bad_rows) + " received row(s) wrong, first " + first_bad);
    for (int j = 0; j < L_; ++j) {
      if (counts[j] != want_counts[j]) {
        problems.add("expert_counts[" + std::to_string(j) + "]: expected " + std::to_string(want_counts[j]) + ", got " +
                     std::to_string(counts[j]));
      }
    }
  }

  template <typename T>
  std::vector<T> download(const T* device, size_t count) {
    std::vector<T> host(count);
    if (count > 0) {
      cuda_check(cudaMemcpyAsync(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    }
    return host;
  }

  // The bytes the dispatched row of `r` must hold (the source's row, scaled when the expert ran in place).
  void expected_row(const Round& round, const RowRef& r, unsigned char* out) const {
    const unsigned char* source = round.inputs[r.source].x.data() + static_cast<size_t>(r.token) * row_bytes_;
    if (!round.in_place_expert) {
      std::memcpy(out, source, row_bytes_);
      return;
    }
    const double scale = moe_expert_scale(r.expert);
    for (size_t h = 0; h < shape_.hidden; ++h) {
      const double value = decode_float(shape_.type, load_bits(shape_.type, source + h * element_)) * scale;
      store_bits(shape_.type, encode_exact(shape_.type, value), out + h * element_);
    }
  }

  void compare_dispatch(const Round& round, const MoeDispatchOutput& view, Problems& problems) {
    compare_fields(view, problems);
    const DispatchRef ref = dispatch_reference(shape_, world_, round, me_);
    const size_t K = static_cast<size_t>(shape_.top_k);
    if (view.capacity_rows != capacity_) {
      problems.add("MoeDispatchOutput::capacity_rows " + std::to_string(view.capacity_rows) + ", MoeBuffer::capacity_rows " +
                   std::to_string(capacity_));
    }
    if (view.local_experts != L_) {
      problems.add("MoeDispatchOutput::local_experts " + std::to_string(view.local_experts) + ", expected " +
                   std::to_string(L_));
    }
    const bool overflow = static_cast<size_t>(ref.offsets.back()) > capacity_;
    const size_t rows = overflow ? capacity_ : ref.rows.size();
    const std::vector<int64_t> counts = download(view.expert_counts, L_);
    const std::vector<int64_t> offsets = download(view.expert_offsets, L_ + 1);
    std::vector<unsigned char> x(rows * row_bytes_);
    if (!x.empty()) cuda_check(cudaMemcpyAsync(x.data(), view.x, x.size(), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    const std::vector<float> weights = overflow ? std::vector<float>() : download(view.weights, rows);
    const std::vector<int32_t> local = overflow ? std::vector<int32_t>() : download(view.local_expert, rows);
    const std::vector<int32_t> source_rank = overflow ? std::vector<int32_t>() : download(view.source_rank, rows);
    const std::vector<int32_t> source_token = overflow ? std::vector<int32_t>() : download(view.source_token, rows);
    if ((view.scales != nullptr) != (scale_count_ > 0)) {
      problems.add(std::string("MoeDispatchOutput::scales is ") + (view.scales != nullptr ? "set" : "null") +
                   (scale_count_ > 0 ? ", the shape dispatches fp8" : ", the shape does not dispatch fp8"));
    }
    const std::vector<float> scales =
        overflow || view.scales == nullptr ? std::vector<float>() : download(view.scales, rows * scale_count_);
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (download)");

    for (int j = 0; j < L_; ++j) {
      if (counts[j] != ref.counts[j]) {
        problems.add("expert_counts[" + std::to_string(j) + "]: expected " + std::to_string(ref.counts[j]) + ", got " +
                     std::to_string(counts[j]));
      }
    }
    for (int j = 0; j <= L_; ++j) {
      if (offsets[j] != ref.offsets[j]) {
        problems.add("expert_offsets[" + std::to_string(j) + "]: expected " + std::to_string(ref.offsets[j]) + ", got " +
                     std::to_string(offsets[j]));
      }
    }
    if (overflow) {  // nothing may be written into the rows
      size_t written = 0;
      for (unsigned char b : x) written += b != kPoison ? 1 : 0;
      if (written > 0) {
        problems.add("needs " + std::to_string(ref.offsets.back()) + " rows, capacity " + std::to_string(capacity_) + ": " +
                     std::to_string(written) + " byte(s) of x were written (expected none)");
      }
      return;
    }
    size_t bad_meta = 0, bad_data = 0, bad_padding = 0, bad_scales = 0;
    std::string first_meta, first_data, first_padding, first_scales;
    std::vector<unsigned char> want(row_bytes_);
    for (size_t i = 0; i < rows; ++i) {
      const RowRef& r = ref.rows[i];
      const std::string where = "row " + std::to_string(i) + " (" + format_row_ref(r) + ")";
      if (r.source < 0) {
        if (weights[i] != 0.0f || local[i] != -1 || source_rank[i] != -1 || source_token[i] != -1) {
          if (bad_padding++ == 0) {
            char text[160];
            std::snprintf(text, sizeof text, ": weight %g, local_expert %d, source_rank %d, source_token %d (expected 0, -1, -1, -1)",
                          static_cast<double>(weights[i]), local[i], source_rank[i], source_token[i]);
            first_padding = where + text;
          }
        }
        continue;
      }
      const float w = round.inputs[r.source].weights[static_cast<size_t>(r.token) * K + r.k];
      if (std::memcmp(&weights[i], &w, sizeof w) != 0 || local[i] != r.expert || source_rank[i] != r.source ||
          source_token[i] != r.token) {
        if (bad_meta++ == 0) {
          char text[200];
          std::snprintf(text, sizeof text,
                        ": weight %.9g, local_expert %d, source_rank %d, source_token %d (expected %.9g, %d, %d, %lld)",
                        static_cast<double>(weights[i]), local[i], source_rank[i], source_token[i], static_cast<double>(w),
                        r.expert, r.source, static_cast<long long>(r.token));
          first_meta = where + text;
        }
      }
      expected_row(round, r, want.data());
      const unsigned char* got = x.data() + i * row_bytes_;
      if (std::memcmp(got, want.data(), row_bytes_) != 0) {
        if (bad_data++ == 0) {
          size_t wrong = 0, first = 0;
          for (size_t h = shape_.hidden; h-- > 0;) {
            if (std::memcmp(got + h * element_, want.data() + h * element_, element_) != 0) {
              ++wrong;
              first = h;
            }
          }
          first_data = where + ": " + std::to_string(wrong) + " of " + std::to_string(shape_.hidden) +
                       " elements wrong, first [" + std::to_string(first) + "]: expected " +
                       format_element(dispatch_type_, want.data() + first * element_) + ", got " +
                       format_element(dispatch_type_, got + first * element_);
        }
      }
      if (scale_count_ > 0 && !scales.empty()) {
        const float* want_scales = round.inputs[r.source].scales.data() + static_cast<size_t>(r.token) * scale_count_;
        const float* got_scales = scales.data() + i * scale_count_;
        if (std::memcmp(got_scales, want_scales, scale_count_ * sizeof(float)) != 0 && bad_scales++ == 0) {
          size_t c = 0;
          while (std::memcmp(got_scales + c, want_scales + c, sizeof(float)) == 0) ++c;
          char text[160];
          std::snprintf(text, sizeof text, ": scale %zu of %zu is %.9g, expected %.9g", c, scale_count_,
                        static_cast<double>(got_scales[c]), static_cast<double>(want_scales[c]));
          first_scales = where + text;
        }
      }
    }
    if (bad_scales > 0) problems.add(std::to_string(bad_scales) + " row(s) with wrong scales, first " + first_scales);
    if (bad_meta > 0) problems.add(std::to_string(bad_meta) + " row(s) with wrong metadata, first " + first_meta);
    if (bad_data > 0) problems.add(std::to_string(bad_data) + " row(s) with wrong data, first " + first_data);
    if (bad_padding > 0) problems.add(std::to_string(bad_padding) + " padding row(s) wrong, first " + first_padding);
  }

  void compare_combine(const Round& round, Problems& problems) {
    const RankInput& in = round.inputs[me_];
    const size_t K = static_cast<size_t>(shape_.top_k);
    const size_t rows = shape_.max_tokens + kGuardTokens;
    std::vector<unsigned char> out(rows * out_row_bytes_);
    cuda_check(cudaMemcpyAsync(out.data(), out_.get(), out.size(), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (out)");
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (out)");
    const double unit = tolerance_unit(shape_.type);
    size_t wrong = 0, wrong_tokens = 0;
    std::string first;
    std::vector<double> factor(K);
    for (size_t t = 0; t < in.tokens; ++t) {
      std::set<int64_t> owners;
      for (size_t k = 0; k < K; ++k) {
        const int64_t id = effective_id(shape_, in, t, static_cast<int>(k));
        factor[k] = 0;
        if (id < 0) continue;
        owners.insert(id / L_);
        factor[k] = (round.weighted ? static_cast<double>(in.weights[t * K + k]) : 1.0) *
                    moe_expert_scale(static_cast<int>(id % L_));
      }
      const double partials = static_cast<double>(owners.size());
      size_t wrong_here = 0;
      for (size_t h = 0; h < shape_.hidden; ++h) {
        double xv = decode_float(dispatch_type_, load_bits(dispatch_type_, in.x.data() + (t * shape_.hidden + h) * element_));
        if (scale_count_ > 0) xv *= static_cast<double>(in.scales[t * scale_count_ + h / kMoeScaleColumns]);
        double reference = 0, magnitude = 0;
        for (size_t k = 0; k < K; ++k) {
          reference += factor[k] * xv;
          magnitude += std::fabs(factor[k] * xv);
        }
        const unsigned char* at = out.data() + (t * shape_.hidden + h) * out_element_;
        const double got = decode_float(shape_.type, load_bits(shape_.type, at));
        const double tolerance = unit * (partials + 1) * magnitude;
        if (std::fabs(got - reference) <= tolerance) continue;  // false for NaN; a token with no expert: exactly 0
        ++wrong;
        if (wrong_here++ == 0 && wrong_tokens++ == 0) {
          char text[200];
          std::snprintf(text, sizeof text, "out[%zu][%zu] (%zu expert(s) on %zu rank(s)): expected %.9g (tolerance %.3g), got ",
                        t, h, static_cast<size_t>(std::count_if(factor.begin(), factor.end(), [](double f) { return f != 0; })),
                        owners.size(), reference, tolerance);
          first = text + format_element(shape_.type, at);
        }
      }
    }
    if (wrong > 0) {
      problems.add(std::string(round.weighted ? "weighted" : "unweighted") + " combine: " + std::to_string(wrong) +
                   " element(s) of " + std::to_string(wrong_tokens) + " token(s) wrong, first " + first);
    }
    size_t written = 0, first_row = 0;
    for (size_t i = in.tokens * out_row_bytes_; i < out.size(); ++i) {
      if (out[i] != kPoison && written++ == 0) first_row = i / out_row_bytes_;
    }
    if (written > 0) {
      problems.add("combine wrote " + std::to_string(written) + " byte(s) of out past its " + std::to_string(in.tokens) +
                   " token rows, first in row " + std::to_string(first_row));
    }
  }

  Communicator& comm_;
  MoeShape shape_;
  int world_, me_, L_;
  DataType dispatch_type_;  // what dispatch moves: the rows' type, or fp8
  size_t element_, row_bytes_;          // of the dispatched rows (x)
  size_t out_element_, out_row_bytes_;  // of the experts' output and combine's (y, out): shape.type
  size_t scale_count_;                  // fp8 dispatch: scales per row, else 0
  cudaStream_t stream_;
  MoeBuffer moe_;
  size_t capacity_;
  DeviceBuffer x_, scales_, ids_, weights_, out_, y_, tokens_device_, scratch_;
  std::vector<MoeDispatchOutput> views_;  // the buffer's views and every view dispatch has returned (poisoned before each round)
  std::vector<unsigned char> host_ids_;
  int64_t host_tokens_ = 0;
  MoeHandle handle_;  // of the last dispatch (redispatch rounds reuse it)
};

// ---- The rounds of the matrix ----

// Every routing of the matrix for one shape, each twice: weighted, then unweighted with the same inputs (the
// second dispatch must lay the rows out the same way).
std::vector<Round> matrix_rounds(const MoeShape& s, int world, uint64_t seed) {
  const size_t M = s.max_tokens;
  std::vector<Round> rounds;
  uint64_t n = 0;
  auto add = [&](const std::string& label, const std::vector<RankPlan>& plans, bool in_place = false) {
    const uint64_t round_seed = mix64(seed + ++n);
    for (bool weighted : {true, false}) {
      rounds.push_back(make_round(s, world, round_seed, plans, label + (weighted ? ", weighted" : ", unweighted"), weighted,
                                  in_place));
    }
  };
  const std::vector<size_t> uneven = different_tokens(mix64(seed ^ 0x7E4ull), world, 1, M);
  add("random routing, a different T on every rank, 1 id in 8 is -1", plans_of(uneven, Route::kRandom, 8));
  add("T = 0 on every rank", plans_of(std::vector<size_t>(world, 0), Route::kRandom));
  add("T = 1 on every rank", plans_of(std::vector<size_t>(world, 1), Route::kRandom));
  add("T = max_tokens on every rank", plans_of(std::vector<size_t>(world, M), Route::kRandom));
  {
    std::vector<RankPlan> plans = plans_of(std::vector<size_t>(world, M), Route::kToRank);
    add("every token of every rank to rank 0's experts, T = max_tokens", plans);
  }
  {
    std::vector<size_t> tokens = different_tokens(mix64(seed ^ 0x5E4Dull), world, 1, M);
    tokens[0] = 0;
    add("rank 0 sends nothing (T = 0), rank " + std::to_string(world - 1) + " receives nothing",
        plans_of(tokens, Route::kAvoidLastRank));
  }
  {
    std::vector<RankPlan> plans = plans_of(different_tokens(mix64(seed ^ 0x404Eull), world, 1, M), Route::kRandom, 5);
    plans[world - 1].route = Route::kNone;
    add("rank " + std::to_string(world - 1) + "'s tokens choose no expert (ids all -1)", plans);
  }
  if (s.top_k >= 2) {
    add("a token lists one expert twice (2 tokens in 3)", plans_of(different_tokens(mix64(seed ^ 0xD0Bull), world, 1, M),
                                                                 Route::kDuplicates));
  }
  if (!s.dispatch_type) {  // fp8 rows cannot hold the expert's output
    add("the expert writes over the dispatched rows, combine reads them there",
        plans_of(different_tokens(mix64(seed ^ 0x1B1Aull), world, 1, M), Route::kRandom, 8), true);
  }
  return rounds;
}

// Every matrix round of the configurations `configs` (indices into kConfigs), round i called as repeats_of(i,
// the shared seed) says; fails the test when a round is wrong.
// A config of a test and the salt of its rounds' seeds (the index of a kConfigs entry).
struct SaltedConfig {
  Config config;
  size_t salt;
};

void run_configs(Communicator& comm, const std::vector<SaltedConfig>& configs, uint64_t seed_offset,
                 const std::function<Repeats(size_t, uint64_t)>& repeats_of, Layout layout = {}) {
  const int world = comm.size();
  const uint64_t seed = shared_seed(comm);
  StreamHandle stream;
  size_t failed = 0, rounds = 0;
  for (const auto& [config, c] : configs) {
    const MoeShape shape = make_shape(config, world, layout);
    Rig rig(comm, shape, stream.get());
    const std::vector<Round> all = matrix_rounds(shape, world, mix64(seed + seed_offset + c));
    for (size_t i = 0; i < all.size(); ++i) {
      rig.run_and_judge(all[i], failed, repeats_of(i, seed));
      ++rounds;
    }
    comm.barrier();  // nobody frees a MoeBuffer a peer still uses
  }
  EXPECT_EQ(failed, 0u) << "rank " << comm.rank() << ": " << failed << " of " << rounds << " rounds wrong";
}

void run_matrix(Communicator& comm, const std::vector<size_t>& configs, uint64_t seed_offset,
                const std::function<Repeats(size_t, uint64_t)>& repeats_of, Layout layout = {}) {
  std::vector<SaltedConfig> salted;
  for (size_t c : configs) salted.push_back({kConfigs[c], c});
  run_configs(comm, salted, seed_offset, repeats_of, layout);
}

TEST(Moe, DispatchAndCombineMatchTheReference) {
  with_communicator([](Communicator& comm) {
    std::vector<size_t> every(std::size(kConfigs));
    std::iota(every.begin(), every.end(), size_t(0));
    run_matrix(comm, every, 0, [](size_t, uint64_t) { return Repeats{}; });
  });
}

// The rank-major layout over the same matrix (expert_alignment 1); "the expert writes over the dispatched rows"
// becomes "the experts' sums go straight into combine_input" (combine copies nothing).
TEST(MoeRankMajor, DispatchAndCombineMatchTheReference) {
  with_communicator([](Communicator& comm) {
    std::vector<size_t> every(std::size(kConfigs));
    std::iota(every.begin(), every.end(), size_t(0));
    run_matrix(comm, every, 0x4A4Eull, [](size_t, uint64_t) { return Repeats{}; }, MoeLayout::kRankMajor);
  });
}

// Dispatch after dispatch and combine after combine: each such call passes the entry barrier that a dispatch
// followed by a combine makes needless (a peer may still be in the last call of the same kind). Every rank must
// take the same decision, or a wait is never matched (a timeout here), and the last dispatch's and combine's
// outputs must be right. Ranks pause differently between calls, so they drift apart.
Repeats skewed_repeats(size_t i, uint64_t seed) {
  Repeats repeats;
  repeats.dispatches = 1 + static_cast<int>(i % 3);
  repeats.combines = 1 + static_cast<int>((i / 3) % 3);
  repeats.pause_seed = mix64(seed ^ (0x5EEDull + i));
  return repeats;
}

TEST(Moe, RepeatedDispatchesAndCombinesWithRankSkew) {
  with_communicator([](Communicator& comm) { run_matrix(comm, {0, 5}, 0xD15Cull, skewed_repeats); });
}

TEST(MoeRankMajor, RepeatedDispatchesAndCombinesWithRankSkew) {
  with_communicator([](Communicator& comm) { run_matrix(comm, {0, 5, 11}, 0xD15Cull, skewed_repeats, MoeLayout::kRankMajor); });
}

// The same with a training-sized max_tokens, so the buffer runs on every multiprocessor (hundreds of blocks): in a
// dispatch after a dispatch, a block with many tokens before its own waits at the entry barrier long after block
// 0 has sent its rows and waits for the peers' (on every block's channel). Each channel's entry wait must come
// first, or a dispatch ends before its rows land and a later wait times out.
TEST(MoeRankMajor, RepeatedDispatchesOfATrainingSizedBufferWithRankSkew) {
  constexpr Config kTraining{DataType::kBFloat16, DataType::kInt64, 64, 8, 64, 1, 4096};
  with_communicator([&](Communicator& comm) {
    run_configs(comm, {{kTraining, 0}}, 0x7A1Dull, skewed_repeats, MoeLayout::kRankMajor);
    run_configs(comm, {{kTraining, 1}}, 0x7A1Dull, skewed_repeats, kLowLatency);
  });
}

// ---- T on the device ----

std::vector<Round> device_token_rounds(const MoeShape& s, int world, uint64_t seed, int count) {
  std::vector<Round> rounds;
  for (int i = 0; i < count; ++i) {
    const uint64_t round_seed = mix64(seed + static_cast<uint64_t>(i));
    std::vector<size_t> tokens = different_tokens(mix64(round_seed ^ 0x70Eull), world, 0, s.max_tokens);
    if (i % 4 == 1) tokens.assign(world, 0);
    if (i % 4 == 2) tokens.assign(world, s.max_tokens);
    Round round = make_round(s, world, round_seed, plans_of(tokens, i % 4 == 3 ? Route::kAvoidLastRank : Route::kRandom, 7),
                             "device T " + std::to_string(i) + (i % 2 == 0 ? ", weighted" : ", unweighted"), i % 2 == 0);
    for (size_t t : tokens) round.device_tokens.push_back(static_cast<int64_t>(t));
    rounds.push_back(std::move(round));
  }
  return rounds;
}

void token_count_on_the_device(Communicator& comm, Layout layout) {
  const int world = comm.size();
  const uint64_t seed = shared_seed(comm);
  StreamHandle stream;
  const MoeShape shape = make_shape({DataType::kBFloat16, DataType::kInt32, 128, 4, 16, 16, 128}, world, layout);
  Rig rig(comm, shape, stream.get());
  size_t failed = 0;
  const std::vector<Round> rounds = device_token_rounds(shape, world, seed, 8);
  for (const Round& round : rounds) rig.run_and_judge(round, failed);
  EXPECT_EQ(failed, 0u) << "rank " << comm.rank() << ": " << failed << " of " << rounds.size() << " rounds wrong";
  comm.barrier();
}

TEST(Moe, TokenCountOnTheDevice) {
  with_communicator([](Communicator& comm) { token_count_on_the_device(comm, MoeLayout::kExpertMajor); });
}

TEST(MoeRankMajor, TokenCountOnTheDevice) {
  with_communicator([](Communicator& comm) { token_count_on_the_device(comm, MoeLayout::kRankMajor); });
}

// ---- CUDA graphs ----

// Captures rig.enqueue(round) on the rig's stream. Returns the view the captured dispatch returned.
MoeDispatchOutput capture(Rig& rig, const Round& round, GraphHandles& graph) {
  const cudaStream_t stream = rig.stream();
  cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  MoeDispatchOutput view;
  try {
    view = rig.enqueue(round, stream);
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);
    if (broken != nullptr) cudaGraphDestroy(broken);
    throw;
  }
  cuda_check(cudaStreamEndCapture(stream, &graph.graph), "cudaStreamEndCapture");
  graph.exec = instantiate_on_every_rank(graph.graph, stream);
  return view;
}

// Replay r's routing: T per rank in [0, max_tokens], 1 id in 6 is -1; every 10th all T = 0, every 10th (another)
// every token of every rank to one rank's experts with T = max_tokens, every 10th (another) T = max_tokens.
Round replay_round(const MoeShape& s, int world, uint64_t seed, int r) {
  const uint64_t round_seed = mix64(seed + static_cast<uint64_t>(r));
  std::vector<size_t> tokens = different_tokens(mix64(round_seed ^ 0x6EAull), world, 0, s.max_tokens);
  std::vector<RankPlan> plans = plans_of(tokens, Route::kRandom, 6);
  std::string label = "replay " + std::to_string(r);
  if (r % 10 == 3) {
    plans = plans_of(std::vector<size_t>(world, 0), Route::kRandom);
    label += " (T = 0 everywhere)";
  } else if (r % 10 == 7) {
    const int target = (r / 10) % world;
    plans = plans_of(std::vector<size_t>(world, s.max_tokens), Route::kToRank);
    for (RankPlan& p : plans) p.target = target;
    label += " (all to rank " + std::to_string(target) + ", T = max_tokens)";
  } else if (r % 10 == 5) {
    plans = plans_of(std::vector<size_t>(world, s.max_tokens), Route::kRandom);
    label += " (T = max_tokens everywhere)";
  }
  Round round = make_round(s, world, round_seed, plans, label, true);
  for (const RankPlan& p : plans) round.device_tokens.push_back(static_cast<int64_t>(p.tokens));
  return round;
}

// dispatch (T on the device) + the expert kernel + weighted combine in one graph, replayed 100 times with the
// ids, weights, rows and device T rewritten between replays (copies on the stream, outside the graph), each
// checked; then 1,000 replays back to back on one routing, checked at the end.
void replays_with_changing_routing(Communicator& comm, Layout layout) {
  const int world = comm.size();
  const uint64_t seed = shared_seed(comm);
  constexpr int kReplays = 100, kBackToBack = 1000;
  StreamHandle stream;
  const MoeShape shape = make_shape({DataType::kBFloat16, DataType::kInt64, 256, 8, 64, 32, 128}, world, layout);
  Rig rig(comm, shape, stream.get());
  size_t failed = 0;
  // One eager round first, then the capture (the two-buffer test captures a first use).
  const Round first = replay_round(shape, world, mix64(seed ^ 0xF1F1ull), 0);
  rig.run_and_judge(first, failed);
  GraphHandles graph;
  rig.prepare(first);
  const MoeDispatchOutput view = capture(rig, first, graph);  // nothing runs while capturing
  for (int r = 0; r < kReplays; ++r) {
    const Round round = replay_round(shape, world, seed, r);
    rig.prepare(round);
    cuda_check(cudaGraphLaunch(graph.exec, rig.stream()), "cudaGraphLaunch");
    rig.judge(round, rig.finish(round, view), failed);
  }
  const Round last = replay_round(shape, world, mix64(seed ^ 0x1000ull), 5);
  rig.prepare(last);
  replay_graph(graph.exec, rig.stream(), kBackToBack);
  rig.judge(last, rig.finish(last, view), failed);
  EXPECT_EQ(failed, 0u) << "rank " << comm.rank() << ": " << failed << " of " << kReplays + 2 << " checked rounds wrong";
  comm.barrier();
}

TEST(MoeGraph, ReplaysWithChangingRoutingRowsAndTokenCounts) {
  with_communicator([](Communicator& comm) { replays_with_changing_routing(comm, MoeLayout::kExpertMajor); });
}

TEST(MoeRankMajorGraph, ReplaysWithChangingRoutingRowsAndTokenCounts) {
  with_communicator([](Communicator& comm) { replays_with_changing_routing(comm, MoeLayout::kRankMajor); });
}

// Two MoeBuffers of different shapes, each captured at its first use in a graph on its own stream; the two graphs
// are launched back to back without waiting, 20 times with fresh routings, and both checked every time.
// Two buffers of one communicator (bf16 with int64 ids, float32 with int32 ids), each driven on its own stream,
// both in flight before either is waited for; every round of both is checked. `graphs`: each buffer's round
// captured once and replayed with new routing, else enqueued eagerly with pauses that differ between ranks.
// `layout_b`: the second buffer's layout.
void two_buffers_on_two_streams(Communicator& comm, int iterations, bool graphs,
                                Layout layout_b = {}) {
  const int world = comm.size();
  const uint64_t seed = shared_seed(comm);
  StreamHandle stream_a, stream_b;
  const MoeShape shape_a = make_shape({DataType::kBFloat16, DataType::kInt64, 256, 8, 64, 1, 64}, world);
  const MoeShape shape_b = make_shape({DataType::kFloat32, DataType::kInt32, 72, 2, 16, 16, 96}, world, layout_b);
  Rig a(comm, shape_a, stream_a.get());
  Rig b(comm, shape_b, stream_b.get());
  auto round_a = [&](int i) { return replay_round(shape_a, world, mix64(seed ^ 0xAAull), i); };
  auto round_b = [&](int i) { return replay_round(shape_b, world, mix64(seed ^ 0xBBull), i); };
  size_t failed = 0;
  GraphHandles graph_a, graph_b;
  MoeDispatchOutput view_a, view_b;
  if (graphs) {
    const Round ra = round_a(0), rb = round_b(0);
    a.prepare(ra);
    b.prepare(rb);
    view_a = capture(a, ra, graph_a);
    view_b = capture(b, rb, graph_b);
  }
  for (int i = 1; i <= iterations; ++i) {
    const Round ra = round_a(i), rb = round_b(i);
    a.prepare(ra);
    b.prepare(rb);
    if (graphs) {
      cuda_check(cudaGraphLaunch(graph_a.exec, a.stream()), "cudaGraphLaunch (a)");
      cuda_check(cudaGraphLaunch(graph_b.exec, b.stream()), "cudaGraphLaunch (b)");
    } else {
      Repeats repeats;
      repeats.pause_seed = mix64(seed ^ (0x0DE4ull + static_cast<uint64_t>(i)));
      view_a = a.enqueue(ra, a.stream(), repeats);
      view_b = b.enqueue(rb, b.stream(), repeats);
    }
    // finish() synchronises one stream at a time.
    const Outcome oa = a.finish(ra, view_a);
    const Outcome ob = b.finish(rb, view_b);
    a.judge(ra, oa, failed);
    b.judge(rb, ob, failed);
  }
  EXPECT_EQ(failed, 0u) << "rank " << comm.rank() << ": " << failed << " of " << 2 * iterations << " rounds wrong";
  comm.barrier();
}

TEST(MoeGraph, TwoBuffersInTwoGraphsOnTwoStreamsAtOnce) {
  with_communicator([](Communicator& comm) { two_buffers_on_two_streams(comm, 20, true); });
}

TEST(MoeRankMajorGraph, ExpertMajorAndRankMajorBuffersInTwoGraphsAtOnce) {
  with_communicator([](Communicator& comm) { two_buffers_on_two_streams(comm, 20, true, MoeLayout::kRankMajor); });
}

TEST(MoeRankMajor, ExpertMajorAndRankMajorBuffersEagerOnTwoStreams) {
  with_communicator([](Communicator& comm) { two_buffers_on_two_streams(comm, 20, false, MoeLayout::kRankMajor); });
}

// Buffers of layouts `a` and `b` (each config's shape) run the same rounds, random routings with empty and hot
// experts, weighted and not: each must match the reference, and their outs must be bit for bit the same.
void same_out_in_two_layouts(Communicator& comm, Layout a, Layout b, std::initializer_list<size_t> configs,
                             uint64_t seed_offset) {
  const int world = comm.size(), me = comm.rank();
  const uint64_t seed = shared_seed(comm);
  StreamHandle stream;
  size_t failed = 0, differing = 0;
  for (size_t c : configs) {
    Rig first(comm, make_shape(kConfigs[c], world, a), stream.get());
    Rig second(comm, make_shape(kConfigs[c], world, b), stream.get());
    const MoeShape& shape = second.shape();
    for (int i = 0; i < 6; ++i) {
      const uint64_t round_seed = mix64(seed + c * 100 + static_cast<uint64_t>(i) + seed_offset);
      std::vector<RankPlan> plans = plans_of(different_tokens(round_seed, world, 1, shape.max_tokens), Route::kRandom, 6);
      if (i % 3 == 1) {  // hot experts: every token's experts on rank 0
        for (RankPlan& p : plans) p.route = Route::kToRank;
      }
      if (i % 3 == 2) plans[0].route = Route::kFirstToRankZero;
      const Round round = make_round(shape, world, round_seed, plans, "layouts " + std::to_string(i), i % 2 == 0);
      const bool first_right = first.run_and_judge(round, failed);
      const std::vector<unsigned char> first_out = first.out_rows(round.inputs[me].tokens);
      const bool second_right = second.run_and_judge(round, failed);
      const std::vector<unsigned char> second_out = second.out_rows(round.inputs[me].tokens);
      if (first_right && second_right && first_out != second_out) {
        size_t bytes = 0;
        for (size_t byte = 0; byte < second_out.size(); ++byte) bytes += second_out[byte] != first_out[byte] ? 1 : 0;
        ADD_FAILURE() << "rank " << me << ": " << describe(shape) << ", round " << i << ": out differs between the layouts in "
                      << bytes << " of " << second_out.size() << " bytes";
        ++differing;
      }
    }
    comm.barrier();
  }
  EXPECT_EQ(failed + differing, 0u) << "rank " << me;
}

// The two layouts give the same results for the same routing: a rank-major MoeBuffer and an expert-major one of
// the same shape (alignment 1) dispatch the same tokens, and out after combine is bit for bit the same when the
// rank-major experts' sums are what an expert-major combine computes per rank (moe_expert_tokens). Random
// routings with empty and hot experts, weighted and not, in bf16, float32 and fp8 dispatch.
TEST(MoeLayouts, RankMajorGivesTheSameOutputAsExpertMajor) {
  with_communicator([](Communicator& comm) {
    same_out_in_two_layouts(comm, MoeLayout::kExpertMajor, MoeLayout::kRankMajor, {0, 5, 10}, 0);
  });
}

// The same eagerly: dispatches and combines of the two buffers interleaved with no event between the streams;
// the communicator orders the calls (braid.hpp, "Ordering").
TEST(MoeOrdering, TwoBuffersEagerOnTwoStreams) {
  with_communicator([](Communicator& comm) { two_buffers_on_two_streams(comm, 30, false); });
}

// ---- Refused data ----

// The last rank plants 5 ids outside [-1, E) (E, E + 5, -2, -1000): its check() raises kInvalidArgument (others may
// raise the same or nothing); every valid pair is dispatched and combined as usual. Then correct rounds.
TEST(MoeErrors, ExpertIdOutOfRangeIsReportedAndSkipped) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size();
    const uint64_t seed = shared_seed(comm);
    StreamHandle stream;
    size_t failed = 0;
    for (const auto [index_type, layout] : {std::pair{DataType::kInt64, Layout(MoeLayout::kExpertMajor)},
                                            std::pair{DataType::kInt32, Layout(MoeLayout::kExpertMajor)},
                                            std::pair{DataType::kInt64, Layout(MoeLayout::kRankMajor)},
                                            std::pair{DataType::kInt32, kLowLatency}}) {
      const MoeShape shape = make_shape({DataType::kBFloat16, index_type, 72, 4, 16, 8, 64}, world, layout);
      Rig rig(comm, shape, stream.get());
      const uint64_t s = mix64(seed + static_cast<uint64_t>(index_type) + 7 * static_cast<uint64_t>(layout.layout) +
                               13 * static_cast<uint64_t>(layout.low_latency));
      std::vector<RankPlan> plans = plans_of(different_tokens(s, world, 8, shape.max_tokens), Route::kRandom, 9);
      plans[world - 1].invalid = 5;
      rig.run_and_judge(make_round(shape, world, s, plans, "rank " + std::to_string(world - 1) + " sends 5 ids outside [-1, E)"),
                        failed);
      for (const Round& round : device_token_rounds(shape, world, mix64(s + 1), 2)) rig.run_and_judge(round, failed);
      comm.barrier();
    }
    EXPECT_EQ(failed, 0u) << "rank " << comm.rank() << ": " << failed << " rounds wrong";
  });
}

// Rank 0's device T is max_tokens + 1: it sends nothing (every rank receives nothing from it) and its check()
// raises kInvalidArgument; the other ranks' tokens are dispatched and combined as usual. Then correct rounds.
TEST(MoeErrors, DeviceTokenCountAboveMaxTokensIsReported) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size();
    const uint64_t seed = shared_seed(comm);
    StreamHandle stream;
    size_t failed = 0;
    for (Layout layout : {Layout(MoeLayout::kExpertMajor), Layout(MoeLayout::kRankMajor), kLowLatency}) {
      const MoeShape shape = make_shape({DataType::kFloat16, DataType::kInt64, 128, 2, 16, 4, 64}, world, layout);
      Rig rig(comm, shape, stream.get());
      std::vector<Round> rounds = device_token_rounds(shape, world, seed, 3);
      Round& bad = rounds[0];
      bad.label = "rank 0's device T is max_tokens + 1 = " + std::to_string(shape.max_tokens + 1);
      bad.device_tokens[0] = static_cast<int64_t>(shape.max_tokens) + 1;
      for (const Round& round : rounds) rig.run_and_judge(round, failed);
      comm.barrier();
    }
    EXPECT_EQ(failed, 0u) << "rank " << comm.rank() << ": " << failed << " rounds wrong";
  });
}

// capacity_rows below what rank 0 receives (every token's first expert on rank 0) and at least what every other
// rank receives: rank 0's rows are not written, its counts and offsets are, its check() raises kInvalidArgument;
// the other ranks get their rows. Then correct rounds on the same MoeBuffer.
TEST(MoeErrors, RowsAboveCapacityAreReported) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size();
    const uint64_t seed = shared_seed(comm);
    StreamHandle stream;
    size_t failed = 0;
    MoeShape shape = make_shape({DataType::kBFloat16, DataType::kInt64, 128, 2, 16, 4, 96}, world);
    const std::vector<RankPlan> heavy_plans =
        plans_of(different_tokens(mix64(seed ^ 0x4EAull), world, shape.max_tokens / 2, shape.max_tokens), Route::kFirstToRankZero);
    Round heavy = make_round(shape, world, seed, heavy_plans, "");
    size_t capacity = 0;
    for (int r = 1; r < world; ++r) capacity = std::max(capacity, rows_needed(shape, world, heavy, r));
    const size_t need0 = rows_needed(shape, world, heavy, 0);
    if (world == 1) capacity = need0 - 1;
    ASSERT_GT(need0, capacity) << "the routing does not load rank 0 most";
    shape.capacity_rows = capacity;
    heavy.label = "rank 0 receives " + std::to_string(need0) + " rows, capacity_rows " + std::to_string(capacity);
    Rig rig(comm, shape, stream.get());
    EXPECT_EQ(rig.capacity(), capacity);
    // Routings that fit: T small enough that no rank can need more than the capacity; one before the overflowing
    // dispatch, three after it.
    size_t fitting = shape.max_tokens;
    const size_t worst_per_token = static_cast<size_t>(world) * std::min(shape.top_k, shape.experts / world);
    const size_t padding = static_cast<size_t>(shape.experts / world) * (shape.expert_alignment - 1);
    while (fitting > 0 && fitting * worst_per_token + padding > capacity) --fitting;
    rig.run_and_judge(make_round(shape, world, mix64(seed + 99), plans_of(different_tokens(mix64(seed + 99), world, 0, fitting), Route::kRandom, 6),
                                 "before the overflow: T <= " + std::to_string(fitting)),
                      failed);
    rig.run_and_judge(heavy, failed);
    for (int i = 0; i < 3; ++i) {
      const uint64_t s = mix64(seed + 100 + static_cast<uint64_t>(i));
      rig.run_and_judge(make_round(shape, world, s, plans_of(different_tokens(s, world, 0, fitting), Route::kRandom, 6),
                                   "after the overflow: T <= " + std::to_string(fitting), i % 2 == 0),
                        failed);
    }
    EXPECT_EQ(failed, 0u) << "rank " << comm.rank() << ": " << failed << " rounds wrong";
    comm.barrier();
  });
}

// ---- Shapes ----

// Whether `message` names `field` as a word ("type" in "index_type" does not count).
bool names_field(const std::string& message, const std::string& field) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; };
  for (size_t at = message.find(field); at != std::string::npos; at = message.find(field, at + 1)) {
    const bool before = at == 0 || !word(message[at - 1]);
    const bool after = at + field.size() == message.size() || !word(message[at + field.size()]);
    if (before && after) return true;
  }
  return false;
}

// dispatch wants x_scales exactly when the shape dispatches fp8, refused at the call (kInvalidArgument naming
// x_scales) with nothing enqueued; the buffer works afterwards.
TEST(MoeErrors, ScalesGoWithFp8DispatchOnly) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size(), me = comm.rank();
    const uint64_t seed = shared_seed(comm);
    StreamHandle stream;
    size_t failed = 0;
    DeviceBuffer inputs(1 << 16);  // x, ids, weights and scales of one token all fit
    const float* some = static_cast<const float*>(inputs.get());
    auto expect_refused = [&](const std::string& what, const std::function<void()>& call) {
      try {
        call();
        ADD_FAILURE() << "rank " << me << ": " << what << " was accepted";
      } catch (const Error& error) {
        EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << "rank " << me << ": " << what << ": " << error.what();
        EXPECT_TRUE(names_field(error.what(), "x_scales"))
            << "rank " << me << ": " << what << ": the message does not name 'x_scales': " << error.what();
      }
    };
    for (std::optional<DataType> fp8 : {std::optional<DataType>(), std::optional<DataType>(DataType::kFloat8E4M3)}) {
      Config config{DataType::kBFloat16, DataType::kInt64, 256, 4, 16, 8, 32, fp8};
      const MoeShape shape = make_shape(config, world);
      Rig rig(comm, shape, stream.get());
      MoeBuffer& moe = rig.moe();
      if (fp8) {
        expect_refused("fp8 dispatch without x_scales (the overload without them)",
                       [&] { moe.dispatch(some, some, some, 1, nullptr, stream.get()); });
        expect_refused("fp8 dispatch with x_scales null",
                       [&] { moe.dispatch(some, nullptr, some, some, 1, nullptr, stream.get()); });
      } else {
        expect_refused("bfloat16 dispatch with x_scales",
                       [&] { moe.dispatch(some, some, some, some, 1, nullptr, stream.get()); });
      }
      comm.check();
      for (const Round& round : device_token_rounds(shape, world, mix64(seed + (fp8 ? 1 : 0)), 2)) {
        rig.run_and_judge(round, failed);
      }
      comm.barrier();
    }
    EXPECT_EQ(failed, 0u) << "rank " << me << ": " << failed << " rounds wrong";
  });
}

// Every rank-major dispatch and combine split by a MoeHook, a fill of another buffer between the halves: the
// matrix's results, with repeated calls and rank skew too.
TEST(MoeRankMajor, CallsSplitByAHookMatchTheReference) {
  with_communicator([](Communicator& comm) {
    run_matrix(comm, {0, 5, 11}, 0x400Cull, [](size_t i, uint64_t seed) {
      Repeats repeats = i % 2 == 0 ? Repeats{} : skewed_repeats(i, seed);
      repeats.hooks = true;
      return repeats;
    }, MoeLayout::kRankMajor);
  });
}

// ---- Low latency: rank-major with fixed rows (MoeShape::low_latency) ----

// The whole matrix (every config, route, T and buffer kind of y), rows and holes checked.
TEST(MoeLowLatency, DispatchAndCombineMatchTheReference) {
  with_communicator([](Communicator& comm) {
    std::vector<size_t> every(std::size(kConfigs));
    std::iota(every.begin(), every.end(), size_t(0));
    run_matrix(comm, every, 0x10C1ull, [](size_t, uint64_t) { return Repeats{}; }, kLowLatency);
  });
}

// Calls of one kind in a row with rank skew, and every call split by a hook.
TEST(MoeLowLatency, RepeatedCallsWithRankSkewAndHooks) {
  with_communicator([](Communicator& comm) {
    run_matrix(comm, {0, 5, 11}, 0x5CE11ull, skewed_repeats, kLowLatency);
    run_matrix(comm, {0, 5, 11}, 0x400Dull, [](size_t i, uint64_t seed) {
      Repeats repeats = i % 2 == 0 ? Repeats{} : skewed_repeats(i, seed);
      repeats.hooks = true;
      return repeats;
    }, kLowLatency);
  });
}

// A decode-sized low-latency buffer moves its rows in LL128 lines whose first line packs the token's metadata (16
// local expert ids as int16, 16 weights) where NVLink carries them whole; a larger one stores its rows and signals.
// Both against the reference at the edges of that packing: K = 16, local expert ids past 255, rows of 14 bytes
// (not 8-byte aligned, and shorter than a line), fp8 scales of 12 bytes, and buffers above the line size.
TEST(MoeLowLatency, SixteenExpertsATokenWideIdsAndBothPathsMatchTheReference) {
  with_communicator([](Communicator& comm) {
    const std::vector<SaltedConfig> configs = {
        {{DataType::kBFloat16, DataType::kInt64, 7, 16, 1024, 1, 64}, 101},
        {{DataType::kFloat32, DataType::kInt32, 136, 16, 640, 1, 128}, 102},
        // bfloat16 rows: an unweighted sum of 16 e5m2-sized outputs exceeds float16's range.
        {{DataType::kBFloat16, DataType::kInt64, 384, 16, 1024, 1, 96, DataType::kFloat8E5M2}, 103},
        {{DataType::kBFloat16, DataType::kInt32, 72, 16, 1024, 1, 200}, 104},  // above the line size
        {{DataType::kFloat16, DataType::kInt64, 128, 3, 64, 1, 520, DataType::kFloat8E4M3}, 105},
    };
    run_configs(comm, configs, 0x16E5ull, [](size_t i, uint64_t seed) {
      Repeats repeats = i % 2 == 0 ? Repeats{} : skewed_repeats(i, seed);
      repeats.hooks = i % 3 == 1;
      return repeats;
    }, kLowLatency);
  });
}

TEST(MoeLowLatency, TokenCountOnTheDevice) {
  with_communicator([](Communicator& comm) { token_count_on_the_device(comm, kLowLatency); });
}

TEST(MoeLowLatencyGraph, ReplaysWithChangingRoutingRowsAndTokenCounts) {
  with_communicator([](Communicator& comm) { replays_with_changing_routing(comm, kLowLatency); });
}

TEST(MoeLowLatencyGraph, BesideAnExpertMajorBufferInTwoGraphsAtOnce) {
  with_communicator([](Communicator& comm) { two_buffers_on_two_streams(comm, 20, true, kLowLatency); });
}

// Fixed rows change where a token lands, never what combine returns: a rank-major buffer and a low-latency one
// of the same shape give out bit for bit alike for the same routing (empty and hot experts, fp8 dispatch).
TEST(MoeLayouts, LowLatencyGivesTheSameOutputAsRankMajor) {
  with_communicator([](Communicator& comm) {
    same_out_in_two_layouts(comm, MoeLayout::kRankMajor, kLowLatency, {0, 4, 11}, 0x77);
  });
}

// `call` throws kInvalidArgument naming `field`.
void expect_refused_naming(int me, const char* what, const char* field, const std::function<void()>& call) {
  try {
    call();
    ADD_FAILURE() << "rank " << me << ": " << what << " was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << what << ": " << error.what();
    EXPECT_TRUE(names_field(error.what(), field)) << what << ": " << error.what();
  }
}

// One rank's shape is refused (hidden 0): that rank throws kInvalidArgument naming shape.hidden and every other
// rank kMismatch naming it, all at once (well before the timeout); a good buffer is then made on every rank.
TEST(MoeErrors, AShapeRefusedOnOneRankFailsEveryRankAtOnce) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size(), me = comm.rank(), refused_rank = world - 1;
    const Config config{DataType::kBFloat16, DataType::kInt64, 128, 4, 16, 1, 64};
    MoeShape shape = make_shape(config, world, MoeLayout::kExpertMajor);
    MoeShape mine = shape;
    if (me == refused_rank) mine.hidden = 0;
    const auto start = std::chrono::steady_clock::now();
    try {
      MoeBuffer::create(comm, mine);
      ADD_FAILURE() << "rank " << me << ": create succeeded";
    } catch (const Error& error) {
      const std::string message = error.what();
      if (me == refused_rank) {
        EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << message;
        EXPECT_NE(message.find("'shape.hidden'"), std::string::npos) << message;
      } else {
        EXPECT_EQ(error.code(), ErrorCode::kMismatch) << message;
        EXPECT_NE(message.find("rank " + std::to_string(refused_rank) + "'s shape was refused"), std::string::npos)
            << message;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, comm.timeout_s() / 2) << "rank " << me << " waited for the timeout";
    MoeBuffer good = MoeBuffer::create(comm, shape);
    EXPECT_EQ(good.shape().hidden, shape.hidden);
  });
}

// A call on the buffer while a hook holds a receiving half, a hook received twice, and a hook on an expert-major
// buffer are refused naming the hook (on every rank alike: nothing was launched); the buffer then works.
TEST(MoeErrors, HooksAreRefusedWhereTheyCannotBeUsed) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size(), me = comm.rank();
    const uint64_t seed = shared_seed(comm);
    StreamHandle stream;
    size_t failed = 0;
    auto refused = [&](const char* what, const std::function<void()>& call) { expect_refused_naming(me, what, "hook", call); };
    const Config config{DataType::kBFloat16, DataType::kInt64, 128, 4, 16, 1, 64};
    {
      Rig expert(comm, make_shape(config, world, MoeLayout::kExpertMajor), stream.get());
      MoeHook hook;
      refused("a hook on an expert-major dispatch", [&] {
        expert.moe().dispatch(nullptr, nullptr, nullptr, 0, nullptr, stream.get(), &hook);
      });
      EXPECT_FALSE(hook.pending());
      refused("receive() of an empty hook", [&] { hook.receive(stream.get()); });
      for (const Round& round : device_token_rounds(expert.shape(), world, seed, 2)) expert.run_and_judge(round, failed);
      comm.barrier();
    }
    Rig rig(comm, make_shape(config, world, MoeLayout::kRankMajor), stream.get());
    MoeHook hook;
    const MoeDispatchOutput view = rig.moe().dispatch(nullptr, nullptr, nullptr, 0, nullptr, stream.get(), &hook);
    EXPECT_TRUE(hook.pending());
    if (ranks_share_a_context()) {  // threads sharing a GPU refuse its legacy stream; the hook keeps its receiving half
      for (cudaStream_t legacy : {cudaStream_t(nullptr), cudaStreamLegacy}) {
        expect_refused_naming(me, "receive() on the legacy stream", "stream", [&] { hook.receive(legacy); });
        EXPECT_TRUE(hook.pending()) << "rank " << me << ": a refused receive() dropped the receiving half";
      }
    }
    refused("a combine while a dispatch's receiving half is pending", [&] {
      rig.moe().combine(view.combine_input, nullptr, false, stream.get());
    });
    refused("a dispatch while a dispatch's receiving half is pending", [&] {
      rig.moe().dispatch(nullptr, nullptr, nullptr, 0, nullptr, stream.get());
    });
    MoeHook moved = std::move(hook);
    EXPECT_FALSE(hook.pending());
    EXPECT_TRUE(moved.pending());
    moved.receive(stream.get());
    refused("receive() twice", [&] { moved.receive(stream.get()); });
    rig.moe().combine(view.combine_input, nullptr, false, stream.get());
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    comm.check();
    for (const Round& round : device_token_rounds(rig.shape(), world, mix64(seed + 1), 2)) rig.run_and_judge(round, failed);
    EXPECT_EQ(failed, 0u) << "rank " << me;
    comm.barrier();
  });
}

// A receive after abort() raises kAborted and keeps the hook pending, so a second one raises kAborted too (a fatal
// failure is raised again by every later call, braid.hpp).
TEST(MoeErrors, AReceiveAfterAnAbortRaisesItAndKeepsTheHook) {
  with_communicator([](Communicator& comm) {
    const int me = comm.rank();
    StreamHandle stream;
    const Config config{DataType::kBFloat16, DataType::kInt64, 128, 4, 16, 1, 64};
    Rig rig(comm, make_shape(config, comm.size(), MoeLayout::kRankMajor), stream.get());
    MoeHook hook;
    rig.moe().dispatch(nullptr, nullptr, nullptr, 0, nullptr, stream.get(), &hook);
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    comm.barrier();  // every rank's sending half has run
    comm.abort();
    for (int attempt = 1; attempt <= 2; ++attempt) {
      try {
        hook.receive(stream.get());
        ADD_FAILURE() << "rank " << me << ": receive #" << attempt << " after abort() raised nothing";
      } catch (const Error& error) {
        EXPECT_EQ(error.code(), ErrorCode::kAborted) << "rank " << me << ", receive #" << attempt << ": " << error.what();
      }
      EXPECT_TRUE(hook.pending()) << "rank " << me << ": receive #" << attempt << " after abort() dropped the hook";
    }
  });
}

// A buffer limited to 3 multiprocessors (6 blocks, far fewer than the tokens) in both layouts, and
// copy_expert_counts: the host copy equals expert_counts.
TEST(Moe, FewMultiprocessorsAndExpertCountsOnTheHost) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size(), me = comm.rank();
    const uint64_t seed = shared_seed(comm);
    StreamHandle stream;
    size_t failed = 0;
    int64_t* host = nullptr;
    cuda_check(cudaMallocHost(reinterpret_cast<void**>(&host), kMoeMaxExperts * sizeof(int64_t)), "cudaMallocHost");
    for (MoeLayout layout : {MoeLayout::kExpertMajor, MoeLayout::kRankMajor}) {
      MoeShape shape = make_shape({DataType::kBFloat16, DataType::kInt32, 256, 8, 64, 1, 128}, world, layout);
      shape.max_sms = 3;
      Rig rig(comm, shape, stream.get());
      for (const Round& round : device_token_rounds(shape, world, mix64(seed + static_cast<uint64_t>(layout)), 4)) {
        rig.prepare(round);
        const MoeDispatchOutput view = rig.enqueue(round, rig.stream());
        const int L = view.local_experts;
        std::fill(host, host + L, int64_t(-7));
        rig.moe().copy_expert_counts(host, rig.stream());
        Outcome outcome = rig.finish(round, view);
        std::vector<int64_t> device(L);
        cuda_check(cudaMemcpy(device.data(), view.expert_counts, L * sizeof(int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
        if (!std::equal(device.begin(), device.end(), host)) outcome.problems.add("copy_expert_counts differs from expert_counts");
        rig.judge(round, outcome, failed);
      }
      comm.barrier();
    }
    cudaFreeHost(host);
    EXPECT_EQ(failed, 0u) << "rank " << me;
  });
}

// Rank-major redispatch: after each routed round, the same routing (every rank's ids, weights and T, on the host
// or the device) with new rows, dispatched by MoeBuffer::redispatch through the first round's handle and combined
// through it (the backward pass of a combine, and of a dispatch); the rows and the combine must be those of the new
// inputs, the metadata and counts those of the routing. Plain and fp8, with and without hooks. Then stale handles
// and an expert-major buffer are refused naming the handle.
TEST(MoeRankMajor, RedispatchMovesNewRowsOnTheSameRouting) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size(), me = comm.rank();
    const uint64_t seed = shared_seed(comm);
    StreamHandle stream;
    size_t failed = 0;
    for (const auto [c, layout] : {std::pair{size_t(0), Layout(MoeLayout::kRankMajor)}, std::pair{size_t(11), Layout(MoeLayout::kRankMajor)},
                                   std::pair{size_t(0), kLowLatency}, std::pair{size_t(11), kLowLatency}}) {
      Rig rig(comm, make_shape(kConfigs[c], world, layout), stream.get());
      const MoeShape& shape = rig.shape();
      std::vector<Round> firsts = device_token_rounds(shape, world, mix64(seed + c), 2);
      firsts.push_back(make_round(shape, world, mix64(seed ^ c), plans_of(different_tokens(mix64(seed + 7 * c), world, 1, shape.max_tokens),
                                                                     Route::kRandom, 6), "host T", false));
      for (size_t i = 0; i < firsts.size(); ++i) {
        const Round& first = firsts[i];
        rig.run_and_judge(first, failed);
        Round second = first;
        second.redispatch = true;
        second.label += ", redispatched with new rows";
        for (int r = 0; r < world; ++r) {
          const RankInput fresh = make_input(shape, world, mix64(first.seed ^ 0xBAC4ull ^ mix64(r)), RankPlan{first.inputs[r].tokens});
          second.inputs[r].x = fresh.x;
          second.inputs[r].scales = fresh.scales;
        }
        Repeats repeats;
        repeats.hooks = i % 2 == 0;  // rounds 0 and 2 (round 1 has T = 0 everywhere)
        rig.run_and_judge(second, failed, repeats);
      }
      comm.barrier();
    }
    auto refused = [&](const char* what, const std::function<void()>& call) { expect_refused_naming(me, what, "handle", call); };
    const Config config{DataType::kBFloat16, DataType::kInt64, 128, 4, 16, 1, 64};
    MoeBuffer rank_major = MoeBuffer::create(comm, make_shape(config, world, MoeLayout::kRankMajor));
    refused("a redispatch before any dispatch", [&] { rank_major.redispatch(MoeHandle{}, nullptr, nullptr, stream.get()); });
    const MoeHandle old = rank_major.dispatch(nullptr, nullptr, nullptr, 0, nullptr, stream.get()).handle;
    const MoeDispatchOutput last = rank_major.dispatch(nullptr, nullptr, nullptr, 0, nullptr, stream.get());
    EXPECT_EQ(last.handle.dispatch, old.dispatch + 1);
    refused("a redispatch through a stale handle", [&] { rank_major.redispatch(old, nullptr, nullptr, stream.get()); });
    refused("a combine through a stale handle", [&] { rank_major.combine(old, last.combine_input, nullptr, false, stream.get()); });
    rank_major.combine(last.handle, last.combine_input, nullptr, false, stream.get());
    MoeBuffer expert_major = MoeBuffer::create(comm, make_shape(config, world, MoeLayout::kExpertMajor));
    const MoeHandle expert = expert_major.dispatch(nullptr, nullptr, nullptr, 0, nullptr, stream.get()).handle;
    refused("a redispatch on an expert-major buffer", [&] { expert_major.redispatch(expert, nullptr, nullptr, stream.get()); });
    DeviceBuffer y(128 * 64 * 2);
    expert_major.combine(expert, y.get(), nullptr, true, stream.get());
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    comm.check();
    comm.barrier();
    EXPECT_EQ(failed, 0u) << "rank " << me;
  });
}

// Two batches in flight on one communicator, as a pipelined MoE layer runs them: two rank-major MoeBuffers, every
// call split by a hook and the halves interleaved on one stream (batch A's dispatch sends, B's sends, A's
// receives, A's expert and combine sends, B's receives, ...), 20 rounds with fresh routings, both checked.
TEST(MoeRankMajor, TwoBatchesInFlightWithInterleavedHooks) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size();
    const uint64_t seed = shared_seed(comm);
    StreamHandle stream;
    const MoeShape shape = make_shape({DataType::kBFloat16, DataType::kInt64, 256, 8, 64, 1, 96}, world, MoeLayout::kRankMajor);
    Rig a(comm, shape, stream.get()), b(comm, shape, stream.get());
    size_t failed = 0;
    for (int i = 0; i < 20; ++i) {
      Round ra = replay_round(shape, world, mix64(seed ^ 0xA0ull), i), rb = replay_round(shape, world, mix64(seed ^ 0xB0ull), i);
      ra.in_place_expert = i % 2 == 0;
      a.prepare(ra);
      b.prepare(rb);
      const cudaStream_t s = stream.get();
      MoeHook dispatch_a, dispatch_b, combine_a, combine_b;
      const MoeDispatchOutput va = a.dispatch(ra, s, &dispatch_a);
      const MoeDispatchOutput vb = b.dispatch(rb, s, &dispatch_b);
      dispatch_a.receive(s);
      a.combine(ra, va, a.expert(ra, va, s), s, &combine_a);
      dispatch_b.receive(s);
      b.combine(rb, vb, b.expert(rb, vb, s), s, &combine_b);
      combine_a.receive(s);
      combine_b.receive(s);
      const Outcome oa = a.finish(ra, va);
      const Outcome ob = b.finish(rb, vb);
      a.judge(ra, oa, failed);
      b.judge(rb, ob, failed);
    }
    EXPECT_EQ(failed, 0u) << "rank " << comm.rank() << ": " << failed << " of 40 rounds wrong";
    comm.barrier();
  });
}

// A rank-major combine sums rows the caller already weighted: weighted = true is refused before anything runs, and
// the same combine with false then completes the round.
TEST(MoeRankMajor, WeightedCombineIsRefusedNamingTheArgument) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size(), me = comm.rank();
    StreamHandle stream;
    const MoeShape shape = make_shape({DataType::kBFloat16, DataType::kInt64, 128, 4, 16, 1, 32}, world, MoeLayout::kRankMajor);
    MoeBuffer moe = MoeBuffer::create(comm, shape);
    DeviceBuffer x(shape.max_tokens * shape.hidden * 2), ids(shape.max_tokens * shape.top_k * 8),
        weights(shape.max_tokens * shape.top_k * 4), out(shape.max_tokens * shape.hidden * 2);
    cuda_check(cudaMemset(ids.get(), 0xFF, ids.bytes()), "cudaMemset (ids: -1)");
    cuda_check(cudaMemset(out.get(), kPoison, out.bytes()), "cudaMemset (out: poison)");  // combine must write zeros
    const MoeDispatchOutput view = moe.dispatch(x.get(), ids.get(), static_cast<const float*>(weights.get()), 4, nullptr, stream.get());
    try {
      moe.combine(view.combine_input, out.get(), true, stream.get());
      ADD_FAILURE() << "rank " << me << ": a weighted rank-major combine was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
      EXPECT_TRUE(names_field(error.what(), "weighted")) << error.what();
    }
    moe.combine(view.combine_input, out.get(), false, stream.get());
    cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    comm.check();
    std::vector<unsigned char> host(4 * shape.hidden * 2);
    cuda_check(cudaMemcpy(host.data(), out.get(), host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](unsigned char b) { return b == 0; }))
        << "rank " << me << ": tokens with no expert must combine to zeros";
    (void)world;
    comm.barrier();
  });
}

// Every block of every rank adds into the same expert_pairs words of one rank at once: every token of every rank
// names all 8 experts of that rank (K = L = 8), T = max_tokens = 4096 (hundreds of blocks a rank), the rank
// rotating, numbered and fixed rows. expert_counts must be world * T for each of its experts, exactly, and the
// rows and combine as the reference says. The rank's own blocks and its peers' add to one word, which PTX makes
// atomic only when both sides are system-scope atomics (moe_rank_major.cu, NOTE [expert_pairs scope]). NVLink
// GPUs perform both at the owner's L2, so no add is lost there at either scope and this cannot fail for the scope
// alone: it checks that the counts stay exact under the heaviest contention.
TEST(MoeRankMajor, ExpertCountsExactWhenEveryRankAddsToOneRanksExpertsAtOnce) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size();
    const uint64_t seed = shared_seed(comm);
    StreamHandle stream;
    size_t failed = 0, rounds = 0;
    for (Layout layout : {Layout(MoeLayout::kRankMajor), kLowLatency}) {
      MoeShape shape = make_shape({DataType::kBFloat16, DataType::kInt64, 64, 8, 8, 1, 4096}, world, layout);
      shape.experts = 8 * world;
      Rig rig(comm, shape, stream.get());
      for (int i = 0; i < 3 * world; ++i) {
        const int target = i % world;
        std::vector<RankPlan> plans(world, RankPlan{shape.max_tokens, Route::kToRank});
        for (RankPlan& plan : plans) plan.target = target;
        const uint64_t round_seed = mix64(seed + static_cast<uint64_t>(i) + (layout.low_latency ? 0x100ull : 0));
        rig.run_and_judge(make_round(shape, world, round_seed, plans, "every token of every rank to all 8 experts of rank " +
                                                                          std::to_string(target)),
                          failed);
        ++rounds;
      }
      comm.barrier();
    }
    EXPECT_EQ(failed, 0u) << "rank " << comm.rank() << ": " << failed << " of " << rounds << " rounds wrong";
  });
}

// A rank-major dispatch's block 0 waits until every block of its own launch has counted itself in. A block the GPU
// never schedules (held by other work) would hold that wait forever, so it is bounded by the communicator's timeout
// like a wait for a peer. testing::stall_next_moe_dispatch starts the count far from 0, so the wait is never met:
// every rank's check() must raise kTimeout naming the MoE dispatch, the rows round and the rank's own kernel (or a
// peer, whose dispatch stalls alike), after about the timeout and never a hang. Numbered and fixed rows (max_tokens above 128: not the dispatch in lines). A
// communicator is unusable after a timeout: each case has its own, lined up by a keeper communicator.
TEST(MoeRankMajorErrors, DispatchWaitForItsOwnBlocksTimesOut) {
  for_each_rank([](const RankContext& context) {
    Communicator keeper = Communicator::init(context.rendezvous, test_options());
    make_current(keeper);
    for (Layout layout : {Layout(MoeLayout::kRankMajor), kLowLatency}) {
      keeper.barrier();
      constexpr double kTimeoutS = 2.0;
      constexpr double kMarginS = 8.0;
      Communicator comm = Communicator::init(context.rendezvous, test_options(kTimeoutS));
      const int world = comm.size(), me = comm.rank();
      StreamHandle stream;
      const MoeShape shape = make_shape({DataType::kBFloat16, DataType::kInt64, 128, 4, 16, 1, 256}, world, layout);
      const std::string what = describe(shape);
      std::optional<Error> error;
      double seconds = 0;
      {
        Rig rig(comm, shape, stream.get());
        const Round round = make_round(shape, world, 0x57A11ull, plans_of(std::vector<size_t>(world, 64), Route::kRandom),
                                       "64 tokens a rank");
        rig.prepare(round);
        stall_next_moe_dispatch(rig.moe());
        const auto start = std::chrono::steady_clock::now();
        rig.dispatch(round, stream.get(), nullptr);
        try {
          cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize (the stalled dispatch)");
          comm.check();
        } catch (const Error& caught) {
          error = caught;
        }
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        keeper.barrier();  // every rank's kernels are over before any rank frees the buffer
      }
      ASSERT_TRUE(error.has_value()) << "rank " << me << ", " << what << ": no error " << seconds
                                     << " s after a dispatch whose block 0 waits for a block that never counts in";
      const std::string message = error->what();
      EXPECT_EQ(error->code(), ErrorCode::kTimeout) << "rank " << me << ", " << what << ": " << message;
      EXPECT_NE(message.find("dispatch"), std::string::npos) << "rank " << me << ": does not name the dispatch: " << message;
      EXPECT_NE(message.find("rows"), std::string::npos) << "rank " << me << ": does not name the wait: " << message;
      // Every rank's dispatch stalls, so a block of this rank that waits at the rows round for a peer's stalled
      // kernel gives up after the same timeout as the stalled block: either may be the first to report. The stream
      // synchronisation above returning within the bound shows the stalled block's own wait ended too.
      const bool own_kernel = message.find("own kernel") != std::string::npos;
      const bool peer_late = message.find("did not arrive") != std::string::npos;
      EXPECT_TRUE(own_kernel || (world > 1 && peer_late))
          << "rank " << me << ": names neither its own late kernel nor a peer's: " << message;
      EXPECT_GE(seconds, 0.5 * kTimeoutS) << "rank " << me << ": gave up before the timeout: " << message;
      EXPECT_LE(seconds, kTimeoutS + kMarginS) << "rank " << me << ": took " << seconds << " s to report: " << message;
      // comm is unusable now; it is destroyed here without any further call.
    }
  });
}

constexpr uint32_t kLateNs = 50'000'000;  // a late rank's spin

// Two combines of one rank-major dispatch, numbered and fixed rows. Peers read a rank's combine_input until their
// combine has completed (moe.hpp, combine).
//  - A combine that copies y after a combine waits for every peer (its entry barrier) before it writes
//    combine_input. Provoked: the late rank splits its first combine by a hook and spins 50 ms between the halves,
//    so it reads the others' combine_input 50 ms after their first combine is over, while their second combine
//    copies NaN rows there unless it waits; the late rank's out of the first combine must be right. The first
//    combine copies y or reads y = combine_input; every rank is the late one in turn.
//  - A combine of combine_input right after a combine that copied y is refused naming y on every rank (with or
//    without a hook on the first), with nothing enqueued: the round's outputs are then checked. One right after a
//    combine of combine_input is accepted.
TEST(MoeRankMajor, SecondCombineOfOneDispatchWaitsForThePeersOrIsRefused) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size(), me = comm.rank();
    const uint64_t seed = shared_seed(comm);
    StreamHandle stream;
    const cudaStream_t s = stream.get();
    size_t failed = 0;
    for (Layout layout : {Layout(MoeLayout::kRankMajor), kLowLatency}) {
      Rig rig(comm, make_shape({DataType::kBFloat16, DataType::kInt64, 256, 4, 16, 1, 128}, world, layout), s);
      const MoeShape& shape = rig.shape();
      const size_t row_bytes = shape.hidden * datatype_size(shape.type);
      DeviceBuffer nan_rows(rig.capacity() * row_bytes), other_out(shape.max_tokens * row_bytes);
      cuda_check(cudaMemset(nan_rows.get(), 0xFF, nan_rows.bytes()), "cudaMemset (NaN rows)");
      uint64_t n = layout.low_latency ? 0x1000 : 0;
      auto round_of = [&](const std::string& label, bool in_place) {
        const uint64_t round_seed = mix64(seed + ++n);
        return make_round(shape, world, round_seed, plans_of(different_tokens(round_seed, world, 1, shape.max_tokens), Route::kRandom, 8),
                          label, false, in_place);
      };
      for (const bool in_place : {false, true}) {
        for (int late = 0; late < world; ++late) {
          const Round round = round_of(std::string(in_place ? "y = combine_input" : "y copied") + ", rank " +
                                           std::to_string(late) + " reads 50 ms late, then a combine copies NaN rows",
                                       in_place);
          rig.prepare(round);
          const MoeDispatchOutput view = rig.dispatch(round, s, nullptr);
          const void* y = rig.expert(round, view, s);
          MoeHook hook;
          rig.combine(round, view, y, s, me == late ? &hook : nullptr);
          if (me == late) {
            cuda_check(spin_on_stream(s, kLateNs), "spin_on_stream (between the halves)");
            hook.receive(s);
          }
          rig.moe().combine(view.handle, nan_rows.get(), other_out.get(), false, s);
          rig.judge(round, rig.finish(round, view), failed);
        }
      }
      for (const bool hooked : {false, true}) {
        const Round round = round_of(std::string("y copied") + (hooked ? " (by a hook)" : "") +
                                         ", then a combine of combine_input (refused)",
                                     false);
        rig.prepare(round);
        const MoeDispatchOutput view = rig.dispatch(round, s, nullptr);
        const void* y = rig.expert(round, view, s);
        MoeHook hook;
        rig.combine(round, view, y, s, hooked ? &hook : nullptr);
        if (hooked) hook.receive(s);
        expect_refused_naming(me, "a combine of combine_input right after a combine that copied y", "y", [&] {
          rig.moe().combine(view.handle, view.combine_input, other_out.get(), false, s);
        });
        rig.judge(round, rig.finish(round, view), failed);
      }
      const Round round = round_of("y = combine_input twice", true);
      rig.prepare(round);
      const MoeDispatchOutput view = rig.dispatch(round, s, nullptr);
      rig.combine(round, view, rig.expert(round, view, s), s, nullptr);
      rig.moe().combine(view.handle, view.combine_input, other_out.get(), false, s);
      rig.judge(round, rig.finish(round, view), failed);
      comm.barrier();
    }
    EXPECT_EQ(failed, 0u) << "rank " << me << ": " << failed << " rounds wrong";
  });
}

TEST(MoeShape, BadShapesAreRefusedNamingTheField) {
  with_communicator([](Communicator& comm) {
    const int world = comm.size(), me = comm.rank();
    const MoeShape good = make_shape({DataType::kBFloat16, DataType::kInt64, 128, 4, 16, 8, 32}, world);
    struct Bad {
      const char* field;
      std::string what;
      MoeShape shape;
    };
    std::vector<Bad> bad;
    auto with = [&](const char* field, const std::string& what, const std::function<void(MoeShape&)>& change) {
      MoeShape s = good;
      change(s);
      bad.push_back({field, what, s});
    };
    with("hidden", "hidden = 0", [](MoeShape& s) { s.hidden = 0; });
    with("top_k", "top_k = 0", [](MoeShape& s) { s.top_k = 0; });
    with("top_k", "top_k = -1", [](MoeShape& s) { s.top_k = -1; });
    with("top_k", "top_k = kMaxTopK + 1", [](MoeShape& s) { s.top_k = kMaxTopK + 1; s.experts = 64 * s.experts; });
    with("experts", "experts = 0", [](MoeShape& s) { s.experts = 0; });
    with("experts", "experts = -world", [&](MoeShape& s) { s.experts = -world; });
    if (world > 1) with("experts", "experts not a multiple of the world size", [&](MoeShape& s) { s.experts = 4 * world + 1; });
    with("expert_alignment", "expert_alignment = 0", [](MoeShape& s) { s.expert_alignment = 0; });
    with("expert_alignment", "expert_alignment = -8", [](MoeShape& s) { s.expert_alignment = -8; });
    with("type", "type = int32", [](MoeShape& s) { s.type = DataType::kInt32; });
    with("type", "type = float64", [](MoeShape& s) { s.type = DataType::kFloat64; });
    with("type", "type = 99", [](MoeShape& s) { s.type = static_cast<DataType>(99); });
    with("index_type", "index_type = float32", [](MoeShape& s) { s.index_type = DataType::kFloat32; });
    with("index_type", "index_type = uint8", [](MoeShape& s) { s.index_type = DataType::kUint8; });
    with("index_type", "index_type = -1", [](MoeShape& s) { s.index_type = static_cast<DataType>(-1); });
    with("max_tokens", "max_tokens = 0", [](MoeShape& s) { s.max_tokens = 0; });
    with("dispatch_type", "dispatch_type = bfloat16 (not fp8)", [](MoeShape& s) { s.dispatch_type = DataType::kBFloat16; });
    with("dispatch_type", "dispatch_type = uint8", [](MoeShape& s) { s.dispatch_type = DataType::kUint8; });
    with("hidden", "fp8 dispatch with hidden = 192 (not a multiple of 128)", [](MoeShape& s) {
      s.dispatch_type = DataType::kFloat8E4M3;
      s.hidden = 192;
    });
    with("expert_alignment", "rank-major with expert_alignment = 8", [](MoeShape& s) { s.layout = MoeLayout::kRankMajor; });
    with("low_latency", "low_latency with the expert-major layout", [](MoeShape& s) { s.low_latency = true; });
    with("capacity_rows", "rank-major with capacity_rows = 100", [](MoeShape& s) {
      s.layout = MoeLayout::kRankMajor;
      s.expert_alignment = 1;
      s.capacity_rows = 100;
    });
    with("layout", "layout = 7", [](MoeShape& s) { s.layout = static_cast<MoeLayout>(7); });
    for (const Bad& b : bad) {
      try {
        MoeBuffer refused = MoeBuffer::create(comm, b.shape);
        ADD_FAILURE() << "rank " << me << ": MoeBuffer::create with " << b.what << " was accepted";
      } catch (const Error& error) {
        EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << "rank " << me << ": " << b.what << ": " << error.what();
        EXPECT_TRUE(names_field(error.what(), b.field))
            << "rank " << me << ": " << b.what << ": the message does not name '" << b.field << "': " << error.what();
      }
    }
    comm.check();
    // The communicator still works: a good shape (and K = kMaxTopK) is made and runs.
    MoeShape widest = good;
    widest.top_k = kMaxTopK;
    widest.experts = (64 + world - 1) / world * world;
    { MoeBuffer made = MoeBuffer::create(comm, widest); }
    StreamHandle stream;
    Rig rig(comm, good, stream.get());
    size_t failed = 0;
    for (const Round& round : device_token_rounds(good, world, shared_seed(comm), 2)) rig.run_and_judge(round, failed);
    EXPECT_EQ(failed, 0u);
    comm.barrier();
  });
}

size_t expected_worst_case(const MoeShape& s, int world) {
  const size_t L = static_cast<size_t>(s.experts / world);
  return static_cast<size_t>(world) * s.max_tokens * std::min<size_t>(static_cast<size_t>(s.top_k), L) +
         L * static_cast<size_t>(s.expert_alignment - 1);
}

TEST(MoeShape, WorstCaseRowsAndSymmetricBytes) {
  // Host functions: any world size.
  for (int world : {1, 2, 4, 8}) {
    for (const Config& c : kConfigs) {
      MoeShape s = make_shape(c, world);
      EXPECT_EQ(MoeBuffer::worst_case_rows(s, world), expected_worst_case(s, world)) << describe(s) << " world " << world;
      const size_t bytes = MoeBuffer::symmetric_bytes(s, world);
      EXPECT_GE(bytes, s.max_tokens * s.hidden * datatype_size(s.type))
          << describe(s) << " world " << world << ": symmetric_bytes below one rank's max_tokens rows";
      MoeShape wider = s;
      wider.hidden *= 2;
      EXPECT_GE(MoeBuffer::symmetric_bytes(wider, world), bytes) << describe(s) << ": doubling H shrank symmetric_bytes";
      MoeShape longer = s;
      longer.max_tokens *= 2;
      EXPECT_GE(MoeBuffer::symmetric_bytes(longer, world), bytes) << describe(s) << ": doubling max_tokens shrank it";
      MoeShape smaller = s;
      smaller.capacity_rows = std::max<size_t>(1, expected_worst_case(s, world) / 4);
      EXPECT_LE(MoeBuffer::symmetric_bytes(smaller, world), bytes) << describe(s) << ": a smaller capacity_rows grew it";
    }
    for (const Config& c : kConfigs) {  // rank-major: world * max_tokens rows, whatever the routing
      const MoeShape r = make_shape(c, world, MoeLayout::kRankMajor);
      EXPECT_EQ(MoeBuffer::worst_case_rows(r, world), static_cast<size_t>(world) * r.max_tokens) << describe(r);
      EXPECT_GE(MoeBuffer::symmetric_bytes(r, world), 2 * world * r.max_tokens * r.hidden * datatype_size(r.type) /
                                                          (r.dispatch_type ? datatype_size(r.type) : 1))
          << describe(r) << ": below the rows and the combine input";
    }
    // K above L: min(K, L) rows per token and rank.
    MoeShape s = make_shape({DataType::kBFloat16, DataType::kInt64, 64, 8, 8, 128, 10}, world);
    EXPECT_EQ(MoeBuffer::worst_case_rows(s, world), expected_worst_case(s, world)) << describe(s) << " world " << world;
    // Shapes create refuses saturate instead of wrapping: W * 2^62 * min(K, E / W) is 2^65 at every world here.
    MoeShape huge = s;
    huge.max_tokens = size_t(1) << 62;
    EXPECT_EQ(MoeBuffer::worst_case_rows(huge, world), SIZE_MAX) << describe(huge) << " world " << world;
    huge.layout = MoeLayout::kRankMajor;
    huge.expert_alignment = 1;
    EXPECT_EQ(MoeBuffer::worst_case_rows(huge, world), world < 4 ? static_cast<size_t>(world) << 62 : SIZE_MAX)
        << describe(huge) << " world " << world;
  }
  with_communicator([](Communicator& comm) {
    const int world = comm.size();
    const MoeShape s = make_shape({DataType::kFloat16, DataType::kInt32, 96, 4, 16, 16, 40}, world);
    MoeBuffer whole = MoeBuffer::create(comm, s);
    EXPECT_EQ(whole.capacity_rows(), expected_worst_case(s, world)) << "capacity_rows 0 must mean worst_case_rows";
    EXPECT_EQ(whole.shape().hidden, s.hidden);
    EXPECT_EQ(whole.shape().experts, s.experts);
    MoeShape small = s;
    small.capacity_rows = 100;
    MoeBuffer part = MoeBuffer::create(comm, small);
    EXPECT_EQ(part.capacity_rows(), 100u);
    // Moved: the moved-to buffer works.
    MoeBuffer moved = std::move(part);
    EXPECT_EQ(moved.capacity_rows(), 100u);
    comm.barrier();
  });
}

}  // namespace
}  // namespace braid::testing
