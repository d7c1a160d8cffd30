// The layers of src/ (docs/architecture.md) include only the layers below them, and the public C++ and C API
// (braid.hpp, braid.h, moe.hpp) only from comm and api. The places where a lower layer still reaches up are
// listed here, each by file and header: a new one fails, and so does a listed one that is gone (the list stays
// true as the layers are narrowed).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace braid {
namespace {

namespace fs = std::filesystem;

// Bottom up: a layer may include itself and what comes before it.
const std::vector<std::string> kLayers = {"core", "bootstrap", "memory", "sync", "collectives",
                                          "moe", "backends", "comm", "api"};
// The public API (what users include), not the shared vocabulary (types.hpp, error.hpp, device/).
const std::set<std::string> kPublicApi = {"braid/braid.hpp", "braid/braid.h", "braid/moe.hpp"};

// (file under src/, header it includes) that break the order today.
const std::set<std::pair<std::string, std::string>> kKnownUpwardIncludes = {
    {"bootstrap/rendezvous.hpp", "braid/braid.hpp"},
    {"bootstrap/store.cpp", "braid/braid.hpp"},
    {"memory/export_import.cpp", "braid/braid.hpp"},
    {"memory/multicast.hpp", "braid/braid.hpp"},
    {"memory/registration.hpp", "braid/braid.hpp"},
    {"memory/symmetric_memory.hpp", "braid/braid.hpp"},
    {"moe/moe_buffer.cpp", "braid/moe.hpp"},
    {"moe/moe_dispatch.cu", "braid/moe.hpp"},
    {"sync/device_sync.hpp", "braid/braid.hpp"},
};

int layer_of(const std::string& name) {
  const auto it = std::find(kLayers.begin(), kLayers.end(), name);
  return it == kLayers.end() ? -1 : static_cast<int>(it - kLayers.begin());
}

// Every (file, header) of src/ whose header belongs to a higher layer than the file, or is the public API
// included below comm.
std::set<std::pair<std::string, std::string>> upward_includes(const fs::path& src) {
  static const std::regex include(R"(^\s*#\s*include\s+"([^"]+)\")");
  const int comm = layer_of("comm");
  std::set<std::pair<std::string, std::string>> found;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file()) continue;
    const std::string file = fs::relative(entry.path(), src).generic_string();
    const int layer = layer_of(file.substr(0, file.find('/')));
    if (layer < 0) continue;
    std::ifstream in(entry.path());
    std::string line;
    std::smatch match;
    while (std::getline(in, line)) {
      if (!std::regex_search(line, match, include)) continue;
      const std::string header = match[1];
      const int target = layer_of(header.substr(0, header.find('/')));
      const bool up = target > layer || (kPublicApi.count(header) != 0 && layer < comm);
      if (up) found.emplace(file, header);
    }
  }
  return found;
}

TEST(Layers, EveryLayerOfSrcIncludesOnlyTheLayersBelowIt) {
  const fs::path src = fs::path(BRAID_SOURCE_DIR) / "src";
  ASSERT_TRUE(fs::is_directory(src)) << src;
  for (const auto& entry : fs::directory_iterator(src)) {
    if (entry.is_directory()) {
      EXPECT_GE(layer_of(entry.path().filename().string()), 0)
          << entry.path() << " is a folder of src/ that is not a known layer: place it in kLayers";
    }
  }
  const auto found = upward_includes(src);
  for (const auto& [file, header] : found) {
    EXPECT_TRUE(kKnownUpwardIncludes.count({file, header}) != 0)
        << "src/" << file << " includes \"" << header << "\", a higher layer (or the public API below comm)";
  }
  for (const auto& [file, header] : kKnownUpwardIncludes) {
    EXPECT_TRUE(found.count({file, header}) != 0)
        << "src/" << file << " no longer includes \"" << header << "\": take it off kKnownUpwardIncludes";
  }
}

}  // namespace
}  // namespace braid
