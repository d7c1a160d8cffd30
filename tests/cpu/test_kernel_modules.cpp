// Kernel preload (core/kernel_modules.hpp): every .cu file of libbraid registers its module, so communicator init
// can load every kernel; on a driver that cannot enumerate a module's functions, preload does nothing and says so.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda_driver.hpp"
#include "core/kernel_modules.hpp"

namespace braid {
namespace {

std::vector<std::filesystem::path> library_cuda_sources() {
  std::vector<std::filesystem::path> sources;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(std::filesystem::path(BRAID_SOURCE_DIR) / "src")) {
    if (entry.is_regular_file() && entry.path().extension() == ".cu") sources.push_back(entry.path());
  }
  return sources;
}

TEST(KernelModules, EveryCudaSourceOfTheLibraryRegistersItsModule) {
  const std::vector<std::filesystem::path> sources = library_cuda_sources();
  ASSERT_GE(sources.size(), 20u);
  for (const std::filesystem::path& source : sources) {
    std::ifstream in(source);
    std::stringstream text;
    text << in.rdbuf();
    const bool every_gpu = text.str().find("\nBRAID_KERNEL_MODULE()\n") != std::string::npos;
    const bool one_gpu_kind = text.str().find("\nBRAID_KERNEL_MODULE_FOR(") != std::string::npos;
    EXPECT_TRUE(every_gpu || one_gpu_kind)
        << source << " does not end with BRAID_KERNEL_MODULE() or BRAID_KERNEL_MODULE_FOR(major, minor): its "
        << "kernels would load lazily, on first launch";
  }
  // This binary links every object of the library: one registration per .cu file, none twice.
  EXPECT_EQ(detail::registered_kernel_modules(), sources.size());
}

TEST(KernelModules, PreloadOnADriverThatCannotEnumerateFunctionsLoadsNothing) {
  const DriverApi without_enumeration{};  // every entry point missing, as on a driver older than CUDA 12.4
  set_driver_for_testing(&without_enumeration);
  detail::KernelLoadCount count;
  EXPECT_NO_THROW(count = detail::preload_kernels());
  set_driver_for_testing(nullptr);
  EXPECT_EQ(count.modules, 0u);
  EXPECT_EQ(count.loaded_now, 0u);
}

}  // namespace
}  // namespace braid
