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
  for (int code = 0; code <= static_cast<int>(ErrorCode::kRevoked); ++code) {
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

// Every call of the C API that takes a communicator refuses a null one naming the function and 'comm'.
TEST(Errors, CApiCallsNameANullCommunicator) {
  const std::vector<std::pair<std::string, std::function<braidResult_t()>>> calls = {
      {"braidAllReduce", [] { return braidAllReduce(nullptr, nullptr, nullptr, 0, braidFloat32, braidSum, nullptr); }},
      {"braidReduce", [] { return braidReduce(nullptr, nullptr, nullptr, 0, braidFloat32, braidMax, 0, nullptr); }},
      {"braidReduceScatter",
       [] { return braidReduceScatter(nullptr, nullptr, nullptr, 0, braidBfloat16, braidAvg, nullptr); }},
      {"braidAllGather", [] { return braidAllGather(nullptr, nullptr, nullptr, 0, braidInt8, nullptr); }},
      {"braidBroadcast", [] { return braidBroadcast(nullptr, nullptr, nullptr, 0, braidInt8, 0, nullptr); }},
      {"braidAllToAll", [] { return braidAllToAll(nullptr, nullptr, nullptr, 0, braidInt32, nullptr); }},
      {"braidAllToAllv",
       [] { return braidAllToAllv(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, braidInt32, nullptr); }},
      {"braidAllToAllvDevice",
       [] {
         return braidAllToAllvDevice(nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr, braidInt32, nullptr);
       }},
      {"braidCommCheck", [] { return braidCommCheck(nullptr); }},
      {"braidCommAbort", [] { return braidCommAbort(nullptr); }},
      {"braidCommRevoke", [] { return braidCommRevoke(nullptr); }},
      {"braidCommShrink", [] {
         braidComm_t child = nullptr;
         return braidCommShrink(nullptr, nullptr, 0, &child);
       }},
      {"braidSendRecv", [] { return braidSendRecv(nullptr, nullptr, 0, nullptr); }},
      {"braidRegisterBuffer", [] {
         braidRegisteredBuffer_t buffer = nullptr;
         return braidRegisterBuffer(nullptr, nullptr, 0, &buffer);
       }},
      {"braidImportGlobal", [] {
         braidGlobalMemory_t memory = nullptr;
         return braidImportGlobal(nullptr, nullptr, &memory);
       }},
      {"braidPut", [] { return braidPut(nullptr, nullptr, 0, 0, nullptr, 0, nullptr); }},
      {"braidGet", [] { return braidGet(nullptr, nullptr, 0, 0, nullptr, 0, nullptr); }},
      {"braidAllToAllGlobal", [] { return braidAllToAllGlobal(nullptr, nullptr, nullptr, 0, braidInt8, nullptr); }},
      {"braidMoeBufferCreate",
       [] {
         braidMoeShape_t shape;
         braidMoeShapeDefaults(&shape);
         braidMoeBuffer_t buffer = nullptr;
         return braidMoeBufferCreate(nullptr, &shape, &buffer);
       }},
      {"braidFusedMatmulCreate",
       [] {
         braidFusedMatmul_t fused = nullptr;
         return braidFusedMatmulCreate(nullptr, &fused);
       }},
  };
  for (const auto& [name, call] : calls) {
    EXPECT_EQ(call(), braidInvalidArgument) << name;
    EXPECT_NE(std::string(braidGetLastError()).find(name + ": argument 'comm' is NULL"), std::string::npos)
        << name << ": " << braidGetLastError();
  }
}

// A constructor of the C API that fails leaves its out-parameter NULL, whichever argument it refused.
TEST(Errors, CApiConstructorsLeaveTheirOutputNullOnFailure) {
  void* const stale = reinterpret_cast<void*>(uintptr_t(1));
  braidComm_t comm = static_cast<braidComm_t>(stale);
  EXPECT_EQ(braidCommInitRank(&comm, nullptr, 0, 1, 1, -1), braidInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  braidSymmetricMemory_t memory = static_cast<braidSymmetricMemory_t>(stale);
  EXPECT_EQ(braidSymmetricAlloc(nullptr, 16, 0, &memory), braidInvalidArgument);
  EXPECT_EQ(memory, nullptr);
  braidRegisteredBuffer_t registered = static_cast<braidRegisteredBuffer_t>(stale);
  EXPECT_EQ(braidRegisterBuffer(nullptr, nullptr, 0, &registered), braidInvalidArgument);
  EXPECT_EQ(registered, nullptr);
  braidGlobalMemory_t global = static_cast<braidGlobalMemory_t>(stale);
  EXPECT_EQ(braidImportGlobal(nullptr, nullptr, &global), braidInvalidArgument);
  EXPECT_EQ(global, nullptr);
  braidMoeBuffer_t moe = static_cast<braidMoeBuffer_t>(stale);
  EXPECT_EQ(braidMoeBufferCreate(nullptr, nullptr, &moe), braidInvalidArgument);
  EXPECT_EQ(moe, nullptr);
  braidFusedMatmul_t fused = static_cast<braidFusedMatmul_t>(stale);
  EXPECT_EQ(braidFusedMatmulCreate(nullptr, &fused), braidInvalidArgument);
  EXPECT_EQ(fused, nullptr);
  braidComm_t child = static_cast<braidComm_t>(stale);
  EXPECT_EQ(braidCommShrink(nullptr, nullptr, 0, &child), braidInvalidArgument);
  EXPECT_EQ(child, nullptr);
}

// The fused GEMM calls name a NULL handle; freeing NULL is a no-op.
TEST(Errors, CApiFusedMatmulCallsNameTheirArguments) {
  auto named = [](braidResult_t result, const std::string& text) {
    EXPECT_EQ(result, braidInvalidArgument) << text;
    EXPECT_NE(std::string(braidGetLastError()).find(text), std::string::npos) << braidGetLastError();
  };
  named(braidFusedMatmulCreate(nullptr, nullptr), "braidFusedMatmulCreate: argument 'comm' is NULL");
  named(braidFusedMatmulReserve(nullptr, 1 << 20), "braidFusedMatmulReserve: argument 'fused' is NULL");
  size_t bytes = 0;
  named(braidFusedMatmulWorkspaceBytes(nullptr, &bytes), "braidFusedMatmulWorkspaceBytes: argument 'fused' is NULL");
  named(braidAllGatherMatmul(nullptr, nullptr, 1, 8, nullptr, braidLayoutRowMajor, 8, nullptr, nullptr, braidBfloat16,
                             nullptr),
        "braidAllGatherMatmul: argument 'fused' is NULL");
  named(braidMatmulReduceScatter(nullptr, nullptr, 2, 8, nullptr, braidLayoutTransposed, 8, nullptr, braidFloat16,
                                 braidSum, nullptr),
        "braidMatmulReduceScatter: argument 'fused' is NULL");
  EXPECT_EQ(braidFusedMatmulFree(nullptr), braidSuccess);
}

// The handle calls name their null out-arguments and refuse a blob that is not one; freeing NULL is a no-op.
TEST(Errors, CApiMemoryHandlesNameTheirArguments) {
  EXPECT_EQ(braidExportHandle(nullptr, 0, -1, nullptr), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("braidExportHandle: argument 'handle'"), std::string::npos)
      << braidGetLastError();
  const void* blob = nullptr;
  size_t size = 0;
  EXPECT_EQ(braidExportedBlob(nullptr, &blob, &size), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("'handle'"), std::string::npos) << braidGetLastError();
  // A stale value: a failed constructor sets its out-parameter to NULL.
  braidImportedMemory_t memory = reinterpret_cast<braidImportedMemory_t>(uintptr_t(1));
  EXPECT_EQ(braidImportHandle(nullptr, 3, -1, &memory), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("braidImportHandle: argument 'blob' is NULL with size 3"),
            std::string::npos) << braidGetLastError();
  EXPECT_EQ(memory, nullptr);
  const char garbage[] = "not a handle";
  EXPECT_EQ(braidImportHandle(garbage, sizeof(garbage), -1, &memory), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("'blob'"), std::string::npos) << braidGetLastError();
  EXPECT_EQ(memory, nullptr);
  void* pointer = nullptr;
  EXPECT_EQ(braidImportedPointer(nullptr, &pointer, nullptr), braidInvalidArgument);
  EXPECT_EQ(braidGlobalPeer(nullptr, 0, &pointer, nullptr), braidInvalidArgument);
  EXPECT_EQ(braidDeregisterBuffer(nullptr), braidSuccess);
  EXPECT_EQ(braidExportedHandleFree(nullptr), braidSuccess);
  EXPECT_EQ(braidImportedMemoryFree(nullptr), braidSuccess);
  EXPECT_EQ(braidGlobalMemoryFree(nullptr), braidSuccess);
}

// The MoE calls: defaults that match braid::MoeShape's, and every null argument named; freeing NULL is a no-op.
TEST(Errors, CApiMoeCallsNameTheirArguments) {
  braidMoeShape_t shape;
  ASSERT_EQ(braidMoeShapeDefaults(&shape), braidSuccess);
  const MoeShape defaults;
  EXPECT_EQ(static_cast<int>(shape.datatype), static_cast<int>(defaults.type));
  EXPECT_EQ(shape.dispatch_datatype, shape.datatype) << "no fp8 dispatch unless asked";
  EXPECT_EQ(static_cast<int>(shape.index_datatype), static_cast<int>(defaults.index_type));
  EXPECT_EQ(shape.expert_alignment, defaults.expert_alignment);
  EXPECT_EQ(shape.layout, braidMoeExpertMajor);
  EXPECT_EQ(shape.hidden, 0u);
  EXPECT_EQ(shape.low_latency, 0);
  EXPECT_EQ(braidMoeShapeDefaults(nullptr), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("braidMoeShapeDefaults: argument 'shape'"), std::string::npos)
      << braidGetLastError();
  braidMoeDispatchOutput_t output;
  EXPECT_EQ(braidMoeDispatch(nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr, &output),
            braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("braidMoeDispatch: argument 'buffer'"), std::string::npos)
      << braidGetLastError();
  EXPECT_EQ(braidMoeRedispatch(nullptr, 1, nullptr, nullptr, nullptr, &output), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("braidMoeRedispatch: argument 'buffer'"), std::string::npos)
      << braidGetLastError();
  EXPECT_EQ(braidMoeCombine(nullptr, nullptr, nullptr, 1, nullptr), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("braidMoeCombine: argument 'buffer'"), std::string::npos)
      << braidGetLastError();
  size_t rows = 0;
  EXPECT_EQ(braidMoeCapacityRows(nullptr, &rows), braidInvalidArgument);
  EXPECT_EQ(braidMoeCopyExpertCounts(nullptr, nullptr, nullptr), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError()).find("braidMoeCopyExpertCounts: argument 'buffer'"), std::string::npos)
      << braidGetLastError();
  EXPECT_EQ(braidMoeBufferCreate(nullptr, nullptr, nullptr), braidInvalidArgument);
  EXPECT_EQ(braidMoeBufferFree(nullptr), braidSuccess);
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
