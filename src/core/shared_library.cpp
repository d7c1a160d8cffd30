#include "core/shared_library.hpp"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <set>

namespace braid::detail {

std::vector<std::string> cuda_library_folders() {
  std::vector<std::string> folders;
  for (const char* variable : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* root = std::getenv(variable);
    if (root != nullptr && *root != '\0') {
      folders.push_back(std::string(root) + "/lib64");
      folders.push_back(std::string(root) + "/lib");
    }
  }
  for (const char* folder : {"/usr/local/cuda/lib64", "/usr/local/cuda/lib"}) {
    if (std::find(folders.begin(), folders.end(), folder) == folders.end()) folders.push_back(folder);
  }
  return folders;
}

namespace {

std::vector<std::string> site_packages_patterns(const std::string& package_folder) {
  std::vector<std::string> prefixes;
  for (const char* variable : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    const char* prefix = std::getenv(variable);
    if (prefix != nullptr && *prefix != '\0') prefixes.push_back(std::string(prefix) + "/lib");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    prefixes.push_back(std::string(home) + "/.local/lib");
  }
  for (const char* prefix : {"/usr/local/lib", "/usr/local/lib64", "/usr/lib", "/usr/lib64", "/opt/conda/lib"}) {
    prefixes.push_back(prefix);
  }
  std::vector<std::string> patterns;
  for (const std::string& prefix : prefixes) {
    for (const char* packages : {"dist-packages", "site-packages"}) {
      patterns.push_back(prefix + "/python3*/" + packages + "/" + package_folder);
    }
  }
  return patterns;
}

// LD_LIBRARY_PATH's folders, in order (searched by path: a bare name may resolve to another copy, e.g. NCCL's shim).
std::vector<std::string> library_path_folders() {
  std::vector<std::string> folders;
  const char* path = std::getenv("LD_LIBRARY_PATH");
  if (path == nullptr) return folders;
  std::string text(path);
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find(':', begin), text.size());
    if (end > begin) folders.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return folders;
}

}  // namespace

std::vector<std::string> library_candidates(const std::string& name, const std::string& package_folder) {
  std::vector<std::string> folders = library_path_folders();
  for (const std::string& folder : cuda_library_folders()) folders.push_back(folder);
  for (const std::string& pattern : site_packages_patterns(package_folder)) {
    glob_t matches{};
    if (glob(pattern.c_str(), GLOB_ONLYDIR, nullptr, &matches) == 0) {
      for (size_t i = 0; i < matches.gl_pathc; ++i) folders.push_back(matches.gl_pathv[i]);
    }
    globfree(&matches);
  }
  std::vector<std::string> candidates;
  std::set<std::string> seen;
  for (const std::string& folder : folders) {
    const std::string candidate = folder + "/" + name;
    char resolved[PATH_MAX];
    if (access(candidate.c_str(), F_OK) != 0 || realpath(candidate.c_str(), resolved) == nullptr) continue;
    if (seen.insert(resolved).second) candidates.push_back(candidate);
  }
  return candidates;
}

}  // namespace braid::detail
