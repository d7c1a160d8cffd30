#include "cuda_objects.hpp"
#include "moe.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "braid/braid.hpp"  // with braid/moe.hpp
#include "moe_kernels.hpp"
#include "report.hpp"

namespace braid::bench {
namespace {



constexpr unsigned char kRowPoison = 0xA5;   // dispatched rows and metadata before a checked dispatch
constexpr unsigned char kOutPoison = 0xFF;   // combine outputs before a checked combine (NaN in every float type)
constexpr size_t kSampledRows = 256;         // rows whose data is checked per rank and path
constexpr size_t kSampledTokens = 128;       // tokens whose combined row is checked per rank and path

// ---- Owners of device and pinned memory (streams, events and graphs: cuda_objects.hpp) ----

class DeviceMemory {  // cudaMalloc'd
 public:
  explicit DeviceMemory(size_t bytes) : bytes_(std::max<size_t>(bytes, 256)) {
    cuda(cudaMalloc(&data_, bytes_), "cudaMalloc");
  }
  ~DeviceMemory() {
    // Unwinding from a failure: cudaFree would wait for kernels that may spin on a dead peer.
    if (std::uncaught_exceptions() == 0) cudaFree(data_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedMemory {
 public:
  explicit PinnedMemory(size_t bytes) { cuda(cudaMallocHost(&data_, std::max<size_t>(bytes, 8)), "cudaMallocHost"); }
  ~PinnedMemory() {
    if (std::uncaught_exceptions() == 0) cudaFreeHost(data_);
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  template <typename T>
  T* get() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
};





// ---- The workload ----

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Routing {  // one rank's: [T, K]
  std::vector<int64_t> ids;
  std::vector<float> weights;
};

// K distinct experts per token, uniform over E; weights in (0, 1]. Every rank can make every rank's.
Routing make_routing(uint64_t seed, int rank, size_t tokens, int top_k, int experts) {
  Routing r;
  r.ids.resize(tokens * top_k);
  r.weights.resize(tokens * top_k);
  uint64_t state = mix(seed ^ mix(0xE0E0ull + static_cast<uint64_t>(rank)));
  auto next = [&] { return mix(state += kGolden); };
  for (size_t t = 0; t < tokens; ++t) {
    int64_t* ids = r.ids.data() + t * top_k;
    for (int k = 0; k < top_k; ++k) {
      int64_t e = 0;
      do {
        e = static_cast<int64_t>(next() % static_cast<uint64_t>(experts));
      } while (std::find(ids, ids + k, e) != ids + k);
      ids[k] = e;
      r.weights[t * top_k + k] = static_cast<float>(1 + next() % 1024) / 1024.0f;
    }
  }
  return r;
}

// The bits of value k / 128 in the row type, and a row element's value.
uint32_t value_bits(DataType type, int k) {
  const float value = static_cast<float>(k) / 128.0f;
  uint32_t bits = 0;
  switch (type) {
    case DataType::kFloat32: std::memcpy(&bits, &value, 4); return bits;
    case DataType::kBFloat16: std::memcpy(&bits, &value, 4); return bits >> 16;  // exact: 7 significant bits at most
    case DataType::kFloat16: {
      const __half h = __float2half_rn(value);
      uint16_t b = 0;
      std::memcpy(&b, &h, 2);
      return b;
    }
    default: throw std::logic_error("--moe: rows are bfloat16, float16 or float32");
  }
}

double decode(DataType type, const unsigned char* p) {
  switch (type) {
    case DataType::kFloat32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DataType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      const uint32_t u = static_cast<uint32_t>(b) << 16;
      float v;
      std::memcpy(&v, &u, 4);
      return v;
    }
    case DataType::kFloat16: {
      __half h;
      std::memcpy(&h, p, 2);
      return static_cast<double>(__half2float(h));
    }
    default: throw std::logic_error("--moe: rows are bfloat16, float16 or float32");
  }
}

uint32_t load_bits(DataType type, const unsigned char* p) {
  if (datatype_size(type) == 1) return *p;
  if (datatype_size(type) == 4) {
    uint32_t b;
    std::memcpy(&b, p, 4);
    return b;
  }
  uint16_t b;
  std::memcpy(&b, p, 2);
  return b;
}

double tolerance_unit(DataType type) {
  return type == DataType::kBFloat16 ? 0x1p-7 : type == DataType::kFloat16 ? 0x1p-10 : 0x1p-20;
}

// Indices of `samples` elements spread evenly over [0, n) (all of them when n <= samples), the last one included.
std::vector<size_t> spread(size_t n, size_t samples) {
  std::vector<size_t> picks;
  if (n == 0) return picks;
  if (n <= samples) {
    for (size_t i = 0; i < n; ++i) picks.push_back(i);
    return picks;
  }
  for (size_t i = 0; i < samples; ++i) picks.push_back(i * (n - 1) / (samples - 1));
  return picks;
}

// One phase of one implementation on this rank, shared with every rank at the end of a row.
struct Slot {
  double time_us = 0;
  uint64_t wrong = 0;
  int32_t state = 0;  // 0: not run, 1: run unchecked, 2: run and checked
};
// What one call of each phase moves, one way, per rank: over NVLink (the most any rank sends or receives) and
// logically (T * K rows); a dispatched row may be fp8 with scales, a combined one is -d's type.
struct Bytes {
  double dispatch_nvlink = 0, combine_nvlink = 0, dispatch_logical = 0, combine_logical = 0;
};
// "layer" is a dispatch followed by a combine, as an MoE layer calls them (with no expert computation between).
// braid's slots per layout (dispatch, combine, layer): expert-major, rank-major, low-latency (first_slot).
enum SlotIndex {
  kBraidDispatch, kBraidCombine, kBraidLayer,
  kRankDispatch, kRankCombine, kRankLayer,
  kLowLatencyDispatch, kLowLatencyCombine, kLowLatencyLayer,
  kNcclDispatch, kNcclCombine, kNcclLayer,
  kSlots
};
// A layout's first slot: the layouts' slots follow each other in the enum's order.
static_assert(kRankDispatch == kBraidDispatch + 3 && kLowLatencyDispatch == kBraidDispatch + 6);
int first_slot(MoeBenchLayout layout) { return kBraidDispatch + 3 * static_cast<int>(layout); }

// ---- The NCCL baseline on one rank ----

// With fp8 dispatch (`fp8` set) each row travels with its scales, packed after it as one alltoallv of bytes
// (packed_bytes a row), and the rows come back as `type` from an expert stand-in that dequantises them (expert(),
// outside the timed calls).
class NcclMoe {
 public:
  NcclMoe(NcclComm& nccl, int world, DataType type, std::optional<DataType> fp8, size_t hidden, size_t tokens, int top_k,
          int experts)
      : nccl_(nccl),
        world_(world),
        type_(type),
        fp8_(fp8),
        hidden_(hidden),
        tokens_(tokens),
        top_k_(top_k),
        experts_(experts),
        row_bytes_(hidden * datatype_size(type)),
        scale_bytes_(fp8 ? hidden / kMoeScaleColumns * sizeof(float) : 0),
        packed_bytes_(fp8 ? hidden + scale_bytes_ : row_bytes_),
        send_rows_(tokens * static_cast<size_t>(std::min(world, top_k))),
        lists_(static_cast<size_t>(world) * tokens * sizeof(int32_t)),
        slots_(tokens * world * sizeof(int32_t)),
        weight_sums_(tokens * world * sizeof(float)),
        counts_(2 * static_cast<size_t>(world) * sizeof(int64_t)),
        host_counts_(2 * static_cast<size_t>(world) * sizeof(int64_t)),
        send_(send_rows_ * packed_bytes_),
        recv_(static_cast<size_t>(world) * tokens * packed_bytes_),
        y_(fp8 ? static_cast<size_t>(world) * tokens * row_bytes_ : 0),
        back_(send_rows_ * row_bytes_),
        send_counts_(world), send_displs_(world), recv_counts_(world), recv_displs_(world),
        back_send_counts_(world), back_send_displs_(world), back_recv_counts_(world), back_recv_displs_(world) {}

  void dispatch(const void* x, const float* scales, const int64_t* ids, const float* weights, cudaStream_t stream) {
    int64_t* counts = counts_.get<int64_t>();
    cuda(moe::route_tokens(ids, weights, tokens_, top_k_, experts_, world_, lists_.get<int32_t>(), slots_.get<int32_t>(),
                           weight_sums_.get<float>(), counts, stream),
         "route_tokens");
    nccl_.all_to_all(counts, counts + world_, 1, DataType::kInt64, stream);
    cuda(cudaMemcpyAsync(host_counts_.get<int64_t>(), counts, 2 * world_ * sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
         "cudaMemcpyAsync (counts to the host)");
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (counts)");
    const int64_t* host = host_counts_.get<int64_t>();
    // Counts in elements: of `type` rows, or (fp8) bytes of packed rows; combine's in rows of `type`.
    const size_t dispatch_elements = fp8_ ? packed_bytes_ : hidden_;
    counts_of(host, dispatch_elements, send_counts_, send_displs_, recv_counts_, recv_displs_);
    counts_of(host, hidden_, back_send_counts_, back_send_displs_, back_recv_counts_, back_recv_displs_);
    if (fp8_) {
      cuda(moe::gather_rows(*fp8_, x, hidden_, tokens_, world_, lists_.get<int32_t>(), counts, send_.get(), stream, scales,
                            scale_bytes_),
           "gather_rows");
    } else {
      cuda(moe::gather_rows(type_, x, hidden_, tokens_, world_, lists_.get<int32_t>(), counts, send_.get(), stream),
           "gather_rows");
    }
    nccl_.all_to_allv(send_.get(), send_counts_.data(), send_displs_.data(), recv_.get(), recv_counts_.data(),
                      recv_displs_.data(), fp8_ ? DataType::kUint8 : type_, stream);
  }

  // fp8: the experts' stand-in, y = the received rows dequantised (without fp8 y is the received rows).
  void expert(cudaStream_t stream) {
    if (!fp8_) return;
    size_t rows = 0;
    for (int q = 0; q < world_; ++q) rows += static_cast<size_t>(received_rows(q));
    const unsigned char* recv = recv_.get<unsigned char>();
    cuda(moe::dequantize_rows(*fp8_, recv, packed_bytes_, recv + hidden_, packed_bytes_, hidden_, rows, type_, y_.get(), stream),
         "dequantize_rows");
  }

  // The experts' rows go back (the expert output stand-in: y = x, dequantised after fp8), then the weighted sum
  // per token.
  void combine(void* out, cudaStream_t stream) {
    const void* y = fp8_ ? y_.get() : recv_.get();
    nccl_.all_to_allv(y, back_recv_counts_.data(), back_recv_displs_.data(), back_.get(), back_send_counts_.data(),
                      back_send_displs_.data(), type_, stream);
    cuda(moe::weighted_sum(type_, back_.get(), hidden_, tokens_, world_, slots_.get<int32_t>(), weight_sums_.get<float>(),
                           counts_.get<int64_t>(), out, stream),
         "weighted_sum");
  }

  // After dispatch (host-side figures of the last one): rows received from each rank.
  int64_t received_rows(int source) const { return host_counts_.get<int64_t>()[world_ + source]; }
  size_t packed_bytes() const { return packed_bytes_; }  // a received row's bytes, its scales included
  const DeviceMemory& recv() const { return recv_; }
  const DeviceMemory& back() const { return back_; }

 private:
  // From the routing counts (host: [world] sent, then [world] received, in rows): counts and displacements in
  // elements, `per_row` a row.
  void counts_of(const int64_t* host, size_t per_row, std::vector<size_t>& send_counts, std::vector<size_t>& send_displs,
                 std::vector<size_t>& recv_counts, std::vector<size_t>& recv_displs) const {
    size_t send_at = 0, recv_at = 0;
    for (int q = 0; q < world_; ++q) {
      send_counts[q] = static_cast<size_t>(host[q]) * per_row;
      recv_counts[q] = static_cast<size_t>(host[world_ + q]) * per_row;
      send_displs[q] = send_at;
      recv_displs[q] = recv_at;
      send_at += send_counts[q];
      recv_at += recv_counts[q];
    }
  }

  NcclComm& nccl_;
  int world_;
  DataType type_;
  std::optional<DataType> fp8_;
  size_t hidden_, tokens_;
  int top_k_, experts_;
  size_t row_bytes_, scale_bytes_, packed_bytes_, send_rows_;
  DeviceMemory lists_, slots_, weight_sums_, counts_;
  PinnedMemory host_counts_;
  DeviceMemory send_, recv_, y_, back_;
  std::vector<size_t> send_counts_, send_displs_, recv_counts_, recv_displs_;  // dispatch, elements
  std::vector<size_t> back_send_counts_, back_send_displs_, back_recv_counts_, back_recv_displs_;  // combine
};

// ---- The benchmark on one rank ----

class MoeBench {
 public:
  MoeBench(Communicator& comm, const Options& options, const std::shared_ptr<NcclLibrary>& nccl)
      : comm_(comm), options_(options), rank_(comm.rank()), ranks_(comm.size()), library_(nccl) {}

  uint64_t run() {
    validate();
    cuda(cudaSetDevice(comm_.device()), "cudaSetDevice");
    stream_ = std::make_unique<StreamHandle>();
    share_seed();
    if (library_) {
      if (!library_->has_send_recv()) {
        throw std::runtime_error("--compare nccl: " + library_->path() + " has no ncclSend/ncclRecv (NCCL 2.7+): the "
                                 "MoE baseline needs them");
      }
      nccl_ = std::make_unique<NcclComm>(library_, comm_);
    }
    header();
    for (int cycle = 0; options_.run_cycles == 0 || cycle < options_.run_cycles; ++cycle) {  // -N
      for (size_t tokens : options_.moe_tokens) run_tokens(tokens);
    }
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    comm_.barrier();
    if (rank_ == 0) {  // nccl-tests' closing line (#wrong summed over every row, braid's and NCCL's)
      std::printf("# Out of bounds values : %llu %s\n#\n", static_cast<unsigned long long>(wrong_total_),
                  wrong_total_ == 0 ? "OK" : "FAILED");
    }
    if (rank_ == 0 && !options_.json_path.empty()) write_json();
    return wrong_total_;
  }

 private:
  cudaStream_t stream() const { return stream_->get(); }
  int local_experts() const { return options_.moe_experts / ranks_; }
  // Of combine's rows (-d's type), and of what dispatch moves: its rows (-d's type, or fp8) and their scales.
  size_t row_bytes() const { return options_.moe_hidden * datatype_size(options_.type); }
  const std::optional<DataType>& fp8() const { return options_.moe_dispatch_type; }
  DataType dispatch_type() const { return fp8().value_or(options_.type); }
  size_t dispatch_row_bytes() const { return options_.moe_hidden * datatype_size(dispatch_type()); }
  size_t scale_count() const { return fp8() ? options_.moe_hidden / kMoeScaleColumns : 0; }
  size_t scale_bytes() const { return scale_count() * sizeof(float); }
  size_t dispatch_token_bytes() const { return dispatch_row_bytes() + scale_bytes(); }

  void validate() const {
    if (options_.moe_experts % ranks_ != 0) {
      throw std::invalid_argument("--experts " + std::to_string(options_.moe_experts) + " is not a multiple of the " +
                                  std::to_string(ranks_) + " ranks");
    }
    if (ranks_ > 64) throw std::invalid_argument("--moe runs on at most 64 ranks");
  }

  void share_seed() {
    uint64_t mine = options_.moe_seed;
    if (rank_ == 0 && mine == 0) {
      std::random_device entropy;
      mine = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
    }
    std::vector<std::string> seeds = comm_.host_allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)));
    std::memcpy(&seed_, seeds[0].data(), sizeof(seed_));
  }

  void header() {
    cudaDeviceProp properties{};
    cuda(cudaGetDeviceProperties(&properties, comm_.device()), "cudaGetDeviceProperties");
    const std::string gpu = "GPU " + std::to_string(comm_.device()) + " " + properties.name + " (" +
                            comm_.peer(rank_).pci_bus_id + ")";
    gpus_ = comm_.host_allgather(gpu);
    if (rank_ != 0) return;
    std::string layouts;
    for (MoeBenchLayout layout : options_.moe_layouts) layouts += (layouts.empty() ? "" : ",") + std::string(layout_name(layout));
    std::printf("# braid-bench --moe: ranks=%d type=%s dispatch=%s H=%zu K=%d E=%d (%d per rank) alignment=%d max_sms=%d ids=int64 "
                "layouts=%s graph=%d nccl=%s\n",
                ranks_, datatype_name(options_.type), fp8() ? (std::string(datatype_name(*fp8())) + "+scales").c_str() : "type",
                options_.moe_hidden, options_.moe_top_k, options_.moe_experts,
                local_experts(), options_.moe_alignment, options_.moe_max_sms, layouts.c_str(), options_.graph_calls,
                library_ ? library_->version().c_str() : "off");
    if (const char* commit = std::getenv("BRAID_COMMIT")) std::printf("# commit %s\n", commit);
    if (library_) std::printf("# nccl library %s\n", library_->path().c_str());
    for (size_t r = 0; r < gpus_.size(); ++r) std::printf("#   rank %zu: %s\n", r, gpus_[r].c_str());
    std::printf("# routing: K distinct experts per token, uniform, weights in (0, 1], from the shared seed %llu (--seed); "
                "braid: MoeBuffer::dispatch, then\n# expert-major: MoeBuffer::combine(y = the dispatched rows, weighted); "
                "rank-major: combine(y = combine_input, holding each token's rows\n# times its weights here); nccl: routing "
                "kernel, ncclAlltoAll of the counts, counts to the host\n# (stream synchronise), gather kernel, grouped "
                "ncclSend/ncclRecv alltoallv; combine: the reverse alltoallv, weighted-sum kernel\n# layer: a dispatch "
                "then a combine, as an MoE layer calls them (bytes: both ways); dispatch and combine: each alone, back to back\n",
                static_cast<unsigned long long>(seed_));
    std::printf("# %d warm-up calls; %d repetitions of %d calls per phase%s\n", options_.warmup_iters, options_.repeats,
                options_.iters,
                options_.graph_calls > 0 ? (" (braid's phases and nccl's combine as replays of a CUDA graph of " +
                                            std::to_string(options_.graph_calls) +
                                            " calls; nccl's dispatch syncs with the host: launched)")
                                               .c_str()
                                         : "");
    std::printf("# time = per call, max over ranks of each rank's median repetition; nvlink = max over ranks of\n"
                "# max(bytes sent to, received from other ranks) / time (a token crosses once per destination rank);\n"
                "# logical = T*K*(row bytes) / time, a dispatched row %zu B, a combined row %zu B; #wrong = entries and "
                "sampled elements outside the reference, summed over ranks%s\n",
                dispatch_token_bytes(), row_bytes(), options_.check ? "" : " (N/A: -c 0)");
    if (fp8()) {
      std::printf("# fp8 dispatch: rows of %s with a float32 scale per %zu columns (moved with the row; nccl: packed "
                  "after it, one alltoallv of bytes);\n# combine takes %s rows, the experts' stand-in dequantising the "
                  "dispatched rows (outside the timed calls)\n",
                  datatype_name(*fp8()), kMoeScaleColumns, datatype_name(options_.type));
    }
    std::printf("#\n# %6s  %-12s  %-8s  %9s  %8s  %7s  %7s  %6s", "tokens", "layout", "phase", "nvlink_MB", "time", "nvlink",
                "logical", "#wrong");
    if (library_) std::printf("  %8s  %8s  %9s  %7s  %6s", "nccl_us", "n_nvlink", "n_logical", "n_wrong", "ratio");
    std::printf("\n");
    std::printf("# %6s  %-12s  %-8s  %9s  %8s  %7s  %7s  %6s", "", "", "", "(max/rank)", "(us)", "(GB/s)", "(GB/s)", "");
    if (library_) std::printf("  %8s  %8s  %9s  %7s  %6s", "(us)", "(GB/s)", "(GB/s)", "", "b/n");
    std::printf("\n");
    std::fflush(stdout);
  }

  // ---- One T ----

  void run_tokens(size_t tokens) {
    const int K = options_.moe_top_k, E = options_.moe_experts, L = local_experts(), W = ranks_;
    const uint64_t seed = mix(seed_ + tokens);
    routings_.clear();
    for (int r = 0; r < W; ++r) routings_.push_back(make_routing(seed, r, tokens, K, E));
    // NVLink traffic: a token crosses once to each other rank holding one of its experts (combine: the reverse).
    std::vector<uint64_t> sent(W, 0), received(W, 0);
    for (int s = 0; s < W; ++s) {
      for (size_t t = 0; t < tokens; ++t) {
        uint64_t ranks = 0;
        for (int k = 0; k < K; ++k) ranks |= uint64_t(1) << (routings_[s].ids[t * K + k] / L);
        for (int d = 0; d < W; ++d) {
          if (d == s || (ranks >> d & 1) == 0) continue;
          ++sent[s];
          ++received[d];
        }
      }
    }
    uint64_t most_rows = 0;
    for (int r = 0; r < W; ++r) most_rows = std::max({most_rows, sent[r], received[r]});
    Bytes bytes;
    bytes.dispatch_nvlink = static_cast<double>(most_rows) * static_cast<double>(dispatch_token_bytes());
    bytes.combine_nvlink = static_cast<double>(most_rows) * static_cast<double>(row_bytes());
    bytes.dispatch_logical = static_cast<double>(tokens) * K * static_cast<double>(dispatch_token_bytes());
    bytes.combine_logical = static_cast<double>(tokens) * K * static_cast<double>(row_bytes());

    // Inputs.
    DeviceMemory x(tokens * dispatch_row_bytes()), scales(tokens * scale_bytes());
    DeviceMemory ids(tokens * K * sizeof(int64_t)), weights(tokens * K * sizeof(float));
    DeviceMemory out(tokens * row_bytes()), nccl_out(tokens * row_bytes());
    cuda(moe::fill_tokens(dispatch_type(), x.get(), tokens, options_.moe_hidden, seed, rank_, stream()), "fill_tokens");
    if (fp8()) cuda(moe::fill_scales(scales.get<float>(), tokens, options_.moe_hidden, seed, rank_, stream()), "fill_scales");
    cuda(cudaMemcpyAsync(ids.get(), routings_[rank_].ids.data(), tokens * K * sizeof(int64_t), cudaMemcpyHostToDevice,
                         stream()),
         "cudaMemcpyAsync (ids)");
    cuda(cudaMemcpyAsync(weights.get(), routings_[rank_].weights.data(), tokens * K * sizeof(float), cudaMemcpyHostToDevice,
                         stream()),
         "cudaMemcpyAsync (weights)");
    cuda(cudaMemsetAsync(out.get(), 0, out.bytes(), stream()), "cudaMemsetAsync");
    cuda(cudaMemsetAsync(nccl_out.get(), 0, nccl_out.bytes(), stream()), "cudaMemsetAsync");
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (inputs)");

    Slot slots[kSlots];
    for (MoeBenchLayout layout : options_.moe_layouts) run_braid(layout, tokens, x, scales, ids, weights, out, slots);
    if (nccl_) {
      NcclMoe baseline(*nccl_, W, options_.type, fp8(), options_.moe_hidden, tokens, K, E);
      const Call dispatch = [&](cudaStream_t s) {
        baseline.dispatch(x.get(), scales.get<float>(), ids.get<int64_t>(), weights.get<float>(), s);
      };
      const Call combine = [&](cudaStream_t s) { baseline.combine(nccl_out.get(), s); };
      if (options_.check) {
        cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
        comm_.barrier();
        cuda(cudaMemsetAsync(baseline.recv().get(), kRowPoison, baseline.recv().bytes(), stream()), "cudaMemsetAsync");
        cuda(cudaMemsetAsync(baseline.back().get(), kRowPoison, baseline.back().bytes(), stream()), "cudaMemsetAsync");
        cuda(cudaMemsetAsync(nccl_out.get(), kOutPoison, nccl_out.bytes(), stream()), "cudaMemsetAsync");
        dispatch(stream());
        cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
        slots[kNcclDispatch].wrong = check_nccl_dispatch(baseline, tokens);
        slots[kNcclDispatch].state = 2;
        baseline.expert(stream());
        combine(stream());
        cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
        slots[kNcclCombine].wrong = check_combined(nccl_out, tokens, "nccl combine");
        slots[kNcclCombine].state = 2;
      } else {
        dispatch(stream());  // combine needs the counts of a dispatch
        baseline.expert(stream());
      }
      slots[kNcclDispatch].time_us = time_calls(dispatch, false);
      slots[kNcclCombine].time_us = time_calls(combine, true);
      const Call layer = [&](cudaStream_t s) {
        dispatch(s);
        combine(s);
      };
      slots[kNcclLayer].time_us = time_calls(layer, false);
      slots[kNcclLayer].state = 1;
      for (int i : {kNcclDispatch, kNcclCombine}) slots[i].state = std::max(slots[i].state, 1);
      cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
      comm_.barrier();
    }
    finish_row(tokens, bytes, slots);
  }

  // braid's phases in one layout: a checked dispatch and combine, then each timed alone and as a layer.
  void run_braid(MoeBenchLayout layout, size_t tokens, DeviceMemory& x, DeviceMemory& scales, DeviceMemory& ids,
                 DeviceMemory& weights, DeviceMemory& out, Slot (&slots)[kSlots]) {
    const int K = options_.moe_top_k, W = ranks_;
    const bool rank = layout != MoeBenchLayout::kExpertMajor;
    const int first = first_slot(layout);
    Slot& dispatch_slot = slots[first];
    Slot& combine_slot = slots[first + 1];
    Slot& layer_slot = slots[first + 2];
    MoeShape shape;
    shape.hidden = options_.moe_hidden;
    shape.type = options_.type;
    shape.index_type = DataType::kInt64;
    shape.max_tokens = tokens;
    shape.top_k = K;
    shape.experts = options_.moe_experts;
    shape.expert_alignment = rank ? 1 : options_.moe_alignment;
    shape.dispatch_type = fp8();
    shape.layout = rank ? MoeLayout::kRankMajor : MoeLayout::kExpertMajor;
    shape.low_latency = layout == MoeBenchLayout::kLowLatency;
    shape.max_sms = options_.moe_max_sms;
    MoeBuffer buffer = MoeBuffer::create(comm_, shape);
    if (rank_ == 0) {
      std::printf("# T=%zu %s: MoeBuffer capacity_rows=%zu, symmetric_bytes=%.1f MiB per rank\n", tokens, layout_name(layout),
                  buffer.capacity_rows(), static_cast<double>(MoeBuffer::symmetric_bytes(shape, W)) / (1 << 20));
      std::fflush(stdout);
    }
    MoeDispatchOutput view;
    const Call dispatch = [&](cudaStream_t s) {
      view = fp8() ? buffer.dispatch(x.get(), scales.get<float>(), ids.get(), weights.get<float>(), tokens, nullptr, s)
                   : buffer.dispatch(x.get(), ids.get(), weights.get<float>(), tokens, nullptr, s);
    };
    dispatch(stream());  // the first call: warm, and the views to poison before the checked one
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    // The experts' output combine takes. Expert-major: the dispatched rows themselves (dequantised once after fp8
    // dispatch). Rank-major: in combine_input, each received row (dequantised) times the sum of its weights here,
    // so that combine's plain sum over ranks is the weighted sum. Made after the checked dispatch, kept for the
    // timed calls.
    std::unique_ptr<DeviceMemory> dequantised;
    if (fp8() && !rank) dequantised = std::make_unique<DeviceMemory>(buffer.capacity_rows() * row_bytes());
    auto expert = [&] {
      if (rank) {
        if (fp8()) {
          cuda(moe::dequantize_rows(*fp8(), view.x, dispatch_row_bytes(), view.scales, scale_bytes(), options_.moe_hidden,
                                    view.capacity_rows, options_.type, view.combine_input, stream()),
               "dequantize_rows");
        } else {
          cuda(cudaMemcpyAsync(view.combine_input, view.x, view.capacity_rows * row_bytes(), cudaMemcpyDeviceToDevice, stream()),
               "cudaMemcpyAsync (combine_input)");
        }
        cuda(moe::weigh_rows(options_.type, view.combine_input, options_.moe_hidden, view.capacity_rows, view.topk_weights, K,
                             stream()),
             "weigh_rows");
        return;
      }
      if (!fp8()) return;
      cuda(moe::dequantize_rows(*fp8(), view.x, dispatch_row_bytes(), view.scales, scale_bytes(), options_.moe_hidden,
                                view.capacity_rows, options_.type, dequantised->get(), stream()),
           "dequantize_rows");
    };
    const void* y = nullptr;
    auto y_of = [&] { return rank ? static_cast<const void*>(view.combine_input) : fp8() ? dequantised->get() : view.x; };
    if (options_.check) {
      dispatch_slot.wrong = rank ? check_rank_dispatch(dispatch, view, tokens, shape.low_latency)
                                 : check_braid_dispatch(dispatch, view, tokens);
      dispatch_slot.state = 2;
      expert();
      cuda(cudaMemsetAsync(out.get(), kOutPoison, out.bytes(), stream()), "cudaMemsetAsync");
      buffer.combine(y_of(), out.get(), !rank, stream());
      cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
      comm_.check();
      combine_slot.wrong = check_combined(out, tokens, rank ? "braid rank-major combine" : "braid combine");
      combine_slot.state = 2;
    } else {
      expert();
    }
    y = y_of();
    dispatch_slot.time_us = time_calls(dispatch, true);
    const Call combine = [&, y](cudaStream_t s) { buffer.combine(y, out.get(), !rank, s); };
    combine_slot.time_us = time_calls(combine, true);
    const Call layer = [&, y](cudaStream_t s) {
      dispatch(s);
      buffer.combine(y, out.get(), !rank, s);
    };
    layer_slot.time_us = time_calls(layer, true);
    layer_slot.state = 1;
    dispatch_slot.state = std::max(dispatch_slot.state, 1);
    combine_slot.state = std::max(combine_slot.state, 1);
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    comm_.barrier();  // no rank frees its MoeBuffer while a peer may still use it
  }

  // After the poisoning, with every rank idle: one dispatch, synchronised, and what check() raises thrown.
  void dispatch_once(const Call& dispatch) {
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    comm_.barrier();
    dispatch(stream());
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    comm_.check();
  }

  // With every rank idle (a barrier first), the dispatched rows and their scales poisoned on the stream.
  void poison_rows(const MoeDispatchOutput& view) {
    comm_.barrier();
    cuda(cudaMemsetAsync(view.x, kRowPoison, view.capacity_rows * dispatch_row_bytes(), stream()), "cudaMemsetAsync");
    if (view.scales != nullptr) {
      cuda(cudaMemsetAsync(const_cast<float*>(view.scales), kRowPoison, view.capacity_rows * scale_bytes(), stream()),
           "cudaMemsetAsync");
    }
  }

  // Rank-major: all views poisoned with every rank idle, one dispatch, then received_tokens, every row's source
  // token, the pairs of kSampledRows rows and their data. `fixed`: low-latency rows (token t of s at row
  // s * tokens + t, a hole's source token -1).
  uint64_t check_rank_dispatch(const Call& dispatch, MoeDispatchOutput& view, size_t tokens, bool fixed) {
    const int K = options_.moe_top_k, L = local_experts();
    const uint64_t seed = mix(seed_ + tokens);
    const size_t capacity = view.capacity_rows;
    poison_rows(view);
    cuda(cudaMemsetAsync(const_cast<int32_t*>(view.source_token), kRowPoison, capacity * 4, stream()), "cudaMemsetAsync");
    cuda(cudaMemsetAsync(const_cast<int32_t*>(view.topk_expert), kRowPoison, capacity * K * 4, stream()), "cudaMemsetAsync");
    cuda(cudaMemsetAsync(const_cast<int64_t*>(view.received_tokens), kRowPoison, ranks_ * sizeof(int64_t), stream()),
         "cudaMemsetAsync");
    dispatch_once(dispatch);
    std::vector<int64_t> received(ranks_);
    std::vector<int32_t> token(capacity), experts(capacity * K);
    cuda(cudaMemcpy(received.data(), view.received_tokens, ranks_ * sizeof(int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
    cuda(cudaMemcpy(token.data(), view.source_token, capacity * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    cuda(cudaMemcpy(experts.data(), view.topk_expert, capacity * K * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    uint64_t wrong = 0;
    std::string first;
    struct Row {
      int source;
      size_t token, row;
    };
    std::vector<Row> rows;
    for (int s = 0; s < ranks_; ++s) {
      size_t i = 0;
      for (size_t t = 0; t < tokens; ++t) {
        bool here = false;
        for (int k = 0; k < K; ++k) here = here || routings_[s].ids[t * K + k] / L == rank_;
        if (!here) {
          if (fixed && token[s * tokens + t] != -1 && wrong++ == 0) {
            first = "row " + std::to_string(s * tokens + t) + ": source_token " + std::to_string(token[s * tokens + t]) +
                    ", expected -1 (a hole)";
          }
          continue;
        }
        const size_t row = s * tokens + (fixed ? t : i);
        ++i;
        rows.push_back({s, t, row});
        if (token[row] != static_cast<int32_t>(t) && wrong++ == 0) {
          first = "row " + std::to_string(row) + ": source_token " + std::to_string(token[row]) + ", expected " + std::to_string(t);
        }
      }
      const size_t want = fixed ? tokens : i;
      if (received[s] != static_cast<int64_t>(want) && wrong++ == 0) {
        first = "received_tokens[" + std::to_string(s) + "] = " + std::to_string(received[s]) + ", expected " + std::to_string(want);
      }
    }
    std::vector<unsigned char> data(dispatch_row_bytes());
    std::vector<float> row_scales(scale_count());
    for (size_t n : spread(rows.size(), kSampledRows)) {
      const Row& r = rows[n];
      for (int k = 0; k < K; ++k) {
        const int64_t id = routings_[r.source].ids[r.token * K + k];
        const int32_t want = id / L == rank_ ? static_cast<int32_t>(id % L) : -1;
        if (experts[r.row * K + k] != want && wrong++ == 0) {
          first = "row " + std::to_string(r.row) + " pair " + std::to_string(k) + ": expert " + std::to_string(experts[r.row * K + k]) +
                  ", expected " + std::to_string(want);
        }
      }
      cuda(cudaMemcpy(data.data(), static_cast<const unsigned char*>(view.x) + r.row * dispatch_row_bytes(), dispatch_row_bytes(),
                      cudaMemcpyDeviceToHost),
           "cudaMemcpy");
      if (fp8()) {
        cuda(cudaMemcpy(row_scales.data(), view.scales + r.row * scale_count(), scale_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
      }
      std::string at;
      const uint64_t bad = compare_row(data.data(), row_scales.data(), r.source, r.token, seed, at);
      if (bad > 0 && wrong == 0) first = "row " + std::to_string(r.row) + ": " + at;
      wrong += bad;
    }
    report("braid rank-major dispatch", wrong, first);
    return wrong;
  }

  // ---- Timing (cuda_objects.hpp, as the collective rows) ----

  double time_calls(const Call& call, bool graphable) {
    return bench::time_calls(comm_, stream(), call,
                             TimingPlan{options_.warmup_iters, options_.iters, options_.repeats,
                                        graphable ? options_.graph_calls : 0, options_.blocking});
  }

  // ---- Checks ----

  void report(const std::string& what, uint64_t wrong, const std::string& first) const {
    if (wrong == 0) return;
    std::fprintf(stderr, "braid-bench: rank %d: %s: %llu wrong, first %s\n", rank_, what.c_str(),
                 static_cast<unsigned long long>(wrong), first.c_str());
  }

  // Compares the dispatched row at `got` (hidden elements of the dispatch type) with row `token` of rank `source`,
  // and with fp8 dispatch its scales at `got_scales`; returns the wrong entries.
  uint64_t compare_row(const unsigned char* got, const float* got_scales, int source, size_t token, uint64_t seed,
                       std::string& first) const {
    const size_t H = options_.moe_hidden, element = datatype_size(dispatch_type());
    uint64_t wrong = 0;
    for (size_t c = 0; c < scale_count(); ++c) {
      const float want = moe::token_scale(seed, source, token * scale_count() + c);
      if (got_scales[c] == want) continue;
      if (wrong++ == 0 && first.empty()) {
        first = "rank " + std::to_string(source) + " token " + std::to_string(token) + " scale " + std::to_string(c) + ": expected " +
                std::to_string(want) + ", got " + std::to_string(got_scales[c]);
      }
    }
    for (size_t h = 0; h < H; ++h) {
      const uint32_t want = fp8() ? moe::token_fp8_bits(*fp8(), seed, source, token * H + h)
                                  : value_bits(options_.type, moe::token_value_k(seed, source, token * H + h));
      const uint32_t have = load_bits(dispatch_type(), got + h * element);
      if (want == have) continue;
      if (wrong++ == 0 && first.empty()) {
        char text[160];
        std::snprintf(text, sizeof text, "rank %d token %zu element %zu: expected 0x%x, got 0x%x", source, token, h, want,
                      have);
        first = text;
      }
    }
    return wrong;
  }

  // All views poisoned with every rank idle, one dispatch, then: counts, offsets and every row's metadata in full,
  // and the data of kSampledRows rows.
  uint64_t check_braid_dispatch(const Call& dispatch, MoeDispatchOutput& view, size_t tokens) {
    const int K = options_.moe_top_k, L = local_experts();
    const uint64_t seed = mix(seed_ + tokens);
    const size_t capacity = view.capacity_rows;
    poison_rows(view);
    for (const void* p : {static_cast<const void*>(view.weights), static_cast<const void*>(view.local_expert),
                          static_cast<const void*>(view.source_rank), static_cast<const void*>(view.source_token)}) {
      cuda(cudaMemsetAsync(const_cast<void*>(p), kRowPoison, capacity * 4, stream()), "cudaMemsetAsync");
    }
    cuda(cudaMemsetAsync(const_cast<int64_t*>(view.expert_counts), kRowPoison, L * sizeof(int64_t), stream()), "cudaMemsetAsync");
    cuda(cudaMemsetAsync(const_cast<int64_t*>(view.expert_offsets), kRowPoison, (L + 1) * sizeof(int64_t), stream()),
         "cudaMemsetAsync");
    dispatch_once(dispatch);

    // The reference: rows of expert j = every (s, t, k) with id == rank * L + j, in (s, t, k) order, then padding.
    struct Row {
      int source;
      int64_t token;
      int k;
      int expert;
    };
    std::vector<Row> rows;
    std::vector<int64_t> counts(L), offsets(L + 1, 0);
    const size_t alignment = static_cast<size_t>(options_.moe_alignment);
    for (int j = 0; j < L; ++j) {
      const int64_t e = static_cast<int64_t>(rank_) * L + j;
      offsets[j] = static_cast<int64_t>(rows.size());
      for (int s = 0; s < ranks_; ++s) {
        for (size_t t = 0; t < tokens; ++t) {
          for (int k = 0; k < K; ++k) {
            if (routings_[s].ids[t * K + k] == e) rows.push_back({s, static_cast<int64_t>(t), k, j});
          }
        }
      }
      counts[j] = static_cast<int64_t>(rows.size()) - offsets[j];
      rows.resize((rows.size() + alignment - 1) / alignment * alignment, Row{-1, -1, -1, -1});
    }
    offsets[L] = static_cast<int64_t>(rows.size());

    uint64_t wrong = 0;
    std::string first;
    std::vector<int64_t> got_counts(L), got_offsets(L + 1);
    cuda(cudaMemcpy(got_counts.data(), view.expert_counts, L * sizeof(int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
    cuda(cudaMemcpy(got_offsets.data(), view.expert_offsets, (L + 1) * sizeof(int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (int j = 0; j <= L; ++j) {
      if (j < L && got_counts[j] != counts[j]) {
        if (wrong++ == 0) first = "expert_counts[" + std::to_string(j) + "] = " + std::to_string(got_counts[j]) + ", expected " + std::to_string(counts[j]);
      }
      if (got_offsets[j] != offsets[j]) {
        if (wrong++ == 0) first = "expert_offsets[" + std::to_string(j) + "] = " + std::to_string(got_offsets[j]) + ", expected " + std::to_string(offsets[j]);
      }
    }
    if (rows.size() > capacity) {
      report("braid dispatch", wrong + 1, "needs " + std::to_string(rows.size()) + " rows, capacity " + std::to_string(capacity));
      return wrong + 1;
    }
    const size_t n = rows.size();
    std::vector<float> w(n);
    std::vector<int32_t> local(n), source(n), token(n);
    if (n > 0) {
      cuda(cudaMemcpy(w.data(), view.weights, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
      cuda(cudaMemcpy(local.data(), view.local_expert, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
      cuda(cudaMemcpy(source.data(), view.source_rank, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
      cuda(cudaMemcpy(token.data(), view.source_token, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    }
    for (size_t i = 0; i < n; ++i) {
      const Row& r = rows[i];
      const float want_w = r.source < 0 ? 0.0f : routings_[r.source].weights[static_cast<size_t>(r.token) * K + r.k];
      const bool right = r.source < 0 ? (w[i] == 0.0f && local[i] == -1 && source[i] == -1 && token[i] == -1)
                                      : (w[i] == want_w && local[i] == r.expert && source[i] == r.source && token[i] == r.token);
      if (right) continue;
      if (wrong++ == 0) {
        char text[200];
        std::snprintf(text, sizeof text, "row %zu metadata (weight %g, expert %d, rank %d, token %d), expected (%g, %d, %d, %lld)",
                      i, static_cast<double>(w[i]), local[i], source[i], token[i], static_cast<double>(want_w), r.expert,
                      r.source, static_cast<long long>(r.token));
        first = text;
      }
    }
    std::vector<unsigned char> data(dispatch_row_bytes());
    std::vector<float> row_scales(scale_count());
    for (size_t i : spread(n, kSampledRows)) {
      const Row& r = rows[i];
      if (r.source < 0) continue;  // padding rows' data is unspecified
      cuda(cudaMemcpy(data.data(), static_cast<const unsigned char*>(view.x) + i * dispatch_row_bytes(), dispatch_row_bytes(),
                      cudaMemcpyDeviceToHost),
           "cudaMemcpy");
      if (fp8()) {
        cuda(cudaMemcpy(row_scales.data(), view.scales + i * scale_count(), scale_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
      }
      std::string at;
      const uint64_t bad = compare_row(data.data(), row_scales.data(), r.source, static_cast<size_t>(r.token), seed, at);
      if (bad > 0 && wrong == 0) first = "row " + std::to_string(i) + ": " + at;
      wrong += bad;
    }
    report("braid dispatch", wrong, first);
    return wrong;
  }

  // The NCCL baseline's received rows: the counts from each rank, and kSampledRows rows' data.
  uint64_t check_nccl_dispatch(const NcclMoe& baseline, size_t tokens) {
    const int K = options_.moe_top_k, L = local_experts();
    const uint64_t seed = mix(seed_ + tokens);
    struct Row {
      int source;
      size_t token;
    };
    std::vector<Row> rows;
    uint64_t wrong = 0;
    std::string first;
    for (int s = 0; s < ranks_; ++s) {
      const size_t before = rows.size();
      for (size_t t = 0; t < tokens; ++t) {
        for (int k = 0; k < K; ++k) {
          if (routings_[s].ids[t * K + k] / L == rank_) {
            rows.push_back({s, t});
            break;
          }
        }
      }
      const int64_t want = static_cast<int64_t>(rows.size() - before);
      if (baseline.received_rows(s) != want && wrong++ == 0) {
        first = "rows from rank " + std::to_string(s) + ": " + std::to_string(baseline.received_rows(s)) + ", expected " +
                std::to_string(want);
      }
    }
    if (wrong == 0) {
      const size_t packed = baseline.packed_bytes();  // the row, then its scales (fp8)
      std::vector<unsigned char> data(packed);
      std::vector<float> row_scales(scale_count());
      for (size_t i : spread(rows.size(), kSampledRows)) {
        cuda(cudaMemcpy(data.data(), baseline.recv().get<unsigned char>() + i * packed, packed, cudaMemcpyDeviceToHost),
             "cudaMemcpy");
        if (fp8()) std::memcpy(row_scales.data(), data.data() + dispatch_row_bytes(), scale_bytes());
        std::string at;
        const uint64_t bad = compare_row(data.data(), row_scales.data(), rows[i].source, rows[i].token, seed, at);
        if (bad > 0 && wrong == 0) first = "received row " + std::to_string(i) + ": " + at;
        wrong += bad;
      }
    }
    report("nccl dispatch", wrong, first);
    return wrong;
  }

  // kSampledTokens tokens of out: x[t] * (sum of t's weights) (every expert's output is the token row itself).
  uint64_t check_combined(const DeviceMemory& out, size_t tokens, const char* what) {
    const int K = options_.moe_top_k, L = local_experts();
    const size_t H = options_.moe_hidden, element = datatype_size(options_.type);
    const uint64_t seed = mix(seed_ + tokens);
    const Routing& mine = routings_[rank_];
    uint64_t wrong = 0;
    std::string first;
    std::vector<unsigned char> data(row_bytes());
    for (size_t t : spread(tokens, kSampledTokens)) {
      cuda(cudaMemcpy(data.data(), out.get<unsigned char>() + t * row_bytes(), row_bytes(), cudaMemcpyDeviceToHost),
           "cudaMemcpy");
      double weight = 0;
      uint64_t owners = 0;
      for (int k = 0; k < K; ++k) {
        weight += mine.weights[t * K + k];
        owners |= uint64_t(1) << (mine.ids[t * K + k] / L);
      }
      double partials = 0;
      for (int r = 0; r < ranks_; ++r) partials += (owners >> r & 1) != 0 ? 1 : 0;
      for (size_t h = 0; h < H; ++h) {
        const double x = fp8() ? static_cast<double>(moe::fp8_value(*fp8(), moe::token_fp8_bits(*fp8(), seed, rank_, t * H + h))) *
                                     moe::token_scale(seed, rank_, t * scale_count() + h / kMoeScaleColumns)
                               : moe::token_value_k(seed, rank_, t * H + h) / 128.0;
        const double want = x * weight;
        const double tolerance = tolerance_unit(options_.type) * (partials + 1) * std::fabs(want);
        const double got = decode(options_.type, data.data() + h * element);
        if (std::fabs(got - want) <= tolerance) continue;
        if (wrong++ == 0) {
          char text[160];
          std::snprintf(text, sizeof text, "token %zu element %zu: expected %.6g (tolerance %.2g), got %.6g", t, h, want,
                        tolerance, got);
          first = text;
        }
      }
    }
    report(what, wrong, first);
    return wrong;
  }

  // ---- Results ----

  void finish_row(size_t tokens, const Bytes& bytes, const Slot (&slots)[kSlots]) {
    std::vector<std::string> all =
        comm_.host_allgather(std::string(reinterpret_cast<const char*>(slots), sizeof(Slot) * kSlots));
    Slot total[kSlots];
    std::vector<double> times[kSlots];  // every rank's, in rank order
    for (const std::string& text : all) {
      Slot theirs[kSlots];
      if (text.size() != sizeof(theirs)) throw std::runtime_error("a rank's results arrived truncated");
      std::memcpy(theirs, text.data(), sizeof(theirs));
      for (int i = 0; i < kSlots; ++i) {
        times[i].push_back(theirs[i].time_us);
        total[i].wrong += theirs[i].wrong;
        total[i].state = theirs[i].state;
      }
    }
    for (int i = 0; i < kSlots; ++i) total[i].time_us = combine_rank_times(times[i], options_.average);
    for (const Slot& slot : total) wrong_total_ += slot.wrong;
    if (rank_ != 0) return;
    auto gbs = [](double bytes, double us) { return us > 0 ? bytes / (us * 1e3) : 0.0; };
    auto wrong_text = [](const Slot& s) { return s.state == 2 ? std::to_string(s.wrong) : std::string("N/A"); };
    // A layer moves the bytes of both (out and back).
    struct Phase {
      int braid;
      SlotIndex nccl;
      const char* name;
      double nvlink_bytes, logical_bytes;
    };
    const Phase phases[] = {{0, kNcclDispatch, "dispatch", bytes.dispatch_nvlink, bytes.dispatch_logical},
                            {1, kNcclCombine, "combine", bytes.combine_nvlink, bytes.combine_logical},
                            {2, kNcclLayer, "layer", bytes.dispatch_nvlink + bytes.combine_nvlink,
                             bytes.dispatch_logical + bytes.combine_logical}};
    for (MoeBenchLayout layout : options_.moe_layouts) {
      for (const Phase& phase : phases) {
        const Slot& b = total[first_slot(layout) + phase.braid];
        const Slot& n = total[phase.nccl];
        const char* name = phase.name;
        const double nvlink_bytes = phase.nvlink_bytes;
        const double logical_bytes = phase.logical_bytes;
        std::printf("  %6zu  %-12s  %-8s  %9.2f  %8.2f  %7.1f  %7.1f  %6s", tokens, layout_name(layout), name, nvlink_bytes / 1e6,
                    b.time_us, gbs(nvlink_bytes, b.time_us), gbs(logical_bytes, b.time_us), wrong_text(b).c_str());
        if (library_) {
          std::printf("  %8.2f  %8.1f  %9.1f  %7s  %6.2f", n.time_us, gbs(nvlink_bytes, n.time_us),
                      gbs(logical_bytes, n.time_us), wrong_text(n).c_str(), n.time_us > 0 ? b.time_us / n.time_us : 0.0);
        }
        std::printf("\n");
        nlohmann::json row{{"tokens", tokens},
                           {"layout", layout_name(layout)},
                           {"phase", name},
                           {"nvlink_bytes_max_per_rank", nvlink_bytes},
                           {"logical_bytes", logical_bytes}};
        auto impl = [&](const Slot& s) -> nlohmann::json {
          if (s.state == 0) return nullptr;
          nlohmann::json value{{"time_us", s.time_us},
                               {"nvlink_gbs", gbs(nvlink_bytes, s.time_us)},
                               {"logical_gbs", gbs(logical_bytes, s.time_us)}};
          value["wrong"] = s.state == 2 ? nlohmann::json(s.wrong) : nlohmann::json(nullptr);
          return value;
        };
        row["braid"] = impl(b);
        row["nccl"] = impl(n);
        row["time_ratio_braid_over_nccl"] =
            b.state != 0 && n.state != 0 && n.time_us > 0 ? nlohmann::json(b.time_us / n.time_us) : nlohmann::json(nullptr);
        rows_.push_back(std::move(row));
      }
    }
    std::fflush(stdout);
  }

  void write_json() const {
    nlohmann::json config{{"mode", "moe"},
                          {"type", datatype_name(options_.type)},
                          {"dispatch_type", datatype_name(dispatch_type())},
                          {"dispatch_scales", fp8() ? nlohmann::json(kMoeScaleColumns) : nlohmann::json(nullptr)},
                          {"hidden", options_.moe_hidden},
                          {"top_k", options_.moe_top_k},
                          {"experts", options_.moe_experts},
                          {"alignment", options_.moe_alignment},
                          {"max_sms", options_.moe_max_sms},
                          {"layouts", [&] {
                             nlohmann::json names = nlohmann::json::array();
                             for (MoeBenchLayout layout : options_.moe_layouts) names.push_back(layout_name(layout));
                             return names;
                           }()},
                          {"tokens", options_.moe_tokens},
                          {"index_type", "int64"},
                          {"ranks", ranks_},
                          {"graph", options_.graph_calls},
                          {"iters", options_.iters},
                          {"warmup_iters", options_.warmup_iters},
                          {"repeats", options_.repeats},
                          {"check", options_.check},
                          {"gpus", gpus_},
                          {"time", time_description(options_)},
                          {"average", options_.average},
                          {"blocking", options_.blocking},
                          {"nvlink", "max over ranks of max(bytes sent to, received from other ranks) / time"},
                          {"logical", "tokens * top_k * (row bytes, scales included) / time"}};
    const char* commit = std::getenv("BRAID_COMMIT");
    config["settings"] = braid_settings();
    config["commit"] = commit != nullptr ? nlohmann::json(commit) : nlohmann::json(nullptr);
    config["nccl_version"] = library_ ? nlohmann::json(library_->version()) : nlohmann::json(nullptr);
    std::ofstream file(options_.json_path);
    file << nlohmann::json{{"tool", "braid-bench"}, {"config", config}, {"rows", rows_}}.dump(2) << "\n";
    if (!file) throw std::runtime_error("cannot write --json file " + options_.json_path);
  }

  Communicator& comm_;
  const Options& options_;
  const int rank_, ranks_;
  std::shared_ptr<NcclLibrary> library_;
  uint64_t seed_ = 0;
  std::unique_ptr<StreamHandle> stream_;
  std::unique_ptr<NcclComm> nccl_;
  std::vector<std::string> gpus_;
  std::vector<Routing> routings_;  // every rank's, for the current T
  nlohmann::json rows_ = nlohmann::json::array();
  uint64_t wrong_total_ = 0;
};

}  // namespace

uint64_t moe_run(Communicator& comm, const Options& options, const std::shared_ptr<NcclLibrary>& nccl) {
  return MoeBench(comm, options, nccl).run();
}

}  // namespace braid::bench
