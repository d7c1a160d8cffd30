// The NCCL shim's inner parts, shared by the files that export NCCL's API (api_*.cpp): what a shim communicator
// is, how a call turns braid's exceptions into ncclResult_t, the real NCCL it falls back to, and which path
// serves a call.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/nccl/nccl_library.hpp"
#include "braid/braid.hpp"
#include "braid/error.hpp"

namespace braid {
class StoreHost;
}

namespace braid::shim {

// A caller's ncclConfig_t for the real NCCL's communicator: copied whole (its size field says how much; the configs
// of newer nccl.h releases are larger than this build's), with blocking set, since the shim's init is done before
// it returns. Null config: none.
class RealConfig {
 public:
  RealConfig() = default;
  explicit RealConfig(const ncclConfig_t* config);
  ncclConfig_t* get() { return bytes_.empty() ? nullptr : reinterpret_cast<ncclConfig_t*>(bytes_.data()); }
  // The config's maxCTAs where the caller set it (braid's cap on a launch's blocks, CommOptions::max_blocks),
  // else 0.
  int max_ctas() const;

 private:
  std::vector<unsigned char> bytes_;
};

}  // namespace braid::shim

// NCCL's opaque communicator type, defined by the shim: a braid communicator (absent where only NCCL serves the
// ranks) and the real NCCL's communicator on the same ranks (null where NCCL could not be loaded).
struct ncclComm {
  static constexpr uint64_t kMagic = 0x6272616964736863ull;  // "braidshc": tells a shim communicator from garbage
  uint64_t magic = kMagic;
  int rank = -1;
  int size = 0;
  int device = -1;
  std::atomic<bool> ready{false};  // false while an init deferred to ncclGroupEnd or running non-blocking is pending
                                  // (or failed)
  // A non-blocking config (blocking = 0): init and finalize run on `background`; async_state is ncclInProgress
  // while one runs, then its result, which ncclCommGetAsyncError reports (with async_error as the last error).
  bool nonblocking = false;
  std::thread background;
  std::atomic<ncclResult_t> async_state{ncclSuccess};
  std::string async_error;  // written before async_state
  std::optional<braid::Communicator> braid;
  bool braid_on_cuda = false;  // braid's CUDA backend serves it (otherwise braid itself runs on NCCL, or is absent)
  std::shared_ptr<braid::detail::NcclLibrary> library;  // the real NCCL; null where it could not be loaded
  ncclComm_t real = nullptr;  // the real NCCL's communicator (NCCL's type, not this struct)
  bool owns_real = false;     // false: borrowed from braid's NCCL backend
  std::shared_ptr<braid::StoreHost> store;  // the rendezvous store, where this process made the unique id
  braid::shim::RealConfig config;  // the caller's config (none: empty), which a split or shrink without one inherits
  bool finalize_called = false;    // ncclCommFinalize was called (a second call is refused, as NCCL does)
  std::mutex events_mutex;
  std::vector<cudaEvent_t> events;  // joins the streams of a send/recv batch (made on first need, kept)
  ~ncclComm() {
    if (background.joinable()) background.join();
  }
};

namespace braid::shim {

// Runs body; braid::Error becomes its ncclResult_t (to_nccl_result), any other exception ncclInternalError or
// ncclSystemError; the message is kept for ncclGetLastError and logged at warn level.
template <typename Body>
ncclResult_t guarded(const char* function, Body&& body);

// The message of this thread's last failed call ("" if none).
void set_last_error(const std::string& message);
const std::string& last_error();

// Refuses (kInvalidArgument naming argument `name` of `function`) a null or foreign communicator; one whose init
// failed or is still pending in a group (kInvalidArgument as well: NCCL's ncclInvalidArgument for a bad comm).
ncclComm& checked_comm(ncclComm_t comm, const char* function, const char* name = "comm");
// A null out-pointer argument: kInvalidArgument naming it.
void require_pointer(const void* pointer, const char* function, const char* name);

// The real NCCL, loaded once per process (BRAID_NCCL_LIBRARY, else the first libnccl.so.2 that is not a shim).
// Null where it cannot be loaded; why is logged once and returned by real_nccl_problem().
std::shared_ptr<detail::NcclLibrary> real_nccl();
const std::string& real_nccl_problem();
// The real NCCL of `comm`, or kUnsupported naming what needed it and why it is absent.
const detail::NcclLibrary& require_real(const ncclComm& comm, const char* what);
// A failure the real NCCL returned: guarded() returns its ncclResult_t as it is (braid's ErrorCode folds
// ncclInvalidUsage into kInvalidArgument).
class RealNcclError : public braid::Error {
 public:
  RealNcclError(ncclResult_t result, const std::string& message)
      : Error(braid::detail::nccl_error_code(result), message), result_(result) {}
  ncclResult_t result() const noexcept { return result_; }

 private:
  ncclResult_t result_;
};
// Raises RealNcclError for a failed real NCCL call (message from NCCL); ncclInProgress is no failure.
void check_real(const ncclComm& comm, ncclResult_t result, const char* call);
// The same for a call of `library` without a communicator (ncclGroupStart, ncclGroupEnd).
void check_real(const braid::detail::NcclLibrary& library, ncclResult_t result, const char* call);

// Calls that reach the shim but belong to the real NCCL. Where the real NCCL was loaded before the shim opened it
// (PyTorch preloads its wheel's libnccl.so.2 with RTLD_GLOBAL), NCCL's calls to its own exported names bind to the
// shim (LD_PRELOAD comes first), with NCCL's communicators as arguments: e.g. ncclCommFinalize polling
// ncclCommGetAsyncError. foreign_entry(comm, name) is the real NCCL's `name` when `comm` is not a shim
// communicator (the caller forwards the call there), else null. called_by_real_nccl(address) tells whether a return
// address lies in the real NCCL's code (for calls without a communicator, e.g. ncclGroupStart).
bool is_shim_comm(const void* comm);  // a communicator of this library (its magic), not the real NCCL's or null
void* foreign_entry(const void* comm, const char* name);
void* real_entry(const char* name);  // the real NCCL's `name`; null where it is not loaded
bool called_by_real_nccl(const void* return_address);

// A split's or shrink's config: the caller's, or, as in NCCL, the parent's where it gave none. The real NCCL's own
// split or shrink is passed the caller's (null included: NCCL then copies its parent's itself).
RealConfig child_config(const ncclComm& parent, const ncclConfig_t* config);

// Makes a shim communicator (collective over `size` ranks): braid's communicator at the store the unique id
// names (its rendezvous), then the real NCCL's communicator on the same ranks: `real` when given (a split of the
// parent's), else a fresh one whose id rank 0 shares through braid, made with `config` where the caller gave one
// (ncclCommInitRankConfig: commName, CTA limits and NCCL's other tuning fields reach NCCL's communicator). An id
// not made by the shim is taken as the real NCCL's own: the communicator is then NCCL only. `device`: the CUDA
// device of this rank.
void initialise(ncclComm& comm, const ncclUniqueId& id, int size, int rank, int device, ncclComm_t real = nullptr,
                RealConfig config = {});
// Releases what initialise made; abort: ncclCommAbort rather than ncclCommDestroy for the real communicator. Waits
// for a non-blocking init or finalize still running first.
void release(ncclComm& comm, bool abort);

// Refuses a config as NCCL's parseCommConfig does (kInvalidArgument naming `config` and the field): no
// NCCL_CONFIG_INITIALIZER magic, or a field outside its range (fields newer than the config's version are
// NCCL's defaults). Null: nothing to check.
void check_config(const char* function, const ncclConfig_t* config);
// Whether a config asks for non-blocking calls (blocking = 0, in a config of NCCL 2.14 or later).
bool nonblocking_config(const ncclConfig_t* config);
// Starts `work` on the communicator's background thread (after the last one ended) and returns ncclInProgress;
// its result goes to async_state.
ncclResult_t run_in_background(ncclComm& comm, const char* function, std::function<void()> work);

}  // namespace braid::shim

#include "shim_guarded.hpp"

// First statement of an exported function taking a communicator: forwards the call to the real NCCL when `comm`
// is one of the real NCCL's (see foreign_entry).
#define SHIM_FORWARD_FOREIGN(comm, function, ...)                                                   \
  do {                                                                                              \
    if (void* real_entry_ = ::braid::shim::foreign_entry(comm, #function)) {                        \
      return reinterpret_cast<decltype(&function)>(real_entry_)(__VA_ARGS__);                       \
    }                                                                                               \
  } while (0)
// First statement of an exported function without a communicator that NCCL itself may call.
#define SHIM_FORWARD_FROM_REAL(function, ...)                                                       \
  do {                                                                                              \
    if (::braid::shim::called_by_real_nccl(__builtin_return_address(0))) {                          \
      if (void* real_entry_ = ::braid::shim::real_entry(#function)) {                               \
        return reinterpret_cast<decltype(&function)>(real_entry_)(__VA_ARGS__);                     \
      }                                                                                             \
    }                                                                                               \
  } while (0)
