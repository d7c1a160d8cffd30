// The shim answers bad arguments with the same ncclResult_t as the real NCCL.
//
// Each entry of the table below is a call that needs no GPU (a NULL communicator, a NULL out-pointer, a group
// end without a start, ...). The test runs it against the real NCCL and against the shim, each in a fresh
// forked child that dlopen-s only that library (RTLD_LOCAL), so neither library's state (a pending group, an
// initialised CUDA, a crash, a hang) can leak into the other's answer or into the next entry. The two codes
// (and, for ncclGetErrorString, the kind of error its text names) must be equal; both are printed.
//
// Skipped, never passed, where there is nothing to compare: the real NCCL cannot be loaded
// (SHIM_TEST_REAL_NCCL overrides its path), it crashed or hung, or it answered ncclUnhandledCudaError, which
// means it stopped at its own CUDA set-up before looking at the arguments (ncclCommInitRank, ncclCommInitAll and
// ncclMemFree do so on a machine without a GPU; on a GPU machine the same entries are compared).
#include <dlfcn.h>
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#ifndef NCCL_SHIM_PATH
#error "NCCL_SHIM_PATH (the shim's libnccl.so.2) must be defined by the build"
#endif
#ifndef REAL_NCCL_PATH
#define REAL_NCCL_PATH "/usr/local/cuda/lib64/libnccl.so.2"
#endif

namespace {

constexpr int kMissingSymbol = -1000;  // the library does not export a function the entry calls
constexpr int kCommLeftSet = -1001;    // an init refused its arguments but left *comm as it was
constexpr int kChildTimeoutS = 30;

// One call: returns its ncclResult_t (or kMissingSymbol); may put a text (ncclGetErrorString's) into `text`.
using Call = int (*)(void* lib, char* text, size_t text_size);

// Looks `name` up in `lib`, typed with nccl.h's declaration of it; returns kMissingSymbol from the entry if absent.
#define SYM(name)                                                                 \
  auto name##_ = reinterpret_cast<decltype(&name)>(dlsym(lib, #name));           \
  if (!name##_) return kMissingSymbol

ncclUniqueId zero_id() {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  return id;
}

// Plausible-looking (never dereferenced by a correct implementation) device pointers for the collectives.
void* const kBuf = reinterpret_cast<void*>(0x10000);
void* const kBuf2 = reinterpret_cast<void*>(0x20000);

template <int kCode>
int error_string(void* lib, char* text, size_t text_size) {
  SYM(ncclGetErrorString);
  const char* s = ncclGetErrorString_(static_cast<ncclResult_t>(kCode));
  std::snprintf(text, text_size, "%s", s ? s : "(null)");
  return 0;
}

// ncclCommInitRank's code for (nranks, rank), or kCommLeftSet where it refused them but did not set *comm to NULL
// (NCCL 2.28 sets it for a rank outside [0, nranks), not for nranks below 1). An answer of ncclUnhandledCudaError
// passes through: the real NCCL stopped at its CUDA set-up (the entry is then skipped, as above).
int init_rank_comm_after_refusal(void* lib, int nranks, int rank) {
  SYM(ncclCommInitRank);
  ncclComm_t c = reinterpret_cast<ncclComm_t>(uintptr_t{1});
  const int code = static_cast<int>(ncclCommInitRank_(&c, nranks, zero_id(), rank));
  return code == ncclSuccess || code == ncclUnhandledCudaError || c == nullptr ? code : kCommLeftSet;
}

struct Entry {
  const char* name;
  Call call;
};
void PrintTo(const Entry& e, std::ostream* os) { *os << e.name; }  // gtest's failure lines name the entry

// clang-format off
const Entry kEntries[] = {
  {"GetUniqueId_NullId", [](void* lib, char*, size_t) { SYM(ncclGetUniqueId); return (int)ncclGetUniqueId_(nullptr); }},
  {"GetUniqueId_Valid", [](void* lib, char*, size_t) { SYM(ncclGetUniqueId); ncclUniqueId id; return (int)ncclGetUniqueId_(&id); }},
  {"CommInitRank_NullComm", [](void* lib, char*, size_t) { SYM(ncclCommInitRank); return (int)ncclCommInitRank_(nullptr, 2, zero_id(), 0); }},
  {"CommInitRank_ZeroRanks", [](void* lib, char*, size_t) { SYM(ncclCommInitRank); ncclComm_t c = nullptr; return (int)ncclCommInitRank_(&c, 0, zero_id(), 0); }},
  {"CommInitRank_NegativeRanks", [](void* lib, char*, size_t) { SYM(ncclCommInitRank); ncclComm_t c = nullptr; return (int)ncclCommInitRank_(&c, -1, zero_id(), 0); }},
  {"CommInitRank_RankNotBelowNranks", [](void* lib, char*, size_t) { SYM(ncclCommInitRank); ncclComm_t c = nullptr; return (int)ncclCommInitRank_(&c, 2, zero_id(), 2); }},
  {"CommInitRank_NegativeRank", [](void* lib, char*, size_t) { SYM(ncclCommInitRank); ncclComm_t c = nullptr; return (int)ncclCommInitRank_(&c, 2, zero_id(), -1); }},
  {"CommInitRank_ZeroRanksCommAfterRefusal", [](void* lib, char*, size_t) { return init_rank_comm_after_refusal(lib, 0, 0); }},
  {"CommInitRank_RankNotBelowNranksCommAfterRefusal", [](void* lib, char*, size_t) { return init_rank_comm_after_refusal(lib, 2, 2); }},
  // Configs NCCL's parseCommConfig refuses (it runs after NCCL's CUDA set-up: compared on a GPU machine).
  {"CommInitRankConfig_ConfigNotInitialised", [](void* lib, char*, size_t) {
     SYM(ncclCommInitRankConfig); ncclComm_t c = nullptr; ncclConfig_t config;
     std::memset(&config, 0, sizeof config);
     config.size = sizeof config;
     return (int)ncclCommInitRankConfig_(&c, 2, zero_id(), 0, &config); }},
  {"CommInitRankConfig_BlockingTwo", [](void* lib, char*, size_t) {
     SYM(ncclCommInitRankConfig); ncclComm_t c = nullptr; ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
     config.blocking = 2;
     return (int)ncclCommInitRankConfig_(&c, 2, zero_id(), 0, &config); }},
  {"CommInitRankConfig_MinCtasAboveMax", [](void* lib, char*, size_t) {
     SYM(ncclCommInitRankConfig); ncclComm_t c = nullptr; ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
     config.minCTAs = 8;
     config.maxCTAs = 4;
     return (int)ncclCommInitRankConfig_(&c, 2, zero_id(), 0, &config); }},
  {"CommInitAll_NullComms", [](void* lib, char*, size_t) { SYM(ncclCommInitAll); return (int)ncclCommInitAll_(nullptr, 2, nullptr); }},
  {"CommInitAll_ZeroDevices", [](void* lib, char*, size_t) { SYM(ncclCommInitAll); ncclComm_t c[2] = {}; return (int)ncclCommInitAll_(c, 0, nullptr); }},
  {"CommInitAll_NegativeDevices", [](void* lib, char*, size_t) { SYM(ncclCommInitAll); ncclComm_t c[2] = {}; return (int)ncclCommInitAll_(c, -1, nullptr); }},
  {"CommInitAll_DeviceNotPresent", [](void* lib, char*, size_t) { SYM(ncclCommInitAll); ncclComm_t c[2] = {}; const int d[2] = {0, 4096}; return (int)ncclCommInitAll_(c, 2, d); }},
  {"CommInitAll_NegativeDevice", [](void* lib, char*, size_t) { SYM(ncclCommInitAll); ncclComm_t c[2] = {}; const int d[2] = {-1, 0}; return (int)ncclCommInitAll_(c, 2, d); }},
  {"CommInitAll_RepeatedDevice", [](void* lib, char*, size_t) { SYM(ncclCommInitAll); ncclComm_t c[2] = {}; const int d[2] = {0, 0}; return (int)ncclCommInitAll_(c, 2, d); }},
  {"CommCount_NullComm", [](void* lib, char*, size_t) { SYM(ncclCommCount); int n = -1; return (int)ncclCommCount_(nullptr, &n); }},
  {"CommCount_NullCount", [](void* lib, char*, size_t) { SYM(ncclCommCount); return (int)ncclCommCount_(nullptr, nullptr); }},
  {"CommCuDevice_NullComm", [](void* lib, char*, size_t) { SYM(ncclCommCuDevice); int d = -1; return (int)ncclCommCuDevice_(nullptr, &d); }},
  {"CommUserRank_NullComm", [](void* lib, char*, size_t) { SYM(ncclCommUserRank); int r = -1; return (int)ncclCommUserRank_(nullptr, &r); }},
  {"AllReduce_NullComm", [](void* lib, char*, size_t) { SYM(ncclAllReduce); return (int)ncclAllReduce_(kBuf, kBuf2, 4, ncclFloat32, ncclSum, nullptr, nullptr); }},
  {"Reduce_NullComm", [](void* lib, char*, size_t) { SYM(ncclReduce); return (int)ncclReduce_(kBuf, kBuf2, 4, ncclFloat32, ncclSum, 0, nullptr, nullptr); }},
  {"Broadcast_NullComm", [](void* lib, char*, size_t) { SYM(ncclBroadcast); return (int)ncclBroadcast_(kBuf, kBuf2, 4, ncclFloat32, 0, nullptr, nullptr); }},
  {"Bcast_NullComm", [](void* lib, char*, size_t) { SYM(ncclBcast); return (int)ncclBcast_(kBuf, 4, ncclFloat32, 0, nullptr, nullptr); }},
  {"AllGather_NullComm", [](void* lib, char*, size_t) { SYM(ncclAllGather); return (int)ncclAllGather_(kBuf, kBuf2, 4, ncclFloat32, nullptr, nullptr); }},
  {"ReduceScatter_NullComm", [](void* lib, char*, size_t) { SYM(ncclReduceScatter); return (int)ncclReduceScatter_(kBuf, kBuf2, 4, ncclFloat32, ncclSum, nullptr, nullptr); }},
  {"AlltoAll_NullComm", [](void* lib, char*, size_t) { SYM(ncclAlltoAll); return (int)ncclAlltoAll_(kBuf, kBuf2, 4, ncclFloat32, nullptr, nullptr); }},
  {"Send_NullComm", [](void* lib, char*, size_t) { SYM(ncclSend); return (int)ncclSend_(kBuf, 4, ncclFloat32, 0, nullptr, nullptr); }},
  {"Recv_NullComm", [](void* lib, char*, size_t) { SYM(ncclRecv); return (int)ncclRecv_(kBuf, 4, ncclFloat32, 0, nullptr, nullptr); }},
  {"GroupEnd_WithoutStart", [](void* lib, char*, size_t) { SYM(ncclGroupEnd); return (int)ncclGroupEnd_(); }},
  {"GroupStart_ThenEnd", [](void* lib, char*, size_t) {
     SYM(ncclGroupStart); SYM(ncclGroupEnd);
     const ncclResult_t start = ncclGroupStart_();
     return start != ncclSuccess ? 100 + (int)start : (int)ncclGroupEnd_(); }},
  {"CommDestroy_NullComm", [](void* lib, char*, size_t) { SYM(ncclCommDestroy); return (int)ncclCommDestroy_(nullptr); }},
  {"CommAbort_NullComm", [](void* lib, char*, size_t) { SYM(ncclCommAbort); return (int)ncclCommAbort_(nullptr); }},
  {"CommFinalize_NullComm", [](void* lib, char*, size_t) { SYM(ncclCommFinalize); return (int)ncclCommFinalize_(nullptr); }},
  {"CommGetAsyncError_NullComm", [](void* lib, char*, size_t) { SYM(ncclCommGetAsyncError); ncclResult_t r = ncclSuccess; return (int)ncclCommGetAsyncError_(nullptr, &r); }},
  {"GetVersion_NullVersion", [](void* lib, char*, size_t) { SYM(ncclGetVersion); return (int)ncclGetVersion_(nullptr); }},
  {"GetVersion_Valid", [](void* lib, char* text, size_t size) {
     SYM(ncclGetVersion); int v = 0; const ncclResult_t r = ncclGetVersion_(&v);
     std::snprintf(text, size, "version %d (not compared)", v);
     return (int)r; }},
  {"GetErrorString_0", error_string<0>}, {"GetErrorString_1", error_string<1>}, {"GetErrorString_2", error_string<2>},
  {"GetErrorString_3", error_string<3>}, {"GetErrorString_4", error_string<4>}, {"GetErrorString_5", error_string<5>},
  {"GetErrorString_6", error_string<6>}, {"GetErrorString_7", error_string<7>}, {"GetErrorString_8", error_string<8>},
  {"RedOpDestroy_BadOpNullComm", [](void* lib, char*, size_t) { SYM(ncclRedOpDestroy); return (int)ncclRedOpDestroy_(static_cast<ncclRedOp_t>(100), nullptr); }},
  {"RedOpDestroy_BuiltinOpNullComm", [](void* lib, char*, size_t) { SYM(ncclRedOpDestroy); return (int)ncclRedOpDestroy_(ncclSum, nullptr); }},
  {"MemFree_Null", [](void* lib, char*, size_t) { SYM(ncclMemFree); return (int)ncclMemFree_(nullptr); }},
  {"CommRegister_NullComm", [](void* lib, char*, size_t) { SYM(ncclCommRegister); void* h = nullptr; return (int)ncclCommRegister_(nullptr, kBuf, 4096, &h); }},
  {"CommDeregister_NullCommNullHandle", [](void* lib, char*, size_t) { SYM(ncclCommDeregister); return (int)ncclCommDeregister_(nullptr, nullptr); }},
  {"CommWindowDeregister_NullCommNullWindow", [](void* lib, char*, size_t) { SYM(ncclCommWindowDeregister); return (int)ncclCommWindowDeregister_(nullptr, nullptr); }},
  // A refused call fails its group: 100 x the call's result + ncclGroupEnd's.
  {"Group_RefusedAllReduceFailsTheGroup", [](void* lib, char*, size_t) {
     SYM(ncclGroupStart); SYM(ncclGroupEnd); SYM(ncclAllReduce);
     ncclGroupStart_();
     const ncclResult_t call = ncclAllReduce_(kBuf, kBuf2, 4, ncclFloat32, ncclSum, nullptr, nullptr);
     return 100 * (int)call + (int)ncclGroupEnd_(); }},
  {"Group_RefusedSendFailsTheGroup", [](void* lib, char*, size_t) {
     SYM(ncclGroupStart); SYM(ncclGroupEnd); SYM(ncclSend);
     ncclGroupStart_();
     const ncclResult_t call = ncclSend_(kBuf, 4, ncclFloat32, 0, nullptr, nullptr);
     return 100 * (int)call + (int)ncclGroupEnd_(); }},
  // Refused inits and splits fail their group too (an NCCL that stops at its CUDA set-up first: skipped).
  {"Group_RefusedInitRankScalableFailsTheGroup", [](void* lib, char*, size_t) {
     SYM(ncclGroupStart); SYM(ncclGroupEnd); SYM(ncclCommInitRankScalable);
     ncclGroupStart_();
     ncclComm_t comm = nullptr;
     const ncclResult_t call = ncclCommInitRankScalable_(&comm, 2, 0, 0, nullptr, nullptr);
     const ncclResult_t end = ncclGroupEnd_();
     return call == ncclUnhandledCudaError ? (int)call : 100 * (int)call + (int)end; }},
  {"Group_RefusedSplitFailsTheGroup", [](void* lib, char*, size_t) {
     SYM(ncclGroupStart); SYM(ncclGroupEnd); SYM(ncclCommSplit);
     ncclGroupStart_();
     ncclComm_t comm = nullptr;
     const ncclResult_t call = ncclCommSplit_(nullptr, 0, 0, &comm, nullptr);
     const ncclResult_t end = ncclGroupEnd_();
     return call == ncclUnhandledCudaError ? (int)call : 100 * (int)call + (int)end; }},
  // The failure ends with its group: 100 x the failed group's end + the next (empty) group's end.
  {"Group_FailureEndsWithItsGroup", [](void* lib, char*, size_t) {
     SYM(ncclGroupStart); SYM(ncclGroupEnd); SYM(ncclAllReduce);
     ncclGroupStart_();
     ncclAllReduce_(kBuf, kBuf2, 4, ncclFloat32, ncclSum, nullptr, nullptr);
     const ncclResult_t failed = ncclGroupEnd_();
     ncclGroupStart_();
     return 100 * (int)failed + (int)ncclGroupEnd_(); }},
  // Nested: the inner end succeeds, the outer returns the failure (100 x inner + outer).
  {"Group_NestedFailureAtTheOuterEnd", [](void* lib, char*, size_t) {
     SYM(ncclGroupStart); SYM(ncclGroupEnd); SYM(ncclAllReduce);
     ncclGroupStart_();
     ncclGroupStart_();
     ncclAllReduce_(kBuf, kBuf2, 4, ncclFloat32, ncclSum, nullptr, nullptr);
     const ncclResult_t inner = ncclGroupEnd_();
     return 100 * (int)inner + (int)ncclGroupEnd_(); }},
  // ncclGroupSimulateEnd: NULL is ncclGroupEnd (so a second end has no group: 100 x simulate + that end).
  {"GroupSimulateEnd_NullIsGroupEnd", [](void* lib, char*, size_t) {
     SYM(ncclGroupStart); SYM(ncclGroupEnd); SYM(ncclGroupSimulateEnd);
     ncclGroupStart_();
     const ncclResult_t simulated = ncclGroupSimulateEnd_(nullptr);
     return 100 * (int)simulated + (int)ncclGroupEnd_(); }},
  {"GroupSimulateEnd_Initialised", [](void* lib, char*, size_t) {
     SYM(ncclGroupStart); SYM(ncclGroupSimulateEnd);
     ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
     ncclGroupStart_();
     return (int)ncclGroupSimulateEnd_(&info); }},
  {"GroupSimulateEnd_NotInitialised", [](void* lib, char*, size_t) {
     SYM(ncclGroupStart); SYM(ncclGroupSimulateEnd);
     ncclSimInfo_t info;
     std::memset(&info, 0, sizeof info);
     info.size = sizeof info;
     ncclGroupStart_();
     return (int)ncclGroupSimulateEnd_(&info); }},
  {"GroupSimulateEnd_WithoutStart", [](void* lib, char*, size_t) {
     SYM(ncclGroupSimulateEnd);
     ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
     return (int)ncclGroupSimulateEnd_(&info); }},
};
// clang-format on

// What a child reported about one library.
struct Outcome {
  enum Kind { kReturned, kNoLibrary, kCrashed, kHung } kind = kCrashed;
  int code = 0;
  std::string text;  // ncclGetErrorString's text, or why the library did not answer
};

struct Report {  // sent through the pipe
  int loaded;
  int code;
  char text[512];
};

// Runs `call` (or only the dlopen, when call is null) on the library at `path` in a forked child.
Outcome run_in_child(const char* path, Call call) {
  int fds[2];
  if (pipe(fds) != 0) return {Outcome::kCrashed, 0, std::string("pipe: ") + std::strerror(errno)};
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return {Outcome::kCrashed, 0, std::string("fork: ") + std::strerror(errno)};
  if (pid == 0) {
    close(fds[0]);
    Report rep{};
    void* lib = dlopen(path, RTLD_LOCAL | RTLD_NOW);
    if (!lib) {
      const char* e = dlerror();
      std::snprintf(rep.text, sizeof rep.text, "%s", e ? e : "dlopen failed");
    } else {
      rep.loaded = 1;
      if (call) rep.code = call(lib, rep.text, sizeof rep.text);
    }
    ssize_t ignored = write(fds[1], &rep, sizeof rep);
    (void)ignored;
    _exit(0);  // no atexit handlers, no library destructors racing the parent
  }
  close(fds[1]);
  Report rep{};
  size_t got = 0;
  bool hung = false;
  while (got < sizeof rep) {
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, kChildTimeoutS * 1000);
    if (ready == 0) {
      hung = true;
      break;
    }
    if (ready < 0 && errno == EINTR) continue;
    const ssize_t n = read(fds[0], reinterpret_cast<char*>(&rep) + got, sizeof rep - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fds[0]);
  if (hung) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (hung) return {Outcome::kHung, 0, "no answer within " + std::to_string(kChildTimeoutS) + " s"};
  if (got != sizeof rep) {
    std::string why = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                          : "exited with " + std::to_string(WEXITSTATUS(status));
    return {Outcome::kCrashed, 0, why + " before answering"};
  }
  if (!rep.loaded) return {Outcome::kNoLibrary, 0, rep.text};
  return {Outcome::kReturned, rep.code, rep.text};
}

const char* real_nccl_path() {
  const char* env = std::getenv("SHIM_TEST_REAL_NCCL");
  return env && *env ? env : REAL_NCCL_PATH;
}

std::string describe(const Outcome& o) {
  switch (o.kind) {
    case Outcome::kReturned:
      if (o.code == kMissingSymbol) return "function not exported";
      if (o.code == kCommLeftSet) return "refused, *comm left as it was";
      return std::to_string(o.code) + (o.text.empty() ? "" : " \"" + o.text + "\"");
    case Outcome::kNoLibrary: return "cannot load: " + o.text;
    case Outcome::kCrashed: return "crashed: " + o.text;
    case Outcome::kHung: return "hung: " + o.text;
  }
  return "?";
}

class ShimArguments : public ::testing::TestWithParam<Entry> {
 protected:
  static void SetUpTestSuite() {
    real_loadable_ = new Outcome(run_in_child(real_nccl_path(), nullptr));
    shim_loadable_ = new Outcome(run_in_child(NCCL_SHIM_PATH, nullptr));
  }
  static void TearDownTestSuite() {
    delete real_loadable_;
    delete shim_loadable_;
  }
  static Outcome* real_loadable_;
  static Outcome* shim_loadable_;
};
Outcome* ShimArguments::real_loadable_ = nullptr;
Outcome* ShimArguments::shim_loadable_ = nullptr;

TEST_P(ShimArguments, SameResultAsRealNccl) {
  const Entry& e = GetParam();
  if (real_loadable_->kind != Outcome::kReturned)
    GTEST_SKIP() << "the real NCCL " << real_nccl_path() << " " << describe(*real_loadable_)
                 << " (set SHIM_TEST_REAL_NCCL to its path)";
  ASSERT_EQ(shim_loadable_->kind, Outcome::kReturned) << "the shim " << NCCL_SHIM_PATH << " "
                                                      << describe(*shim_loadable_);
  const Outcome real = run_in_child(real_nccl_path(), e.call);
  const Outcome shim = run_in_child(NCCL_SHIM_PATH, e.call);
  std::printf("  %-34s real NCCL: %s\n  %-34s shim:      %s\n", e.name, describe(real).c_str(), "",
              describe(shim).c_str());
  if (real.kind != Outcome::kReturned || real.code == kMissingSymbol)
    GTEST_SKIP() << "the real NCCL did not answer (" << describe(real) << "): nothing to compare";
  if (real.code == ncclUnhandledCudaError)
    GTEST_SKIP() << "the real NCCL answered ncclUnhandledCudaError: it stopped at its CUDA set-up (no usable GPU "
                    "here) before checking the arguments, so there is nothing to compare";
  ASSERT_EQ(shim.kind, Outcome::kReturned) << "the shim " << describe(shim);
  ASSERT_NE(shim.code, kMissingSymbol) << "the shim does not export a function this entry calls";
  EXPECT_EQ(shim.code, real.code) << "ncclResult_t differs: shim " << describe(shim) << ", real NCCL "
                                  << describe(real);
  if (std::strncmp(e.name, "GetErrorString_", 15) == 0) {
    // The same kind of error; where NCCL points at its own log (NCCL_DEBUG) the shim points at braid's.
    const auto kind = [](const std::string& text) { return text.substr(0, std::min(text.find(" ("), text.find(" - "))); };
    EXPECT_EQ(kind(shim.text), kind(real.text));
    EXPECT_EQ(shim.text.find("NCCL_DEBUG"), std::string::npos) << shim.text;
    if (real.text.find("NCCL_DEBUG") != std::string::npos) EXPECT_NE(shim.text.find("BRAID_LOG_LEVEL"), std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(Calls, ShimArguments, ::testing::ValuesIn(kEntries),
                         [](const ::testing::TestParamInfo<Entry>& info) { return std::string(info.param.name); });

}  // namespace
