// The layers of src/ (docs/architecture.md) include only the layers below them. The public headers belong to
// layers too: types.hpp, error.hpp and device/ to core (the shared vocabulary), rendezvous.hpp to bootstrap,
// memory.hpp to memory, moe.hpp to moe, braid.hpp (the Communicator) to comm, fused_matmul.hpp to overlap, braid.h to api. A layer may include
// the public header of its own layer or a lower one (the layer that implements a public class includes its
// declaration), and a public header only the public headers of its layer or lower ones.
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
const std::vector<std::string> kLayers = {"core", "bootstrap", "memory", "sync", "kernels",
                                          "collectives", "moe", "backends", "comm", "overlap", "api"};
// The layer of each public header (a path under include/); device/ headers are core's.
const std::map<std::string, std::string> kPublicLayer = {
    {"braid/types.hpp", "core"},    {"braid/error.hpp", "core"},   {"braid/rendezvous.hpp", "bootstrap"},
    {"braid/memory.hpp", "memory"}, {"braid/moe.hpp", "moe"},      {"braid/braid.hpp", "comm"},
    {"braid/moe_shape.hpp", "core"},
    {"braid/fused_matmul.hpp", "overlap"},
    {"braid/braid.h", "api"},
};

int layer_of(const std::string& name) {
  const auto it = std::find(kLayers.begin(), kLayers.end(), name);
  return it == kLayers.end() ? -1 : static_cast<int>(it - kLayers.begin());
}

// The layer a header of braid's own belongs to: a folder of src/, or a public header; -1 for other headers
// (the standard library, CUDA, third parties).
int layer_of_header(const std::string& header) {
  if (header.rfind("braid/device/", 0) == 0) return layer_of("core");
  const auto it = kPublicLayer.find(header);
  if (it != kPublicLayer.end()) return layer_of(it->second);
  if (header.rfind("braid/", 0) == 0) return static_cast<int>(kLayers.size());  // a public header without a layer
  return layer_of(header.substr(0, header.find('/')));
}

// The quoted includes of one file.
std::vector<std::string> includes_of(const fs::path& path) {
  static const std::regex include(R"(^\s*#\s*include\s+"([^"]+)\")");
  std::vector<std::string> headers;
  std::ifstream in(path);
  std::string line;
  std::smatch match;
  while (std::getline(in, line)) {
    if (std::regex_search(line, match, include)) headers.push_back(match[1].str());
  }
  return headers;
}

// Every (file, header) under `root` whose header belongs to a higher layer than the file; `file_layer` gives the
// layer of a file (its path relative to root), -1 to skip it.
template <typename FileLayer>
std::set<std::pair<std::string, std::string>> upward_includes(const fs::path& root, FileLayer file_layer) {
  std::set<std::pair<std::string, std::string>> found;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    const std::string file = fs::relative(entry.path(), root).generic_string();
    const int layer = file_layer(file);
    if (layer < 0) continue;
    for (const std::string& header : includes_of(entry.path())) {
      if (layer_of_header(header) > layer) found.emplace(file, header);
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
  const auto found = upward_includes(src, [](const std::string& file) { return layer_of(file.substr(0, file.find('/'))); });
  for (const auto& [file, header] : found) {
    ADD_FAILURE() << "src/" << file << " includes \"" << header << "\", a header of a higher layer";
  }
}

TEST(Layers, EveryPublicHeaderIncludesOnlyThePublicHeadersOfItsLayerOrBelow) {
  const fs::path include = fs::path(BRAID_SOURCE_DIR) / "include";
  ASSERT_TRUE(fs::is_directory(include / "braid")) << include;
  size_t headers = 0;
  const auto found = upward_includes(include, [&](const std::string& file) {
    const int layer = layer_of_header(file);
    EXPECT_LT(layer, static_cast<int>(kLayers.size())) << "include/" << file << " has no layer: place it in kPublicLayer";
    ++headers;
    return layer;
  });
  EXPECT_GE(headers, 8u);
  for (const auto& [file, header] : found) {
    ADD_FAILURE() << "include/" << file << " includes \"" << header << "\", a header of a higher layer";
  }
}

// The NCCL shim and the tools sit on the public API (docs/architecture.md); each may reach these internals of
// src/ and no others. A header added to a list here is a decision to record in docs/architecture.md too.
const std::map<std::string, std::set<std::string>> kInternalsAllowed = {
    // errors, logging, device and driver guards, the config table, the VMM helpers (ncclMemAlloc), NCCL's loader,
    // the launch cap (kMaxBlocks) and the topology rule (which ranks braid can serve)
    {"nccl_shim",
     {"core/error.hpp", "core/log.hpp", "core/device_guard.hpp", "core/cuda_check.hpp", "core/cuda_driver.hpp",
      "core/config.hpp", "memory/vmm.hpp", "backends/nccl/nccl_library.hpp", "collectives/selection.hpp",
      "comm/topology.hpp"}},
    // braid-run serves the store and holds the job secret; braid-bench runs NCCL beside braid
    {"tools", {"bootstrap/store.hpp", "bootstrap/job_secret.hpp", "backends/nccl/nccl_backend.hpp"}},
};

TEST(Layers, TheShimAndTheToolsReachOnlyTheInternalsTheyAreAllowed) {
  for (const auto& [folder, allowed] : kInternalsAllowed) {
    const fs::path root = fs::path(BRAID_SOURCE_DIR) / folder;
    ASSERT_TRUE(fs::is_directory(root)) << root;
    std::set<std::string> used;
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (!entry.is_regular_file()) continue;
      for (const std::string& header : includes_of(entry.path())) {
        const size_t slash = header.find('/');
        if (slash == std::string::npos || layer_of(header.substr(0, slash)) < 0) continue;  // not an internal of src/
        used.insert(header);
        EXPECT_TRUE(allowed.count(header) > 0)
            << fs::relative(entry.path(), BRAID_SOURCE_DIR).generic_string() << " includes \"" << header
            << "\", an internal of src/ that " << folder << "/ may not use (kInternalsAllowed)";
      }
    }
    for (const std::string& header : allowed) {
      EXPECT_TRUE(used.count(header) > 0) << header << " is allowed to " << folder << "/ but nothing there uses it";
    }
  }
}

}  // namespace
}  // namespace braid
