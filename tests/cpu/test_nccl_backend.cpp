// The NCCL backend's pieces that need no GPU: loading NCCL with dlopen (a missing library or symbol is a clear
// kUnsupported naming it; the real libnccl.so.2 loads with every required symbol), the mapping tables (every braid
// DataType and ReduceOp, every ncclResult_t), failure messages, BRAID_NCCL_REGISTER and the NCCL config entries,
// and NcclBackend's refusal of bad arguments before any NCCL or CUDA call.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <regex>
#include <set>
#include <string>

#include "backends/nccl/nccl_backend.hpp"
#include "backends/nccl/nccl_library.hpp"
#include "core/config.hpp"
#include "core/error.hpp"

namespace braid::detail {
namespace {

bool contains(const std::string& text, const std::string& fragment) { return text.find(fragment) != std::string::npos; }

// `call` must throw braid::Error with `code` and a message containing every fragment.
void expect_error(const std::function<void()>& call, ErrorCode code, std::initializer_list<std::string> fragments) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected " << error_code_name(code);
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << error.what();
    for (const std::string& fragment : fragments) {
      EXPECT_TRUE(contains(error.what(), fragment)) << "no '" << fragment << "' in: " << error.what();
    }
  }
}

// The real NCCL (BRAID_NCCL_LIBRARY, else libnccl.so.2 wherever load() finds it), or null with the reason.
std::shared_ptr<NcclLibrary> real_library(std::string& reason) {
  try {
    return NcclLibrary::load();
  } catch (const Error& error) {
    reason = error.what();
    return nullptr;
  }
}

#define REQUIRE_REAL_NCCL(library)                                                      \
  std::string skip_reason;                                                               \
  std::shared_ptr<NcclLibrary> library = real_library(skip_reason);                      \
  if (library == nullptr) GTEST_SKIP() << "no NCCL library on this machine: " << skip_reason

// ---- Loading ----

TEST(NcclLibrary, NonexistentPathIsUnsupportedNamingThePathAndDlerror) {
  const std::string path = "/nonexistent/braid-test/libnccl.so.2";
  expect_error([&] { NcclLibrary::load(path); }, ErrorCode::kUnsupported,
               {"cannot load NCCL", path, "No such file"});
}

TEST(NcclLibrary, UnknownBareNameAlsoSearchesToolkitAndSitePackages) {
  const std::string name = "libnccl-braid-test-missing.so.9";
  expect_error([&] { NcclLibrary::load(name); }, ErrorCode::kUnsupported,
               {"cannot load NCCL from '" + name + "'", name + ": ", "/usr/local/cuda/lib64", "site-packages"});
}

TEST(NcclLibrary, ALibraryWithoutNcclNamesTheMissingSymbol) {
  expect_error([] { NcclLibrary::load("libm.so.6"); }, ErrorCode::kUnsupported,
               {"libm.so.6", "lacks the required symbol ncclGetVersion"});
}

// BRAID_NCCL_LIBRARY names the library load() takes, and the error says to set it. A fresh process (death test,
// threadsafe style: the binary re-executed) so that its first read of the environment sees the variable.
TEST(NcclLibraryDeathTest, EmptyPathTakesBraidNcclLibrary) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("BRAID_NCCL_LIBRARY", "/nonexistent/braid-env-test/libnccl.so.2", 1);
        alarm(20);
        try {
          NcclLibrary::load();
          std::_Exit(1);
        } catch (const Error& error) {
          std::fprintf(stderr, "%s\n", error.what());
          std::fflush(stderr);
          std::_Exit(error.code() == ErrorCode::kUnsupported ? 0 : 2);
        }
      },
      testing::ExitedWithCode(0), "/nonexistent/braid-env-test/libnccl.so.2.*set BRAID_NCCL_LIBRARY");
}

TEST(NcclLibrary, RealLibraryLoadsWithEveryRequiredSymbol) {
  REQUIRE_REAL_NCCL(library);
  std::printf("[nccl] %s from %s\n", library->version().c_str(), library->path().c_str());
  EXPECT_GE(library->version_code(), NCCL_VERSION(2, 19, 0)) << library->version();
  EXPECT_TRUE(std::regex_match(library->version(), std::regex(R"(\d+\.\d+\.\d+)"))) << library->version();
  EXPECT_EQ(library->version(), nccl_version_text(library->version_code()));
  EXPECT_FALSE(library->path().empty());

  const NcclApi& api = library->api();
  EXPECT_NE(api.get_version, nullptr);
  EXPECT_NE(api.get_unique_id, nullptr);
  EXPECT_TRUE(api.comm_init_rank != nullptr || api.comm_init_rank_config != nullptr);
  EXPECT_NE(api.comm_destroy, nullptr);
  EXPECT_NE(api.comm_abort, nullptr);
  EXPECT_NE(api.comm_get_async_error, nullptr);
  EXPECT_NE(api.get_error_string, nullptr);
  EXPECT_NE(api.group_start, nullptr);
  EXPECT_NE(api.group_end, nullptr);
  EXPECT_NE(api.all_reduce, nullptr);
  EXPECT_NE(api.reduce, nullptr);
  EXPECT_NE(api.reduce_scatter, nullptr);
  EXPECT_NE(api.all_gather, nullptr);
  EXPECT_NE(api.broadcast, nullptr);
  // 2.19+: send/recv (2.7), last error (2.13) and registration (2.19) are all there.
  EXPECT_TRUE(library->has_send_recv());
  EXPECT_NE(api.get_last_error, nullptr);
  EXPECT_TRUE(library->has_register());
  // has_all_to_all says what the library exports.
  void* handle = dlopen(library->path().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << "the library load() took is not loaded";
  EXPECT_EQ(library->has_all_to_all(), dlsym(handle, "ncclAlltoAll") != nullptr);
  dlclose(handle);  // drops the RTLD_NOLOAD reference only
  if (library->version_code() >= NCCL_VERSION(2, 28, 0)) EXPECT_TRUE(library->has_all_to_all());

  // The path it reports loads again, as given.
  std::shared_ptr<NcclLibrary> again = NcclLibrary::load(library->path());
  EXPECT_EQ(again->version_code(), library->version_code());
  EXPECT_EQ(again->path(), library->path());

  // Braid keeps NCCL's NVLink multicast off unless the environment asks for it.
  EXPECT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);
}

// A bare name the loader does not know is found where the nvidia-nccl wheels put NCCL: here a link to the real
// library, under $VIRTUAL_ENV/lib/python3.*/site-packages/nvidia/nccl/lib.
TEST(NcclLibrary, BareNameIsFoundInPythonSitePackages) {
  REQUIRE_REAL_NCCL(library);
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(library->api().get_version), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  char root_template[] = "/tmp/braid-nccl-test-XXXXXX";
  ASSERT_NE(mkdtemp(root_template), nullptr);
  const std::filesystem::path root = root_template;
  const std::filesystem::path folder = root / "lib/python3.99/site-packages/nvidia/nccl/lib";
  std::filesystem::create_directories(folder);
  const std::string name = "libbraid-test-nccl.so.2";
  std::filesystem::create_symlink(std::filesystem::absolute(info.dli_fname), folder / name);
  const char* previous = std::getenv("VIRTUAL_ENV");
  const std::string saved = previous != nullptr ? previous : "";
  setenv("VIRTUAL_ENV", root.c_str(), 1);
  std::shared_ptr<NcclLibrary> found;
  std::string error;
  try {
    found = NcclLibrary::load(name);
  } catch (const Error& failure) {
    error = failure.what();
  }
  if (previous != nullptr) {
    setenv("VIRTUAL_ENV", saved.c_str(), 1);
  } else {
    unsetenv("VIRTUAL_ENV");
  }
  std::filesystem::remove_all(root);
  ASSERT_NE(found, nullptr) << error;
  EXPECT_EQ(found->path(), (folder / name).string());
  EXPECT_EQ(found->version_code(), library->version_code());
}

TEST(NcclLibrary, VersionTextFollowsBothNumberings) {
  EXPECT_EQ(nccl_version_text(NCCL_VERSION(2, 28, 9)), "2.28.9");
  EXPECT_EQ(nccl_version_text(22809), "2.28.9");
  EXPECT_EQ(nccl_version_text(21903), "2.19.3");
  EXPECT_EQ(nccl_version_text(2708), "2.7.8");  // before 2.9: X*1000 + Y*100 + Z
}

TEST(NcclLibrary, FailureMessagesNameTheCallTheErrorAndTheRank) {
  REQUIRE_REAL_NCCL(library);
  const std::string text = library->api().get_error_string(ncclInvalidUsage);
  const std::string message = library->failure_message(ncclInvalidUsage, "ncclAllReduce", nullptr, "3");
  EXPECT_EQ(message.rfind("ncclAllReduce failed: " + text, 0), 0u) << message;
  EXPECT_TRUE(contains(message, "on rank 3")) << message;
  expect_error([&] { library->raise_error(ncclRemoteError, "ncclBroadcast", nullptr, "1"); }, ErrorCode::kRemoteError,
               {"ncclBroadcast failed: ", library->api().get_error_string(ncclRemoteError), "on rank 1"});
  EXPECT_NO_THROW(library->check(ncclSuccess, "ncclGroupEnd", nullptr, "0"));
  expect_error([&] { library->check(ncclUnhandledCudaError, "ncclGroupEnd", nullptr, "0"); }, ErrorCode::kCudaError,
               {"ncclGroupEnd failed"});
}

TEST(NcclLibrary, UniqueIdIs128Bytes) {
  REQUIRE_REAL_NCCL(library);
  const std::string first = NcclBackend::make_unique_id(*library);
  const std::string second = NcclBackend::make_unique_id(*library);
  EXPECT_EQ(first.size(), sizeof(ncclUniqueId));
  EXPECT_EQ(first.size(), 128u);
  EXPECT_NE(first, second);
}

// ---- The mapping tables ----

TEST(NcclMapping, EveryDataTypeMapsToItsNcclType) {
  const std::pair<DataType, ncclDataType_t> expected[] = {
      {DataType::kInt8, ncclInt8},       {DataType::kUint8, ncclUint8},     {DataType::kInt32, ncclInt32},
      {DataType::kUint32, ncclUint32},   {DataType::kInt64, ncclInt64},     {DataType::kUint64, ncclUint64},
      {DataType::kFloat16, ncclFloat16}, {DataType::kFloat32, ncclFloat32}, {DataType::kFloat64, ncclFloat64},
      {DataType::kBFloat16, ncclBfloat16}, {DataType::kFloat8E4M3, ncclFloat8e4m3},
      {DataType::kFloat8E5M2, ncclFloat8e5m2}};
  ASSERT_EQ(std::size(expected), static_cast<size_t>(kDataTypeCount));
  std::set<int> braid_values, nccl_values;
  for (const auto& [type, nccl] : expected) {
    EXPECT_EQ(to_nccl(type), nccl) << datatype_name(type);
    braid_values.insert(static_cast<int>(type));
    nccl_values.insert(static_cast<int>(to_nccl(type)));
  }
  EXPECT_EQ(braid_values.size(), static_cast<size_t>(kDataTypeCount));  // every braid DataType covered
  EXPECT_EQ(nccl_values.size(), static_cast<size_t>(kDataTypeCount));   // each to its own NCCL type
  for (int value : {-1, kDataTypeCount, 1000}) {
    expect_error([&] { to_nccl(static_cast<DataType>(value)); }, ErrorCode::kInvalidArgument, {"'type'"});
  }
}

TEST(NcclMapping, EveryReduceOpMapsToItsNcclOp) {
  const std::pair<ReduceOp, ncclRedOp_t> expected[] = {{ReduceOp::kSum, ncclSum},
                                                        {ReduceOp::kProd, ncclProd},
                                                        {ReduceOp::kMax, ncclMax},
                                                        {ReduceOp::kMin, ncclMin},
                                                        {ReduceOp::kAvg, ncclAvg}};
  ASSERT_EQ(std::size(expected), static_cast<size_t>(kReduceOpCount));
  std::set<int> braid_values, nccl_values;
  for (const auto& [op, nccl] : expected) {
    EXPECT_EQ(to_nccl(op), nccl) << reduce_op_name(op);
    braid_values.insert(static_cast<int>(op));
    nccl_values.insert(static_cast<int>(to_nccl(op)));
  }
  EXPECT_EQ(braid_values.size(), static_cast<size_t>(kReduceOpCount));
  EXPECT_EQ(nccl_values.size(), static_cast<size_t>(kReduceOpCount));
  for (int value : {-1, kReduceOpCount}) {
    expect_error([&] { to_nccl(static_cast<ReduceOp>(value)); }, ErrorCode::kInvalidArgument, {"'op'"});
  }
}

TEST(NcclMapping, EveryNcclResultMapsToABraidErrorCode) {
  const std::pair<ncclResult_t, ErrorCode> expected[] = {
      {ncclSuccess, ErrorCode::kSuccess},
      {ncclUnhandledCudaError, ErrorCode::kCudaError},
      {ncclSystemError, ErrorCode::kSystemError},
      {ncclInternalError, ErrorCode::kInternal},
      {ncclInvalidArgument, ErrorCode::kInvalidArgument},
      {ncclInvalidUsage, ErrorCode::kInvalidArgument},
      {ncclRemoteError, ErrorCode::kRemoteError},
      {ncclInProgress, ErrorCode::kInternal},
  };
  ASSERT_EQ(std::size(expected), static_cast<size_t>(ncclNumResults));
  std::set<std::string> names;
  for (const auto& [result, code] : expected) {
    EXPECT_EQ(nccl_error_code(result), code) << nccl_result_name(result);
    names.insert(nccl_result_name(result));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(ncclNumResults));
  EXPECT_EQ(names.count("unknown ncclResult_t"), 0u);
  EXPECT_EQ(nccl_error_code(static_cast<ncclResult_t>(99)), ErrorCode::kInternal);
  EXPECT_STREQ(nccl_result_name(static_cast<ncclResult_t>(99)), "unknown ncclResult_t");
}

// ---- Configuration ----

TEST(NcclConfig, RegisterModeParsesTryYesNoAndDefaultsToTry) {
  EXPECT_EQ(nccl_register_mode(Config::parse({}, nullptr)), NcclRegisterMode::kTry);
  EXPECT_EQ(nccl_register_mode(Config::parse({{"BRAID_NCCL_REGISTER", "try"}}, nullptr)), NcclRegisterMode::kTry);
  EXPECT_EQ(nccl_register_mode(Config::parse({{"BRAID_NCCL_REGISTER", "yes"}}, nullptr)), NcclRegisterMode::kYes);
  EXPECT_EQ(nccl_register_mode(Config::parse({{"BRAID_NCCL_REGISTER", "no"}}, nullptr)), NcclRegisterMode::kNo);
  for (const char* bad : {"maybe", "", "YES", "1"}) {
    Config config = Config::parse({{"BRAID_NCCL_REGISTER", bad}}, nullptr);
    expect_error([&] { nccl_register_mode(config); }, ErrorCode::kInvalidArgument,
                 {"BRAID_NCCL_REGISTER='" + std::string(bad) + "'", "try|yes|no"});
  }
  for (NcclRegisterMode mode : {NcclRegisterMode::kTry, NcclRegisterMode::kYes, NcclRegisterMode::kNo}) {
    Config config = Config::parse({{"BRAID_NCCL_REGISTER", nccl_register_mode_name(mode)}}, nullptr);
    EXPECT_EQ(nccl_register_mode(config), mode) << nccl_register_mode_name(mode);
  }
}

TEST(NcclConfig, BackendAndLibraryEntries) {
  Config defaults = Config::parse({}, nullptr);
  EXPECT_EQ(defaults.string("BRAID_BACKEND"), "auto");
  EXPECT_EQ(defaults.string("BRAID_NCCL_LIBRARY"), "libnccl.so.2");
  for (const char* backend : {"auto", "cuda", "nccl"}) {
    EXPECT_EQ(Config::parse({{"BRAID_BACKEND", backend}}, nullptr).string("BRAID_BACKEND"), backend);
  }
  Config bad = Config::parse({{"BRAID_BACKEND", "mpi"}}, nullptr);
  expect_error([&] { bad.string("BRAID_BACKEND"); }, ErrorCode::kInvalidArgument,
               {"BRAID_BACKEND='mpi'", "auto|cuda|nccl"});
  EXPECT_EQ(Config::parse({{"BRAID_NCCL_LIBRARY", "/opt/nccl/lib/libnccl.so.2"}}, nullptr).string("BRAID_NCCL_LIBRARY"),
            "/opt/nccl/lib/libnccl.so.2");
}

// ---- NcclBackend's argument checks (before any NCCL or CUDA call) ----

TEST(NcclBackend, BadArgumentsAreRefusedNamingThem) {
  expect_error([] { NcclBackend(nullptr, 0, 1, 0, std::string(128, 'x'), NcclRegisterMode::kTry, 30.0); },
               ErrorCode::kInvalidArgument, {"'library'"});
  REQUIRE_REAL_NCCL(library);
  const std::string id(sizeof(ncclUniqueId), '\0');
  expect_error([&] { NcclBackend(library, 0, 2, 0, "short", NcclRegisterMode::kTry, 30.0); }, ErrorCode::kInvalidArgument,
               {"'unique_id'", "has 5 bytes", "128"});
  expect_error([&] { NcclBackend(library, 0, 2, 0, id + "x", NcclRegisterMode::kTry, 30.0); }, ErrorCode::kInvalidArgument,
               {"'unique_id'", "129"});
  expect_error([&] { NcclBackend(library, 2, 2, 0, id, NcclRegisterMode::kTry, 30.0); }, ErrorCode::kInvalidArgument,
               {"'rank'"});
  expect_error([&] { NcclBackend(library, -1, 2, 0, id, NcclRegisterMode::kTry, 30.0); }, ErrorCode::kInvalidArgument,
               {"'rank'"});
  expect_error([&] { NcclBackend(library, 0, 0, 0, id, NcclRegisterMode::kTry, 30.0); }, ErrorCode::kInvalidArgument,
               {"'size'"});
  expect_error([&] { NcclBackend(library, 0, 2, -1, id, NcclRegisterMode::kTry, 30.0); }, ErrorCode::kInvalidArgument,
               {"'device'"});
  expect_error([&] { NcclBackend(library, 0, 2, 0, id, NcclRegisterMode::kTry, 0.0); }, ErrorCode::kInvalidArgument,
               {"'timeout_s'"});
}

}  // namespace
}  // namespace braid::detail
