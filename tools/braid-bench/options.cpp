#include "options.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <iterator>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

#include "braid/moe.hpp"

namespace braid::bench {

std::optional<size_t> parse_bytes(const std::string& text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  size_t end = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &end);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  unsigned shift = 0;
  if (end < text.size()) {
    if (end + 1 != text.size()) return std::nullopt;
    switch (std::toupper(static_cast<unsigned char>(text[end]))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      default: return std::nullopt;
    }
  }
  if (value > (std::numeric_limits<unsigned long long>::max() >> shift)) return std::nullopt;
  return static_cast<size_t>(value << shift);
}

std::vector<size_t> Options::sizes() const {
  std::vector<size_t> sizes;
  if (step_bytes > 0) {
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes += step_bytes) {
      sizes.push_back(bytes);
      if (bytes > max_bytes - step_bytes) break;
    }
    return sizes;
  }
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= step_factor) {
    sizes.push_back(bytes);
    if (step_factor < 2 || bytes > max_bytes / step_factor) break;
  }
  return sizes;
}

double combine_rank_times(const std::vector<double>& times, int average) {
  if (times.empty()) return 0;
  switch (average) {
    case 0: return times[0];
    case 1: {
      double sum = 0;
      for (double time : times) sum += time;
      return sum / static_cast<double>(times.size());
    }
    case 2: return *std::min_element(times.begin(), times.end());
    default: return *std::max_element(times.begin(), times.end());
  }
}

std::string time_description(const Options& options) {
  static const char* const kOver[] = {"rank 0's", "the mean over ranks", "the min over ranks", "the max over ranks"};
  const int over = options.average >= 0 && options.average <= 3 ? options.average : 3;
  std::string text = std::string("per call: ") + kOver[over] + " of each rank's median repetition";
  if (options.blocking) text += ", the host waiting for each call";
  return text;
}

namespace {

template <typename T>
std::vector<std::string> names(const std::map<std::string, T>& table) {
  std::vector<std::string> keys;
  for (const auto& entry : table) keys.push_back(entry.first);
  return keys;
}

// An integer in [low, high] (high: none when it is the type's maximum), with a message that says so.
CLI::Validator integer_in(long long low, long long high = std::numeric_limits<long long>::max()) {
  const std::string range = high == std::numeric_limits<long long>::max() ? "an integer >= " + std::to_string(low)
                                                                          : "an integer from " + std::to_string(low) + " to " + std::to_string(high);
  return CLI::Validator(
      [low, high, range](std::string& text) -> std::string {
        size_t end = 0;
        long long value = 0;
        try {
          value = std::stoll(text, &end);
        } catch (const std::exception&) {
          end = 0;
        }
        if (text.empty() || end != text.size() || value < low || value > high) return "expected " + range + ", got '" + text + "'";
        return "";
      },
      range);
}

}  // namespace

std::optional<int> parse_options(int argc, char** argv, Options& options) {
  CLI::App app{
      "braid-bench: braid's collectives timed and checked, nccl-tests style, on every local GPU (ranks as threads),\n"
      "or one rank per process under braid-run (braid-run -n N braid-bench ...). --smoke runs the symmetric-memory\n"
      "smoke run instead."};
  const std::map<std::string, Collective> collectives{
      {"allreduce", Collective::kAllReduce},       {"reduce", Collective::kReduce},
      {"reducescatter", Collective::kReduceScatter}, {"allgather", Collective::kAllGather},
      {"broadcast", Collective::kBroadcast},         {"alltoall", Collective::kAllToAll},
      {"sendrecv", Collective::kSendRecv}};
  const std::map<std::string, DataType> types{
      {"int8", DataType::kInt8},       {"uint8", DataType::kUint8},         {"int32", DataType::kInt32},
      {"uint32", DataType::kUint32},   {"int64", DataType::kInt64},         {"uint64", DataType::kUint64},
      {"half", DataType::kFloat16},    {"float16", DataType::kFloat16},     {"bfloat16", DataType::kBFloat16},
      {"float", DataType::kFloat32},   {"float32", DataType::kFloat32},     {"double", DataType::kFloat64},
      {"float64", DataType::kFloat64}, {"float8e4m3", DataType::kFloat8E4M3}, {"f8e4m3", DataType::kFloat8E4M3},
      {"float8e5m2", DataType::kFloat8E5M2}, {"f8e5m2", DataType::kFloat8E5M2}};
  const std::map<std::string, ReduceOp> ops{{"sum", ReduceOp::kSum}, {"prod", ReduceOp::kProd}, {"max", ReduceOp::kMax},
                                            {"min", ReduceOp::kMin}, {"avg", ReduceOp::kAvg}};
  const CLI::Validator bytes_validator(
      [](std::string& text) -> std::string {
        return parse_bytes(text) ? "" : "expected a byte count such as 8, 8K, 128M or 1G, got '" + text + "'";
      },
      "BYTES");

  std::string min_bytes, max_bytes, step_bytes, compare, type = "float32", op = "sum";
  int symmetric = 0, registered = 0, vmm = 0, blocking = 0, local_register = -1, gpus_per_thread = 0;
  app.add_flag("--smoke", options.smoke, "run the symmetric-memory smoke run (peer writes, checked) instead");
  app.add_flag("--moe", options.moe,
               "benchmark MoE dispatch and combine (braid::MoeBuffer) instead of the collectives; -d defaults to bfloat16");
  app.add_option("--tokens", options.moe_tokens, "--moe: tokens per rank (T), one row per value: 128,4096")
      ->delimiter(',')->check(integer_in(1))->capture_default_str();
  app.add_option("--hidden", options.moe_hidden, "--moe: elements of one token row (H)")->check(integer_in(1))
      ->capture_default_str();
  app.add_option("--top-k", options.moe_top_k, "--moe: experts per token (K), distinct, 1..16")->check(integer_in(1, 16))
      ->capture_default_str();
  app.add_option("--experts", options.moe_experts, "--moe: experts in all (E), a multiple of the ranks")
      ->check(integer_in(1))->capture_default_str();
  app.add_option("--alignment", options.moe_alignment, "--moe: each local expert's block of rows starts at a multiple of this")
      ->check(integer_in(1))->capture_default_str();
  std::vector<std::string> layouts;
  app.add_option("--layout", layouts, "--moe: expert-major, rank-major, low-latency (rank-major with fixed rows), "
                 "comma-separated; default all three")
      ->delimiter(',')->check(CLI::IsMember(std::vector<std::string>(std::begin(kMoeBenchLayoutNames),
                                                                   std::end(kMoeBenchLayoutNames))));
  app.add_option("--max-sms", options.moe_max_sms,
                 "--moe: multiprocessors dispatch and combine may occupy (MoeShape::max_sms; 0: braid picks)")
      ->check(integer_in(0))->capture_default_str();
  app.add_option("--seed", options.moe_seed,
                 "--moe: the routing's seed (0: a random one, shared by the ranks); python -m braid.bench --seed (with the "
                 "same --experts and --tokens) "
                 "draws the same routing")
      ->capture_default_str();
  std::string dispatch_type;
  app.add_option("--dispatch-type", dispatch_type,
                 "--moe: fp8 dispatch, f8e4m3 or f8e5m2 rows with a float32 scale per 128 columns (combine stays -d)");
  app.add_option("--coll", options.coll,
                 "collective: allreduce, reduce, reducescatter, allgather, broadcast, alltoall, sendrecv (to the next "
                 "rank, from the previous one), all")
      ->check(CLI::IsMember({"allreduce", "reduce", "reducescatter", "allgather", "broadcast", "alltoall", "sendrecv", "all"}))
      ->capture_default_str();
  app.add_option("-b,--minbytes", min_bytes, "smallest size, bytes (K, M, G suffixes) [8; smoke: 1]")
      ->check(bytes_validator);
  app.add_option("-e,--maxbytes", max_bytes, "largest size, bytes [128M; smoke: 64M]")->check(bytes_validator);
  app.add_option("-f,--stepfactor", options.step_factor, "multiply the size by this between rows [2; smoke: 64]")
      ->check(integer_in(1));
  app.add_option("-i,--stepbytes", step_bytes, "add this many bytes between rows instead of multiplying (excludes -f)")
      ->check(bytes_validator);
  app.add_option("-d,--datatype", type, "element type (half = float16, float = float32, double = float64)")
      ->check(CLI::IsMember(names(types)))->capture_default_str();
  app.add_option("-o,--op", op, "reduction")->check(CLI::IsMember(names(ops)))->capture_default_str();
  app.add_option("-r,--root", options.root, "root rank of reduce and broadcast")->check(integer_in(0))
      ->capture_default_str();
  app.add_option("-n,--iters", options.iters, "calls per timed repetition")->check(integer_in(1))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", options.warmup_iters, "untimed calls first")->check(integer_in(0))
      ->capture_default_str();
  app.add_option("--repeats", options.repeats, "timed repetitions of -n calls; the median is reported")
      ->check(integer_in(1))->capture_default_str();
  app.add_option("-G,--cudagraph", options.graph_calls,
                 "capture N back-to-back calls in a CUDA graph and time its replays (ceil(iters/N) per repetition); "
                 "0: plain launches")
      ->check(integer_in(0))->capture_default_str();
  app.add_option("-c,--check", options.check_iters,
                 "checked calls per size, placement and implementation, against a host reference (0: none; --moe "
                 "checks once)")
      ->check(integer_in(0))->capture_default_str();
  app.add_option("-z,--blocking", blocking, "1: the host waits for each call (or graph replay) before the next")
      ->check(integer_in(0, 1))->capture_default_str();
  app.add_option("-a,--average", options.average,
                 "a row's time over ranks (each rank's median): 0 rank 0's, 1 the mean, 2 the min, 3 the max")
      ->check(integer_in(0, 3))->capture_default_str();
  app.add_option("-N,--run_cycles", options.run_cycles, "runs of the whole sweep (0: until interrupted)")
      ->check(integer_in(0))->capture_default_str();
  app.add_option("--json", options.json_path, "also write the configuration and every row to this JSON file");
  app.add_option("-t,--nthreads,--threads", options.threads,
                 "ranks as threads of this process, one GPU each [every visible GPU]")
      ->check(integer_in(1));
  app.add_option("-g,--ngpus", gpus_per_thread, "GPUs per thread (nccl-tests): -t x -g ranks as threads")
      ->check(integer_in(1));
  app.add_option("--compare", compare, "run NCCL on the same GPUs, buffers and stream beside braid")
      ->check(CLI::IsMember({"nccl"}));
  app.add_option("--nccl-lib", options.nccl_lib, "NCCL library to dlopen")->capture_default_str();
  app.add_option("--inplace", options.in_place,
                 "0: out-of-place only, 1: in-place only, 2: both (sendrecv has no in-place form: n/a)")
      ->check(integer_in(0, 2))->capture_default_str();
  app.add_option("--symmetric", symmetric, "1: buffers from comm.alloc (zero-copy path); 0: cudaMalloc (staged eagerly; with -G registered automatically at capture unless BRAID_AUTO_REGISTER=0)")
      ->check(integer_in(0, 1))->capture_default_str();
  app.add_option("--register", registered, "1: the user buffers registered with comm.register_buffer (zero copy)")
      ->check(integer_in(0, 1))->capture_default_str();
  app.add_option("--vmm", vmm, "1: user buffers of VMM memory with POSIX-fd handles, as PyTorch's expandable segments "
                               "make them, instead of cudaMalloc (with --register 1 and BRAID_EAGER_ZERO_COPY=1, "
                               "exposed to the peers)")
      ->check(integer_in(0, 1))->capture_default_str();
  app.add_option("-R,--local_register", local_register,
                 "nccl-tests' registration: 0 cudaMalloc, 1 --register 1, 2 --symmetric 1")
      ->check(integer_in(0, 2));
  app.add_option("-T,--timeout,--timeout-s", options.timeout_s, "bound on every wait for a peer, seconds [BRAID_TIMEOUT_S]")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              size_t end = 0;
              if (std::stod(text, &end) > 0 && end == text.size()) return "";
            } catch (const std::exception&) {
            }
            return "expected a number of seconds above 0, got '" + text + "'";
          },
          "SECONDS"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }

  options.type = types.at(type);
  if (options.moe) {
    if (options.smoke) {
      std::fprintf(stderr, "braid-bench: --moe and --smoke are two different runs: pick one\n");
      return 2;
    }
    if (app.count("--datatype") == 0) options.type = DataType::kBFloat16;
    if (options.type != DataType::kBFloat16 && options.type != DataType::kFloat16 && options.type != DataType::kFloat32) {
      std::fprintf(stderr, "braid-bench: --moe rows are bfloat16, float16 or float32 (-d %s)\n", type.c_str());
      return 2;
    }
    if (!dispatch_type.empty()) {
      const auto found = types.find(dispatch_type);
      if (found == types.end() || (found->second != DataType::kFloat8E4M3 && found->second != DataType::kFloat8E5M2)) {
        std::fprintf(stderr, "braid-bench: --dispatch-type is f8e4m3 or f8e5m2 (got %s)\n", dispatch_type.c_str());
        return 2;
      }
      if (options.moe_hidden % kMoeScaleColumns != 0) {
        std::fprintf(stderr, "braid-bench: --dispatch-type %s needs --hidden a multiple of %zu (got %zu)\n",
                     dispatch_type.c_str(), kMoeScaleColumns, options.moe_hidden);
        return 2;
      }
      options.moe_dispatch_type = found->second;
    }
    if (!layouts.empty()) {
      options.moe_layouts.clear();
      for (const std::string& layout : layouts) {
        const auto named = std::find(std::begin(kMoeBenchLayoutNames), std::end(kMoeBenchLayoutNames), layout);
        options.moe_layouts.push_back(static_cast<MoeBenchLayout>(named - std::begin(kMoeBenchLayoutNames)));
      }
    }
    if (options.moe_top_k > options.moe_experts) {
      std::fprintf(stderr, "braid-bench: --top-k %d needs at least as many --experts (%d): experts are distinct\n",
                   options.moe_top_k, options.moe_experts);
      return 2;
    }
  }
  options.op = ops.at(op);
  options.check = options.check_iters > 0;
  options.blocking = blocking != 0;
  options.symmetric = symmetric != 0;
  options.registered = registered != 0;
  options.vmm = vmm != 0;
  if (local_register >= 0) {
    if (app.count("--symmetric") + app.count("--register") > 0) {
      std::fprintf(stderr, "braid-bench: -R/--local_register says what --symmetric and --register say: give one of them\n");
      return 2;
    }
    options.registered = local_register == 1;
    options.symmetric = local_register == 2;
  }
  if (options.symmetric && options.registered) {
    std::fprintf(stderr, "braid-bench: --symmetric 1 and --register 1 exclude each other\n");
    return 2;
  }
  if (options.symmetric && options.vmm) {
    std::fprintf(stderr, "braid-bench: --symmetric 1 and --vmm 1 exclude each other\n");
    return 2;
  }
  if (gpus_per_thread > 0) options.threads = (options.threads > 0 ? options.threads : 1) * gpus_per_thread;
  if (!step_bytes.empty()) {
    if (app.count("--stepfactor") > 0) {
      std::fprintf(stderr, "braid-bench: -i/--stepbytes and -f/--stepfactor exclude each other\n");
      return 2;
    }
    options.step_bytes = *parse_bytes(step_bytes);
    if (options.step_bytes == 0) {
      std::fprintf(stderr, "braid-bench: -i/--stepbytes must be above 0\n");
      return 2;
    }
  }
  if (!options.json_path.empty()) {  // a path that cannot be written fails now, not after the run
    std::ofstream probe(options.json_path, std::ios::app);
    if (!probe) {
      std::fprintf(stderr, "braid-bench: --json %s cannot be opened for writing\n", options.json_path.c_str());
      return 2;
    }
  }
  options.compare_nccl = compare == "nccl";
  if (options.coll == "all") {
    options.collectives.assign(std::begin(kAllCollectives), std::end(kAllCollectives));
  } else {
    options.collectives = {collectives.at(options.coll)};
  }
  // The smoke run keeps its own defaults (sizes per peer region, a factor of 64).
  options.min_bytes = !min_bytes.empty() ? *parse_bytes(min_bytes) : options.smoke ? 1 : options.min_bytes;
  options.max_bytes = !max_bytes.empty() ? *parse_bytes(max_bytes) : options.smoke ? size_t(64) << 20 : options.max_bytes;
  if (options.smoke && app.count("--stepfactor") == 0) options.step_factor = 64;
  if (options.min_bytes == 0 || options.min_bytes > options.max_bytes) {
    std::fprintf(stderr, "braid-bench: -b/--minbytes must be positive and at most -e/--maxbytes\n");
    return 2;
  }
  return std::nullopt;
}

}  // namespace braid::bench
