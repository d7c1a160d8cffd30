// FusedMatmul: the GEMMs of tensor-parallel layers with their collective hidden under them (braid/fused_matmul.hpp).
// The GEMMs run on the caller's stream; the copies into the peers' workspace, and the single-element all-reduces
// where the ranks meet, run on a side stream forked from it and joined back, so a call captures into a CUDA graph
// like any other.
#include "braid/fused_matmul.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "collectives/call_checks.hpp"
#include "collectives/collective_context.hpp"
#include "collectives/collectives.hpp"
#include "core/config.hpp"
#include "core/cuda_check.hpp"
#include "core/device_guard.hpp"
#include "core/error.hpp"
#include "core/private_copy.hpp"
#include "kernels/matmul_sm90.hpp"
#include "kernels/matrix_sum.hpp"
#include "overlap/cublaslt.hpp"

namespace braid {
using detail::Gemm;
}  // namespace braid

namespace braid {
namespace detail {

// NOTE [fused matmul synchronisation]
// Each rank writes its rows into every peer's symmetric workspace with the copy engines, between two meetings of
// the ranks: single-element all-reduces of the communicator on the side stream (an all-reduce ends on a rank only
// once every rank has started it, and its kernel starts only after the copies enqueued before it have completed).
//   - The entry meeting: every peer has forked this call from its stream, after the GEMMs of its previous call, so
//     nothing still reads the workspace the copies are about to overwrite.
//   - A meeting after the copies: every rank's copies into this rank's workspace have landed, so the GEMMs that
//     read them may start (the caller's stream waits for an event recorded after the meeting).
// The caller's stream waits for every event the side stream records before the call ends, so a call's side work
// is joined into its stream (and into its capture), and the next call's fork comes after all of it.
struct FusedMatmulState {
  FusedMatmulState(Communicator handle, std::shared_ptr<collectives::CollectiveContext> context);
  ~FusedMatmulState();
  FusedMatmulState(const FusedMatmulState&) = delete;
  FusedMatmulState& operator=(const FusedMatmulState&) = delete;

  Communicator comm;  // a handle of its own on the communicator's state
  // The communicator's collective context: its signal pad's fatal word, which the epilogue reduce-scatter's waits
  // report to and give up on (NOTE [stopped ranks]).
  const std::shared_ptr<collectives::CollectiveContext> context;
  const int rank, size, device;
  // Some ranks share a GPU (NOTE [fused matmul on a shared GPU]): the collective context's ranks_per_gpu, the same
  // on every rank, so every rank takes the same schedule (its meetings must match).
  const bool shares_gpu;
  // The multiprocessors a GEMM that runs beside the side stream's work may take (NOTE [multiprocessors left to the
  // meetings]); 0: all, on a shared GPU, where nothing runs beside.
  const int overlapped_gemm_multiprocessors;
  GemmRunner gemm;
  cudaStream_t own_side = nullptr;
  cudaStream_t side = nullptr;  // the call in progress's: own_side, or the caller's stream on a shared GPU
  int32_t* meeting_word = nullptr;  // the all-reduced element of the meetings
  // The calls in one launch of braid's Hopper GEMM with an exchange (NOTE [one-launch choice]).
  const bool epilogue_wanted;       // BRAID_MATMUL_REDUCE_SCATTER=epilogue
  const bool engines_wanted;        // BRAID_MATMUL_REDUCE_SCATTER=engines
  const bool loads_wanted;          // BRAID_ALL_GATHER_MATMUL=loads
  int hopper_agreed = -1;           // every rank runs the kernel: 1, not: 0, not asked yet: -1
  SymmetricMemory exchange;         // the kernel's exchange area (kernels/matmul_sm90.hpp), for both kinds
  size_t exchange_flags = 0;        // the flag capacity it was made with
  unsigned long long epilogue_calls = 0, loads_calls = 0;  // epilogue_calls: epilogue and engines alike
  std::vector<cudaEvent_t> events;  // made as needed; a call uses each at most once
  size_t events_used = 0;
  SymmetricMemory workspace;
  // NOTE [workspace kept for captured graphs]: a graph captured from a call reads and writes the workspace (and the
  // exchange area) at the addresses it had then; a later growth must not unmap them under that graph. So an
  // allocation that a capture used is kept here when it is replaced, until the FusedMatmul is destroyed.
  bool workspace_captured = false, exchange_captured = false;
  std::vector<SymmetricMemory> retired;
  // Replaces `memory` by a new allocation of `bytes` (collective), keeping the old one where a capture used it.
  void regrow(SymmetricMemory& memory, bool& captured, size_t bytes);
  // The previous call: its stream, its capture's id (0: eager), and an event recorded at its end.
  cudaEvent_t done = nullptr;
  Stream last_stream = nullptr;
  unsigned long long last_capture = 0;
  bool made_a_call = false;
  unsigned long long capture = 0;  // the call in progress's capture id (0: eager)

  // What every call starts with: refuses the legacy stream where ranks share a GPU, checks the workspace holds
  // `bytes` (growing it, collectively, outside a capture), then orders this call after the previous one.
  void order(const char* function, size_t bytes, Stream stream);
  // order(), then forks the side stream from `stream`.
  void begin(const char* function, size_t bytes, Stream stream);
  // A call's product over k = 0: zeros into `out`, ordered as every call, with nothing on the side stream.
  void zeros(const char* function, void* out, size_t bytes, Stream stream);
  void end(Stream stream);
  cudaEvent_t record(cudaStream_t on);  // an unused event, recorded on `on`
  // `waiter`'s later work waits for what `leader` has enqueued so far (nothing to do where they are one stream).
  void follow(cudaStream_t waiter, cudaStream_t leader);
  void meet();                          // NOTE [fused matmul synchronisation]
  // Whether every rank runs braid's Hopper GEMM with an exchange (NOTE [one-launch choice]).
  bool hopper_agreed_on(Stream stream);
  // The exchange area for a call of `kind` with block_rows x columns per rank on `stream`, grown (collectively,
  // outside a capture; refused naming `stream` inside one) where needed.
  void reserve_exchange(const char* function, kernels::Sm90ExchangeKind kind, size_t block_rows, size_t columns,
                        DataType type, Stream stream);
  // The id of the capture `stream` is in (0: none).
  static unsigned long long capture_of(Stream stream);
  // A call in one launch of braid's Hopper GEMM with an exchange of `matmul.exchange.kind`, where it is asked for
  // and every rank and the call allow it (NOTE [one-launch choice]), its exchange filled in here (ordered, the area
  // reserved, an equal share of the GPU where ranks share it); false, with nothing enqueued, where not.
  bool run_exchanged(const char* function, kernels::Sm90Matmul matmul, Layout b_layout, size_t block_rows,
                     Stream stream);
  // The side stream's part of a reduce-scatter by the copy engines, its GEMM launched (NOTE [reduce-scatter by the
  // copy engines] in kernels/matmul_sm90_engine_exchange.cuh): the entry meeting, then for each peer and chunk a
  // gate, the copy of the chunk into the peer's received block for this rank, and a post.
  void copy_engine_rows(const kernels::Sm90Matmul& matmul);
  size_t workspace_bytes() const { return workspace ? workspace.bytes() : 0; }
  char* local(size_t offset) const { return static_cast<char*>(workspace.local()) + offset; }
  char* peer(int q, size_t offset) const { return static_cast<char*>(workspace.peer(q)) + offset; }
};

// NOTE [multiprocessors left to the meetings]
// cuBLASLt's GEMMs on Hopper are persistent: one block per multiprocessor for the whole GEMM. A meeting (an
// all-reduce kernel) or the peers' sum, launched beside such a GEMM, would wait for the GEMM's end for a
// multiprocessor, and with it the copies that follow it: the communication would no longer be hidden. So the GEMMs
// that run while the side stream works target all multiprocessors but kReservedMultiprocessors (cuBLASLt's SM count
// target); the last GEMMs of a call, with nothing beside them, take them all.
constexpr int kReservedMultiprocessors = 4;
constexpr int kSharedGpuSumBlocks = 32;  // where nothing runs beside the sum

int multiprocessors_of(int device) {
  int count = 0;
  BRAID_CUDA(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// NOTE [fused matmul on a shared GPU]
// Ranks that share a GPU as threads share its context's hardware queues (NOTE [shared hardware queues]): a command
// of one rank queued behind another rank's wait for its meeting would hold back the meeting that ends that wait.
// Where any ranks share a GPU, every rank's call (their meetings must match) runs on the caller's stream alone, and
// an eager call meets its peers on the host (its stream synchronised, then Communicator::barrier), so nothing of it
// spins on the GPU: the same results, nothing overlapped (timings mean nothing in that mode anyway). A captured
// call still meets on the GPU. The copy engines' reduce-scatter cannot run so: its GEMM waits for its side stream's
// posts, so it keeps its side stream and meets on the GPU there too, where ranks that are threads may meet the
// hazard of NOTE [shared hardware queues] (a wait that ends at the timeout, as docs/shared-gpu.md says).
// NOTE [one-launch choice]
// BRAID_MATMUL_REDUCE_SCATTER=epilogue runs matmul_reduce_scatter, and BRAID_ALL_GATHER_MATMUL=loads runs
// all_gather_matmul, as one launch of braid's Hopper GEMM with an exchange (NOTE [reduce-scatter in the epilogue]
// in kernels/matmul_sm90_epilogue_exchange.cuh and NOTE [all-gather under the loads] in
// kernels/matmul_sm90_loads_gather.cuh) where every rank can: its GemmRunner offers the
// kernel (compute capability 9.0, BRAID_GEMM_TUNING on). The rest of the choice depends only on the call's
// arguments, which every rank shares: B Layout::kTransposed, rows per rank a multiple of 128, and the kernel's own
// limits (FusedMatmulState::run_exchanged checks them first). The ranks agree once, at the first eager call that asks
// and whose arguments allow it (a host allgather of the communicator: no GPU work); until then, and where any rank
// cannot, calls take the pieces.
// The kernel's waits for its peers spin on the GPU: where ranks share a GPU, each takes an equal share of its
// multiprocessors, so that every rank's launch is resident at once.

FusedMatmulState::FusedMatmulState(Communicator handle, std::shared_ptr<collectives::CollectiveContext> collective_context)
    : comm(std::move(handle)),
      context(std::move(collective_context)),
      rank(comm.rank()),
      size(comm.size()),
      device(comm.device()),
      shares_gpu(context->ranks_per_gpu > 1),
      overlapped_gemm_multiprocessors(shares_gpu ? 0 : std::max(1, multiprocessors_of(device) - kReservedMultiprocessors)),
      gemm(device),
      epilogue_wanted(Config::get().string("BRAID_MATMUL_REDUCE_SCATTER").value_or("pieces") == "epilogue"),
      engines_wanted(Config::get().string("BRAID_MATMUL_REDUCE_SCATTER").value_or("pieces") == "engines"),
      loads_wanted(Config::get().string("BRAID_ALL_GATHER_MATMUL").value_or("pieces") == "loads") {
  DeviceGuard guard(device);
  BRAID_CUDA(cudaStreamCreateWithFlags(&own_side, cudaStreamNonBlocking));
  BRAID_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  BRAID_CUDA(cudaMalloc(reinterpret_cast<void**>(&meeting_word), sizeof(int32_t)));
  detail::fill_zeros_now(meeting_word, sizeof(int32_t), context->memory.setup());  // NOTE [no device-wide waits]
}

FusedMatmulState::~FusedMatmulState() {
  DeviceGuard guard(device);
  if (own_side != nullptr) cudaStreamSynchronize(own_side);
  for (cudaEvent_t event : events) cudaEventDestroy(event);
  if (done != nullptr) cudaEventDestroy(done);
  if (meeting_word != nullptr) cudaFree(meeting_word);
  if (own_side != nullptr) cudaStreamDestroy(own_side);
}

cudaEvent_t FusedMatmulState::record(cudaStream_t on) {
  if (events_used == events.size()) {
    cudaEvent_t event = nullptr;
    BRAID_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    events.push_back(event);
  }
  cudaEvent_t event = events[events_used++];
  BRAID_CUDA(cudaEventRecord(event, on));
  return event;
}

void FusedMatmulState::follow(cudaStream_t waiter, cudaStream_t leader) {
  if (waiter != leader) BRAID_CUDA(cudaStreamWaitEvent(waiter, record(leader), 0));
}

void FusedMatmulState::meet() {
  if (shares_gpu && capture == 0) {  // NOTE [fused matmul on a shared GPU]
    BRAID_CUDA(cudaStreamSynchronize(side));
    comm.barrier();
    return;
  }
  comm.all_reduce(meeting_word, meeting_word, 1, DataType::kInt32, ReduceOp::kMax, side);
}

bool FusedMatmulState::hopper_agreed_on(Stream stream) {
  if (size < 2) return false;
  if (hopper_agreed < 0) {
    if (capture_of(stream) != 0) return false;  // asked at the first eager call
    // On the host (no GPU work): ranks sharing a GPU would wait on each other's copies around a GPU meeting.
    int able = 1;
    for (const std::string& theirs : comm.host_allgather(gemm.offers_hopper_gemm() ? "1" : "0")) {
      able = std::min(able, theirs == "1" ? 1 : 0);
    }
    hopper_agreed = able;
  }
  return hopper_agreed == 1;
}

void FusedMatmulState::reserve_exchange(const char* function, kernels::Sm90ExchangeKind kind, size_t block_rows,
                                        size_t columns, DataType type, Stream stream) {
  const size_t flags = kernels::sm90_exchange_flag_bytes(kind, size, block_rows, columns);
  const size_t capacity = std::max(exchange_flags, flags);
  const size_t bytes = kernels::sm90_exchange_bytes(kind, size, block_rows, columns, type, capacity);
  if (exchange && flags <= exchange_flags && bytes <= exchange.bytes()) return;
  if (capture_of(stream) != 0) {
    raise_invalid_argument(function, "stream",
                           "is being captured, and the call needs an exchange area of {} bytes where {} are made: "
                           "growing it allocates collectively, which a capture cannot hold; make the call once "
                           "eagerly first", bytes, exchange ? exchange.bytes() : 0);
  }
  constexpr size_t kFlagGrain = size_t(64) << 10, kGrain = size_t(2) << 20;
  // Room for the received blocks of the largest call so far, not this call's alone: more flags move the blocks.
  const size_t received = bytes - kernels::kSm90ExchangeFlagsOffset - capacity;
  const size_t made = exchange ? exchange.bytes() - kernels::kSm90ExchangeFlagsOffset - exchange_flags : 0;
  exchange_flags = (capacity + kFlagGrain - 1) / kFlagGrain * kFlagGrain;
  const size_t grown = kernels::kSm90ExchangeFlagsOffset + exchange_flags + std::max(received, made);
  regrow(exchange, exchange_captured, (grown + kGrain - 1) / kGrain * kGrain);
}

void FusedMatmulState::regrow(SymmetricMemory& memory, bool& captured, size_t bytes) {
  if (captured) retired.push_back(std::move(memory));  // NOTE [workspace kept for captured graphs]
  memory.reset();
  captured = false;
  memory = comm.alloc(bytes);
}

bool FusedMatmulState::run_exchanged(const char* function, kernels::Sm90Matmul matmul, Layout b_layout,
                                     size_t block_rows, Stream stream) {
  const kernels::Sm90ExchangeKind kind = matmul.exchange.kind;
  const bool engines = kind == kernels::Sm90ExchangeKind::kEngineReduceScatter;
  const bool wanted = kind == kernels::Sm90ExchangeKind::kAllGather ? loads_wanted : engines ? engines_wanted
                                                                                             : epilogue_wanted;
  // What the call's arguments allow (the same on every rank), checked before the ranks agree or anything is
  // reserved: the kernel's limits on the shape, and those of its exchange.
  kernels::Sm90Matmul shape = matmul;
  shape.exchange = {};
  if (!wanted || b_layout != Layout::kTransposed || block_rows % 128 != 0 || size > kernels::kSm90ExchangeMaxWorld ||
      !kernels::sm90_matmul_supports(shape) || !hopper_agreed_on(stream)) {
    return false;
  }
  const size_t columns = kind == kernels::Sm90ExchangeKind::kAllGather ? matmul.k : matmul.n;
  reserve_exchange(function, kind, block_rows, columns, matmul.type, stream);  // may refuse: before order()'s wait
  order(function, 0, stream);
  if (capture != 0) exchange_captured = true;
  // Where ranks share a GPU, an equal share of the blocks that fit at once for each of the most ranks on one GPU
  // (NOTE [one-launch choice]); at least one cluster, which sm90_matmul_supports asks of any launch. The copy
  // engines' reduce-scatter leaves kReservedMultiprocessors to its side stream's kernels (the meeting, the gates and
  // posts), which its GEMM waits for.
  const int sharing = context->ranks_per_gpu;
  const int resident = kernels::sm90_exchange_resident_blocks(device, matmul.type, kind);
  const int shared = (engines ? resident - kReservedMultiprocessors : resident) / sharing / 2 * 2;
  matmul.multiprocessors = sharing == 1 && !engines ? 0 : std::max(2, shared);
  kernels::Sm90Exchange& x = matmul.exchange;
  x.world = size;
  x.rank = rank;
  x.block_rows = block_rows;
  x.local = static_cast<uint8_t*>(exchange.local());
  x.peers = reinterpret_cast<uint8_t* const*>(exchange.device_peers());
  x.host_peers = reinterpret_cast<uint8_t* const*>(exchange.peers());
  x.received_offset = kernels::kSm90ExchangeFlagsOffset + exchange_flags;
  x.pad = context->sync->pad();
  if (!kernels::sm90_matmul_supports(matmul)) {  // the exchange as filled in here: always taken
    raise(ErrorCode::kInternal, "{}: braid's Hopper GEMM refused the exchange it was given", function);
  }
  auto launched = [&](cudaError_t status, const char* what) {
    if (status != cudaSuccess) {
      raise(ErrorCode::kCudaError, "{}: {} failed to launch: {}", function, what, cudaGetErrorString(status));
    }
  };
  if (engines) {  // NOTE [reduce-scatter by the copy engines] in kernels/matmul_sm90_engine_exchange.cuh
    side = own_side;  // its GEMM waits for the side's posts: never the caller's stream, even on a shared GPU
    follow(side, stream);  // forked before the GEMM, which the side's work must not wait for
    launched(kernels::launch_sm90_matmul(matmul, stream), "braid's Hopper GEMM with its exchange");
    copy_engine_rows(matmul);
    follow(stream, side);
  } else {
    launched(kernels::launch_sm90_matmul(matmul, stream), "braid's Hopper GEMM with its exchange");
  }
  ++(kind == kernels::Sm90ExchangeKind::kAllGather ? loads_calls : epilogue_calls);
  end(stream);
  return true;
}

void FusedMatmulState::copy_engine_rows(const kernels::Sm90Matmul& matmul) {
  const kernels::Sm90Exchange& x = matmul.exchange;
  const size_t row_bytes = matmul.n * datatype_size(matmul.type), block_bytes = x.block_rows * row_bytes;
  const size_t chunk_rows = kernels::sm90_engine_chunk_rows(x.block_rows);
  const size_t chunks = kernels::sm90_engine_chunks(x.block_rows);
  // The entry meeting (every peer's previous call has ended: its received blocks are free), on the GPU even where
  // ranks share one: this call's GEMM, already launched, waits for what follows it.
  comm.all_reduce(meeting_word, meeting_word, 1, DataType::kInt32, ReduceOp::kMax, side);
  for (int destination = 0; destination < size - 1; ++destination) {  // the kernel's order: rank + 1 first
    const int peer = (rank + 1 + destination) % size, slot = (rank - peer - 1 + size) % size;
    const char* products = static_cast<const char*>(exchange.local()) +
                           kernels::sm90_engine_partials_offset(x, matmul.n, matmul.type, destination);
    char* received = static_cast<char*>(exchange.peer(peer)) + x.received_offset + slot * block_bytes;
    for (size_t chunk = 0; chunk < chunks; ++chunk) {
      const size_t first = chunk * chunk_rows, rows = std::min(chunk_rows, x.block_rows - first);
      const uint32_t target = kernels::sm90_engine_ready_target(rows, matmul.n);
      BRAID_CUDA(kernels::launch_sm90_engine_gate(x, destination, chunk, target, side));
      BRAID_CUDA(cudaMemcpyAsync(received + first * row_bytes, products + first * row_bytes, rows * row_bytes,
                                 cudaMemcpyDeviceToDevice, side));
      BRAID_CUDA(kernels::launch_sm90_engine_post(x, peer, slot, chunk, side));
    }
  }
}

unsigned long long FusedMatmulState::capture_of(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  BRAID_CUDA(cudaStreamGetCaptureInfo(stream, &status, &id));
  return status == cudaStreamCaptureStatusActive ? id : 0;
}

void FusedMatmulState::order(const char* function, size_t bytes, Stream stream) {
  capture = capture_of(stream);
  if (bytes > workspace_bytes()) {
    if (capture != 0) {
      raise_invalid_argument(function, "stream",
                             "is being captured, and the call needs a workspace of {} bytes where {} are made: growing "
                             "it allocates collectively, which a capture cannot hold; make the call once eagerly "
                             "first, or call reserve({})", bytes, workspace_bytes(), bytes);
    }
    constexpr size_t kGrain = size_t(2) << 20;
    regrow(workspace, workspace_captured, (bytes + kGrain - 1) / kGrain * kGrain);
  }
  events_used = 0;
  if (made_a_call && last_stream != stream && last_capture == capture) {
    BRAID_CUDA(cudaStreamWaitEvent(stream, done, 0));
  }
}

void FusedMatmulState::zeros(const char* function, void* out, size_t bytes, Stream stream) {
  order(function, 0, stream);
  BRAID_CUDA(cudaMemsetAsync(out, 0, bytes, stream));
  end(stream);
}

void FusedMatmulState::begin(const char* function, size_t bytes, Stream stream) {
  order(function, bytes, stream);
  if (capture != 0) workspace_captured = true;
  side = shares_gpu ? stream : own_side;
  follow(side, stream);
}

void FusedMatmulState::end(Stream stream) {
  BRAID_CUDA(cudaEventRecord(done, stream));
  last_stream = stream;
  last_capture = capture;
  made_a_call = true;
}

}  // namespace detail

namespace {

using collectives::check_buffer;
using collectives::checked_product;
using collectives::overlap;

detail::FusedMatmulState& usable(const std::unique_ptr<detail::FusedMatmulState>& state, const char* function) {
  if (state == nullptr) raise(ErrorCode::kInvalidArgument, "{}: the FusedMatmul was moved from", function);
  return *state;
}

// A call's start, as every call of the communicator's: a failure recorded on it (a wait of an earlier call that
// gave up, an abort, a revocation, a peer's exit) raises first, then the legacy stream is refused where ranks
// share a GPU, whatever the sizes.
detail::FusedMatmulState& enter(const std::unique_ptr<detail::FusedMatmulState>& state, const char* function,
                                Stream stream) {
  detail::FusedMatmulState& usable_state = usable(state, function);
  collectives::raise_recorded_failure(*usable_state.context);
  collectives::refuse_shared_legacy_stream(function, usable_state.context->threads_per_gpu, stream);
  return usable_state;
}

void check_type(const char* function, DataType type) {
  if (type != DataType::kBFloat16 && type != DataType::kFloat16) {
    raise_invalid_argument(function, "type", "is {} ({}); the fused GEMMs take bfloat16 and float16",
                           datatype_name(type), static_cast<int>(type));
  }
}

void check_layout(const char* function, Layout layout) {
  if (layout != Layout::kRowMajor && layout != Layout::kTransposed) {
    raise_invalid_argument(function, "b_layout", "is {}, not a Layout", static_cast<int>(layout));
  }
}

// A matrix argument: device memory of this GPU (when it holds anything), 16-byte aligned.
void check_matrix(const char* function, const char* argument, const void* pointer, size_t bytes, int device) {
  check_buffer(function, pointer, argument, bytes, device);
  if (bytes != 0 && reinterpret_cast<uintptr_t>(pointer) % 16 != 0) {
    raise_invalid_argument(function, argument, "({}) is not 16-byte aligned", pointer);
  }
}

struct Extent {
  const char* argument;
  const void* pointer;
  size_t bytes;
};

// No output overlaps an input or another output.
void check_disjoint(const char* function, const std::vector<Extent>& outputs, const std::vector<Extent>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (const Extent& input : inputs) {
      if (overlap(outputs[i].pointer, outputs[i].bytes, input.pointer, input.bytes)) {
        raise_invalid_argument(function, outputs[i].argument, "overlaps {}", input.argument);
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (overlap(outputs[i].pointer, outputs[i].bytes, outputs[j].pointer, outputs[j].bytes)) {
        raise_invalid_argument(function, outputs[i].argument, "overlaps {}", outputs[j].argument);
      }
    }
  }
}

const char* at(const void* base, size_t bytes) { return static_cast<const char*>(base) + bytes; }
char* at(void* base, size_t bytes) { return static_cast<char*>(base) + bytes; }

}  // namespace

FusedMatmul::FusedMatmul(std::unique_ptr<detail::FusedMatmulState> state) : state_(std::move(state)) {}
FusedMatmul::FusedMatmul(FusedMatmul&&) noexcept = default;
FusedMatmul& FusedMatmul::operator=(FusedMatmul&&) noexcept = default;
FusedMatmul::~FusedMatmul() = default;

FusedMatmul FusedMatmul::create(Communicator& comm) {
  constexpr const char* kFunction = "FusedMatmul::create";
  if (std::string(comm.backend()) != "cuda") {
    raise(ErrorCode::kUnsupported, "{}: the communicator runs on the {} backend; fused GEMMs need the CUDA backend "
          "(symmetric memory)", kFunction, comm.backend());
  }
  return FusedMatmul(std::make_unique<detail::FusedMatmulState>(Communicator(comm.state_), comm.cuda_context(kFunction)));
}

void FusedMatmul::reserve(size_t bytes) {
  detail::FusedMatmulState& state = usable(state_, "FusedMatmul::reserve");
  if (bytes <= state.workspace_bytes()) return;
  DeviceGuard guard(state.device);
  state.regrow(state.workspace, state.workspace_captured, bytes);
}

size_t FusedMatmul::workspace_bytes() const { return usable(state_, "FusedMatmul::workspace_bytes").workspace_bytes(); }

unsigned long long FusedMatmul::epilogue_reduce_scatters() const {
  return usable(state_, "FusedMatmul::epilogue_reduce_scatters").epilogue_calls;
}

unsigned long long FusedMatmul::all_gathers_under_loads() const {
  return usable(state_, "FusedMatmul::all_gathers_under_loads").loads_calls;
}

void FusedMatmul::all_gather_matmul(const void* a_shard, size_t rows, size_t k, const void* b, Layout b_layout,
                                    size_t n, void* out, void* a_gathered, DataType type, Stream stream) {
  constexpr const char* kFunction = "FusedMatmul::all_gather_matmul";
  detail::FusedMatmulState& state = enter(state_, kFunction, stream);
  check_type(kFunction, type);
  check_layout(kFunction, b_layout);
  const size_t element = datatype_size(type);
  const int world = state.size, rank = state.rank;
  const size_t m = checked_product(kFunction, "rows", rows, static_cast<size_t>(world));
  const size_t shard_bytes = checked_product(kFunction, "k", checked_product(kFunction, "rows", rows, k), element);
  const size_t gathered_bytes = checked_product(kFunction, "k", checked_product(kFunction, "k", m, k), element);
  const size_t b_bytes = checked_product(kFunction, "n", checked_product(kFunction, "k", k, n), element);
  const size_t row_bytes = checked_product(kFunction, "n", n, element);
  const size_t out_bytes = checked_product(kFunction, "n", m, row_bytes);
  check_matrix(kFunction, "a_shard", a_shard, shard_bytes, state.device);
  check_matrix(kFunction, "b", b, b_bytes, state.device);
  check_matrix(kFunction, "out", out, out_bytes, state.device);
  if (a_gathered != nullptr) check_matrix(kFunction, "a_gathered", a_gathered, gathered_bytes, state.device);
  check_disjoint(kFunction, {{"out", out, out_bytes}, {"a_gathered", a_gathered, a_gathered ? gathered_bytes : 0}},
                 {{"a_shard", a_shard, shard_bytes}, {"b", b, b_bytes}});
  if (out_bytes == 0) return;

  DeviceGuard guard(state.device);
  if (k == 0) return state.zeros(kFunction, out, out_bytes, stream);  // nothing to gather
  {
    kernels::Sm90Matmul matmul{type, m, k, n, a_shard, b, nullptr, out};
    matmul.exchange.kind = kernels::Sm90ExchangeKind::kAllGather;
    matmul.exchange.gathered = a_gathered;
    if (state.run_exchanged(kFunction, matmul, b_layout, rows, stream)) return;  // NOTE [one-launch choice]
  }
  state.begin(kFunction, gathered_bytes, stream);
  cudaStream_t side = state.side;
  auto multiply = [&](const void* a, size_t first_row, size_t row_count, int multiprocessors) {
    Gemm gemm{type, row_count, k, n, b_layout, a, b, nullptr, at(out, first_row * row_bytes)};
    gemm.multiprocessors = multiprocessors;
    state.gemm.run(gemm, stream);
  };
  // The caller's stream: this rank's rows first, enqueued before the side stream's work so that the host's time
  // spent enqueuing the meetings and copies runs under it.
  multiply(a_shard, rank * rows, rows, state.overlapped_gemm_multiprocessors);
  // Side: this rank's rows into every peer's workspace, between two meetings.
  state.meet();
  for (int i = 1; i < world; ++i) {
    const int peer = (rank + i) % world;
    BRAID_CUDA(cudaMemcpyAsync(state.peer(peer, rank * shard_bytes), a_shard, shard_bytes, cudaMemcpyDeviceToDevice, side));
  }
  state.meet();
  // Then the rows before and after this rank's once they are here (on a shared GPU all of it after the meetings:
  // NOTE [fused matmul on a shared GPU]).
  state.follow(stream, side);
  if (a_gathered != nullptr) {  // side: the gathered A out of the workspace, beside the GEMMs that read it
    BRAID_CUDA(cudaMemcpyAsync(a_gathered, state.local(0), rank * shard_bytes, cudaMemcpyDeviceToDevice, side));
    BRAID_CUDA(cudaMemcpyAsync(at(a_gathered, rank * shard_bytes), a_shard, shard_bytes, cudaMemcpyDeviceToDevice, side));
    const size_t after = (rank + 1) * shard_bytes;
    BRAID_CUDA(cudaMemcpyAsync(at(a_gathered, after), state.local(after), gathered_bytes - after,
                               cudaMemcpyDeviceToDevice, side));
  }
  multiply(state.local(0), 0, rank * rows, 0);
  multiply(state.local((rank + 1) * shard_bytes), (rank + 1) * rows, (world - rank - 1) * rows, 0);
  state.follow(stream, side);
  state.end(stream);
}

// NOTE [fused matmul + reduce-scatter schedule]
// The workspace holds R, world blocks of rows x n (block q: what rank q sent this rank), then P, world blocks of
// this rank's partial products (block p: rows p x n of a x B, for rank p; block `rank` holds, beyond 2 ranks, the
// sum of the received blocks). Every block is cut into the same chunks of rows. For each chunk, the caller's stream
// multiplies the peers' rows (peer rank + 1 first, as the copies of all ranks then spread over the peers), and the
// side stream copies each product into its owner's R as soon as it is done, then meets the peers. The own rows'
// GEMM of a chunk waits for that meeting and adds the received chunk (its sum beyond 2 ranks) as cuBLASLt's C.
void FusedMatmul::matmul_reduce_scatter(const void* a, size_t m, size_t k, const void* b, Layout b_layout, size_t n,
                                        void* out, DataType type, ReduceOp op, Stream stream) {
  constexpr const char* kFunction = "FusedMatmul::matmul_reduce_scatter";
  detail::FusedMatmulState& state = enter(state_, kFunction, stream);
  check_type(kFunction, type);
  check_layout(kFunction, b_layout);
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg) {
    raise_invalid_argument(kFunction, "op", "is {}; the fused reduce-scatter takes sum and avg",
                           static_cast<int>(op) >= 0 && static_cast<int>(op) < kReduceOpCount ? reduce_op_name(op)
                                                                                               : "not a ReduceOp");
  }
  const int world = state.size, rank = state.rank;
  if (m % static_cast<size_t>(world) != 0) {
    raise_invalid_argument(kFunction, "m", "is {}, which does not divide by the {} ranks", m, world);
  }
  const size_t element = datatype_size(type);
  const size_t rows = m / world;
  const size_t a_bytes = checked_product(kFunction, "k", checked_product(kFunction, "m", m, k), element);
  const size_t b_bytes = checked_product(kFunction, "n", checked_product(kFunction, "k", k, n), element);
  const size_t row_bytes = checked_product(kFunction, "n", n, element);
  const size_t block_bytes = checked_product(kFunction, "m", rows, row_bytes);
  const size_t out_bytes = block_bytes;
  const size_t a_row_bytes = k * element;
  check_matrix(kFunction, "a", a, a_bytes, state.device);
  check_matrix(kFunction, "b", b, b_bytes, state.device);
  check_matrix(kFunction, "out", out, out_bytes, state.device);
  check_disjoint(kFunction, {{"out", out, out_bytes}}, {{"a", a, a_bytes}, {"b", b, b_bytes}});
  if (out_bytes == 0) return;

  DeviceGuard guard(state.device);
  if (k == 0) return state.zeros(kFunction, out, out_bytes, stream);
  const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(world) : 1.0f;
  {
    kernels::Sm90Matmul matmul{type, m, k, n, a, b, nullptr, out, scale};
    matmul.exchange.kind = state.engines_wanted ? kernels::Sm90ExchangeKind::kEngineReduceScatter
                                                : kernels::Sm90ExchangeKind::kReduceScatter;
    if (state.run_exchanged(kFunction, matmul, b_layout, rows, stream)) return;  // NOTE [one-launch choice]
  }

  const size_t received = 0, partials = checked_product(kFunction, "m", static_cast<size_t>(world), block_bytes);
  state.begin(kFunction, checked_product(kFunction, "m", 2, partials), stream);
  cudaStream_t side = state.side;
  constexpr size_t kChunks = 2;
  const size_t chunks = std::min(kChunks, rows);
  auto chunk_rows = [&](size_t h) { return std::make_pair(h * rows / chunks, (h + 1) * rows / chunks); };

  std::vector<cudaEvent_t> ready(chunks);  // null where side is the caller's stream
  for (size_t h = 0; h < chunks; ++h) {
    const auto [first, last] = chunk_rows(h);
    for (int i = 1; i < world; ++i) {
      const int peer = (rank + i) % world;
      char* product = state.local(partials + peer * block_bytes + first * row_bytes);
      Gemm gemm{type, last - first, k, n, b_layout, at(a, (peer * rows + first) * a_row_bytes), b, nullptr, product};
      gemm.multiprocessors = state.overlapped_gemm_multiprocessors;
      state.gemm.run(gemm, stream);
      // The entry meeting (every peer's R is free) comes after the first GEMM is enqueued: that GEMM writes only
      // this rank's P, so the host's time spent on the meeting runs under it.
      if (h == 0 && i == 1) state.meet();
      state.follow(side, stream);
      BRAID_CUDA(cudaMemcpyAsync(state.peer(peer, received + rank * block_bytes + first * row_bytes), product,
                                 (last - first) * row_bytes, cudaMemcpyDeviceToDevice, side));
    }
    state.meet();
    if (world > 2) {
      std::vector<const void*> sources;
      for (int q = 0; q < world; ++q) {
        if (q != rank) sources.push_back(state.local(received + q * block_bytes + first * row_bytes));
      }
      kernels::launch_matrix_sum(type, state.local(partials + rank * block_bytes + first * row_bytes), sources.data(),
                                 static_cast<int>(sources.size()), (last - first) * n,
                                 state.shares_gpu ? detail::kSharedGpuSumBlocks : detail::kReservedMultiprocessors, side);
    }
    if (side != stream) ready[h] = state.record(side);
  }
  // The peers' sum: none on 1 rank, the one received block on 2, else the sum in P's own block.
  const size_t sum_offset = world == 2 ? received + ((rank + 1) % world) * block_bytes : partials + rank * block_bytes;
  auto peers_sum = [&](size_t first) -> const void* {
    return world == 1 ? nullptr : state.local(sum_offset + first * row_bytes);
  };
  for (size_t h = 0; h < chunks; ++h) {
    const auto [first, last] = chunk_rows(h);
    if (ready[h] != nullptr) BRAID_CUDA(cudaStreamWaitEvent(stream, ready[h], 0));
    Gemm gemm{type, last - first, k, n, b_layout, at(a, (rank * rows + first) * a_row_bytes), b, peers_sum(first),
              at(out, first * row_bytes), scale, scale};
    gemm.multiprocessors = h + 1 < chunks ? state.overlapped_gemm_multiprocessors : 0;  // the last has nothing beside
    state.gemm.run(gemm, stream);
  }
  state.end(stream);
}

}  // namespace braid
