// What rank 0 prints and writes: nccl-tests-style '#' header lines and rows, and the --json file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "collective.hpp"
#include "options.hpp"

namespace braid::bench {

// One implementation's numbers for one row and placement (out-of-place or in-place).
struct Timing {
  bool ran = false;
  double time_us = 0;  // per call: max over ranks of each rank's median
  double algbw = 0;    // GB/s: size / time
  double busbw = 0;    // GB/s: algbw * bus_factor
  std::optional<uint64_t> wrong;  // elements wrong, summed over ranks; nothing when not checked
};

struct Placement {
  Timing braid, nccl;
  std::optional<double> ratio() const;  // braid time / NCCL time, when both ran
};

struct Row {
  Collective coll = Collective::kAllReduce;
  size_t bytes = 0;
  size_t count = 0;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = -1;  // -1: the collective has none
  Placement out_of_place, in_place;
};

// Facts about the run, gathered by rank 0 before the first row.
struct RunInfo {
  int ranks = 0;
  std::string launch;             // "threads" (ranks of one process, -t) or "processes" (braid-run)
  std::vector<std::string> gpus;  // per rank: "GPU <ordinal> <name> (<pci bus id>)"
  std::string nccl_version;       // empty: NCCL not compared
  std::string nccl_path;
  std::string commit;             // BRAID_COMMIT, when set
};

// The BRAID_* variables of this process's environment but BRAID_COMMIT, those braid-run sets for every rank and the
// job's secret: written into --json files so that a run under changed settings (a forced algorithm, say) is never
// read as the defaults.
std::map<std::string, std::string> braid_settings();

Timing make_timing(Collective coll, size_t bytes, int ranks, double time_us, std::optional<uint64_t> wrong);

class Report {
 public:
  Report(const Options& options, RunInfo info);
  void header() const;                          // the run's '#' lines
  void begin(Collective coll) const;            // a collective's column headers
  void note(const std::string& text) const;     // one '#' line
  void row(const Row& row);                     // prints it and keeps it for the JSON file
  // nccl-tests' closing lines: the wrong elements of every row (braid's; NCCL's beside them when compared) and
  // the mean bus bandwidth over every row and placement that ran.
  void summary() const;
  void write_json(const std::string& path) const;  // throws std::runtime_error when it cannot write

 private:
  const Options& options_;
  RunInfo info_;
  std::vector<Row> rows_;
};

}  // namespace braid::bench
