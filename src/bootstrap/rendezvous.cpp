// Rendezvous from launcher conventions: braid-run, torchrun, Open MPI, MPICH/Hydra, Slurm.
//
// Each convention yields a LaunchInfo (rank, size, local rank/size, the launcher's job identifier);
// the store address is then chosen the same way for every launcher that does not serve one itself.
#include "bootstrap/rendezvous.hpp"

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>

#include "bootstrap/socket.hpp"
#include "core/config.hpp"
#include "core/hash.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

extern char** environ;

namespace braid {
namespace {

// Ports derived from a job identifier (single-host MPI/Slurm jobs) fall in [kDerivedPortBase,
// kDerivedPortBase + kDerivedPortSpan): above the well-known/registered services people usually
// run, below the usual Linux ephemeral range (32768-60999 overlaps; a collision only means rank 0
// fails to bind, with a clear error).
constexpr int kDerivedPortBase = 20000;
constexpr int kDerivedPortSpan = 40000;

constexpr const char* kNothingFound =
    "no launcher rendezvous found in the environment; looked for braid-run (BRAID_RANK, "
    "BRAID_WORLD_SIZE, BRAID_STORE_ADDR), torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), "
    "Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), MPICH/Hydra (PMI_RANK, PMI_SIZE) and "
    "Slurm (SLURM_PROCID, SLURM_NTASKS); launch with one of them or use Rendezvous::at_store()";

// Reads variables from one environment snapshot: BRAID_* through the config table (so there is
// one parser and one set of defaults), everything else directly.
class EnvReader {
 public:
  explicit EnvReader(const Environment& env) : env_(env), config_(Config::parse(env, nullptr)) {}

  const Config& config() const { return config_; }

  // A non-BRAID variable; empty values count as unset (wrappers often export "VAR=").
  std::optional<std::string> text(const char* name) const {
    auto it = env_.find(name);
    if (it == env_.end() || it->second.empty()) return std::nullopt;
    return it->second;
  }
  bool has(const char* name) const { return text(name).has_value(); }

  std::optional<int> integer(const char* name) const {
    std::optional<std::string> value = text(name);
    if (!value) return std::nullopt;
    return to_int(name, *value);
  }
  int required_integer(const char* name, const char* convention) const {
    std::optional<int> value = integer(name);
    if (!value) raise(ErrorCode::kInvalidArgument, "{} rendezvous: environment variable {} is not set", convention, name);
    return *value;
  }

  // A BRAID_* integer, narrowed to int (a value outside int's range is refused naming the variable).
  std::optional<int> braid_integer(const char* name) const {
    std::optional<int64_t> value = config_.integer_in(name, INT_MIN, INT_MAX);
    if (!value) return std::nullopt;
    return static_cast<int>(*value);
  }

 private:
  static int to_int(const char* name, const std::string& value) {
    char* end = nullptr;
    errno = 0;
    long long parsed = std::strtoll(value.c_str(), &end, 10);
    if (*end != '\0') {
      raise(ErrorCode::kInvalidArgument, "environment variable {}='{}' is not an integer", name, value);
    }
    if (errno == ERANGE || parsed < INT_MIN || parsed > INT_MAX) {
      raise(ErrorCode::kInvalidArgument, "environment variable {}='{}' is out of range", name, value);
    }
    return static_cast<int>(parsed);
  }

  const Environment& env_;
  Config config_;
};

// What a launcher convention says about this process, before the store is chosen.
struct LaunchInfo {
  const char* source = "";
  int rank = 0;
  int size = 0;
  int local_rank = 0;
  int local_size = 0;
  bool local_size_known = false;  // the launcher told us how many ranks share this host
  const char* local_size_variable = "";
  std::string job_key;            // the launcher's job identifier; empty when none was found
  std::string job_key_variables;  // where job_key is looked for, for messages
};

// Names of the variables of a convention, for range messages.
struct VariableNames {
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

void check_ranks(const LaunchInfo& info, const VariableNames& names) {
  if (info.size < 1) {
    raise(ErrorCode::kInvalidArgument, "environment variable {}={} must be at least 1", names.size, info.size);
  }
  if (info.rank < 0 || info.rank >= info.size) {
    raise(ErrorCode::kInvalidArgument, "environment variable {}={} is out of range: must be in [0, {}) ({}={})",
          names.rank, info.rank, info.size, names.size, info.size);
  }
  if (info.local_size < 1 || info.local_size > info.size) {
    raise(ErrorCode::kInvalidArgument, "environment variable {}={} is out of range: must be in [1, {}] ({}={})",
          names.local_size, info.local_size, info.size, names.size, info.size);
  }
  if (info.local_rank < 0 || info.local_rank >= info.local_size) {
    raise(ErrorCode::kInvalidArgument, "environment variable {}={} is out of range: must be in [0, {}) ({}={})",
          names.local_rank, info.local_rank, info.local_size, names.local_size, info.local_size);
  }
}

// Rank, size and local rank/size from a convention's four variables; local ones default to the
// global ones when absent (local_size_known records whether the launcher said).
LaunchInfo read_ranks(const EnvReader& reader, const char* source, const VariableNames& names) {
  LaunchInfo info;
  info.source = source;
  info.rank = reader.required_integer(names.rank, source);
  info.size = reader.required_integer(names.size, source);
  info.local_rank = reader.integer(names.local_rank).value_or(info.rank);
  std::optional<int> local_size = reader.integer(names.local_size);
  info.local_size_known = local_size.has_value();
  info.local_size = local_size.value_or(info.size);
  info.local_size_variable = names.local_size;
  return info;
}

// The first of `names` that is set.
std::optional<std::string> first_set(const EnvReader& reader, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (std::optional<std::string> value = reader.text(name)) return value;
  }
  return std::nullopt;
}


int derived_port(const std::string& job_key) {
  return kDerivedPortBase + static_cast<int>(stable_hash(job_key) % kDerivedPortSpan);
}

// MASTER_PORT plus BRAID_STORE_PORT_OFFSET: the launcher's own store (torchrun's) holds MASTER_PORT.
int master_store_port(const EnvReader& reader, const char* source) {
  int master_port = reader.required_integer("MASTER_PORT", source);
  if (master_port < 1 || master_port > 65535) {
    raise(ErrorCode::kInvalidArgument, "environment variable MASTER_PORT={} is not a port (1-65535)", master_port);
  }
  const int offset =
      static_cast<int>(reader.config().integer_in("BRAID_STORE_PORT_OFFSET", -65535, 65535).value_or(1));
  if (offset == 0) {
    raise(ErrorCode::kInvalidArgument,
          "environment variable BRAID_STORE_PORT_OFFSET=0 would put braid's store on MASTER_PORT={}, which the "
          "launcher's own store holds; leave it unset (1) or give another offset", master_port);
  }
  int port = master_port + offset;
  if (port < 1 || port > 65535) {
    raise(ErrorCode::kInvalidArgument,
          "MASTER_PORT={} plus BRAID_STORE_PORT_OFFSET={} gives {}, which is not a port (1-65535)", master_port,
          offset, port);
  }
  return port;
}

// "host:port" of a store every rank connects to: port 0 ("any free port") cannot be shared.
std::pair<std::string, int> parse_store_address(const std::string& text, const char* what) {
  std::pair<std::string, int> address = net::parse_host_port(text, what);
  if (address.second == 0) {
    raise(ErrorCode::kInvalidArgument, "{}: '{}' has port 0, but every rank must know the store's port", what, text);
  }
  return address;
}

// BRAID_STORE_ADDR, parsed, when set.
std::optional<std::pair<std::string, int>> store_override(const EnvReader& reader) {
  std::optional<std::string> address = reader.config().string("BRAID_STORE_ADDR");
  if (!address) return std::nullopt;
  return parse_store_address(*address, "BRAID_STORE_ADDR");
}

// The ranks of `info`, with rank 0 serving the store (every launcher but braid-run).
Rendezvous served_by_rank0(const LaunchInfo& info) {
  Rendezvous result;
  result.rank = info.rank;
  result.size = info.size;
  result.local_rank = info.local_rank;
  result.local_size = info.local_size;
  result.source = info.source;
  result.serve_store = info.rank == 0;
  return result;
}

// Store and job id for a launcher that does not serve a store itself (torchrun, MPI, Slurm):
// rank 0 serves it, at BRAID_STORE_ADDR, else MASTER_ADDR:MASTER_PORT+offset, else (one host only)
// at a loopback port derived from the launcher's job identifier.
Rendezvous finish_served_by_rank0(const EnvReader& reader, const LaunchInfo& info) {
  Rendezvous result = served_by_rank0(info);

  if (auto address = store_override(reader)) {
    std::tie(result.store_host, result.store_port) = *address;
  } else if (reader.has("MASTER_ADDR") && reader.has("MASTER_PORT")) {
    result.store_host = *reader.text("MASTER_ADDR");
    result.store_port = master_store_port(reader, info.source);
  } else if (!info.local_size_known || info.local_size != info.size) {
    std::string why = info.local_size_known
                          ? fmt::format("spans several hosts ({} ranks here of {})", info.local_size, info.size)
                          : fmt::format("may span several hosts ({} is not set)", info.local_size_variable);
    raise(ErrorCode::kInvalidArgument,
          "{} rendezvous: the job {}, so braid cannot pick a store address by itself; set BRAID_STORE_ADDR=host:port "
          "(rank 0 serves it) or MASTER_ADDR and MASTER_PORT",
          info.source, why);
  } else if (info.job_key.empty()) {
    raise(ErrorCode::kInvalidArgument,
          "{} rendezvous: none of {} is set, so braid cannot derive a store port for this job; set "
          "BRAID_STORE_ADDR=host:port (rank 0 serves it) or MASTER_ADDR and MASTER_PORT",
          info.source, info.job_key_variables);
  } else {
    result.store_host = "127.0.0.1";
    result.store_port = derived_port(std::string(info.source) + ":" + info.job_key);
  }

  if (!info.job_key.empty()) {
    result.job_id = std::string(info.source) + "-" + info.job_key;
  } else {
    result.job_id = fmt::format("{}-{}-{}", info.source, result.store_host, result.store_port);
  }
  return result;
}

std::optional<Rendezvous> from_braid_run(const EnvReader& reader) {
  if (!reader.config().is_set("BRAID_RANK")) return std::nullopt;
  LaunchInfo info;
  info.source = "braid-run";
  info.rank = *reader.braid_integer("BRAID_RANK");
  std::optional<int> size = reader.braid_integer("BRAID_WORLD_SIZE");
  if (!size) raise(ErrorCode::kInvalidArgument, "braid-run rendezvous: BRAID_RANK is set but BRAID_WORLD_SIZE is not");
  info.size = *size;
  info.local_rank = reader.braid_integer("BRAID_LOCAL_RANK").value_or(info.rank);
  info.local_size = reader.braid_integer("BRAID_LOCAL_SIZE").value_or(info.size);
  check_ranks(info, {"BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE"});

  std::optional<std::pair<std::string, int>> address = store_override(reader);
  if (!address) raise(ErrorCode::kInvalidArgument, "braid-run rendezvous: BRAID_RANK is set but BRAID_STORE_ADDR is not");

  Rendezvous result;
  result.rank = info.rank;
  result.size = info.size;
  result.local_rank = info.local_rank;
  result.local_size = info.local_size;
  std::tie(result.store_host, result.store_port) = *address;
  result.serve_store = false;  // braid-run serves the store; BRAID_JOB_ID is applied by the caller
  result.source = info.source;
  return result;
}

std::optional<Rendezvous> from_torchrun(const EnvReader& reader) {
  if (!reader.has("RANK") || !reader.has("WORLD_SIZE")) return std::nullopt;
  const VariableNames names{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
  LaunchInfo info = read_ranks(reader, "torchrun", names);
  check_ranks(info, names);

  Rendezvous result = served_by_rank0(info);

  // Without MASTER_ADDR the store is on this host, so every rank must be here.
  if (!reader.has("MASTER_ADDR") && !reader.config().is_set("BRAID_STORE_ADDR") && info.local_size != info.size) {
    raise(ErrorCode::kInvalidArgument,
          "torchrun rendezvous: environment variable MASTER_ADDR is not set, but the job spans several hosts "
          "(LOCAL_WORLD_SIZE={} of WORLD_SIZE={}); set MASTER_ADDR (or BRAID_STORE_ADDR=host:port)",
          info.local_size, info.size);
  }
  // The job's address: the master's, or, where BRAID_STORE_ADDR overrides the store and MASTER_PORT is not set,
  // the store's (MASTER_PORT is required only without the override).
  const std::string master_addr = reader.text("MASTER_ADDR").value_or("127.0.0.1");
  const std::optional<std::pair<std::string, int>> address = store_override(reader);
  std::string job_address;
  if (address && !reader.has("MASTER_PORT")) {
    job_address = fmt::format("{}-{}", address->first, address->second);
  } else {
    job_address = fmt::format("{}-{}", master_addr, reader.required_integer("MASTER_PORT", "torchrun"));
  }
  if (address) {
    std::tie(result.store_host, result.store_port) = *address;
  } else {
    result.store_host = master_addr;
    result.store_port = master_store_port(reader, "torchrun");
  }
  // torchrun's default run id is the literal "none" (static rendezvous), shared by every job on the
  // host, so it cannot tell jobs apart in the store's keys; the job's address can.
  std::optional<std::string> run_id = reader.text("TORCHELASTIC_RUN_ID");
  if (run_id && *run_id != "none") {
    result.job_id = "torchrun-" + *run_id;
  } else {
    result.job_id = "torchrun-" + job_address;
  }
  return result;
}

std::optional<Rendezvous> from_open_mpi(const EnvReader& reader) {
  if (!reader.has("OMPI_COMM_WORLD_RANK") || !reader.has("OMPI_COMM_WORLD_SIZE")) return std::nullopt;
  const VariableNames names{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                            "OMPI_COMM_WORLD_LOCAL_SIZE"};
  LaunchInfo info = read_ranks(reader, "openmpi", names);
  check_ranks(info, names);
  info.job_key = first_set(reader, {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}).value_or("");
  info.job_key_variables = "OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE";
  return finish_served_by_rank0(reader, info);
}

std::optional<Rendezvous> from_mpich(const EnvReader& reader) {
  if (!reader.has("PMI_RANK") || !reader.has("PMI_SIZE")) return std::nullopt;
  const VariableNames names{"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};
  LaunchInfo info = read_ranks(reader, "mpich", names);
  check_ranks(info, names);
  // Hydra names the job's key-value space; PMI_PORT (the PMI server's host:port) is unique per
  // running job on a host when the KVS name is not exported.
  info.job_key = first_set(reader, {"PMI_KVSNAME", "PMI_PORT", "PMIX_NAMESPACE"}).value_or("");
  info.job_key_variables = "PMI_KVSNAME, PMI_PORT, PMIX_NAMESPACE";
  return finish_served_by_rank0(reader, info);
}

// Tasks on node `node` from SLURM_TASKS_PER_NODE, e.g. "4(x2),3" -> 4, 4, 3.
std::optional<int> slurm_tasks_on_node(const std::string& text, int node) {
  size_t position = 0;
  while (position < text.size()) {
    size_t end = text.find(',', position);
    std::string field = text.substr(position, end == std::string::npos ? std::string::npos : end - position);
    char* rest = nullptr;
    long tasks = std::strtol(field.c_str(), &rest, 10);
    long repeat = 1;
    if (rest == field.c_str() || tasks < 1) return std::nullopt;
    if (*rest == '(') {
      if (rest[1] != 'x') return std::nullopt;
      repeat = std::strtol(rest + 2, &rest, 10);
      if (repeat < 1 || *rest != ')') return std::nullopt;
      ++rest;
    }
    if (*rest != '\0') return std::nullopt;
    if (node < repeat) return static_cast<int>(tasks);
    node -= static_cast<int>(repeat);
    if (end == std::string::npos) break;
    position = end + 1;
  }
  return std::nullopt;
}

// Ranks on this node: SLURM_NTASKS_PER_NODE, else all tasks on a one-node job, else this node's
// field of SLURM_TASKS_PER_NODE (the first field when SLURM_NODEID is unknown).
std::optional<int> slurm_local_size(const EnvReader& reader, int size) {
  if (std::optional<int> per_node = reader.integer("SLURM_NTASKS_PER_NODE")) return per_node;
  if (reader.integer("SLURM_NNODES") == 1) return size;
  std::optional<std::string> tasks_per_node = reader.text("SLURM_TASKS_PER_NODE");
  if (!tasks_per_node) return std::nullopt;
  int node = reader.integer("SLURM_NODEID").value_or(0);
  std::optional<int> tasks = slurm_tasks_on_node(*tasks_per_node, node);
  if (!tasks) {
    raise(ErrorCode::kInvalidArgument, "environment variable SLURM_TASKS_PER_NODE='{}' has no entry for node {}",
          *tasks_per_node, node);
  }
  return tasks;
}

std::optional<Rendezvous> from_slurm(const EnvReader& reader) {
  if (!reader.has("SLURM_PROCID") || !reader.has("SLURM_NTASKS")) return std::nullopt;
  LaunchInfo info;
  info.source = "slurm";
  info.rank = reader.required_integer("SLURM_PROCID", "slurm");
  info.size = reader.required_integer("SLURM_NTASKS", "slurm");
  info.local_rank = reader.integer("SLURM_LOCALID").value_or(info.rank);
  std::optional<int> local_size = slurm_local_size(reader, info.size);
  info.local_size_known = local_size.has_value();
  info.local_size = local_size.value_or(info.size);
  info.local_size_variable = reader.has("SLURM_NTASKS_PER_NODE")        ? "SLURM_NTASKS_PER_NODE"
                             : reader.integer("SLURM_NNODES") == 1 ? "SLURM_NTASKS"
                                                                    : "SLURM_TASKS_PER_NODE";
  check_ranks(info, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", info.local_size_variable});
  if (std::optional<std::string> job = reader.text("SLURM_JOB_ID")) {
    std::optional<std::string> step = reader.text("SLURM_STEP_ID");
    info.job_key = step ? *job + "." + *step : *job;
  }
  info.job_key_variables = "SLURM_JOB_ID";
  return finish_served_by_rank0(reader, info);
}

}  // namespace

Rendezvous rendezvous_from_environment(const Environment& env) {
  EnvReader reader(env);
  using Convention = std::optional<Rendezvous> (*)(const EnvReader&);
  for (Convention convention : {from_braid_run, from_torchrun, from_open_mpi, from_mpich, from_slurm}) {
    if (std::optional<Rendezvous> result = convention(reader)) {
      // BRAID_JOB_ID names the job under any launcher (braid-run sets it; users may too).
      // An empty value is unset, as every launcher variable's.
      std::optional<std::string> job_id = reader.config().string("BRAID_JOB_ID");
      if (job_id && !job_id->empty()) result->job_id = *job_id;
      return *result;
    }
  }
  // No convention has both its rank and its size: name the half-set one, else list them all.
  const std::pair<const char*, const char*> pairs[] = {{"BRAID_RANK", "BRAID_WORLD_SIZE"},
                                                       {"RANK", "WORLD_SIZE"},
                                                       {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                                       {"PMI_RANK", "PMI_SIZE"},
                                                       {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const auto& [rank, size] : pairs) {
    const bool has_rank = reader.has(rank), has_size = reader.has(size);
    if (has_rank != has_size) {
      raise(ErrorCode::kInvalidArgument, "launcher rendezvous: environment variable {} is set but {} is not",
            has_rank ? rank : size, has_rank ? size : rank);
    }
  }
  raise(ErrorCode::kInvalidArgument, "{}", kNothingFound);
}

Environment process_environment_map() {
  Environment env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    size_t eq = text.find('=');
    if (eq != std::string::npos) env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return env;
}

Rendezvous Rendezvous::from_env() {
  log_enabled(LogLevel::kWarn);  // prints, once, the warnings about unknown BRAID_* names (typos)
  return rendezvous_from_environment(process_environment_map());
}

Rendezvous Rendezvous::at_store(const std::string& store_address, int rank, int size, bool rank0_serves_store) {
  if (size < 1) raise_invalid_argument("Rendezvous::at_store", "size", "must be at least 1, got {}", size);
  if (rank < 0 || rank >= size) {
    raise_invalid_argument("Rendezvous::at_store", "rank", "must be in [0, {}) (size), got {}", size, rank);
  }
  Rendezvous result;
  std::tie(result.store_host, result.store_port) =
      parse_store_address(store_address, "Rendezvous::at_store: argument 'store_address'");
  result.rank = rank;
  result.size = size;
  result.local_rank = rank;
  result.local_size = size;
  result.serve_store = rank0_serves_store && rank == 0;
  result.source = "explicit";
  return result;
}

std::string store_bind_host(const std::string& host) {
  std::string bare = host;
  if (bare.size() > 2 && bare.front() == '[' && bare.back() == ']') bare = bare.substr(1, bare.size() - 2);
  // Every address of the name (localhost: 127.0.0.1 and ::1), so that no other process can take one the ranks
  // dial; beyond loopback, every interface of both families ("").
  return net::is_loopback_host(bare) ? bare : "";
}

}  // namespace braid
