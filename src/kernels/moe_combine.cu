// MoE combine, expert-major layout, two launches (docs/dev/moe.md, "Expert-major combine"):
//   1. send: per received token, one float32 partial of its rows here, into the source's combine area (a token
//      crosses NVLink once per rank), between an entry and an exit barrier.
//   2. reduce (local): out[t] = float32 sum of the partials of the ranks token t went to (zeros for none).
#include "kernels/dependent_launch.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/pipeline.cuh"
#include "core/kernel_modules.hpp"
#include "kernels/moe_kernels.hpp"
#include "kernels/moe_layout.cuh"
#include "sync/device_sync.hpp"

namespace braid::kernels::moe {
namespace {

using kernels::acc_t;
using kernels::from_acc;
using kernels::to_acc;

// N elements of a row: a 16-byte vector when every row is 16-byte aligned, else N = 1.
template <typename T, int N>
struct Lanes {
  acc_t<T> value[N];
};

template <typename T, int N>
__device__ __forceinline__ void load_lanes(const T* source, Lanes<T, N>& lanes) {
  if constexpr (N == 1) {
    lanes.value[0] = to_acc(*source);
  } else {
    const kernels::Vector<T> vector = kernels::load_vector<T>(source);
#pragma unroll
    for (int i = 0; i < N; ++i) lanes.value[i] = to_acc(vector.value[i]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_lanes(T* destination, const Lanes<T, N>& lanes) {
  if constexpr (N == 1) {
    *destination = from_acc<T>(lanes.value[0]);
  } else {
    kernels::Vector<T> vector;
#pragma unroll
    for (int i = 0; i < N; ++i) vector.value[i] = from_acc<T>(lanes.value[i]);
    kernels::store_vector<T>(destination, vector);
  }
}

// Rows whose loads are in flight together.
constexpr int kRowBatch = 4;

// One thread in this many prefetches a 128-byte line of the group's next stretch.
template <typename T, int N>
constexpr unsigned int kLanesPerLine =
    N * sizeof(T) < kernels::kPrefetchLineBytes ? kernels::kPrefetchLineBytes / (N * sizeof(T)) : 1;

// sum += weight(q) * source(q)[0, N) for q in [0, n).
template <typename T, int N, typename Source, typename Weight>
__device__ __forceinline__ void accumulate_rows(int n, Source source, Weight weight, Lanes<T, N>& sum) {
  for (int q0 = 0; q0 < n; q0 += kRowBatch) {
    Lanes<T, N> term[kRowBatch];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (q0 + u < n) load_lanes<T, N>(source(q0 + u), term[u]);
    }
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      if (q0 + u < n) {
        const acc_t<T> w = weight(q0 + u);
#pragma unroll
        for (int i = 0; i < N; ++i) sum.value[i] += w * term[u].value[i];
      }
    }
  }
}

// Sources are taken in turn, so HBM loads and NVLink stores overlap. A group takes a piece by its index, then
// claims more from a counter, the next claim in flight while it sums: fixed shares of 1 to K rows are uneven.
template <typename T, int N>
__device__ void send_partials(const MoeLaunch& launch, int blocks, int pieces) {
  const int K = launch.top_k, me = launch.rank, W = launch.world;
  int64_t longest = 0;
  for (int s = 0; s < W; ++s) longest = max(longest, launch.received_tokens[s]);
  const size_t H = launch.hidden;
  const int32_t* records = at_offset<int32_t>(launch.peers[me], launch.layout.records);
  const T* y = reinterpret_cast<const T*>(launch.y);
  // A named barrier per group (ids 1 to 4); only WarpGroup's sync() and lane() are used.
  static_assert(kMoeThreads / kCombineGroup <= 4, "a named barrier per group: ids 1 to 4");
  const int group_id = static_cast<int>(threadIdx.x / kCombineGroup);
  const kernels::WarpGroup group{group_id, 1 + group_id, group_id * kCombineGroup, kCombineGroup};
  const unsigned int lane = static_cast<unsigned int>(group.lane());
  const unsigned long long items = static_cast<unsigned long long>(longest) * W * pieces;
  constexpr size_t kStep = size_t(kCombineGroup) * N;
  __shared__ unsigned long long claimed[kMoeThreads / kCombineGroup][2];  // this claim and the next
  const unsigned long long groups = static_cast<unsigned long long>(blocks) * (kMoeThreads / kCombineGroup);
  int parity = 0;
  for (unsigned long long flat = blockIdx.x * (kMoeThreads / kCombineGroup) + group_id; flat < items;
       flat = claimed[group_id][parity]) {
    // That slot was last read before the previous group.sync(): free to overwrite.
    if (lane == 0) claimed[group_id][parity ^ 1] = groups + atomicAdd(launch.combine_claims, 1ull);
    const Span piece = piece_of<N>(H, static_cast<int>(flat % pieces), pieces);
    const int s = (me + 1 + static_cast<int>(flat / pieces % W)) % W;
    const int64_t i = flat / pieces / W;
    parity ^= 1;
    if (i >= launch.received_tokens[s]) {
      group.sync();  // the next claim is written
      continue;
    }
    const int32_t* record = records + (s * static_cast<int64_t>(launch.max_tokens) + i) * record_words(K);
    const int64_t t = record[0];
    const int n = min(max(record[1], 0), K);
    const int32_t* rows = record + 2;
    const float* weights = reinterpret_cast<const float*>(record + 2 + K);
    T* partial = at_offset<T>(launch.peers[s], launch.layout.combine) + (me * launch.max_tokens + t) * H;
    for (size_t h = piece.begin + lane * N; h < piece.end; h += kStep) {
      // The next stretch into L2 while this one is summed: the loads bound the send. Further ahead was slower.
      if (lane % kLanesPerLine<T, N> == 0 && h + kStep < piece.end) {
        for (int q = 0; q < n; ++q) kernels::prefetch_l2(y + size_t(rows[q]) * H + h + kStep);
      }
      Lanes<T, N> sum{};
      accumulate_rows<T, N>(
          n, [&](int q) { return y + size_t(rows[q]) * H + h; },
          [&](int q) { return launch.weighted ? static_cast<acc_t<T>>(weights[q]) : acc_t<T>(1); }, sum);
      store_lanes<T, N>(partial + h, sum);
    }
    group.sync();  // the next claim is written
  }
}

template <typename T>
__global__ void __launch_bounds__(kMoeThreads, kMoeBlocksPerSm) moe_combine_send(MoeLaunch launch) {
  kernels::start_dependent_kernel();  // the dispatch, or the user's kernel
  if (device::rank_stopped(launch.pad)) return;  // NOTE [stopped ranks]: nothing written, nothing posted
  const int blocks = launch.combine_plan[0], pieces = launch.combine_plan[1];  // blocks past these: no work
  if (static_cast<int>(blockIdx.x) >= blocks) return;
  // The entry barrier (every peer's combine area is free) is implied after a dispatch, whose counts this rank
  // waited for: a peer enters it only after its last combine.
  const bool after_dispatch = launch.combine_plan[2] != 0;
  if (!after_dispatch && !device::barrier(launch.pad, blockIdx.x, launch.combine_id, kSiteEntryBarrier)) return;
  constexpr int kVector = kernels::Vector<T>::kCount;
  if ((launch.hidden * sizeof(T)) % kernels::kVectorBytes == 0 && reinterpret_cast<uintptr_t>(launch.y) % kernels::kVectorBytes == 0) {
    send_partials<T, kVector>(launch, blocks, pieces);
  } else {
    send_partials<T, 1>(launch, blocks, pieces);
  }
  device::barrier(launch.pad, blockIdx.x, launch.combine_id, kSiteExitBarrier);
}

template <typename T, int N>
__device__ void reduce_partials(const MoeLaunch& launch) {
  const size_t H = launch.hidden, tokens = static_cast<size_t>(*launch.tokens);
  const uint32_t delivered = *launch.delivered_ranks;
  const T* partials = at_offset<T>(launch.peers[launch.rank], launch.layout.combine);
  T* out = reinterpret_cast<T*>(launch.out);
  const unsigned int lane = threadIdx.x % kCombineGroup, per_block = blockDim.x / kCombineGroup;
  const size_t groups = size_t(gridDim.x) * per_block;
  int pieces = 1;  // as in send
  while (pieces < kCombineSlices && tokens * pieces * 2 <= groups) pieces *= 2;
  for (size_t flat = size_t(blockIdx.x) * per_block + threadIdx.x / kCombineGroup; flat < tokens * pieces; flat += groups) {
    const size_t t = flat / pieces;
    const Span piece = piece_of<N>(H, static_cast<int>(flat % pieces), pieces);
    const uint32_t ranks = launch.token_ranks[t] & delivered;
    const T* parts[kMaxWorld];
    int n = 0;
    for (int r = 0; r < launch.world; ++r) {
      if ((ranks >> r) & 1u) parts[n++] = partials + (r * launch.max_tokens + t) * H;
    }
    constexpr size_t kStep = size_t(kCombineGroup) * N;
    for (size_t h = piece.begin + lane * N; h < piece.end; h += kStep) {
      if (lane % kLanesPerLine<T, N> == 0 && h + kStep < piece.end) {  // as in send
        for (int q = 0; q < n; ++q) kernels::prefetch_l2(parts[q] + h + kStep);
      }
      Lanes<T, N> sum{};
      accumulate_rows<T, N>(n, [&](int q) { return parts[q] + h; }, [](int) { return acc_t<T>(1); }, sum);
      store_lanes<T, N>(out + t * H + h, sum);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kMoeThreads) moe_combine_reduce(MoeLaunch launch) {
  constexpr int kVector = kernels::Vector<T>::kCount;
  kernels::start_dependent_kernel();  // send
  if (blockIdx.x == 0 && threadIdx.x == 0) {  // send is over: every plan read and claim made
    launch.combine_plan[2] = 0;
    *launch.combine_claims = 0;
  }
  if ((launch.hidden * sizeof(T)) % kernels::kVectorBytes == 0) {
    reduce_partials<T, kVector>(launch);  // store_lanes tolerates an unaligned out
  } else {
    reduce_partials<T, 1>(launch);
  }
}

}  // namespace

void launch_combine(const MoeLaunch& launch, DataType type, cudaStream_t stream) {
  kernels::dispatch_type(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half> || std::is_same_v<T, float>) {
      kernels::launch_dependent(moe_combine_send<T>, launch.blocks, kMoeThreads, stream, launch);
      // Within the buffer's blocks (MoeShape::max_sms) too.
      kernels::launch_dependent(moe_combine_reduce<T>, std::min(kReduceBlocks, launch.blocks), kMoeThreads, stream, launch);
    } else {
      raise(ErrorCode::kInternal, "MoE combine reached with datatype {}", datatype_name(type));
    }
  });
}

}  // namespace braid::kernels::moe

BRAID_KERNEL_MODULE()
