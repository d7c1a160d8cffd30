// One rank of braid-bench --moe (MoeBench): per T, braid's layouts and the NCCL baseline, each checked against the
// host reference, then timed. moe.cpp runs it, moe_sweep.cpp does one T, moe_check.cpp checks, moe_report.cpp prints.
#pragma once

#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "braid/braid.hpp"  // with braid/moe.hpp
#include "cuda_objects.hpp"
#include "moe_data.hpp"
#include "moe_nccl.hpp"
#include "nccl.hpp"
#include "options.hpp"
#include "rank_slots.hpp"

namespace braid::bench::moe {

constexpr unsigned char kRowPoison = 0xA5;   // dispatched rows and metadata before a checked dispatch

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
inline int first_slot(MoeBenchLayout layout) { return kBraidDispatch + 3 * static_cast<int>(layout); }

class MoeBench {
 public:
  MoeBench(Communicator& comm, const Options& options, const std::shared_ptr<NcclLibrary>& nccl)
      : comm_(comm), options_(options), rank_(comm.rank()), ranks_(comm.size()), library_(nccl) {}

  uint64_t run();

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

  // Setup (moe.cpp).
  void validate() const;
  void share_seed();

  // One T (moe_sweep.cpp).
  void run_tokens(size_t tokens);
  void run_braid(MoeBenchLayout layout, size_t tokens, DeviceMemory& x, DeviceMemory& scales, DeviceMemory& ids,
                 DeviceMemory& weights, DeviceMemory& out, Slot (&slots)[kSlots]);
  double time_calls(const Call& call, bool graphable);

  // Checks (moe_check.cpp).
  void dispatch_once(const Call& dispatch);
  void poison_rows(const MoeDispatchOutput& view);
  uint64_t check_rank_dispatch(const Call& dispatch, MoeDispatchOutput& view, size_t tokens, bool fixed);
  void report(const std::string& what, uint64_t wrong, const std::string& first) const;
  uint64_t compare_row(const unsigned char* got, const float* got_scales, int source, size_t token, uint64_t seed,
                       std::string& first) const;
  uint64_t check_braid_dispatch(const Call& dispatch, MoeDispatchOutput& view, size_t tokens);
  uint64_t check_nccl_dispatch(const NcclMoe& baseline, size_t tokens);
  uint64_t check_combined(const DeviceMemory& out, size_t tokens, const char* what);

  // Output (moe_report.cpp).
  void header();
  void finish_row(size_t tokens, const Bytes& bytes, const Slot (&slots)[kSlots]);
  void write_json() const;

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

}  // namespace braid::bench::moe
