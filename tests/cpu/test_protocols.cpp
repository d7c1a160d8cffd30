// The protocol registry (collectives/protocols.hpp) against the selection table, the planner, BRAID_ALGO and the
// launch functions: no protocol the table or the planner can choose lacks a row, no row is out of their reach, and
// every launch function is some row's. No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "braid/types.hpp"
#include "collectives/planner.hpp"
#include "collectives/protocols.hpp"
#include "collectives/selection.hpp"
#include "core/error.hpp"

namespace braid::collectives {
namespace {

constexpr Collective kCollectives[] = {Collective::kAllReduce, Collective::kReduce,   Collective::kReduceScatter,
                                       Collective::kAllGather, Collective::kBroadcast, Collective::kAllToAll,
                                       Collective::kAllToAllv, Collective::kSendRecv};
constexpr Algorithm kAlgorithms[] = {Algorithm::kLL,         Algorithm::kOneShot,   Algorithm::kTwoShot,
                                     Algorithm::kPipelined,  Algorithm::kStaged,    Algorithm::kCopyEngine,
                                     Algorithm::kMulticast,  Algorithm::kSplit,     Algorithm::kLL128};

// BRAID_ALGO's names of the collectives (docs/config.md).
const std::map<Collective, std::string> kAlgoNames = {
    {Collective::kAllReduce, "allreduce"}, {Collective::kReduce, "reduce"},       {Collective::kReduceScatter, "reducescatter"},
    {Collective::kAllGather, "allgather"}, {Collective::kBroadcast, "broadcast"}, {Collective::kAllToAll, "alltoall"},
    {Collective::kAllToAllv, "alltoallv"}, {Collective::kSendRecv, "sendrecv"}};

std::string name_of(const Protocol& row) {
  return std::string(collective_name(static_cast<unsigned int>(row.collective))) + " " + algorithm_name(row.algorithm) +
         " (" + buffer_mode_name(row.mode) + ")";
}

// Sizes around every cut-off of the table, and the areas of a default 2-rank communicator with room for every
// protocol (a multicast region and send/recv's line and engine slots).
std::set<size_t> swept_sizes() {
  std::set<size_t> sizes{0, 1, 16};
  for (int shift = 4; shift <= 30; ++shift) {
    const size_t size = size_t(1) << shift;
    sizes.insert({size - 16, size, size + 16});
  }
  return sizes;
}
constexpr AreaCapacities kAreas{size_t(16) << 20, size_t(1) << 20, size_t(16) << 20, size_t(1) << 20,
                                size_t(256) << 10, size_t(8) << 20, true};

std::vector<BufferFacts> every_facts() {
  std::vector<BufferFacts> all;
  for (int bits = 0; bits < 64; ++bits) {
    all.push_back(BufferFacts{.peers_map = (bits & 1) != 0, .peers_map_output = (bits & 2) != 0,
                              .same_process_peers = (bits & 4) != 0, .in_place = (bits & 8) != 0,
                              .one_sided = (bits & 16) != 0, .announced = (bits & 32) != 0});
  }
  return all;
}

// Every plan the planner makes over the sweep, with and without each override, for every fact the lookups give, at
// every world from one rank up: none raises (a plan the table, the gates and the rows' worlds leave without a row
// is kInternal) and each row serves the plan's world.
std::set<const Protocol*> planned_rows() {
  std::set<const Protocol*> reached;
  const std::string none;
  std::vector<std::string> overrides{none};
  for (const Protocol& row : protocols()) overrides.push_back(kAlgoNames.at(row.collective) + "=" + algorithm_name(row.algorithm));
  const std::vector<BufferFacts> facts = every_facts();
  for (const Collective collective : kCollectives) {
    for (const std::string& text : overrides) {
      if (!text.empty() && text.rfind(kAlgoNames.at(collective) + "=", 0) != 0) continue;
      for (int world = 1; world <= 8; ++world) {
        for (const size_t bytes : swept_sizes()) {
          for (const bool multicast : {false, true}) {
            const CallShape shape{collective, bytes, world, DataType::kFloat32, &text, multicast};
            for (const BufferFacts& fact : facts) {
              const std::string where = std::string(collective_name(static_cast<unsigned int>(collective))) +
                                        " of " + std::to_string(bytes) + " bytes on " + std::to_string(world) +
                                        " rank(s), BRAID_ALGO '" + text + "'";
              CallPlan plan{};
              try {
                plan = plan_call(shape, kAreas, fact);
              } catch (const Error& error) {
                ADD_FAILURE() << where << ": " << error.what();
                return reached;
              }
              const bool whole = plan.protocol != nullptr && plan.protocol->collective == collective &&
                                 plan.protocol->algorithm == plan.algorithm && plan.protocol->mode == plan.mode;
              if (!whole || !serves_world(plan.protocol->worlds, world)) {
                ADD_FAILURE() << where << ": " << (whole ? "a row for another world" : "a plan without its row");
                return reached;
              }
              reached.insert(plan.protocol);
            }
          }
        }
      }
    }
  }
  return reached;
}

TEST(Protocols, EveryRowIsReachedByTheTableAndThePlannerAndEveryPlanHasARow) {
  const std::set<const Protocol*> reached = planned_rows();
  for (const Protocol& row : protocols()) EXPECT_TRUE(reached.count(&row)) << name_of(row) << ": no plan reaches it";
}

TEST(Protocols, EveryProtocolTheTableCanNameHasARow) {
  for (const Collective collective : kCollectives) {
    for (const int world : {1, 2, 3, 4, 8}) {
      for (const DataType type : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat8E5M2}) {
        for (const Buffers buffers : {Buffers::kAny, Buffers::kSymmetric}) {
          for (int bits = 0; bits < 16; ++bits) {
            const Gates gates{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, (bits & 8) != 0};
            for (const size_t bytes : swept_sizes()) {
              const Algorithm algorithm = select_algorithm(collective, bytes, world, type, "", buffers, gates).algorithm;
              EXPECT_NE(find_protocol(collective, algorithm), nullptr)
                  << collective_name(static_cast<unsigned int>(collective)) << " " << algorithm_name(algorithm);
            }
          }
        }
      }
    }
  }
}

// BRAID_ALGO accepts exactly the protocols with a row.
TEST(Protocols, BraidAlgoNamesExactlyTheRows) {
  for (const Collective collective : kCollectives) {
    for (const Algorithm algorithm : kAlgorithms) {
      const std::string text = kAlgoNames.at(collective) + "=" + algorithm_name(algorithm);
      if (find_protocol(collective, algorithm) != nullptr) {
        EXPECT_NO_THROW(select_algorithm(collective, 4096, 2, DataType::kFloat32, text)) << text;
      } else {
        try {
          select_algorithm(collective, 4096, 2, DataType::kFloat32, text);
          ADD_FAILURE() << text << " was accepted without a row";
        } catch (const Error& error) {
          EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << text;
        }
      }
    }
  }
}

// One gate per (collective, protocol); a staged row needs nothing of the buffers, a zero-copy row something, and
// comes first; at most one row per mode and needs; a null launch only where pairs run their own protocols.
TEST(Protocols, RowsAreConsistent) {
  std::set<std::pair<Collective, Algorithm>> staged_seen;
  std::map<std::pair<Collective, Algorithm>, std::set<std::pair<BufferMode, Needs>>> modes;
  for (const Protocol& row : protocols()) {
    const auto key = std::make_pair(row.collective, row.algorithm);
    EXPECT_EQ(row.gate, gate_of(row.collective, row.algorithm)) << name_of(row);
    EXPECT_TRUE(modes[key].insert({row.mode, row.needs}).second) << name_of(row) << ": a second row of the same mode and needs";
    if (row.mode == BufferMode::kStagedCopy) {
      EXPECT_EQ(row.needs, Needs::kNothing) << name_of(row);
      staged_seen.insert(key);
    } else {
      EXPECT_NE(row.needs, Needs::kNothing) << name_of(row);
      EXPECT_FALSE(staged_seen.count(key)) << name_of(row) << ": listed after its staged row";
    }
    const bool pairwise = row.collective == Collective::kSendRecv || row.collective == Collective::kAllToAllv;
    EXPECT_EQ(row.launch == nullptr, pairwise) << name_of(row);
  }
}

std::string read_source(const std::string& path) {
  std::ifstream file(std::string(BRAID_SOURCE_DIR) + "/" + path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// Every launch function launches.hpp declares is named by a row of protocols.cpp, and every row's function is one
// launches.hpp declares.
TEST(Protocols, EveryLaunchFunctionIsARowsAndEveryRowsIsDeclared) {
  const std::string header = read_source("src/collectives/launches.hpp");
  const std::string registry = read_source("src/collectives/protocols.cpp");
  ASSERT_FALSE(header.empty());
  ASSERT_FALSE(registry.empty());
  std::set<std::string> declared, named;
  const std::regex declaration(R"(void (run_\w+)\(CollectiveContext&)");
  for (auto it = std::sregex_iterator(header.begin(), header.end(), declaration); it != std::sregex_iterator(); ++it) {
    declared.insert((*it)[1]);
  }
  const std::regex row(R"(\{k\w+, k\w+, k\w+, Gate::k\w+, k\w+, k\w+, (run_\w+|nullptr)(,\s*k\w+)?\})");
  size_t rows = 0;
  for (auto it = std::sregex_iterator(registry.begin(), registry.end(), row); it != std::sregex_iterator(); ++it) {
    ++rows;
    if ((*it)[1] != "nullptr") named.insert((*it)[1]);
  }
  EXPECT_EQ(rows, protocols().size()) << "protocols.cpp rows the pattern did not read";
  EXPECT_FALSE(declared.empty());
  for (const std::string& name : declared) EXPECT_TRUE(named.count(name)) << name << " is no row's launch";
  for (const std::string& name : named) EXPECT_TRUE(declared.count(name)) << name << " is not in launches.hpp";
}

}  // namespace
}  // namespace braid::collectives
