#include "options.hpp"

#include <CLI/CLI.hpp>

#include <cctype>
#include <cstdio>
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
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= step_factor) {
    sizes.push_back(bytes);
    if (step_factor < 2 || bytes > max_bytes / step_factor) break;
  }
  return sizes;
}

namespace {

template <typename T>
std::vector<std::string> names(const std::map<std::string, T>& table) {
  std::vector<std::string> keys;
  for (const auto& entry : table) keys.push_back(entry.first);
  return keys;
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

  std::string min_bytes, max_bytes, compare, type = "float32", op = "sum";
  int check = 1, symmetric = 0, registered = 0;
  app.add_flag("--smoke", options.smoke, "run the symmetric-memory smoke run (peer writes, checked) instead");
  app.add_flag("--moe", options.moe,
               "benchmark MoE dispatch and combine (braid::MoeBuffer) instead of the collectives; -d defaults to bfloat16");
  app.add_option("--tokens", options.moe_tokens, "--moe: tokens per rank (T), one row per value: 128,4096")
      ->delimiter(',')->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--hidden", options.moe_hidden, "--moe: elements of one token row (H)")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--top-k", options.moe_top_k, "--moe: experts per token (K), distinct, 1..16")->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--experts", options.moe_experts, "--moe: experts in all (E), a multiple of the ranks")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--alignment", options.moe_alignment, "--moe: each local expert's block of rows starts at a multiple of this")
      ->check(CLI::PositiveNumber)->capture_default_str();
  std::vector<std::string> layouts;
  app.add_option("--layout", layouts, "--moe: expert-major, rank-major, or both (comma-separated; default both)")
      ->delimiter(',')->check(CLI::IsMember({"expert-major", "rank-major"}));
  app.add_option("--max-sms", options.moe_max_sms, "--moe: multiprocessors dispatch and combine may occupy (0: all)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  std::string dispatch_type;
  app.add_option("--dispatch-type", dispatch_type,
                 "--moe: fp8 dispatch, f8e4m3 or f8e5m2 rows with a float32 scale per 128 columns (combine stays -d)");
  app.add_option("-c,--coll", options.coll,
                 "collective: allreduce, reduce, reducescatter, allgather, broadcast, alltoall, sendrecv (to the next "
                 "rank, from the previous one), all")
      ->check(CLI::IsMember({"allreduce", "reduce", "reducescatter", "allgather", "broadcast", "alltoall", "sendrecv", "all"}))
      ->capture_default_str();
  app.add_option("-b,--minbytes", min_bytes, "smallest size, bytes (K, M, G suffixes) [8; smoke: 1]")
      ->check(bytes_validator);
  app.add_option("-e,--maxbytes", max_bytes, "largest size, bytes [128M; smoke: 64M]")->check(bytes_validator);
  app.add_option("-f,--stepfactor", options.step_factor, "multiply the size by this between rows [2; smoke: 64]")
      ->check(CLI::PositiveNumber);
  app.add_option("-d,--datatype", type, "element type (half = float16, float = float32, double = float64)")
      ->check(CLI::IsMember(names(types)))->capture_default_str();
  app.add_option("-o,--op", op, "reduction")->check(CLI::IsMember(names(ops)))->capture_default_str();
  app.add_option("-r,--root", options.root, "root rank of reduce and broadcast")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("-n,--iters", options.iters, "calls per timed repetition")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", options.warmup_iters, "untimed calls first")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--repeats", options.repeats, "timed repetitions of -n calls; the median is reported")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("-G,--cudagraph", options.graph_calls,
                 "capture N back-to-back calls in a CUDA graph and time its replays (ceil(iters/N) per repetition); "
                 "0: plain launches")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("-z,--check", check, "check every result against a host reference (0|1)")->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("--json", options.json_path, "also write the configuration and every row to this JSON file");
  app.add_option("-t,--threads", options.threads, "ranks as threads of this process [every visible GPU]")
      ->check(CLI::PositiveNumber);
  app.add_option("--compare", compare, "run NCCL on the same GPUs, buffers and stream beside braid")
      ->check(CLI::IsMember({"nccl"}));
  app.add_option("--nccl-lib", options.nccl_lib, "NCCL library to dlopen")->capture_default_str();
  app.add_option("--inplace", options.in_place,
                 "0: out-of-place only, 1: in-place only, 2: both (sendrecv has no in-place form: n/a)")
      ->check(CLI::Range(0, 2))->capture_default_str();
  app.add_option("--symmetric", symmetric, "1: buffers from comm.alloc (zero-copy path); 0: cudaMalloc (staged)")
      ->check(CLI::Range(0, 1))->capture_default_str();
  app.add_option("--register", registered, "1: cudaMalloc buffers registered with comm.register_buffer (zero copy)")
      ->check(CLI::Range(0, 1))->capture_default_str();
  app.add_option("--timeout-s", options.timeout_s, "bound on every wait for a peer [BRAID_TIMEOUT_S]")
      ->check(CLI::PositiveNumber);
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
        options.moe_layouts.push_back(layout == "rank-major" ? MoeLayout::kRankMajor : MoeLayout::kExpertMajor);
      }
    }
    if (options.moe_top_k > options.moe_experts) {
      std::fprintf(stderr, "braid-bench: --top-k %d needs at least as many --experts (%d): experts are distinct\n",
                   options.moe_top_k, options.moe_experts);
      return 2;
    }
  }
  options.op = ops.at(op);
  options.check = check != 0;
  options.symmetric = symmetric != 0;
  options.registered = registered != 0;
  if (options.symmetric && options.registered) throw std::invalid_argument("--symmetric 1 and --register 1 exclude each other");
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
