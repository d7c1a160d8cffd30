#include "report.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>  // environ

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

namespace braid::bench {
namespace {

// nccl-tests' widths: time with two decimals until it no longer fits.
std::string format_time(double us) {
  char text[32];
  std::snprintf(text, sizeof(text), us < 10000 ? "%.2f" : "%.0f", us);
  return text;
}

std::string format_wrong(const std::optional<uint64_t>& wrong) {
  return wrong ? std::to_string(*wrong) : std::string("N/A");
}

nlohmann::json timing_json(const Timing& timing) {
  if (!timing.ran) return nullptr;
  nlohmann::json value{{"time_us", timing.time_us}, {"algbw_gbs", timing.algbw}, {"busbw_gbs", timing.busbw}};
  value["wrong"] = timing.wrong ? nlohmann::json(*timing.wrong) : nlohmann::json(nullptr);
  return value;
}

nlohmann::json placement_json(const Placement& placement) {
  if (!placement.braid.ran && !placement.nccl.ran) return nullptr;
  nlohmann::json value{{"braid", timing_json(placement.braid)}, {"nccl", timing_json(placement.nccl)}};
  const std::optional<double> ratio = placement.ratio();
  value["time_ratio_braid_over_nccl"] = ratio ? nlohmann::json(*ratio) : nlohmann::json(nullptr);
  return value;
}

}  // namespace

std::optional<double> Placement::ratio() const {
  if (!braid.ran || !nccl.ran || nccl.time_us <= 0) return std::nullopt;
  return braid.time_us / nccl.time_us;
}

std::map<std::string, std::string> braid_settings() {
  // Where the ranks are and how they meet (set by braid-run for every rank), which no measurement depends on,
  // and the job's secret, which no file may hold.
  static const std::set<std::string> kLaunch = {"BRAID_COMMIT",     "BRAID_RANK",      "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK",
                                                "BRAID_LOCAL_SIZE", "BRAID_STORE_ADDR", "BRAID_JOB_ID",     "BRAID_JOB_SECRET"};
  std::map<std::string, std::string> settings;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const char* equals = std::strchr(*entry, '=');
    if (equals == nullptr || std::strncmp(*entry, "BRAID_", 6) != 0) continue;
    const std::string name(*entry, static_cast<size_t>(equals - *entry));
    if (kLaunch.count(name) == 0) settings[name] = equals + 1;
  }
  return settings;
}

Timing make_timing(Collective coll, size_t bytes, int ranks, double time_us, std::optional<uint64_t> wrong) {
  Timing timing;
  timing.ran = true;
  timing.time_us = time_us;
  timing.algbw = time_us > 0 ? static_cast<double>(bytes) / (time_us * 1e3) : 0;  // bytes/us/1e3 = GB/s
  timing.busbw = timing.algbw * bus_factor(coll, ranks);
  timing.wrong = wrong;
  return timing;
}

Report::Report(const Options& options, RunInfo info) : options_(options), info_(std::move(info)) {}

void Report::header() const {
  std::string ops = options_.coll == "all" || has_op(options_.collectives[0]) ? reduce_op_name(options_.op) : "none";
  std::printf("# braid-bench: %s %s %s ranks=%d graph=%d buffers=%s nccl=%s\n", options_.coll.c_str(),
              datatype_name(options_.type), ops.c_str(), info_.ranks, options_.graph_calls,
              buffers_name(options_),
              info_.nccl_version.empty() ? "off" : info_.nccl_version.c_str());
  if (!info_.commit.empty()) std::printf("# commit %s\n", info_.commit.c_str());
  if (!info_.nccl_path.empty()) std::printf("# nccl library %s\n", info_.nccl_path.c_str());
  for (size_t rank = 0; rank < info_.gpus.size(); ++rank) {
    std::printf("#   rank %zu: %s\n", rank, info_.gpus[rank].c_str());
  }
  const std::string step = options_.step_bytes > 0 ? "+" + std::to_string(options_.step_bytes)
                                                   : "x" + std::to_string(options_.step_factor);
  std::printf("# sizes %zu..%zu bytes %s; %d warm-up calls; per size and placement, %d repetitions of %d calls",
              options_.min_bytes, options_.max_bytes, step.c_str(), options_.warmup_iters, options_.repeats,
              options_.iters);
  if (options_.graph_calls > 0) {
    std::printf(" (as replays of a CUDA graph of %d calls)", options_.graph_calls);
  }
  std::printf("\n# time = %s; algbw = size / time;\n", time_description(options_).c_str());
  std::printf("# busbw = algbw * nccl-tests' factor; #wrong = elements outside the reference, summed over ranks%s\n",
              options_.check ? "" : " (N/A: -c 0)");
  if (!info_.nccl_version.empty()) {
    std::printf("# nccl_* columns: NCCL on the same GPUs, buffers and stream; ratio = braid time / NCCL time\n");
  }
  std::fflush(stdout);
}

// Column formats: a row and its two header lines use the same widths.
constexpr const char* kImplColumns = "  %7s  %6s  %6s  %6s";     // time algbw busbw #wrong (33 wide)
constexpr const char* kNcclColumns = "  %8s  %7s  %7s  %7s  %6s";  // + NCCL's, and the ratio (45 wide)

static std::string columns(const char* format, const char* a, const char* b, const char* c, const char* d,
                    const char* e = "") {
  char text[128];
  std::snprintf(text, sizeof(text), format, a, b, c, d, e);
  return text;
}

void Report::begin(Collective coll) const {
  const bool nccl = !info_.nccl_version.empty();
  std::string placements, titles, units;
  for (int placement = 0; placement < 2; ++placement) {
    if ((placement == 0 && !options_.out_of_place()) || (placement == 1 && !options_.in_place_too())) continue;
    std::string title = columns(kImplColumns, "time", "algbw", "busbw", "#wrong");
    std::string unit = columns(kImplColumns, "(us)", "(GB/s)", "(GB/s)", "");
    if (nccl) {
      title += columns(kNcclColumns, "nccl_us", "n_algbw", "n_busbw", "n_wrong", "ratio");
      unit += columns(kNcclColumns, "(us)", "(GB/s)", "(GB/s)", "", "");
    }
    const std::string name = placement == 0 ? "out-of-place" : "in-place";
    std::string centred(title.size(), ' ');
    centred.replace((title.size() - name.size()) / 2, name.size(), name);
    placements += centred;
    titles += title;
    units += unit;
  }
  std::printf("#\n# %s\n", collective_name(coll));
  if (options_.in_place_too() && !has_in_place(coll)) {
    std::printf("# in-place: n/a (%s has no in-place form: braid and NCCL refuse overlapping send and recv)\n",
                collective_name(coll));
  }
  std::printf("# %50s%s\n", "", placements.c_str());
  std::printf("# %10s  %12s  %8s  %6s  %6s%s\n", "size", "count", "type", "redop", "root", titles.c_str());
  std::printf("# %10s  %12s  %8s  %6s  %6s%s\n", "(B)", "(elements)", "", "", "", units.c_str());
  std::fflush(stdout);
}

void Report::note(const std::string& text) const {
  std::printf("# %s\n", text.c_str());
  std::fflush(stdout);
}

void Report::row(const Row& row) {
  const bool nccl = !info_.nccl_version.empty();
  std::printf("%12zu  %12zu  %8s  %6s  %6d", row.bytes, row.count, datatype_name(row.type),
              has_op(row.coll) ? reduce_op_name(row.op) : "none", row.root);
  for (int placement = 0; placement < 2; ++placement) {
    if ((placement == 0 && !options_.out_of_place()) || (placement == 1 && !options_.in_place_too())) continue;
    const Placement& p = placement == 0 ? row.out_of_place : row.in_place;
    if (!p.braid.ran && !p.nccl.ran) {  // a placement the collective does not have (in-place alltoall)
      std::printf("%s", columns(kImplColumns, "n/a", "n/a", "n/a", "n/a").c_str());
      if (nccl) std::printf("%s", columns(kNcclColumns, "n/a", "n/a", "n/a", "n/a", "n/a").c_str());
      continue;
    }
    std::printf("  %7s  %6.2f  %6.2f  %6s", format_time(p.braid.time_us).c_str(), p.braid.algbw, p.braid.busbw,
                format_wrong(p.braid.wrong).c_str());
    if (nccl) {
      const std::optional<double> ratio = p.ratio();
      std::printf("  %8s  %7.2f  %7.2f  %7s  %6.2f", format_time(p.nccl.time_us).c_str(), p.nccl.algbw, p.nccl.busbw,
                  format_wrong(p.nccl.wrong).c_str(), ratio ? *ratio : 0.0);
    }
  }
  std::printf("\n");
  std::fflush(stdout);
  rows_.push_back(row);
}

void Report::summary() const {
  const bool nccl = !info_.nccl_version.empty();
  uint64_t wrong[2] = {0, 0};
  double busbw[2] = {0, 0};
  int timed[2] = {0, 0};
  for (const Row& row : rows_) {
    for (const Placement* placement : {&row.out_of_place, &row.in_place}) {
      const Timing* impls[2] = {&placement->braid, &placement->nccl};
      for (int i = 0; i < 2; ++i) {
        if (!impls[i]->ran) continue;
        wrong[i] += impls[i]->wrong.value_or(0);
        busbw[i] += impls[i]->busbw;
        ++timed[i];
      }
    }
  }
  std::printf("# Out of bounds values : %llu %s", static_cast<unsigned long long>(wrong[0]), wrong[0] == 0 ? "OK" : "FAILED");
  if (nccl) std::printf(" (NCCL: %llu)", static_cast<unsigned long long>(wrong[1]));
  std::printf("\n# Avg bus bandwidth    : %g\n", timed[0] > 0 ? busbw[0] / timed[0] : 0.0);
  if (nccl) std::printf("# Avg bus bandwidth (NCCL) : %g\n", timed[1] > 0 ? busbw[1] / timed[1] : 0.0);
  std::printf("#\n");
  std::fflush(stdout);
}

void Report::write_json(const std::string& path) const {
  nlohmann::json config{
      {"coll", options_.coll},
      {"type", datatype_name(options_.type)},
      {"op", reduce_op_name(options_.op)},
      {"root", options_.root},
      {"ranks", info_.ranks},
      {"launch", info_.launch},
      {"graph", options_.graph_calls},
      {"iters", options_.iters},
      {"warmup_iters", options_.warmup_iters},
      {"repeats", options_.repeats},
      {"check", options_.check},
      {"in_place", options_.in_place},
      {"buffers", buffers_name(options_)},
      {"min_bytes", options_.min_bytes},
      {"max_bytes", options_.max_bytes},
      {"step_factor", options_.step_factor},
      {"step_bytes", options_.step_bytes},
      {"average", options_.average},
      {"blocking", options_.blocking},
      {"gpus", info_.gpus},
      {"time", time_description(options_)},
  };
  config["settings"] = braid_settings();
  config["commit"] = info_.commit.empty() ? nlohmann::json(nullptr) : nlohmann::json(info_.commit);
  config["nccl_version"] = info_.nccl_version.empty() ? nlohmann::json(nullptr) : nlohmann::json(info_.nccl_version);
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& row : rows_) {
    rows.push_back({{"coll", collective_name(row.coll)},
                    {"size", row.bytes},
                    {"count", row.count},
                    {"type", datatype_name(row.type)},
                    {"redop", has_op(row.coll) ? reduce_op_name(row.op) : "none"},
                    {"root", row.root},
                    {"out_of_place", placement_json(row.out_of_place)},
                    {"in_place", placement_json(row.in_place)}});
  }
  std::ofstream file(path);
  file << nlohmann::json{{"tool", "braid-bench"}, {"config", config}, {"rows", rows}}.dump(2) << "\n";
  if (!file) throw std::runtime_error("cannot write --json file " + path);
}

}  // namespace braid::bench
