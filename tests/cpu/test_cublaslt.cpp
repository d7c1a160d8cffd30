// The fused GEMM calls' cuBLASLt loader (overlap/cublaslt.hpp): what it loads, where it looks, what it says when it
// cannot. The loader keeps the process's first result, so each case runs in a fresh process (death tests,
// threadsafe style: the binary re-executed) whose first read of the environment sees its BRAID_CUBLASLT_LIBRARY.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "braid/error.hpp"
#include "overlap/cublaslt.hpp"

namespace braid::detail {
namespace {

// Exit 0 when cublaslt() raises kUnsupported (its message on stderr), 1 when it loads, 2 on another error.
[[noreturn]] void load_with(const char* library) {
  if (library != nullptr) setenv("BRAID_CUBLASLT_LIBRARY", library, 1);
  alarm(60);
  try {
    const CublasLtApi& api = cublaslt();
    std::fprintf(stderr, "loaded cuBLASLt %zu\n", api.get_version());
    std::fflush(stderr);
    std::_Exit(1);
  } catch (const Error& error) {
    std::fprintf(stderr, "%s\n", error.what());
    std::fflush(stderr);
    std::_Exit(error.code() == ErrorCode::kUnsupported ? 0 : 2);
  }
}

TEST(CublasLtDeathTest, NonexistentPathIsUnsupportedNamingThePathAndTheVariable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(load_with("/nonexistent/braid-test/libcublasLt.so.13"), testing::ExitedWithCode(0),
              "cannot load cuBLASLt.*/nonexistent/braid-test/libcublasLt.so.13.*BRAID_CUBLASLT_LIBRARY");
}

TEST(CublasLtDeathTest, UnknownBareNameIsUnsupportedListingWhatItTried) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(load_with("libcublasLt-braid-test-missing.so.9"), testing::ExitedWithCode(0),
              "cannot load cuBLASLt for the fused GEMM calls from 'libcublasLt-braid-test-missing.so.9'.*tried");
}

TEST(CublasLtDeathTest, ALibraryWithoutCublasLtNamesTheMissingSymbol) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(load_with("libm.so.6"), testing::ExitedWithCode(0), "libm.so.6 lacks the required symbol cublasLtCreate");
}

// The toolkit's cuBLASLt (the CUDA 13 toolkit braid builds with) loads with every entry point the GEMMs use.
TEST(CublasLtDeathTest, TheToolkitsLibraryLoadsWithEveryRequiredSymbol) {
  const char* path = "/usr/local/cuda/lib64/libcublasLt.so.13";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not on this machine";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(load_with(path), testing::ExitedWithCode(1), "loaded cuBLASLt [0-9]+");
}

}  // namespace
}  // namespace braid::detail
