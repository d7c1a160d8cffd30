// Error messages and codes: C++ exceptions, the C API's codes and last-error text, and what happens on a
// machine without a GPU (every binary starts; the first call fails saying so).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "braid/braid.h"
#include "braid/braid.hpp"
#include "core/cuda_check.hpp"
#include "core/error.hpp"

namespace braid {
namespace {

bool has_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

TEST(Errors, InvalidArgumentNamesFunctionAndArgument) {
  try {
    raise_invalid_argument("Communicator::alloc", "bytes", "is {}; must be ≥ 1", 0);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(error.what(), "Communicator::alloc: argument 'bytes' is 0; must be ≥ 1");
  }
}

TEST(Errors, CudaFailuresCarryCallCodeNameAndRank) {
  try {
    BRAID_CUDA(cudaErrorMemoryAllocation);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kCudaError);
    std::string text = error.what();
    EXPECT_NE(text.find("cudaErrorMemoryAllocation"), std::string::npos) << text;
    EXPECT_NE(text.find("failed on rank"), std::string::npos) << text;
    EXPECT_NE(text.find("(2)"), std::string::npos) << text;
  }
}

TEST(Errors, EveryCodeHasAName) {
  for (int code = 0; code <= static_cast<int>(ErrorCode::kInternal); ++code) {
    EXPECT_STRNE(error_code_name(static_cast<ErrorCode>(code)), "unknown error") << code;
    EXPECT_STREQ(braidGetErrorString(static_cast<braidResult_t>(code)), error_code_name(static_cast<ErrorCode>(code)));
  }
}

TEST(Errors, CApiRejectsNullArgumentsByName) {
  EXPECT_EQ(braidCommInitRank(nullptr, "127.0.0.1:1", 0, 1, 0, -1), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("'comm'"), std::string::npos) << braidGetLastError();
  braidComm_t comm = nullptr;
  EXPECT_EQ(braidCommInitRank(&comm, nullptr, 0, 1, 0, -1), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("'store_address'"), std::string::npos) << braidGetLastError();
  int rank = 0;
  EXPECT_EQ(braidCommRank(nullptr, &rank), braidInvalidArgument);
  EXPECT_EQ(braidSymmetricLocal(nullptr, nullptr), braidInvalidArgument);
  EXPECT_EQ(braidSend(nullptr, nullptr, 0, braidFloat32, 0, nullptr), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("braidSend: argument 'comm'"), std::string::npos) << braidGetLastError();
  EXPECT_EQ(braidRecv(nullptr, nullptr, 0, braidInt8, 0, nullptr), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("braidRecv: argument 'comm'"), std::string::npos) << braidGetLastError();
}

TEST(Errors, CommunicatorRejectsBadRankAndSizeBeforeTouchingTheNetwork) {
  Rendezvous rendezvous;
  rendezvous.rank = 2;
  rendezvous.size = 2;
  rendezvous.store_port = 1;
  try {
    Communicator::init(rendezvous);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("'rendezvous.rank'"), std::string::npos) << error.what();
  }
}

TEST(NoGpu, CommunicatorInitFailsSayingThereIsNoDevice) {
  if (has_gpu()) GTEST_SKIP() << "this machine has a GPU; the no-GPU path is checked where there is none";
  braid::StoreHost store;
  try {
    Communicator::init(Rendezvous::at_store(store.address(), 0, 1, false));
    FAIL() << "init succeeded without a GPU";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kNoDevice) << error.what();
    EXPECT_NE(std::string(error.what()).find("no CUDA device"), std::string::npos) << error.what();
  }
  braidComm_t comm = nullptr;
  EXPECT_EQ(braidCommInitRank(&comm, store.address().c_str(), 0, 1, 0, -1), braidNoDevice);
  EXPECT_EQ(comm, nullptr);
}

TEST(NoGpu, DriverEntryPointsFailWithAClearError) {
  if (has_gpu()) GTEST_SKIP() << "this machine has a GPU";
  try {
    driver();
    FAIL() << "driver entry points resolved without a driver";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kNoDevice) << error.what();
  }
}

}  // namespace
}  // namespace braid
