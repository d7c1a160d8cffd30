// Where a library braid loads at run time (dlopen: NCCL, cuBLASLt) may lie when the loader's search path does not
// have it.
#pragma once

#include <dlfcn.h>

#include <string>
#include <vector>

namespace braid::detail {

// The CUDA toolkit's lib folders: $CUDA_HOME and $CUDA_PATH's lib64 and lib, then /usr/local/cuda's.
std::vector<std::string> cuda_library_folders();

// Existing copies of `name`, each file once (folders may be links to one another), in LD_LIBRARY_PATH's folders,
// the CUDA toolkit's lib folders, then `package_folder` (e.g. "nvidia/nccl/lib") of python3's site-packages and
// dist-packages under $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local and the system's prefixes.
std::vector<std::string> library_candidates(const std::string& name, const std::string& package_folder);

// Sets `function` to the entry point `name` of the dlopen'd `handle` (null where it lacks it); whether it has it.
template <typename F>
bool resolve_symbol(void* handle, const char* name, F& function) {
  dlerror();
  function = reinterpret_cast<F>(dlsym(handle, name));
  dlerror();
  return function != nullptr;
}

}  // namespace braid::detail
