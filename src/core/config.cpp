#include "core/config.hpp"

#include <algorithm>
#include <cstdlib>

#include "core/error.hpp"

extern char** environ;

namespace braid {
namespace {

// THE table. Add a variable here and a row to docs/config.md (test_config checks both agree).
constexpr ConfigVar kTable[] = {
    {"BRAID_LOG_LEVEL", ConfigType::kEnum, "warn", "error|warn|info|debug|trace",
     "Least severe log level printed to stderr; each line is prefixed with host and rank."},
    {"BRAID_TIMEOUT_S", ConfigType::kDouble, "300", nullptr,
     "Bound, in seconds, on every wait for a peer (store, bootstrap, fd passing, device spins)."},
    {"BRAID_RANK", ConfigType::kInt, nullptr, nullptr,
     "Rank of this process in the job (set by braid-run)."},
    {"BRAID_WORLD_SIZE", ConfigType::kInt, nullptr, nullptr,
     "Number of ranks in the job (set by braid-run)."},
    {"BRAID_LOCAL_RANK", ConfigType::kInt, nullptr, nullptr,
     "Rank among the ranks of this host; selects the GPU (set by braid-run)."},
    {"BRAID_LOCAL_SIZE", ConfigType::kInt, nullptr, nullptr,
     "Number of ranks on this host (set by braid-run)."},
    {"BRAID_STORE_ADDR", ConfigType::kString, nullptr, nullptr,
     "host:port of the bootstrap store; overrides every launcher convention. Set by braid-run, which serves it."},
    {"BRAID_RESOLVE_TIMEOUT_S", ConfigType::kDouble, "30", nullptr,
     "Bound, in seconds, on retrying a store host name that does not resolve (a DNS record that appears late); "
     "connection attempts to a name that resolves go on until BRAID_TIMEOUT_S."},
    {"BRAID_STORE_PORT_OFFSET", ConfigType::kInt, "1", nullptr,
     "Under torchrun (and other MASTER_ADDR/MASTER_PORT launchers), rank 0 serves braid's store on "
     "MASTER_PORT plus this offset, since the launcher's own store holds MASTER_PORT."},
    {"BRAID_JOB_SECRET", ConfigType::kString, nullptr, nullptr,
     "Secret every connection to the job's store proves it knows (an HMAC challenge both ways; never sent, never "
     "logged); at least 16 bytes. Set by braid-run; unset: the store takes any client of its own uid on this host, "
     "and any client of another host, that reaches it."},
    {"BRAID_STORE_BUDGET_BYTES", ConfigType::kInt, "268435456", nullptr,
     "Bytes the bootstrap store served in this process may hold in all (stored keys and values, requests being "
     "received, replies not yet read, keys of waiting requests); a request beyond first drops the clients holding "
     "more of it than its own and at least 1/64 of it, where that makes room, and is otherwise refused with an error naming this variable."},
    {"BRAID_STORE_MAX_VALUE_BYTES", ConfigType::kInt, "16777216", nullptr,
     "Largest value one key of the bootstrap store served in this process may hold; a larger SET is refused with "
     "an error naming this variable."},
    {"BRAID_JOB_ID", ConfigType::kString, nullptr, nullptr,
     "Identifier of the job, used to namespace its keys in the bootstrap store (set by braid-run; derived from the "
     "launcher's job variables when unset)."},
    {"BRAID_DEVICE", ConfigType::kInt, nullptr, nullptr,
     "CUDA device ordinal for this rank; default: local rank."},
    {"BRAID_STAGING_BYTES", ConfigType::kInt, "33554432", nullptr,
     "Bytes of each rank's symmetric staging buffer, made at communicator init; larger collectives run in chunks."},
    {"BRAID_COMMIT", ConfigType::kString, nullptr, nullptr,
     "Read by the benchmarks only (braid-bench, bench/tp_overlap.py): the source commit they write into their "
     "output's header and JSON rows (set by bench/ scripts)."},
    {"BRAID_PIPELINE_BYTES", ConfigType::kInt, "268435456", nullptr,
     "Bytes of each rank's symmetric pipeline buffer (FIFOs of the pipelined collectives), made at communicator init."},
    {"BRAID_ALGO", ConfigType::kString, nullptr, nullptr,
     "Algorithm overrides, e.g. allreduce=twoshot,alltoall=copyengine; default: the selection table."},
    {"BRAID_MAX_BLOCKS", ConfigType::kInt, "0", nullptr,
     "Cap, 1 to 64, on the thread blocks of every collective and send/recv launch; 0: the selection table's widths."},
    {"BRAID_BACKEND", ConfigType::kEnum, "auto", "auto|cuda|nccl",
     "Backend of a communicator's collectives. auto: the CUDA backend when every rank is on one host and every "
     "pair is P2P-reachable, otherwise NCCL."},
    {"BRAID_NCCL_LIBRARY", ConfigType::kString, "libnccl.so.2", nullptr,
     "NCCL library the NCCL backend dlopens: a path, or a name looked for by the loader, in every LD_LIBRARY_PATH "
     "folder, in the CUDA toolkit's lib folders and in python3's site-packages (nvidia/nccl/lib); braid's NCCL shim "
     "is passed over."},
    {"BRAID_CUBLASLT_LIBRARY", ConfigType::kString, "libcublasLt.so.13", nullptr,
     "cuBLASLt library the fused GEMM calls (FusedMatmul) dlopen: a path, or a name looked for by the loader, in "
     "every LD_LIBRARY_PATH folder, in the CUDA toolkit's lib folders and in python3's site-packages "
     "(nvidia/cu13/lib, nvidia/cublas/lib)."},
    {"BRAID_GEMM_TUNING", ConfigType::kEnum, "on", "on|cublaslt|off",
     "on: each GEMM shape of the fused calls (FusedMatmul) times its candidates where it runs (cuBLASLt's first 4 "
     "algorithms, and braid's Hopper GEMM where the GPU and the shape allow it), on its first runs outside CUDA "
     "graph captures (3 each), and its first run after those have completed keeps the fastest (ranks may settle on "
     "different candidates, whose roundings may differ); cublaslt: the same among cuBLASLt's 4 alone; off: "
     "cuBLASLt's first candidate on every run."},
    {"BRAID_ALL_GATHER_MATMUL", ConfigType::kEnum, "pieces", "pieces|loads",
     "How FusedMatmul::all_gather_matmul runs. pieces: a GEMM of this rank's rows beside the copy engines' copies "
     "of them into the peers' workspace, then a GEMM of the peers' rows. loads: one launch of braid's Hopper GEMM "
     "that sends this rank's rows to its peers while it multiplies them, each load of a peer's rows waiting for "
     "them, where every rank runs it (compute capability 9.0, BRAID_GEMM_TUNING on, B Layout::kTransposed, rows per "
     "rank a multiple of 128, k and n multiples of 8, 2 to 8 ranks; other calls take the pieces). Set it alike on "
     "every rank."},
    {"BRAID_MATMUL_REDUCE_SCATTER", ConfigType::kEnum, "pieces", "pieces|epilogue|engines",
     "How FusedMatmul::matmul_reduce_scatter runs. pieces: GEMMs of chunks of rows, the copy engines moving each "
     "to its owner beside the next. epilogue: one launch of braid's Hopper GEMM whose epilogue stores the peers' rows "
     "into their workspace and adds the rows received. engines: one launch of braid's Hopper GEMM that computes the "
     "peers' rows first, the copy engines carrying each chunk of them to its owner as soon as it is stored, and adds "
     "the rows received. epilogue and engines run where every rank runs them (compute capability 9.0, "
     "BRAID_GEMM_TUNING on, B Layout::kTransposed, rows per rank a multiple of 128, k and n multiples of 8, 2 to 8 "
     "ranks; other calls take the pieces). Set it alike on every rank."},
    {"BRAID_AUTO_REGISTER", ConfigType::kEnum, "1", "0|1",
     "1: a collective captured into a CUDA graph with buffers neither symmetric nor registered maps the peers' "
     "allocations at capture time (every rank joins one exchange per buffer), so its replays take the paths of "
     "registered buffers; the graph holds the mappings until it is destroyed. 0: such calls are staged. Eager "
     "calls are not affected."},
    {"BRAID_EAGER_ZERO_COPY", ConfigType::kEnum, "0", "0|1",
     "1: register_buffer also exposes the range to every peer (VMM memory; cudaMalloc memory where the ranks are "
     "threads of one process), and every eager all-gather, reduce-scatter, all-reduce and all-to-all whose buffers "
     "are not symmetric memory, at the sizes where that pays (docs/registration.md), runs one kernel that "
     "announces at its entry barrier where each rank's buffers lie: zero copy where every rank's are exposed, else "
     "staged inside that kernel; buffers of 4 MiB or more that nobody registered but whole VMM allocations back "
     "(PyTorch's expandable segments) are exposed at their first use; no eager call exchanges a registered buffer "
     "(other calls stage registered buffers). Every rank must set the same value (init refuses a mismatch). 0: "
     "registration stays local and such calls take the selection table's paths."},
    {"BRAID_NCCL_REGISTER", ConfigType::kEnum, "try", "try|yes|no",
     "Whether the NCCL backend registers user buffers with NCCL (ncclCommRegister, NCCL 2.19+) on their first "
     "collective. try: where it can; yes: a failure is an error; no: never."},
    {"BRAID_NCCL_WATCHDOG", ConfigType::kEnum, "on", "on|off",
     "on: every NCCL-backend operation is bounded by BRAID_TIMEOUT_S (an event per call, polled by a thread; a "
     "stuck one aborts the NCCL communicator); off: NCCL's waits are unbounded, and eager calls cost less."},
    {"BRAID_PRELOAD_KERNELS", ConfigType::kEnum, "on", "on|off",
     "on: communicator init loads every braid kernel into its GPU's context, so no later launch waits for a lazy "
     "load (which can wait for the GPU to go idle); off: kernels load on first launch (CUDA_MODULE_LOADING)."},
    {"BRAID_LL128", ConfigType::kEnum, "on", "on|off",
     "on: LL128 lines (the all-reduce's ll128 rows, send/recv pairs of at most 256 KiB, MoE low-latency dispatch) "
     "where every pair of GPUs reports native P2P atomics (NVLink); off: never on this communicator (any rank's off "
     "turns them off on all)."},
    {"BRAID_CHECK_POINTERS", ConfigType::kEnum, "on", "on|off",
     "on: every call asks CUDA (cudaPointerGetAttributes) whether each buffer is device memory this rank's GPU can "
     "use, and refuses one that is not naming the argument; off: only null buffers are refused (NCCL's default)."},
    {"BRAID_ALLOW_SHARED_GPU", ConfigType::kEnum, "0", "0|1",
     "1: ranks may share a GPU (to test N ranks on fewer GPUs; timings then mean nothing); 0: refused at init."},
    {"BRAID_ENABLE_MULTICAST", ConfigType::kEnum, "0", "0|1",
     "1: NVLink multicast (NVLS) collectives where every GPU reports support; never on a shared GPU host."},
    {"BRAID_MULTICAST_BYTES", ConfigType::kInt, "33554432", nullptr,
     "Bytes of each rank's memory bound to the multicast object (two halves), made at init when multicast is on."},
    {"BRAID_SHIM_FALLBACK", ConfigType::kString, nullptr, nullptr,
     "NCCL shim: calls the real NCCL serves even where braid could, a comma-separated list of allreduce, reduce, "
     "reducescatter, allgather, broadcast, alltoall, sendrecv (sends, receives, gather, scatter), or all."},
};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::map<std::string, std::string> process_environment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    size_t eq = text.find('=');
    if (eq != std::string::npos) env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return env;
}

}  // namespace

std::span<const ConfigVar> config_table() { return kTable; }

std::vector<std::string> close_config_names(const std::string& unknown) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const ConfigVar& var : kTable) {
    size_t distance = edit_distance(unknown, var.name);
    if (distance <= 3) scored.emplace_back(distance, var.name);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> names;
  for (auto& [distance, name] : scored) names.push_back(name);
  return names;
}

Config Config::parse(const std::map<std::string, std::string>& env, std::vector<std::string>* warnings) {
  Config config;
  for (const auto& [name, value] : env) {
    if (name.rfind("BRAID_", 0) != 0) continue;
    bool known = std::any_of(std::begin(kTable), std::end(kTable),
                             [&](const ConfigVar& var) { return name == var.name; });
    if (known) {
      config.values_[name] = value;
    } else if (warnings != nullptr) {
      std::vector<std::string> close = close_config_names(name);
      std::string message = fmt::format("unknown environment variable {} is ignored", name);
      if (!close.empty()) message += fmt::format("; did you mean {}?", fmt::join(close, " or "));
      warnings->push_back(message);
    }
  }
  return config;
}

namespace {
struct EnvironmentSnapshot {
  std::vector<std::string> warnings;
  Config config;
};
const EnvironmentSnapshot& environment_snapshot() {
  static const EnvironmentSnapshot snapshot = [] {
    EnvironmentSnapshot parsed;
    parsed.config = Config::parse(process_environment(), &parsed.warnings);
    return parsed;
  }();
  return snapshot;
}
}  // namespace

const Config& Config::get() { return environment_snapshot().config; }

const std::vector<std::string>& Config::environment_warnings() { return environment_snapshot().warnings; }

const ConfigVar& Config::lookup(const char* name) const {
  for (const ConfigVar& var : kTable) {
    if (std::string_view(name) == var.name) return var;
  }
  raise(ErrorCode::kInternal, "configuration variable {} is not in braid's table", name);
}

bool Config::is_set(const char* name) const {
  lookup(name);
  return values_.count(name) != 0;
}

std::optional<std::string> Config::string(const char* name) const {
  const ConfigVar& var = lookup(name);
  auto it = values_.find(name);
  if (it != values_.end()) {
    if (var.type == ConfigType::kEnum) {
      std::string choices = std::string("|") + var.choices + "|";
      if (it->second.empty() || choices.find("|" + it->second + "|") == std::string::npos) {
        raise(ErrorCode::kInvalidArgument, "environment variable {}='{}' is not one of {}", name, it->second,
              var.choices);
      }
    }
    return it->second;
  }
  if (var.default_value != nullptr) return std::string(var.default_value);
  return std::nullopt;
}

std::optional<int64_t> Config::integer(const char* name) const {
  std::optional<std::string> text = string(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text->c_str(), &end, 10);
  if (text->empty() || *end != '\0' || errno == ERANGE) {
    raise(ErrorCode::kInvalidArgument, "environment variable {}='{}' is not an integer", name, *text);
  }
  return value;
}

std::optional<int64_t> Config::integer_in(const char* name, int64_t min, int64_t max) const {
  std::optional<int64_t> value = integer(name);
  if (value && (*value < min || *value > max)) {
    raise(ErrorCode::kInvalidArgument, "environment variable {}={} is out of range: it must be {} to {}", name, *value,
          min, max);
  }
  return value;
}

std::optional<double> Config::real(const char* name) const {
  std::optional<std::string> text = string(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(text->c_str(), &end);
  if (text->empty() || *end != '\0') {
    raise(ErrorCode::kInvalidArgument, "environment variable {}='{}' is not a number", name, *text);
  }
  return value;
}

double timeout_seconds() {
  double seconds = *Config::get().real("BRAID_TIMEOUT_S");
  if (!(seconds >= kMinTimeoutS && seconds <= kMaxTimeoutS)) {
    raise(ErrorCode::kInvalidArgument, "environment variable BRAID_TIMEOUT_S={} must be at least {:g} and at most {:g}",
          seconds, kMinTimeoutS, kMaxTimeoutS);
  }
  return seconds;
}

double timeout_seconds(double chosen, const char* name) {
  if (chosen == 0) return timeout_seconds();
  if (!(chosen >= kMinTimeoutS && chosen <= kMaxTimeoutS)) {
    raise(ErrorCode::kInvalidArgument, "'{}' is {} s; it must be at least {:g} and at most {:g} (0: BRAID_TIMEOUT_S)",
          name, chosen, kMinTimeoutS, kMaxTimeoutS);
  }
  return chosen;
}

bool eager_zero_copy_enabled() { return Config::get().string("BRAID_EAGER_ZERO_COPY").value_or("0") == "1"; }

}  // namespace braid
