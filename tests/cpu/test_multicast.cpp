// The multicast gate (off unless BRAID_ENABLE_MULTICAST=1), with a fake driver-entry-point table that counts every call:
// with BRAID_ENABLE_MULTICAST unset (or 0) setup makes no driver call at all; with it set on a device that
// reports no support, braid warns and stays unicast; a failure on any rank undoes every step alike; a region
// that was made is torn down call for call. Also the selection rows that only an open gate reaches.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <string>

#include "braid/error.hpp"
#include "kernels/multicast_launch.hpp"
#include "collectives/selection.hpp"
#include "core/config.hpp"
#include "core/cuda_driver.hpp"
#include "memory/multicast.hpp"

namespace braid {
namespace {

std::map<std::string, int> g_calls;  // driver entry point -> calls since the fixture's SetUp
int g_supported = 0;                 // what the fake reports for CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
int g_exported_fd = -1;

// A counting stub for any entry point: it records its field's name and refuses (CUDA_ERROR_NOT_SUPPORTED).
template <typename F>
struct Stub;
template <typename... A>
struct Stub<CUresult (*)(A...)> {
  template <const char* Name>
  static CUresult call(A...) {
    ++g_calls[Name];
    return CUDA_ERROR_NOT_SUPPORTED;
  }
};

#define BRAID_FAKE_ENTRIES(X)                                                                                      \
  X(cuGetErrorName) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuDeviceGet) X(cuDeviceGetAttribute)                     \
  X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) X(cuMemExportToShareableHandle)                    \
  X(cuMemImportFromShareableHandle) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap)             \
  X(cuMemSetAccess) X(cuMemGetAddressRange) X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle) \
  X(cuPointerGetAttribute) X(cuMulticastGetGranularity) X(cuMulticastCreate) X(cuMulticastAddDevice)                \
  X(cuMulticastBindAddr) X(cuMulticastUnbind)

#define BRAID_NAME(field) constexpr char k_##field[] = #field;
BRAID_FAKE_ENTRIES(BRAID_NAME)
#undef BRAID_NAME

// Every entry point a counting stub that refuses.
DriverApi refusing_driver() {
  DriverApi api{};
#define BRAID_STUB(field) api.field = &Stub<decltype(api.field)>::template call<k_##field>;
  BRAID_FAKE_ENTRIES(BRAID_STUB)
#undef BRAID_STUB
  return api;
}

// A driver on which every multicast step succeeds (still counting each call).
DriverApi working_driver() {
  DriverApi api = refusing_driver();
  api.cuGetErrorName = [](CUresult, const char** name) {
    *name = "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
  };
  api.cuDeviceGet = [](CUdevice* device, int ordinal) {
    ++g_calls["cuDeviceGet"];
    *device = ordinal;
    return CUDA_SUCCESS;
  };
  api.cuDeviceGetAttribute = [](int* value, CUdevice_attribute attribute, CUdevice) {
    ++g_calls["cuDeviceGetAttribute"];
    *value = attribute == CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED ? g_supported : 0;
    return CUDA_SUCCESS;
  };
  api.cuMulticastGetGranularity = [](size_t* granularity, const CUmulticastObjectProp*, CUmulticastGranularity_flags) {
    ++g_calls["cuMulticastGetGranularity"];
    *granularity = size_t(2) << 20;
    return CUDA_SUCCESS;
  };
  api.cuMulticastCreate = [](CUmemGenericAllocationHandle* handle, const CUmulticastObjectProp*) {
    ++g_calls["cuMulticastCreate"];
    *handle = 42;
    return CUDA_SUCCESS;
  };
  api.cuMemExportToShareableHandle = [](void* fd, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                                        unsigned long long) {
    ++g_calls["cuMemExportToShareableHandle"];
    g_exported_fd = dup(0);
    std::memcpy(fd, &g_exported_fd, sizeof(int));
    return CUDA_SUCCESS;
  };
  api.cuMulticastAddDevice = [](CUmemGenericAllocationHandle, CUdevice) {
    ++g_calls["cuMulticastAddDevice"];
    return CUDA_SUCCESS;
  };
  api.cuMulticastBindAddr = [](CUmemGenericAllocationHandle, size_t, CUdeviceptr, size_t, unsigned long long) {
    ++g_calls["cuMulticastBindAddr"];
    return CUDA_SUCCESS;
  };
  api.cuMemAddressReserve = [](CUdeviceptr* address, size_t, size_t, CUdeviceptr, unsigned long long) {
    ++g_calls["cuMemAddressReserve"];
    *address = 0x7000000000;
    return CUDA_SUCCESS;
  };
  api.cuMemMap = [](CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) {
    ++g_calls["cuMemMap"];
    return CUDA_SUCCESS;
  };
  api.cuMemSetAccess = [](CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) {
    ++g_calls["cuMemSetAccess"];
    return CUDA_SUCCESS;
  };
  api.cuMemUnmap = [](CUdeviceptr, size_t) {
    ++g_calls["cuMemUnmap"];
    return CUDA_SUCCESS;
  };
  api.cuMemAddressFree = [](CUdeviceptr, size_t) {
    ++g_calls["cuMemAddressFree"];
    return CUDA_SUCCESS;
  };
  api.cuMulticastUnbind = [](CUmemGenericAllocationHandle, CUdevice, size_t, size_t) {
    ++g_calls["cuMulticastUnbind"];
    return CUDA_SUCCESS;
  };
  api.cuMemRelease = [](CUmemGenericAllocationHandle handle) {
    ++g_calls[handle == 42 ? "cuMemRelease(multicast)" : "cuMemRelease"];
    return CUDA_SUCCESS;
  };
  return api;
}

bool fd_closed(int fd) { return fcntl(fd, F_GETFD) == -1 && errno == EBADF; }

int total_calls() {
  int total = 0;
  for (const auto& [name, calls] : g_calls) total += calls;
  return total;
}

// A team of `size` ranks as seen by rank 0; `agreements` answers: the peers' verdict at each step (true once
// the list runs out), and'ed with this rank's.
struct FakeTeam {
  int size = 1;
  std::vector<bool> peers_agree;
  std::vector<bool> mine;  // what this rank passed, step by step
  int shared_fd = -2;      // what rank 0 passed to share_fd (-2: never called)
  std::vector<size_t> allocated;

  detail::MulticastTeam team() {
    detail::MulticastTeam t;
    t.rank = 0;
    t.size = size;
    t.device = 3;
    t.all_agree = [this](bool ok) {
      const size_t step = mine.size();
      mine.push_back(ok);
      return ok && (step >= peers_agree.size() || peers_agree[step]);
    };
    t.share_fd = [this](int fd) {
      shared_fd = fd;
      return -1;
    };
    t.allocate = [this](size_t bytes) {
      allocated.push_back(bytes);
      return SymmetricMemory();
    };
    return t;
  }
};

Config config_with(const std::map<std::string, std::string>& env) {
  std::vector<std::string> warnings;
  return Config::parse(env, &warnings);
}

class Multicast : public ::testing::Test {
 protected:
  void SetUp() override {
    g_calls.clear();
    g_supported = 0;
    g_exported_fd = -1;
  }
  void TearDown() override { set_driver_for_testing(nullptr); }
  void use(const DriverApi& api) {
    api_ = api;
    set_driver_for_testing(&api_);
  }
  DriverApi api_{};
};

TEST_F(Multicast, GateClosedMakesNoDriverCallAtAll) {
  use(working_driver());
  g_supported = 1;
  for (const auto& env : {std::map<std::string, std::string>{}, {{"BRAID_ENABLE_MULTICAST", "0"}}}) {
    FakeTeam fake;
    fake.size = 4;
    EXPECT_FALSE(detail::multicast_enabled(config_with(env)));
    EXPECT_EQ(detail::open_multicast(config_with(env), fake.team(), size_t(32) << 20), nullptr);
    EXPECT_EQ(total_calls(), 0) << "a closed gate reached the driver";
    EXPECT_TRUE(fake.mine.empty()) << "a closed gate reached the peers";
    EXPECT_EQ(fake.shared_fd, -2);
    EXPECT_TRUE(fake.allocated.empty());
  }
}

TEST_F(Multicast, OpenGateOnADeviceWithoutSupportWarnsAndStaysUnicast) {
  use(working_driver());
  g_supported = 0;
  FakeTeam fake;
  fake.size = 2;
  testing::internal::CaptureStderr();
  EXPECT_EQ(detail::open_multicast(config_with({{"BRAID_ENABLE_MULTICAST", "1"}}), fake.team(), size_t(32) << 20),
            nullptr);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("GPU 3 reports no multicast support"), std::string::npos) << log;
  EXPECT_NE(log.find("collectives run unicast"), std::string::npos) << log;
  EXPECT_EQ(g_calls["cuDeviceGetAttribute"], 1);
  for (const char* call : {"cuMulticastGetGranularity", "cuMulticastCreate", "cuMulticastAddDevice",
                           "cuMulticastBindAddr", "cuMemMap", "cuMemAddressReserve"}) {
    EXPECT_EQ(g_calls[call], 0) << call;
  }
  EXPECT_EQ(fake.mine, std::vector<bool>{false}) << "the ranks must agree before anything is made";
  EXPECT_TRUE(fake.allocated.empty());
}

TEST_F(Multicast, DriverWithoutMulticastEntryPointsWarnsAndStaysUnicast) {
  DriverApi api = working_driver();
  api.cuMulticastCreate = nullptr;  // a driver older than CUDA 12.1
  use(api);
  g_supported = 1;
  FakeTeam fake;
  testing::internal::CaptureStderr();
  EXPECT_EQ(detail::open_multicast(config_with({{"BRAID_ENABLE_MULTICAST", "1"}}), fake.team(), size_t(1) << 20),
            nullptr);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("no multicast entry points"), std::string::npos) << log;
  EXPECT_EQ(total_calls(), 0);
}

TEST_F(Multicast, APeersFailureUndoesEveryStepAlike) {
  use(working_driver());
  g_supported = 1;
  FakeTeam fake;
  fake.size = 2;
  // Steps: support, granularity, object, import, devices, binding, mapping. The peer fails to add its GPU.
  fake.peers_agree = {true, true, true, true, false};
  testing::internal::CaptureStderr();
  EXPECT_EQ(detail::open_multicast(config_with({{"BRAID_ENABLE_MULTICAST", "1"}}), fake.team(), size_t(3) << 20),
            nullptr);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("failed at adding the GPUs (on another rank)"), std::string::npos) << log;
  EXPECT_EQ(fake.mine, (std::vector<bool>{true, true, true, true, true}));
  EXPECT_EQ(fake.allocated, std::vector<size_t>{size_t(4) << 20}) << "3 MiB rounded up to the 2 MiB granularity";
  EXPECT_EQ(fake.shared_fd, g_exported_fd) << "rank 0 shares the object it exported";
  EXPECT_EQ(g_calls["cuMulticastCreate"], 1);
  EXPECT_EQ(g_calls["cuMulticastAddDevice"], 1);
  EXPECT_EQ(g_calls["cuMemRelease(multicast)"], 1) << "the object made must be released";
  EXPECT_EQ(g_calls["cuMulticastBindAddr"], 0) << "no rank binds before every rank has added its GPU";
  EXPECT_EQ(g_calls["cuMulticastUnbind"], 0);
  EXPECT_TRUE(fd_closed(g_exported_fd)) << "rank 0 closes its exported fd once shared";
}

TEST_F(Multicast, ARegionIsTornDownCallForCall) {
  use(working_driver());
  g_supported = 1;
  FakeTeam fake;
  fake.size = 4;
  std::unique_ptr<detail::MulticastRegion> region =
      detail::open_multicast(config_with({{"BRAID_ENABLE_MULTICAST", "1"}}), fake.team(), size_t(32) << 20);
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(region->bytes(), size_t(32) << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(region->multicast()), uintptr_t(0x7000000000));
  EXPECT_EQ(fake.mine.size(), 7u);
  for (const char* call : {"cuMulticastCreate", "cuMulticastAddDevice", "cuMulticastBindAddr", "cuMemAddressReserve",
                           "cuMemMap", "cuMemSetAccess"}) {
    EXPECT_EQ(g_calls[call], 1) << call;
  }
  region.reset();
  for (const char* call : {"cuMemUnmap", "cuMemAddressFree", "cuMulticastUnbind", "cuMemRelease(multicast)"}) {
    EXPECT_EQ(g_calls[call], 1) << call;
  }
}

TEST(MulticastSelection, RowsOnlyWhereTheGateIsOpenAndTheCallServed) {
  // Served: float32 sums, float16/bfloat16 sums, minima, maxima; all-gather of anything; whole 16-byte vectors.
  EXPECT_TRUE(kernels::multicast_serves(Collective::kAllReduce, DataType::kFloat32, ReduceOp::kSum, 1 << 20));
  EXPECT_TRUE(kernels::multicast_serves(Collective::kReduce, DataType::kBFloat16, ReduceOp::kMax, 1 << 20));
  EXPECT_TRUE(kernels::multicast_serves(Collective::kAllGather, DataType::kInt8, ReduceOp::kSum, 1 << 20));
  EXPECT_FALSE(kernels::multicast_serves(Collective::kAllReduce, DataType::kFloat32, ReduceOp::kMax, 1 << 20));
  EXPECT_FALSE(kernels::multicast_serves(Collective::kAllReduce, DataType::kFloat16, ReduceOp::kProd, 1 << 20));
  EXPECT_FALSE(kernels::multicast_serves(Collective::kAllReduce, DataType::kFloat16, ReduceOp::kAvg, 1 << 20));
  EXPECT_FALSE(kernels::multicast_serves(Collective::kAllReduce, DataType::kInt32, ReduceOp::kSum, 1 << 20));
  EXPECT_FALSE(kernels::multicast_serves(Collective::kAllReduce, DataType::kFloat32, ReduceOp::kSum, (1 << 20) + 4));
  EXPECT_FALSE(kernels::multicast_serves(Collective::kReduceScatter, DataType::kFloat32, ReduceOp::kSum, 1 << 20));
  EXPECT_FALSE(kernels::multicast_serves(Collective::kAllGather, DataType::kFloat32, ReduceOp::kSum, 0));

  for (Collective collective : {Collective::kAllReduce, Collective::kReduce, Collective::kAllGather}) {
    const char* name = collective == Collective::kAllReduce ? "allreduce=multicast"
                       : collective == Collective::kReduce  ? "reduce=multicast"
                                                            : "allgather=multicast";
    for (size_t bytes : {size_t(1) << 20, size_t(512) << 20}) {
      const Choice closed = select_algorithm(collective, bytes, 4, DataType::kFloat32, "", Buffers::kAny, Gates{.multicast = false});
      EXPECT_NE(closed.algorithm, Algorithm::kMulticast);
      EXPECT_EQ(select_algorithm(collective, bytes, 4, DataType::kFloat32, "", Buffers::kAny, Gates{.multicast = true}).algorithm,
                Algorithm::kMulticast);
      // Forced where the gate is closed: the table's unicast choice.
      EXPECT_EQ(select_algorithm(collective, bytes, 4, DataType::kFloat32, name, Buffers::kAny, Gates{.multicast = false}).algorithm,
                closed.algorithm);
    }
    // LL keeps the small sizes, gate open or not.
    EXPECT_EQ(select_algorithm(collective, 8 << 10, 4, DataType::kFloat32, "", Buffers::kAny, Gates{.multicast = true}).algorithm,
              Algorithm::kLL);
  }
  EXPECT_THROW(select_algorithm(Collective::kReduceScatter, 1 << 20, 4, DataType::kFloat32, "reducescatter=multicast"),
               Error);
}

}  // namespace
}  // namespace braid
