// braid-bench's command line (nccl-tests' flags where they exist) and the values it resolves to.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "braid/moe.hpp"
#include "braid/types.hpp"
#include "collective.hpp"

namespace braid::bench {

// The MoE layouts --moe times: MoeShape::layout, and the rank-major layout with fixed rows (MoeShape::low_latency).
enum class MoeBenchLayout { kExpertMajor, kRankMajor, kLowLatency };
// Each layout's name on the command line and in the output, in the enum's order.
inline constexpr const char* kMoeBenchLayoutNames[] = {"expert-major", "rank-major", "low-latency"};
inline const char* layout_name(MoeBenchLayout layout) { return kMoeBenchLayoutNames[static_cast<int>(layout)]; }

struct Options {
  bool smoke = false;  // --smoke: the symmetric-memory smoke run instead of the collectives
  bool moe = false;    // --moe: MoE dispatch and combine (MoeBuffer) instead of the collectives

  // --moe's workload: tokens per rank (one row per value), hidden size, experts per token, experts in all, the
  // alignment of each local expert's block of rows (expert-major), and the layouts timed. The defaults are
  // DeepEP's test shapes: a decode batch (T = 128) and a training batch (T = 4096) of H = 7168, K = 8, E = 256.
  std::vector<size_t> moe_tokens{128, 4096};
  size_t moe_hidden = 7168;
  int moe_top_k = 8;
  int moe_experts = 256;
  int moe_alignment = 1;
  std::vector<MoeBenchLayout> moe_layouts{MoeBenchLayout::kExpertMajor, MoeBenchLayout::kRankMajor, MoeBenchLayout::kLowLatency};
  std::optional<DataType> moe_dispatch_type;  // --dispatch-type: fp8 dispatch (rows of -d's type come back)
  int moe_max_sms = 0;                         // --max-sms: MoeShape::max_sms (0: every multiprocessor)
  uint64_t moe_seed = 0;                       // --seed: the routing's seed (0: random, shared by the ranks)

  std::vector<Collective> collectives{Collective::kAllReduce};
  std::string coll = "allreduce";  // as given: one name or "all"
  size_t min_bytes = 8;
  size_t max_bytes = size_t(128) << 20;
  size_t step_factor = 2;
  size_t step_bytes = 0;  // -i: add this between sizes instead of multiplying by step_factor (0: multiply)
  DataType type = DataType::kFloat32;  // --moe: bfloat16 unless -d says otherwise
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int iters = 20;        // calls per timed repetition
  int warmup_iters = 5;  // untimed calls before the first repetition
  int repeats = 5;       // timed repetitions; the reported time is their median
  int graph_calls = 0;   // -G N: N calls per CUDA graph, replayed; 0: eager launches
  int check_iters = 1;   // -c N: checked calls per (size, placement, implementation); 0: none
  bool check = true;     // check_iters > 0
  bool blocking = false;  // -z 1: the host waits for every call (or graph replay) before the next
  int average = 3;        // -a: a row's time over ranks: 0 rank 0's, 1 mean, 2 min, 3 max
  int run_cycles = 1;     // -N: runs of the whole sweep; 0: until interrupted
  std::string json_path;
  int threads = 0;  // ranks as threads (-t x -g); 0: every visible GPU (ignored under braid-run)
  bool compare_nccl = false;
  std::string nccl_lib = "libnccl.so.2";
  int in_place = 2;  // 0: out-of-place only, 1: in-place only, 2: both (never in place: alltoall)
  bool symmetric = false;  // buffers from comm.alloc (zero-copy) instead of cudaMalloc (staged)
  bool registered = false;  // user buffers registered with the communicator (zero copy after the first use)
  bool vmm = false;         // user buffers of VMM memory with POSIX-fd handles (PyTorch's expandable segments)
  double timeout_s = 0;    // 0: braid's default (BRAID_TIMEOUT_S)

  bool out_of_place() const { return in_place != 1; }
  bool in_place_too() const { return in_place != 0; }
  std::vector<size_t> sizes() const;  // min, min*f (or min+i), ... up to max
};

// Parses argv into `options`. Returns an exit code when the program should stop now (--help: 0, a bad
// argument: CLI11's nonzero code after printing why), nothing when it should run.
std::optional<int> parse_options(int argc, char** argv, Options& options);

// "8", "8K", "128M", "1G" (powers of 1024, as nccl-tests reads them); nothing for anything else.
std::optional<size_t> parse_bytes(const std::string& text);

// A row's time from every rank's (in rank order), as -a asks: rank 0's, the mean, the min or the max.
double combine_rank_times(const std::vector<double>& times, int average);
// What a row's time is, as -a and -z make it ("per call: the max over ranks of each rank's median repetition"), for
// the header and the JSON.
std::string time_description(const Options& options);

// The kind of buffers the run uses, for the header and the JSON: "symmetric", "registered", "cudaMalloc", or with
// --vmm "registered-vmm" and "vmm".
inline const char* buffers_name(const Options& options) {
  if (options.symmetric) return "symmetric";
  if (options.vmm) return options.registered ? "registered-vmm" : "vmm";
  return options.registered ? "registered" : "cudaMalloc";
}

}  // namespace braid::bench
