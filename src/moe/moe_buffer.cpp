// MoeBuffer, host side: validates the shape, carves the symmetric and local memory once, and enqueues the MoE
// launches without host synchronisation. A buffer has a signal pad of its own (two buffers on two streams never
// count each other's signals); failures go to the communicator's error words, for comm.check().
#include "braid/moe.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/call_checks.hpp"
#include "collectives/collective_context.hpp"
#include "kernels/ll128_launch.hpp"
#include "collectives/peer_bases.hpp"
#include "collectives/plan.hpp"
#include "collectives/selection.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/limits.hpp"
#include "core/log.hpp"
#include "core/private_copy.hpp"
#include "memory/symmetric_memory.hpp"
#include "kernels/moe_kernels.hpp"
#include "moe/moe_test_hooks.hpp"
#include "sync/device_sync.hpp"

namespace braid {
namespace detail {

struct MoeState {
  std::shared_ptr<collectives::CollectiveContext> comm;  // kept alive with the buffer
  MoeShape shape;
  size_t capacity = 0;
  std::unique_ptr<DeviceSync> sync;
  std::shared_ptr<SymmetricAllocation> memory;  // every rank's copy mapped here
  void* local = nullptr;  // one cudaMalloc, carved into MoeLaunch's local pointers
  kernels::moe::MoeLaunch base{};  // all but a call's inputs
  size_t last_host_tokens = 0;
  bool last_tokens_on_device = false;
  // A call split by a MoeHook whose receiving half is still to be enqueued (pending_call null: none).
  kernels::moe::MoeLaunch pending{};
  bool pending_dispatch = false;
  const char* pending_call = nullptr;
  uint64_t routed = 0;  // routed dispatches so far (MoeHandle::dispatch of the last one)
  // Rank-major: the last call was a combine that copied y into combine_input.
  bool combine_copied_last = false;

  ~MoeState() {
    if (local != nullptr) {
      DeviceGuard guard(comm->device);
      cudaFree(local);
    }
  }
};

}  // namespace detail

namespace {

constexpr size_t kPieceAlignment = 256;

size_t round_up(size_t value, size_t alignment) { return (value + alignment - 1) / alignment * alignment; }

// NOTE [byte sizes within size_t]
// A piece is a product of the shape's sizes, saturated at SIZE_MAX where it would wrap, and the Carver notes the
// first piece whose end (aligned) would not fit in size_t. validate_shape refuses a shape whose symmetric layout
// overflows, naming shape.hidden (max_tokens and the rows are bounded by 2^31, the world by kMaxWorld), so the
// offsets and sizes of a validated shape are exact.
struct Carver {
  size_t used = 0;
  bool overflowed = false;
  size_t take(size_t bytes) {
    const size_t offset = used;
    if (bytes > SIZE_MAX - (kPieceAlignment - 1) - used) {
      overflowed = true;
    } else {
      used = round_up(used + bytes, kPieceAlignment);
    }
    return offset;
  }
  // A piece of `factors` multiplied, saturated at SIZE_MAX (NOTE [byte sizes within size_t]).
  size_t take(std::initializer_list<size_t> factors) {
    size_t bytes = 1;
    for (const size_t factor : factors) {
      if (factor == 0) return take(0);
    }
    for (const size_t factor : factors) bytes = bytes > SIZE_MAX / factor ? SIZE_MAX : bytes * factor;
    return take(bytes);
  }
};

bool rank_major(const MoeShape& shape) { return shape.layout == MoeLayout::kRankMajor; }

size_t capacity_of(const MoeShape& shape, int world) {
  return shape.capacity_rows != 0 ? shape.capacity_rows : MoeBuffer::worst_case_rows(shape, world);
}

DataType dispatch_type_of(const MoeShape& shape) { return shape.dispatch_type.value_or(shape.type); }
size_t dispatch_row_bytes(const MoeShape& shape) { return shape.hidden * datatype_size(dispatch_type_of(shape)); }
size_t scale_bytes(const MoeShape& shape) {
  return shape.dispatch_type ? shape.hidden / kMoeScaleColumns * sizeof(float) : 0;
}

// Lines of a token's slot: metadata, row and scales, each from a line of its own, in whole groups of 4 (a warp's).
size_t slot_lines(const MoeShape& shape) {
  const size_t payload = kernels::kLL128LinePayload;
  const size_t lines = 1 + (dispatch_row_bytes(shape) + payload - 1) / payload + (scale_bytes(shape) + payload - 1) / payload;
  return round_up(lines, kernels::kLL128LinesPerWarp);
}

// Whether a shape dispatches in LL128 lines where the GPUs carry them (moe_lines.cu): few tokens, and a slot whose
// bytes (and so its row's) the kernel's 32-bit offsets address.
bool line_rows(const MoeShape& shape) {
  return shape.low_latency && shape.max_tokens <= kernels::moe::kLineTokens &&
         slot_lines(shape) <= UINT32_MAX / kernels::kLL128LineBytes;
}

// Raises kInvalidArgument naming shape.hidden where a byte size would not fit in size_t (NOTE [byte sizes within
// size_t]).
kernels::moe::SymmetricLayout symmetric_layout(const MoeShape& shape, int world, const char* function) {
  const size_t capacity = capacity_of(shape, world), W = world, T = shape.max_tokens, K = shape.top_k;
  const size_t row_bytes = shape.hidden * datatype_size(shape.type);
  const size_t expert_major = rank_major(shape) ? 0 : 1, ranks = 1 - expert_major;
  Carver carve;
  kernels::moe::SymmetricLayout layout{};
  layout.rows = carve.take({capacity, dispatch_row_bytes(shape)});
  layout.row_scales = carve.take({capacity, scale_bytes(shape)});
  layout.row_weight = carve.take({expert_major, capacity, sizeof(float)});
  layout.row_expert = carve.take({expert_major, capacity, sizeof(int32_t)});
  layout.row_rank = carve.take({capacity, sizeof(int32_t)});
  layout.row_token = carve.take({capacity, sizeof(int32_t)});
  layout.records = carve.take({expert_major, W, T, kernels::moe::record_words(static_cast<int>(K)), sizeof(int32_t)});
  layout.counts = carve.take({expert_major, 2, W, shape.experts + W, sizeof(uint64_t)});
  layout.combine = carve.take({W, T, row_bytes});
  layout.topk_expert = carve.take({ranks, capacity, K, sizeof(int32_t)});
  layout.topk_weight = carve.take({ranks, capacity, K, sizeof(float)});
  layout.received = carve.take({ranks, 2, W, sizeof(int64_t)});
  layout.block_rows = carve.take({ranks, W, kernels::moe::kScatterBlocks, sizeof(uint64_t)});
  layout.expert_pairs = carve.take({ranks, static_cast<size_t>(shape.experts / std::max(world, 1)), sizeof(uint32_t)});
  const size_t lines = line_rows(shape) ? 1 : 0;
  layout.line_tokens = carve.take({lines, 2, W, kernels::kLL128LineBytes});
  layout.lines = carve.take({lines, 2, W, T, slot_lines(shape), kernels::kLL128LineBytes});
  if (carve.overflowed) {
    raise_invalid_argument(function, "shape.hidden", "is {}: the buffer's symmetric memory on {} ranks would exceed "
                           "SIZE_MAX bytes", shape.hidden, world);
  }
  layout.bytes = carve.used;
  return layout;
}

// Returns the shape's symmetric layout, which the checks compute (NOTE [byte sizes within size_t]).
kernels::moe::SymmetricLayout validate_shape(const MoeShape& shape, int world, const char* function) {
  if (world < 1 || world > kMaxWorld) {
    raise_invalid_argument(function, "world", "is {}; must be in [1, {}] (ranks of one host)", world, kMaxWorld);
  }
  if (shape.hidden == 0) raise_invalid_argument(function, "shape.hidden", "is 0");
  if (shape.type != DataType::kBFloat16 && shape.type != DataType::kFloat16 && shape.type != DataType::kFloat32) {
    raise_invalid_argument(function, "shape.type", "is {}; MoE rows are bfloat16, float16 or float32",
                           datatype_name(shape.type));
  }
  if (shape.dispatch_type) {
    const DataType fp8 = *shape.dispatch_type;
    if (fp8 != DataType::kFloat8E4M3 && fp8 != DataType::kFloat8E5M2) {
      raise_invalid_argument(function, "shape.dispatch_type", "is {}; set it only for fp8 dispatch: float8_e4m3 or float8_e5m2",
                             datatype_name(fp8));
    }
    if (shape.hidden % kMoeScaleColumns != 0) {
      raise_invalid_argument(function, "shape.hidden", "is {}; fp8 dispatch needs a multiple of {} (one scale per {} columns)",
                             shape.hidden, kMoeScaleColumns, kMoeScaleColumns);
    }
  }
  if (shape.index_type != DataType::kInt32 && shape.index_type != DataType::kInt64) {
    raise_invalid_argument(function, "shape.index_type", "is {}; expert ids are int32 or int64", datatype_name(shape.index_type));
  }
  if (shape.max_tokens == 0 || shape.max_tokens > INT32_MAX) {
    raise_invalid_argument(function, "shape.max_tokens", "is {}; must be in [1, {}]", shape.max_tokens, INT32_MAX);
  }
  if (shape.top_k < 1 || shape.top_k > kMaxTopK) {
    raise_invalid_argument(function, "shape.top_k", "is {}; must be in [1, {}]", shape.top_k, kMaxTopK);
  }
  if (shape.experts < 1 || shape.experts % world != 0 || shape.experts > kernels::moe::kMaxExperts) {
    raise_invalid_argument(function, "shape.experts", "is {}; must be a multiple of the world size {}, at most {}",
                           shape.experts, world, kernels::moe::kMaxExperts);
  }
  if (shape.expert_alignment < 1) raise_invalid_argument(function, "shape.expert_alignment", "is {}; must be >= 1", shape.expert_alignment);
  if (shape.layout != MoeLayout::kExpertMajor && shape.layout != MoeLayout::kRankMajor) {
    raise_invalid_argument(function, "shape.layout", "is {}; must be kExpertMajor or kRankMajor", static_cast<int>(shape.layout));
  }
  if (shape.max_sms < 0) raise_invalid_argument(function, "shape.max_sms", "is {}; must be >= 0 (0: every multiprocessor)", shape.max_sms);
  if (rank_major(shape) && shape.expert_alignment != 1) {
    raise_invalid_argument(function, "shape.expert_alignment", "is {}; the rank-major layout has no expert blocks (must be 1)",
                           shape.expert_alignment);
  }
  if (shape.low_latency && !rank_major(shape)) {
    raise_invalid_argument(function, "shape.low_latency", "is true with the expert-major layout; its fixed rows are "
                           "rank-major's (set layout = kRankMajor)");
  }
  if (rank_major(shape) && shape.capacity_rows != 0) {
    raise_invalid_argument(function, "shape.capacity_rows", "is {}; the rank-major layout always holds world * max_tokens rows (must be 0)",
                           shape.capacity_rows);
  }
  const size_t capacity = capacity_of(shape, world);
  if (capacity > INT32_MAX) {
    // The worst case follows from max_tokens, the world and the experts a token may reach.
    if (shape.capacity_rows != 0) {
      raise_invalid_argument(function, "shape.capacity_rows", "is {}; rows are indexed in 32 bits", capacity);
    }
    // The padding of every local expert's block, with the rows of one token (max_tokens 1), already too many.
    const size_t local = static_cast<size_t>(shape.experts / world);
    const size_t padding = local * static_cast<size_t>(shape.expert_alignment - 1);
    if (padding + size_t(world) * std::min(local, static_cast<size_t>(shape.top_k)) > INT32_MAX) {
      raise_invalid_argument(function, "shape.expert_alignment", "is {}: the padding of {} local experts, {} rows, "
                             "with one token's rows exceeds the 2^31 - 1 that rows are indexed in, whatever max_tokens",
                             shape.expert_alignment, local, padding);
    }
    raise_invalid_argument(function, "shape.max_tokens", "is {}: the receive rows it needs on {} ranks, {}, exceed the "
                           "2^31 - 1 that rows are indexed in", shape.max_tokens, world, capacity);
  }
  const size_t row_bytes = shape.hidden * datatype_size(shape.type);
  if (row_bytes / datatype_size(shape.type) != shape.hidden) {
    raise_invalid_argument(function, "shape.hidden", "is {}: a row's size in bytes exceeds SIZE_MAX", shape.hidden);
  }
  return symmetric_layout(shape, world, function);  // NOTE [byte sizes within size_t]
}

std::string describe(const MoeShape& shape) {
  return fmt::format("hidden {} type {} dispatch {} index {} max_tokens {} top_k {} experts {} alignment {} capacity {} {}",
                     shape.hidden, datatype_name(shape.type), datatype_name(dispatch_type_of(shape)),
                     datatype_name(shape.index_type), shape.max_tokens, shape.top_k, shape.experts,
                     shape.expert_alignment, shape.capacity_rows, rank_major(shape) ? "rank-major" : "expert-major") +
         fmt::format(" max_sms {}{}", shape.max_sms, shape.low_latency ? " low-latency" : "");
}

// A host allgather over the communicator's store, as Communicator::host_allgather.
std::vector<std::string> host_allgather(collectives::CollectiveContext& context, const std::string& mine) {
  std::lock_guard<std::mutex> lock(context.memory.setup_mutex);
  return context.memory.bootstrap->allgather(mine, "MoeBuffer::create");
}

// Blocks of the launches pairing with every peer's: all resident at once (kMoeBlocksPerSm a multiprocessor, by
// their launch bounds) and as many on every rank, so the smallest GPU decides.
int agreed_blocks(collectives::CollectiveContext& context, const MoeShape& shape) {
  int multiprocessors = 0;
  BRAID_CUDA(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, context.device));
  multiprocessors = std::max(1, multiprocessors / context.ranks_per_gpu);  // ranks on one GPU share it
  int blocks = std::min(kernels::moe::kScatterBlocks, kernels::moe::kMoeBlocksPerSm * kernels::moe::moe_sms(shape, multiprocessors));
  // Ranks sharing a GPU: every collective's cap (with the multiprocessors split evenly, two ranks' launches hung).
  if (context.ranks_per_gpu > 1) blocks = std::min(blocks, context.max_blocks);
  for (const std::string& theirs : host_allgather(context, std::to_string(blocks))) blocks = std::min(blocks, std::stoi(theirs));
  return blocks;
}

// The state of a buffer not moved from (all the getters need).
detail::MoeState& existing(const std::unique_ptr<detail::MoeState>& state, const char* function) {
  if (!state) raise(ErrorCode::kInvalidArgument, "{}: the MoeBuffer was moved from", function);
  return *state;
}

// The state for a call: refused after a recorded failure and while a receiving half is pending.
detail::MoeState& checked(const std::unique_ptr<detail::MoeState>& state, const char* function) {
  existing(state, function);
  set_log_rank(state->comm->rank);
  // A recorded timeout leaves the communicator unusable.
  state->comm->sync->raise_recorded_error(collective_name, collectives::describe_plan);
  if (state->pending_call != nullptr) {
    raise_invalid_argument(function, "hook", "the receiving half of the last {} (its MoeHook) is still to be called: "
                           "call MoeHook::receive first", state->pending_call);
  }
  return *state;
}

// The same for a call that enqueues on `stream`: then, where ranks share a GPU as threads, the legacy stream is
// refused.
detail::MoeState& checked(const std::unique_ptr<detail::MoeState>& state, const char* function, Stream stream) {
  detail::MoeState& usable_state = checked(state, function);
  collectives::refuse_shared_legacy_stream(function, usable_state.comm->threads_per_gpu, stream);
  return usable_state;
}

// A call with a hook: rank-major only, and the hook must hold nothing pending.
void check_hook(const detail::MoeState& state, const MoeHook* hook, const char* function) {
  if (hook == nullptr) return;
  if (!state.base.rank_major) {
    raise_invalid_argument(function, "hook", "is given, but the buffer's layout is expert-major; hooks split rank-major calls");
  }
  if (hook->pending()) raise_invalid_argument(function, "hook", "still holds a receiving half to call (MoeHook::receive)");
}

// Launches a dispatch or combine in the communicator's order of calls.
void launch_call(detail::MoeState& state, const kernels::moe::MoeLaunch& launch, bool dispatch, cudaStream_t stream) {
  const auto order = collectives::ordered(*state.comm, stream);
  if (dispatch) {
    if (launch.slot_lines != 0) {
      kernels::moe::launch_line_dispatch(launch, state.shape.index_type, stream);
    } else if (launch.rank_major) {
      kernels::moe::launch_rank_dispatch(launch, state.shape.index_type, stream);
    } else {
      kernels::moe::launch_dispatch(launch, state.shape.index_type, stream);
    }
  } else if (launch.rank_major) {
    kernels::moe::launch_rank_combine(launch, state.shape.type, stream);
  } else {
    kernels::moe::launch_combine(launch, state.shape.type, stream);
  }
}

// Enqueues `launch` whole, or its sending half with the receiving half left to `hook`.
void enqueue(detail::MoeState& state, kernels::moe::MoeLaunch launch, bool dispatch, const char* function, MoeHook* hook,
             detail::MoeState** hook_state, cudaStream_t stream) {
  launch.phase = hook != nullptr ? kernels::moe::kSendingHalf : kernels::moe::kWholeCall;
  launch_call(state, launch, dispatch, stream);
  if (hook == nullptr) return;
  launch.phase = kernels::moe::kReceivingHalf;
  state.pending = launch;
  state.pending_call = function;
  state.pending_dispatch = dispatch;
  *hook_state = &state;
}

}  // namespace

size_t MoeBuffer::worst_case_rows(const MoeShape& shape, int world) {
  // Saturated at SIZE_MAX, like the Carver's pieces, for shapes that create would refuse.
  auto times = [](size_t a, size_t b) { return b != 0 && a > SIZE_MAX / b ? SIZE_MAX : a * b; };
  const size_t ranks = static_cast<size_t>(std::max(world, 0));
  const size_t local = world > 0 && shape.experts > 0 ? static_cast<size_t>(shape.experts / world) : 0;
  const size_t per_token = std::min<size_t>(static_cast<size_t>(std::max(shape.top_k, 0)), local);
  if (rank_major(shape)) return times(ranks, shape.max_tokens);
  const size_t rows = times(times(ranks, shape.max_tokens), per_token);
  const size_t padding = times(local, static_cast<size_t>(std::max(shape.expert_alignment - 1, 0)));
  return rows > SIZE_MAX - padding ? SIZE_MAX : rows + padding;
}

size_t MoeBuffer::symmetric_bytes(const MoeShape& shape, int world) {
  const char* function = "MoeBuffer::symmetric_bytes";
  return validate_shape(shape, world, function).bytes;
}

MoeBuffer MoeBuffer::create_on(std::shared_ptr<collectives::CollectiveContext> context, const MoeShape& shape) {
  const char* function = "MoeBuffer::create";
  collectives::CollectiveContext& comm_state = *context;
  const int world = comm_state.size;
  // NOTE [a refused shape in the allgather]
  // A rank whose shape is refused still takes part in the allgather, with kRefused and its message in place of the
  // shape, so its peers fail at once instead of at the bootstrap's timeout: it raises its own kInvalidArgument, and
  // a rank whose shape passed raises kMismatch naming the first rank refused (their shapes differ).
  constexpr std::string_view kRefused = "refused: ";
  std::exception_ptr refused;
  std::string mine;
  kernels::moe::SymmetricLayout layout{};
  try {
    layout = validate_shape(shape, world, function);
    mine = describe(shape);
  } catch (const Error& error) {
    refused = std::current_exception();
    mine = std::string(kRefused) + error.what();
  }
  const std::vector<std::string> shapes = host_allgather(comm_state, mine);
  if (refused) std::rethrow_exception(refused);
  for (int r = 0; r < world; ++r) {
    if (shapes[r].starts_with(kRefused)) {
      raise(ErrorCode::kMismatch, "{}: rank {}'s shape was refused ({}); this rank {} asked for ({})", function, r,
            shapes[r].substr(kRefused.size()), comm_state.rank, mine);
    }
  }
  for (int r = 0; r < world; ++r) {
    if (shapes[r] != shapes[comm_state.rank]) {
      raise(ErrorCode::kMismatch, "{}: rank {} asked for ({}) but rank {} for ({})", function, comm_state.rank,
            shapes[comm_state.rank], r, shapes[r]);
    }
  }
  auto state = std::make_unique<detail::MoeState>();
  state->comm = context;
  state->shape = shape;
  state->capacity = capacity_of(shape, world);
  // The communicator's memory context, kept alive by the same owner as `context`.
  const std::shared_ptr<detail::MemoryContext> memory(context, &comm_state.memory);
  state->sync = std::make_unique<DeviceSync>(memory, comm_state.memory.timeout_s, kernels::moe::kGridChannel + 1);
  state->memory = allocate_symmetric(memory, layout.bytes, AllocOptions{});  // zeroed

  const size_t W = world, T = shape.max_tokens, K = shape.top_k, E = shape.experts, L = E / W;
  Carver carve;
  const size_t pair_slot = carve.take(T * K * sizeof(int32_t)), slot_token = carve.take(W * T * sizeof(int32_t));
  const size_t token_row = carve.take(rank_major(shape) && !shape.low_latency ? W * T * sizeof(int32_t) : 0);
  const size_t token_ranks = carve.take(T * sizeof(uint32_t)), delivered = carve.take(sizeof(uint32_t));
  const size_t combine_plan = carve.take(4 * sizeof(int32_t));
  const size_t tokens = carve.take(sizeof(int64_t));
  const size_t received = carve.take(W * sizeof(int64_t)), expert_counts = carve.take(L * sizeof(int64_t));
  const size_t expert_offsets = carve.take((L + 1) * sizeof(int64_t)), epoch = carve.take(sizeof(uint64_t));
  const size_t blocks_done = carve.take(sizeof(unsigned int)), copies_done = carve.take(sizeof(unsigned int));
  const size_t combine_claims = carve.take(sizeof(unsigned long long));
  const size_t line_epochs = carve.take(kernels::moe::kScatterBlocks * sizeof(uint64_t)), counts_cleared = carve.take(sizeof(uint64_t));
  {
    DeviceGuard guard(comm_state.device);
    BRAID_CUDA(cudaMalloc(&state->local, carve.used));
    detail::fill_zeros_now(state->local, carve.used, comm_state.memory.setup());  // NOTE [no device-wide waits]
  }
  char* local = static_cast<char*>(state->local);
  kernels::moe::MoeLaunch& b = state->base;
  b.world = world;
  b.rank = comm_state.rank;
  b.experts = shape.experts;
  b.local_experts = static_cast<int>(L);
  b.top_k = shape.top_k;
  b.alignment = shape.expert_alignment;
  b.hidden = shape.hidden;
  b.row_bytes = dispatch_row_bytes(shape);
  b.scale_bytes = scale_bytes(shape);
  b.max_tokens = shape.max_tokens;
  b.capacity = state->capacity;
  collectives::copy_peer_bases(state->memory->peer_pointers.data(), world, b.peers);
  b.layout = layout;
  b.pair_slot = reinterpret_cast<int32_t*>(local + pair_slot);
  b.slot_token = reinterpret_cast<int32_t*>(local + slot_token);
  b.token_row = reinterpret_cast<int32_t*>(local + token_row);
  b.rank_major = rank_major(shape);
  b.fixed_rows = shape.low_latency;
  b.slot_lines = line_rows(shape) && comm_state.ll128_lines ? slot_lines(shape) : 0;
  b.token_ranks = reinterpret_cast<uint32_t*>(local + token_ranks);
  b.delivered_ranks = reinterpret_cast<uint32_t*>(local + delivered);
  b.combine_plan = reinterpret_cast<int32_t*>(local + combine_plan);
  b.tokens = reinterpret_cast<int64_t*>(local + tokens);
  b.received_tokens = reinterpret_cast<int64_t*>(local + received);
  b.expert_counts = reinterpret_cast<int64_t*>(local + expert_counts);
  b.expert_offsets = reinterpret_cast<int64_t*>(local + expert_offsets);
  b.epoch = reinterpret_cast<uint64_t*>(local + epoch);
  b.blocks_done = reinterpret_cast<unsigned int*>(local + blocks_done);
  b.copies_done = reinterpret_cast<unsigned int*>(local + copies_done);
  b.combine_claims = reinterpret_cast<unsigned long long*>(local + combine_claims);
  b.line_epochs = reinterpret_cast<uint64_t*>(local + line_epochs);
  b.counts_cleared = reinterpret_cast<uint64_t*>(local + counts_cleared);
  b.blocks = agreed_blocks(comm_state, shape);
  b.pad = state->sync->pad();
  b.pad.error = comm_state.sync->pad().error;  // failures go where comm.check() looks
  b.pad.data_error = comm_state.sync->pad().data_error;
  b.pad.stopped = comm_state.sync->pad().stopped;  // the buffer's kernels stop with the communicator
  b.dispatch_id = static_cast<unsigned int>(Collective::kMoeDispatch);
  b.combine_id = static_cast<unsigned int>(Collective::kMoeCombine);
  BRAID_DEBUG("MoeBuffer: {}; {} receive rows, {} bytes of symmetric memory", describe(shape), state->capacity, layout.bytes);
  return MoeBuffer(std::move(state));
}

MoeBuffer::MoeBuffer(std::unique_ptr<detail::MoeState> state) : state_(std::move(state)) {}
MoeBuffer::MoeBuffer(MoeBuffer&&) noexcept = default;
MoeBuffer& MoeBuffer::operator=(MoeBuffer&&) noexcept = default;
MoeBuffer::~MoeBuffer() = default;

const MoeShape& MoeBuffer::shape() const { return existing(state_, "MoeBuffer::shape").shape; }
size_t MoeBuffer::capacity_rows() const { return existing(state_, "MoeBuffer::capacity_rows").capacity; }

MoeHook::MoeHook(MoeHook&& other) noexcept : state_(std::exchange(other.state_, nullptr)) {}
MoeHook& MoeHook::operator=(MoeHook&& other) noexcept {
  state_ = std::exchange(other.state_, nullptr);
  return *this;
}

void MoeHook::receive(Stream stream) {
  const char* function = "MoeHook::receive";
  if (state_ == nullptr) raise_invalid_argument(function, "hook", "holds no receiving half (received already, or never given to a call)");
  collectives::refuse_shared_legacy_stream(function, state_->comm->threads_per_gpu, stream);  // the hook kept
  set_log_rank(state_->comm->rank);
  state_->comm->sync->raise_recorded_error(collective_name, collectives::describe_plan);  // the hook kept
  detail::MoeState& state = *std::exchange(state_, nullptr);
  state.pending_call = nullptr;
  launch_call(state, state.pending, state.pending_dispatch, stream);
}

namespace {

MoeDispatchOutput output_of(const detail::MoeState& state, const kernels::moe::MoeLaunch& launch) {
  const bool fp8 = state.shape.dispatch_type.has_value();
  char* base = static_cast<char*>(state.memory->peer_pointers[state.memory->rank]);
  MoeDispatchOutput output;
  output.x = base + launch.layout.rows;
  output.scales = fp8 ? kernels::moe::at_offset<float>(base, launch.layout.row_scales) : nullptr;
  output.expert_counts = launch.expert_counts;
  output.source_rank = kernels::moe::at_offset<int32_t>(base, launch.layout.row_rank);
  output.source_token = kernels::moe::at_offset<int32_t>(base, launch.layout.row_token);
  if (launch.rank_major) {
    output.received_tokens = kernels::moe::at_offset<int64_t>(base, launch.layout.received);
    output.topk_expert = kernels::moe::at_offset<int32_t>(base, launch.layout.topk_expert);
    output.topk_weights = kernels::moe::at_offset<float>(base, launch.layout.topk_weight);
    output.combine_input = base + launch.layout.combine;
  } else {
    output.expert_offsets = launch.expert_offsets;
    output.weights = kernels::moe::at_offset<float>(base, launch.layout.row_weight);
    output.local_expert = kernels::moe::at_offset<int32_t>(base, launch.layout.row_expert);
  }
  output.capacity_rows = state.capacity;
  output.local_experts = launch.local_experts;
  output.handle.dispatch = state.routed;
  return output;
}

// x_scales exactly when the shape dispatches fp8; with `needed` (the call may have tokens), both on this device.
void check_rows(const detail::MoeState& state, const void* x, const float* x_scales, bool needed, const char* function) {
  const bool fp8 = state.shape.dispatch_type.has_value();
  if (!fp8 && x_scales != nullptr) {
    raise_invalid_argument(function, "x_scales", "is given, but the shape moves {} rows (shape.dispatch_type unset)",
                           datatype_name(state.shape.type));
  }
  if (!needed) return;
  if (x == nullptr) raise_invalid_argument(function, "x", "is null");
  if (fp8 && x_scales == nullptr) {
    raise_invalid_argument(function, "x_scales", "is null; the shape moves {} rows with float32 scales",
                           datatype_name(*state.shape.dispatch_type));
  }
  collectives::check_device_pointer(function, x, "x", state.comm->device);
  if (fp8) collectives::check_device_pointer(function, x_scales, "x_scales", state.comm->device);
}

void check_handle(const detail::MoeState& state, const MoeHandle& handle, const char* function) {
  if (handle.dispatch == 0 || handle.dispatch != state.routed) {
    raise_invalid_argument(function, "handle", "names routed dispatch {}; the buffer's last one is {} (0: none yet)",
                           handle.dispatch, state.routed);
  }
}

}  // namespace

MoeDispatchOutput MoeBuffer::redispatch(const MoeHandle& handle, const void* x, const float* x_scales, Stream stream,
                                        MoeHook* hook) {
  const char* function = "MoeBuffer::redispatch";
  detail::MoeState& state = checked(state_, function, stream);
  if (!state.base.rank_major) raise_invalid_argument(function, "handle", "redispatch takes a rank-major buffer's handle");
  check_handle(state, handle, function);
  check_hook(state, hook, function);
  check_rows(state, x, x_scales, state.last_tokens_on_device || state.last_host_tokens > 0, function);
  kernels::moe::MoeLaunch launch = state.base;
  launch.x = static_cast<const char*>(x);
  launch.x_scales = reinterpret_cast<const char*>(x_scales);
  launch.reuse_routing = true;
  enqueue(state, launch, true, function, hook, hook != nullptr ? &hook->state_ : nullptr, stream);
  state.combine_copied_last = false;
  return output_of(state, launch);
}

MoeDispatchOutput MoeBuffer::dispatch(const void* x, const void* topk_idx, const float* topk_weights, size_t num_tokens,
                                      const int64_t* num_tokens_device, Stream stream, MoeHook* hook) {
  return dispatch(x, nullptr, topk_idx, topk_weights, num_tokens, num_tokens_device, stream, hook);
}

MoeDispatchOutput MoeBuffer::dispatch(const void* x, const float* x_scales, const void* topk_idx,
                                      const float* topk_weights, size_t num_tokens, const int64_t* num_tokens_device,
                                      Stream stream, MoeHook* hook) {
  const char* function = "MoeBuffer::dispatch";
  detail::MoeState& state = checked(state_, function, stream);
  check_hook(state, hook, function);
  const int device = state.comm->device;
  if (num_tokens_device == nullptr && num_tokens > state.shape.max_tokens) {
    raise_invalid_argument(function, "num_tokens", "is {}; the buffer holds at most {} (shape.max_tokens)", num_tokens,
                           state.shape.max_tokens);
  }
  if (num_tokens_device != nullptr) collectives::check_device_pointer(function, num_tokens_device, "num_tokens_device", device);
  // With T on the device any T up to max_tokens may come.
  const bool tokens_possible = num_tokens_device != nullptr || num_tokens > 0;
  check_rows(state, x, x_scales, tokens_possible, function);
  if (tokens_possible) {
    if (topk_idx == nullptr) raise_invalid_argument(function, "topk_idx", "is null");
    if (topk_weights == nullptr) raise_invalid_argument(function, "topk_weights", "is null");
    collectives::check_device_pointer(function, topk_idx, "topk_idx", device);
    collectives::check_device_pointer(function, topk_weights, "topk_weights", device);
  }
  kernels::moe::MoeLaunch launch = state.base;
  launch.x = static_cast<const char*>(x);
  launch.x_scales = reinterpret_cast<const char*>(x_scales);
  launch.topk_idx = topk_idx;
  launch.topk_weights = topk_weights;
  launch.num_tokens = num_tokens;
  launch.num_tokens_device = num_tokens_device;
  enqueue(state, launch, true, function, hook, hook != nullptr ? &hook->state_ : nullptr, stream);
  state.last_host_tokens = num_tokens;
  state.last_tokens_on_device = num_tokens_device != nullptr;
  state.combine_copied_last = false;
  ++state.routed;
  return output_of(state, launch);
}

namespace {

// combine's checks and launch on the state checked() returned; `hook_state`: the hook's pending slot (MoeHook's).
void combine_on(detail::MoeState& state, const void* y, void* out, bool weighted, Stream stream, MoeHook* hook,
                detail::MoeState** hook_state) {
  const char* function = "MoeBuffer::combine";
  check_hook(state, hook, function);
  const int device = state.comm->device;
  if (y == nullptr) raise_invalid_argument(function, "y", "is null");
  if (state.base.rank_major && weighted) {
    raise_invalid_argument(function, "weighted", "is true; in the rank-major layout y holds one row per token with the "
                           "weights applied (pass false)");
  }
  collectives::check_device_pointer(function, y, "y", device);
  const bool tokens_possible = state.last_tokens_on_device || state.last_host_tokens > 0;
  if (tokens_possible || out != nullptr) {
    if (out == nullptr) raise_invalid_argument(function, "out", "is null");
    collectives::check_device_pointer(function, out, "out", device);
  }
  kernels::moe::MoeLaunch launch = state.base;
  launch.y = static_cast<const char*>(y);
  launch.out = static_cast<char*>(out);
  launch.weighted = weighted;
  const char* combine_input = static_cast<const char*>(state.memory->peer_pointers[state.memory->rank]) + launch.layout.combine;
  launch.copy_y = launch.rank_major && launch.y != combine_input;
  // NOTE [combine_input after a combine]
  // Peers read this rank's combine_input until their combine completes, and the caller's writes into it precede
  // the combine, where no barrier of braid's can wait for the peers. A combine that copied y left there the peers'
  // rows only (this rank's own it read from y), so a combine of combine_input right after it would read rows
  // written while peers may still read them: refused. One after a combine of combine_input rereads the same rows;
  // a combine that copies y passes its entry barrier before it writes.
  if (launch.rank_major && !launch.copy_y && state.combine_copied_last) {
    raise_invalid_argument(function, "y", "is the dispatch's combine_input, and the buffer's last call was a combine "
                           "that copied another y there: that copy holds only the rows the peers read (not this "
                           "rank's own), and peers may still be reading them, so no write into combine_input since "
                           "then can have been safe. Write combine_input only between a dispatch (or redispatch) and "
                           "the combine after it, or pass the rows in a buffer of your own (combine copies them there "
                           "once every peer is done)");
  }
  enqueue(state, launch, false, function, hook, hook_state, stream);
  state.combine_copied_last = launch.copy_y;
}

}  // namespace

void MoeBuffer::combine(const MoeHandle& handle, const void* y, void* out, bool weighted, Stream stream, MoeHook* hook) {
  detail::MoeState& state = checked(state_, "MoeBuffer::combine", stream);
  check_handle(state, handle, "MoeBuffer::combine");
  combine_on(state, y, out, weighted, stream, hook, hook != nullptr ? &hook->state_ : nullptr);
}

void MoeBuffer::combine(const void* y, void* out, bool weighted, Stream stream, MoeHook* hook) {
  combine_on(checked(state_, "MoeBuffer::combine", stream), y, out, weighted, stream, hook,
             hook != nullptr ? &hook->state_ : nullptr);
}

namespace detail {
struct MoeTestAccess {
  static MoeState& state(MoeBuffer& buffer, const char* function) { return checked(buffer.state_, function); }
};
}  // namespace detail

void testing::stall_next_moe_dispatch(MoeBuffer& buffer) {
  const char* function = "testing::stall_next_moe_dispatch";
  detail::MoeState& state = detail::MoeTestAccess::state(buffer, function);
  if (!state.base.rank_major || state.base.slot_lines != 0) {
    raise_invalid_argument(function, "buffer", "does not dispatch with moe_rank_major.cu's kernel (a rank-major buffer "
                           "whose rows do not go in lines)");
  }
  DeviceGuard guard(state.comm->device);
  const unsigned int offset = 1u << 31;  // the count never reaches the launch's blocks
  // NOTE [no device-wide waits]
  detail::copy_to_device_now(state.base.blocks_done, &offset, sizeof offset, state.comm->memory.setup());
}

MoeDispatchOutput testing::moe_output_views(MoeBuffer& buffer) {
  detail::MoeState& state = detail::MoeTestAccess::state(buffer, "testing::moe_output_views");
  MoeDispatchOutput views = output_of(state, state.base);
  views.handle.dispatch = 0;
  return views;
}

void MoeBuffer::copy_expert_counts(int64_t* host_counts, Stream stream) {
  const char* function = "MoeBuffer::copy_expert_counts";
  detail::MoeState& state = checked(state_, function, stream);
  if (host_counts == nullptr) raise_invalid_argument(function, "host_counts", "is null");
  DeviceGuard guard(state.comm->device);
  BRAID_CUDA(cudaMemcpyAsync(host_counts, state.base.expert_counts, state.base.local_experts * sizeof(int64_t),
                             cudaMemcpyDeviceToHost, stream));
}

}  // namespace braid
